"""Executor overhead on CPU (gloo): a plan of SP-1 groups against plain per-sample accumulation,
and what overlapping the gradient reductions with the last backward saves on a plan with uneven
groups.

    .venv/bin/python benchmarks/executor_overhead.py [--ranks 2] [--repeats 10] [--stages 1,2,3]

Both sides run the same samples on the same model with the same attention: the baseline is a
hand-written loop (forward, loss sum, backward per sample, then one flat all-reduce of the
gradients and token count); the executor runs a plan whose groups are all of size 1 with one
sample per micro-batch and no checkpointing, so every difference is the executor's own work
(plan checks and agreement, packing, switches, timing). Steps alternate between the two;
medians of wall time and of rank 0's CPU time are compared (CPU time is the steadier
number on a shared machine).

Overlap: for each ZeRO stage, two executors on copies of a larger model run the same uneven plan
(rank 0 one micro-batch, every other rank three, so groups end at different times), one with
`overlap=True` (each layer's reduction starts as soon as the last micro-batch's backward has
produced it; at stage 3 the next layer's gather is prefetched) and one with `overlap=False`
(everything after the last micro-batch); steps alternate between them. Reported: median step
wall time of each and their ratio, and the median time from the slowest group's last
micro-batch to reduced gradients (`StepStats.grad_sync_s` on the rank that finishes last) and
that rank's micro-batches (their measured time: with overlap the reductions run during them).
On a CPU the gloo collectives run on threads that compete with the backward for the same cores,
so this measures gloo on a shared 2-core box, not NCCL.

Prints tables and writes benchmarks/results/executor_overhead.json. Not a test: nothing asserts
on time.
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


# The overlap measurement: wide enough that a layer's gradient reduction is worth hiding (the
# reductions move 4 bytes per parameter), with short micro-batches, as many a plan has.
OVERLAP_SPEC = dataclasses.replace(SPEC, name="bench-llama-wide", num_layers=8, hidden=512, ffn_hidden=1376)
OVERLAP_LENGTHS = {"first": [[300, 160]], "others": [[200], [150, 33], [120]]}
"""Micro-batches (sample lengths) of rank 0 and of every other rank: uneven groups."""


def overlap_plan(world: int) -> tuple[list[Sample], object]:
    batch, groups = [], []
    for r in range(world):
        mbs = OVERLAP_LENGTHS["first" if r == 0 else "others"]
        ids = []
        for mb in mbs:
            ids.append([])
            for n in mb:
                batch.append(Sample(1000 * r + len(batch), n, attention_pairs("causal", n)))
                ids[-1].append(batch[-1].id)
        groups.append((r, 1, [(mb, 0) for mb in ids]))
    return batch, manual_plan(batch, world, OVERLAP_SPEC.num_layers, groups)


def overlap_worker(rank: int, world: int, store: str, repeats: int, stages: list[int], out: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(minutes=5))
    state = ParallelState.create(timeout_s=300)
    batch, plan = overlap_plan(world)
    group = plan.group_of_rank(rank)
    mine = {i for mb in group.microbatches for i in mb.samples}
    tensors = {s.id: sample_tensors(OVERLAP_SPEC, s) for s in batch if s.id in mine}

    def loss_fn(o, b):  # noqa: ANN001, ANN202
        return lm_loss(o, b["labels"])

    results = {}
    for stage in stages:
        model = build_model(OVERLAP_SPEC, seed=0)
        executors = {"overlap": Executor(copy.deepcopy(model), state, zero_stage=stage, overlap=True),
                     "no_overlap": Executor(model, state, zero_stage=stage, overlap=False)}
        times: dict[str, list[float]] = {f"{name}{part}": [] for name in ("overlap", "no_overlap")
                                         for part in ("", "_sync", "_compute")}
        for rep in range(repeats + 2):  # two warm-up rounds
            for name in ("overlap", "no_overlap") if rep % 2 else ("no_overlap", "overlap"):
                dist.barrier()
                t0 = time.perf_counter()
                stats = executors[name].step(plan, tensors, loss_fn)
                wall = time.perf_counter() - t0
                dist.barrier()
                # The rank whose group finishes last waits for nobody: its sync is what is exposed.
                box = [None] * world
                dist.all_gather_object(box, (sum(m.measured_s for m in stats.microbatches), stats.grad_sync_s, wall))
                if rep >= 2:
                    slowest = max(box, key=lambda b: b[0])
                    times[name].append(max(b[2] for b in box))
                    times[name + "_sync"].append(slowest[1])
                    times[name + "_compute"].append(slowest[0])
        results[stage] = times
    if rank == 0:
        out.update({f"stage{s}": t for s, t in results.items()})
    dist.destroy_process_group()


def report_overlap(times: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """Per stage: median step and exposed sync with and without overlap, and their ratios."""
    print(f"\n{'overlap':10s} {'step on s':>10s} {'step off s':>10s} {'on/off':>7s} {'paired':>7s} "
          f"{'sync on s':>10s} {'sync off s':>10s} {'mbs on s':>9s} {'mbs off s':>9s}")
    summary = {}
    for stage, t in times.items():
        med = {k: statistics.median(v) for k, v in t.items()}
        paired = statistics.median(a / b for a, b in zip(t["overlap"], t["no_overlap"], strict=True))
        summary[stage] = {"step_overlap_s": med["overlap"], "step_no_overlap_s": med["no_overlap"],
                          "ratio": med["overlap"] / med["no_overlap"], "paired_ratio": paired,
                          "sync_overlap_s": med["overlap_sync"], "sync_no_overlap_s": med["no_overlap_sync"],
                          "microbatches_overlap_s": med["overlap_compute"],
                          "microbatches_no_overlap_s": med["no_overlap_compute"]}
        print(f"{stage:10s} {med['overlap']:10.4f} {med['no_overlap']:10.4f} {summary[stage]['ratio']:7.3f} "
              f"{paired:7.3f} {med['overlap_sync']:10.4f} {med['no_overlap_sync']:10.4f} "
              f"{med['overlap_compute']:9.4f} {med['no_overlap_compute']:9.4f}")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--stages", default="1,2,3", help="ZeRO stages of the overlap measurement")
    args = parser.parse_args()
    stages = [int(s) for s in args.stages.split(",") if s]
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(worker, args=(args.ranks, os.path.join(tmp, "store"), args.repeats, out), nprocs=args.ranks)
        times = dict(out)
        overlap_out = manager.dict()
        mp.spawn(overlap_worker, args=(args.ranks, os.path.join(tmp, "store2"), args.repeats, stages, overlap_out),
                 nprocs=args.ranks)
        overlap_times = dict(overlap_out)
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
    overlap = report_overlap(overlap_times)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "executor_overhead", "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs", "torch": torch.__version__,
        "ranks": args.ranks, "repeats": args.repeats, "model": dataclasses.asdict(SPEC),
        "lengths_per_rank": LENGTHS, "median_s": med, "times_s": times, "ratio": ratio,
        "paired_ratio": paired, "cpu_ratio": cpu_ratio,
        "overlap": {"model": dataclasses.asdict(OVERLAP_SPEC), "microbatch_lengths": OVERLAP_LENGTHS,
                    "summary": overlap, "times_s": overlap_times},
    }, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
