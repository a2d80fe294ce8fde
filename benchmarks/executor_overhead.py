"""Executor overhead on CPU (gloo): a plan of SP-1 groups against plain per-sample accumulation.

    .venv/bin/python benchmarks/executor_overhead.py [--ranks 2] [--repeats 10]

Both sides run the same samples on the same model with the same attention: the baseline is a
hand-written loop (forward, loss sum, backward per sample, then one flat all-reduce of the
gradients and token count); the executor runs a plan whose groups are all of size 1 with one
sample per micro-batch and no checkpointing, so every difference is the executor's own work
(plan checks and agreement, packing, switches, timing). Steps alternate between the two;
medians of wall time and of rank 0's CPU time are compared (CPU time is the steadier
number on a shared machine). Prints a table and writes benchmarks/results/executor_overhead.json.
Not a test: nothing asserts on time.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import platform
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dcp.costmodel import attention_pairs, load_model
from dcp.executor import Executor, ParallelState
from dcp.executor.reference import manual_plan
from dcp.models import PackedSeqs, build_model, lm_loss, sample_tensors
from dcp.planner import Sample

RESULTS = Path(__file__).parent / "results" / "executor_overhead.json"
# Big enough that a step is compute, as in training, small enough for two CPU cores.
SPEC = dataclasses.replace(load_model("tiny-llama"), name="bench-llama", num_layers=4, hidden=256, heads=8,
                           kv_heads=4, ffn_hidden=688, vocab=1024, memory={})  # tiny-llama's footprint is not this shape's
LENGTHS = [384, 96, 200, 64, 512, 150, 33, 260]  # per rank, varied like a real batch


def baseline_step(model: torch.nn.Module, ids: list[int], tensors: dict[int, dict[str, torch.Tensor]]) -> float:
    """Plain gradient accumulation, one sample at a time, then one data-parallel all-reduce."""
    model.zero_grad(set_to_none=True)
    count = 0.0
    for i in ids:
        t = tensors[i]
        loss, tokens = lm_loss(model(t["inputs"], PackedSeqs.pack([t["inputs"].shape[0]])), t["labels"])
        loss.backward()
        count += float(tokens)
    params = list(model.parameters())
    flat = torch.cat([p.grad.reshape(-1) for p in params] + [torch.tensor([count])])
    dist.all_reduce(flat)
    flat[:-1] /= flat[-1]
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
    return flat[-1].item()


def worker(rank: int, world: int, store: str, repeats: int, out: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(minutes=5))
    state = ParallelState.create(timeout_s=300)
    model = build_model(SPEC, seed=0)
    plain = copy.deepcopy(model)  # without the executor's attention swap and checkpoint switches
    executor = Executor(model, state)
    batch = [Sample(r * 100 + i, n, attention_pairs("causal", n)) for r in range(world) for i, n in enumerate(LENGTHS)]
    mine = [s.id for s in batch if s.id // 100 == rank]
    tensors = {s.id: sample_tensors(SPEC, s) for s in batch if s.id in mine}
    plan = manual_plan(batch, world, SPEC.num_layers,
                       [(r, 1, [([r * 100 + i], 0) for i in range(len(LENGTHS))]) for r in range(world)])

    def loss_fn(o, b):  # noqa: ANN001, ANN202
        return lm_loss(o, b["labels"])

    times: dict[str, list[float]] = {"executor": [], "baseline": [], "executor_cpu": [], "baseline_cpu": []}
    for rep in range(repeats + 2):  # two warm-up rounds
        for name in ("executor", "baseline") if rep % 2 else ("baseline", "executor"):
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            if name == "executor":
                executor.step(plan, tensors, loss_fn)
            else:
                baseline_step(plain, mine, tensors)
            c1 = time.process_time()
            dist.barrier()
            if rep >= 2:
                times[name].append(time.perf_counter() - t0)
                times[name + "_cpu"].append(c1 - c0)
    if rank == 0:
        out.update(times)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(worker, args=(args.ranks, os.path.join(tmp, "store"), args.repeats, out), nprocs=args.ranks)
        times = dict(out)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["executor"] / med["baseline"]
    # Rounds alternate executor and baseline back to back: per-round ratios cancel slow drifts
    # of a shared machine's load.
    paired = statistics.median(e / b for e, b in zip(times["executor"], times["baseline"], strict=True))
    # Rank 0's CPU time (one thread per rank) hardly depends on what else the machine runs.
    cpu_ratio = med["executor_cpu"] / med["baseline_cpu"]
    print(f"{'':10s} {'median s':>10s} {'min s':>10s} {'max s':>10s}")
    for k, v in times.items():
        print(f"{k:10s} {med[k]:10.4f} {min(v):10.4f} {max(v):10.4f}")
    print(f"executor / baseline = {ratio:.4f} wall (medians), {paired:.4f} wall (median of paired rounds), "
          f"{cpu_ratio:.4f} rank-0 CPU time (medians)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "executor_overhead", "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs", "torch": torch.__version__,
        "ranks": args.ranks, "repeats": args.repeats, "model": dataclasses.asdict(SPEC),
        "lengths_per_rank": LENGTHS, "median_s": med, "times_s": times, "ratio": ratio,
        "paired_ratio": paired, "cpu_ratio": cpu_ratio,
    }, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
