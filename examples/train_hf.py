"""Train a Hugging Face LlamaForCausalLM with dcp: sampler -> planner -> executor -> optimizer.

    .venv/bin/torchrun --nproc_per_node 4 examples/train_hf.py --steps 20
    .venv/bin/torchrun --nproc_per_node 4 examples/train_hf.py --steps 3 --check-grads --memory-gb 0.003
    .venv/bin/torchrun --nproc_per_node 4 examples/train_hf.py --steps 3 --zero-stage 3 --check-grads

The model is built from a small LlamaConfig with random weights (nothing is downloaded); with
a checkpoint, `AutoModelForCausalLM.from_pretrained(...)` takes its place unchanged. The
planner's ModelSpec comes from the model's config, so it only plans SP sizes that divide the
heads and KV heads (on CPU, --memory-gb 0.003 makes it mix SP 1, 2 and 4). Samples are learnable
arithmetic token sequences of variable length.
--check-grads compares every step's gradients with plain single-process HF training on the same
global batch (each sample alone, sdpa attention, `labels`, fp32) and prints
`max_grad_diff=<largest relative difference>` last.
"""

from __future__ import annotations

import argparse
import copy

import torch

try:  # transformers comes with dcp's hf extra
    from transformers import LlamaConfig, LlamaForCausalLM

    from dcp.executor.hf import (
        causal_lm_loss,
        hf_executor,
        lm_sample,
        plain_hf_step,
    )
    from dcp.executor.hf_memory import measured_model_spec
except ImportError as e:
    from dcp.launch import fail

    fail(f"examples/train_hf.py needs transformers ({e}): install dcp's hf extra with `scripts/setup_env.sh hf` "
         "(or `.venv/bin/pip install -e '.[hf]'`) in the repository")

from dcp.executor import executor_optimizer
from dcp.executor.reference import load_reference, reference_grad_diff
from dcp.launch import (
    RunOptions,
    init_distributed,
    maybe_save,
    open_checkpoints,
    planned_batches,
    run_main,
    shutdown_distributed,
    step_summary,
    write_step_stats,
)
from dcp.models import sample_tensors
from dcp.models.precision import param_dtype


def parse_args() -> tuple[argparse.Namespace, RunOptions]:
    """(the model's shape, the run's options)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=2, help="decoder layers of the Llama")
    p.add_argument("--hidden", type=int, default=64, help="hidden size")
    p.add_argument("--heads", type=int, default=8, help="attention heads")
    p.add_argument("--kv-heads", type=int, default=4, help="key/value heads (GQA)")
    p.add_argument("--vocab", type=int, default=256, help="vocabulary size")
    RunOptions.add_arguments(p)
    args = p.parse_args()
    return args, RunOptions.from_args(args)


def main() -> None:
    shape, options = parse_args()
    state = init_distributed(timeout_s=300)
    rank, cuda = state.rank, state.device.type == "cuda"

    config = LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=2 * shape.hidden,
                         num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, max_position_embeddings=4096)
    recipe = options.recipe(cuda)  # the one the planner's cost model prices
    torch.manual_seed(options.seed)
    model = LlamaForCausalLM(config).to(device=state.device, dtype=param_dtype(recipe))
    reference = copy.deepcopy(model) if options.check_grads and rank == 0 else None  # stays plain HF (sdpa)
    executor = hf_executor(model, state, recipe=recipe, zero_stage=options.zero_stage)
    optimizer = executor_optimizer(executor, lr=options.lr)

    # The planner's ModelSpec, with this model's memory measured in the run's recipe (fake tensors).
    spec = measured_model_spec(config, recipe.name, name="hf-llama", bytes_per_element=recipe.compute_bytes)
    # Every rank draws and plans the same batches (dcp-greedy is deterministic; ilp is not, so
    # with ilp the executor's plan-digest check would flag ranks whose time-limited solves differ).
    sampler = planned_batches(spec, state, options)
    ckpt, start = open_checkpoints(options, model, optimizer, sampler)  # --resume: where the run stopped
    worst = 0.0
    for step, planned in zip(range(start, options.steps), sampler, strict=False):
        plan = planned.plan
        specs = plan.sample_map()
        wanted = specs if reference is not None else planned.local_samples(rank)  # reference needs all
        ids = {i: sample_tensors(spec, specs[i], seed=options.seed)["inputs"] for i in wanted}
        if options.check_grads:  # every rank: at ZeRO-3 the parameters are gathered (a collective)
            load_reference(executor, model, reference)
        stats = executor.step(plan, {i: lm_sample(x) for i, x in ids.items()}, causal_lm_loss)
        if options.check_grads:
            if reference is not None:
                plain_hf_step(reference, [ids[s.id].to(state.device) for s in plan.samples])
            worst = max(worst, reference_grad_diff(executor, model, reference))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0 and options.stats_out:
            write_step_stats(options.stats_out, step, stats)
        if rank == 0:
            print(step_summary(step, plan, stats), flush=True)
        maybe_save(ckpt, options, step + 1, model, optimizer, sampler, planned)
    sampler.close()
    if ckpt is not None:
        ckpt.close()  # an async save in flight commits before the job ends
    if options.check_grads and rank == 0:
        print(f"max_grad_diff={worst:.3e}", flush=True)
    shutdown_distributed()


if __name__ == "__main__":
    run_main(main)
