"""Train a Hugging Face LlamaForCausalLM with dcp: sampler -> planner -> executor -> optimizer.

    .venv/bin/torchrun --nproc_per_node 4 examples/train_hf.py --steps 20
    .venv/bin/torchrun --nproc_per_node 4 examples/train_hf.py --steps 3 --check-grads --memory-mb 3

The model is built from a small LlamaConfig with random weights (nothing is downloaded); with
a checkpoint, `AutoModelForCausalLM.from_pretrained(...)` takes its place unchanged. The
planner's ModelSpec comes from the model's config, so it only plans SP sizes that divide the
heads and KV heads (on CPU, --memory-mb 3 makes it mix SP 1, 2 and 4). Samples are learnable
arithmetic token sequences of variable length.
--check-grads compares every step's gradients with plain single-process HF training on the same
global batch (each sample alone, sdpa attention, `labels`, fp32) and prints
`max_grad_diff=<largest relative difference>` last.
"""

from __future__ import annotations

import argparse
import copy
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

from dcp.costmodel import Cluster, CostModel, TrainingSetup, load_hardware
from dcp.data import GlobalBatchSampler, load_workload
from dcp.executor import ParallelState, sharded_optimizer
from dcp.executor.hf import (
    causal_lm_loss,
    hf_executor,
    lm_sample,
    model_spec_from_hf_config,
    plain_hf_step,
)
from dcp.executor.reference import relative_grad_diff
from dcp.models import sample_tensors


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=2, help="decoder layers of the Llama")
    p.add_argument("--hidden", type=int, default=64, help="hidden size")
    p.add_argument("--heads", type=int, default=8, help="attention heads")
    p.add_argument("--kv-heads", type=int, default=4, help="key/value heads (GQA)")
    p.add_argument("--vocab", type=int, default=256, help="vocabulary size")
    p.add_argument("--workload", default="lognormal:mean=64,sigma=1,min=8,max=512",
                   help="dcp.data.load_workload spec (sample lengths)")
    p.add_argument("--strategy", default="dcp-greedy", help="planner strategy: dcp-greedy, ilp, bucket, packed")
    p.add_argument("--global-batch", type=int, default=32, help="samples per global batch")
    p.add_argument("--memory-mb", type=float, default=None,
                   help="usable memory per rank for the planner (small values force SP and checkpointing)")
    p.add_argument("--steps", type=int, default=20, help="training steps")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check-grads", action="store_true", help="compare gradients with plain HF every step")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(minutes=5))
    world, rank = dist.get_world_size(), dist.get_rank()
    state = ParallelState.create(timeout_s=300)

    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, max_position_embeddings=4096)
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config).to(state.device)
    reference = copy.deepcopy(model) if args.check_grads and rank == 0 else None  # stays plain HF (sdpa)
    executor = hf_executor(model, state, autocast_dtype=None if args.check_grads else "auto")
    optimizer = sharded_optimizer(model.parameters(), lr=args.lr)

    spec = model_spec_from_hf_config(config, name="hf-llama", bytes_per_element=2 if cuda else 4)
    hw = load_hardware("h200-sxm" if cuda else "cpu")
    per_node = torch.cuda.device_count() if cuda else world
    cluster = Cluster(num_gpus=world, gpus_per_node=min(per_node, world),
                      memory_bytes=args.memory_mb * 1e6 if args.memory_mb else hw.memory_bytes)
    cm = CostModel(spec, hw, cluster, TrainingSetup(precision="bf16" if cuda else "fp32", zero_stage=1))
    # Every rank draws and plans the same batches (dcp-greedy is deterministic; ilp is not, so
    # with ilp the executor's plan-digest check would flag ranks whose time-limited solves differ).
    sampler = GlobalBatchSampler.from_workload(load_workload(args.workload, seed=args.seed), cm,
                                               batch_size=args.global_batch, strategy=args.strategy,
                                               seed=args.seed, workers=0)
    worst = 0.0
    for step, planned in zip(range(args.steps), sampler, strict=False):
        plan = planned.plan
        wanted = plan.sample_map() if reference is not None else planned.local_samples(rank)
        ids = {i: sample_tensors(spec, plan.sample_map()[i], seed=args.seed)["inputs"] for i in wanted}
        if reference is not None:
            reference.load_state_dict(model.state_dict())
        stats = executor.step(plan, {i: lm_sample(x) for i, x in ids.items()}, causal_lm_loss)
        if reference is not None:
            plain_hf_step(reference, [ids[s.id].to(state.device) for s in plan.samples])
            worst = max(worst, relative_grad_diff(list(model.parameters()), list(reference.parameters())))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0:
            groups = " ".join(f"sp{g.sp}:{len(g.microbatches)}mb" for g in plan.groups)
            print(f"step {step:3d} loss {stats.loss:.4f} tokens {stats.loss_tokens:5d} groups [{groups}] "
                  f"predicted {stats.predicted_step_s * 1e3:8.2f} ms measured {stats.measured_step_s * 1e3:8.2f} ms",
                  flush=True)
    sampler.close()
    if args.check_grads and rank == 0:
        print(f"max_grad_diff={worst:.3e}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
