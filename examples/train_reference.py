"""Train a reference transformer end to end: workload -> global batches -> planner -> executor -> optimizer.

    .venv/bin/dcp profile --device cpu --quick -o p.json      # this machine's profile of tiny-llama
    .venv/bin/torchrun --nproc_per_node 4 examples/train_reference.py --steps 20 --hardware p.json
    .venv/bin/torchrun --nproc_per_node 4 examples/train_reference.py --steps 3 --check-grads
    .venv/bin/torchrun --nproc_per_node 4 examples/train_reference.py --steps 3 --zero-stage 3 --check-grads

CPU ranks use gloo, GPUs nccl; the precision recipe (--precision: autocast-bf16 on GPUs, fp32 on
CPU by default) and ZeRO stage (--zero-stage) are the ones the planner's cost model prices. Every rank draws the same global batches from
dcp.data.GlobalBatchSampler and plans them (dcp-greedy is deterministic); with --strategy ilp,
whose time limit can give ranks different incumbents, rank 0's plan is broadcast. Rank 0 logs
which hardware profile prices the plans (--hardware: a profile from `dcp profile` predicts this
machine; the default `cpu` preset's datasheet rates do not), then each step's loss and predicted
versus measured time. --check-grads compares every step's
gradients with single-process training on the same global batch (fp32, no autocast) and prints
`max_grad_diff=<largest relative difference>` last.
"""

from __future__ import annotations

import argparse
import copy

import torch

from dcp.costmodel import load_model
from dcp.executor import Executor, broadcast_plan, default_forward, executor_optimizer
from dcp.executor.reference import load_reference, reference_grad_diff, reference_step
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
from dcp.models import build_model, lm_loss, mse_loss, sample_tensors
from dcp.models.precision import param_dtype


def parse_args() -> tuple[str, RunOptions]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-llama", help="model preset or JSON (tiny-llama, tiny-stdit)")
    RunOptions.add_arguments(p)
    args = p.parse_args()
    return args.model, RunOptions.from_args(args)


def main() -> None:
    model_name, options = parse_args()
    state = init_distributed(timeout_s=300)
    rank = state.rank

    spec = load_model(model_name)
    recipe = options.recipe(state.device.type == "cuda")  # the one the planner's cost model prices
    model = build_model(spec, seed=options.seed, device=state.device, dtype=param_dtype(recipe))
    reference = copy.deepcopy(model) if options.check_grads and rank == 0 else None  # before the executor swaps
    executor = Executor(model, state, recipe=recipe, zero_stage=options.zero_stage)
    optimizer = executor_optimizer(executor, lr=options.lr)
    dtype = param_dtype(recipe)

    def loss_fn(out: torch.Tensor, batch) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
        if spec.attention == "spatial_temporal":
            return mse_loss(out, batch["target"], batch.valid)
        return lm_loss(out, batch["labels"])

    sampler = planned_batches(spec, state, options)
    ckpt, start = open_checkpoints(options, model, optimizer, sampler)  # --resume: where the run stopped
    worst = 0.0
    for step, planned in zip(range(start, options.steps), sampler, strict=False):
        plan = broadcast_plan(planned.plan, state) if options.strategy == "ilp" else planned.plan
        specs = plan.sample_map()
        wanted = specs if reference is not None else planned.local_samples(rank)  # reference needs all
        tensors = {i: sample_tensors(spec, specs[i], seed=options.seed, dtype=dtype) for i in wanted}
        if options.check_grads:  # every rank: at ZeRO-3 the parameters are gathered (a collective)
            load_reference(executor, model, reference)
        stats = executor.step(plan, tensors, loss_fn)
        if options.check_grads:
            if reference is not None:
                reference_step(reference, plan.samples, tensors, loss_fn, default_forward, state.device)
            worst = max(worst, reference_grad_diff(executor, model, reference))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0 and options.stats_out:
            write_step_stats(options.stats_out, step, stats)
        if rank == 0:
            mine = stats.microbatches
            print(f"{step_summary(step, plan, stats)} "
                  f"(rank 0: {len(mine)} mb, predicted {sum(m.predicted_s for m in mine) * 1e3:.2f} ms, "
                  f"measured {sum(m.measured_s for m in mine) * 1e3:.2f} ms) "
                  f"plan wait {planned.plan_wait_s * 1e3:.1f} ms", flush=True)
        maybe_save(ckpt, options, step + 1, model, optimizer, sampler, planned)
    sampler.close()
    if ckpt is not None:
        ckpt.close()  # an async save in flight commits before the job ends
    if options.check_grads and rank == 0:
        print(f"max_grad_diff={worst:.3e}", flush=True)
    shutdown_distributed()


if __name__ == "__main__":
    run_main(main)
