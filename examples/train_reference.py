"""Train a reference transformer end to end: workload -> global batches -> planner -> executor -> optimizer.

    .venv/bin/torchrun --nproc_per_node 4 examples/train_reference.py --steps 20
    .venv/bin/torchrun --nproc_per_node 4 examples/train_reference.py --steps 3 --check-grads

CPU ranks use gloo, GPUs nccl (bf16 autocast). Every rank draws the same global batches from
dcp.data.GlobalBatchSampler and plans them (dcp-greedy is deterministic); with --strategy ilp,
whose time limit can give ranks different incumbents, rank 0's plan is broadcast. Rank 0 logs
each step's loss and predicted versus measured time. --check-grads compares every step's
gradients with single-process training on the same global batch (fp32, no autocast) and prints
`max_grad_diff=<largest relative difference>` last.
"""

from __future__ import annotations

import argparse
import copy
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from dcp.costmodel import Cluster, CostModel, TrainingSetup, load_hardware, load_model
from dcp.data import GlobalBatchSampler, load_workload
from dcp.executor import Executor, ParallelState, broadcast_plan, default_forward, sharded_optimizer
from dcp.executor.reference import reference_step, relative_grad_diff
from dcp.models import build_model, lm_loss, mse_loss, sample_tensors


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-llama", help="model preset or JSON (tiny-llama, tiny-stdit)")
    p.add_argument("--hardware", default=None, help="hardware profile for the cost model (default: cpu, "
                   "or h200-sxm on GPUs)")
    p.add_argument("--workload", default="lognormal:mean=64,sigma=1,min=8,max=512",
                   help="dcp.data.load_workload spec (lengths scaled down for a tiny model)")
    p.add_argument("--strategy", default="dcp-greedy", help="planner strategy: dcp-greedy, ilp, bucket, packed")
    p.add_argument("--global-batch", type=int, default=32, help="samples per global batch")
    p.add_argument("--memory-mb", type=float, default=None,
                   help="usable memory per rank for the planner (small values force SP and checkpointing)")
    p.add_argument("--steps", type=int, default=20, help="training steps")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check-grads", action="store_true", help="compare gradients with one process every step")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    # A timeout on every group: a dead rank ends the job with an error instead of a hang.
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(minutes=5))
    world, rank = dist.get_world_size(), dist.get_rank()
    state = ParallelState.create(timeout_s=300)

    spec = load_model(args.model)
    hw = load_hardware(args.hardware or ("h200-sxm" if cuda else "cpu"))
    per_node = torch.cuda.device_count() if cuda else world
    cluster = Cluster(num_gpus=world, gpus_per_node=min(per_node, world),
                      memory_bytes=args.memory_mb * 1e6 if args.memory_mb else hw.memory_bytes)
    cm = CostModel(spec, hw, cluster, TrainingSetup(precision="bf16" if cuda else "fp32", zero_stage=1))

    model = build_model(spec, seed=args.seed, device=state.device)
    reference = copy.deepcopy(model) if args.check_grads and rank == 0 else None  # before the executor swaps
    executor = Executor(model, state, autocast_dtype=None if args.check_grads else "auto")
    optimizer = sharded_optimizer(model.parameters(), lr=args.lr)

    def loss_fn(out: torch.Tensor, batch) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
        if spec.attention == "spatial_temporal":
            return mse_loss(out, batch["target"], batch.valid)
        return lm_loss(out, batch["labels"])

    workload = load_workload(args.workload, seed=args.seed)
    # Planned inline (workers=0): on a CPU job the ranks already use every core.
    sampler = GlobalBatchSampler.from_workload(workload, cm, batch_size=args.global_batch,
                                               strategy=args.strategy, seed=args.seed, workers=0)
    worst = 0.0
    for step, planned in zip(range(args.steps), sampler, strict=False):
        plan = broadcast_plan(planned.plan, state) if args.strategy == "ilp" else planned.plan
        specs = plan.sample_map()
        wanted = specs if reference is not None else planned.local_samples(rank)  # reference needs all
        tensors = {i: sample_tensors(spec, specs[i], seed=args.seed) for i in wanted}
        if reference is not None:
            reference.load_state_dict(model.state_dict())
        stats = executor.step(plan, tensors, loss_fn)
        if reference is not None:
            reference_step(reference, plan.samples, tensors, loss_fn, default_forward, state.device)
            worst = max(worst, relative_grad_diff(list(model.parameters()), list(reference.parameters())))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0:
            groups = " ".join(f"sp{g.sp}:{len(g.microbatches)}mb" for g in plan.groups)
            mine = stats.microbatches
            print(f"step {step:3d} loss {stats.loss:.4f} tokens {stats.loss_tokens:5d} groups [{groups}] "
                  f"predicted {stats.predicted_step_s * 1e3:8.2f} ms measured {stats.measured_step_s * 1e3:8.2f} ms "
                  f"(rank 0: {len(mine)} mb, predicted {sum(m.predicted_s for m in mine) * 1e3:.2f} ms, "
                  f"measured {sum(m.measured_s for m in mine) * 1e3:.2f} ms) "
                  f"plan wait {planned.plan_wait_s * 1e3:.1f} ms", flush=True)
    sampler.close()
    if args.check_grads and rank == 0:
        print(f"max_grad_diff={worst:.3e}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
