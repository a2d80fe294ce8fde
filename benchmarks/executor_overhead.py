"""Executor overhead on CPU (gloo): the executor against a plain FSDP2 loop over the same
micro-batches, at each ZeRO stage.

    .venv/bin/python benchmarks/executor_overhead.py [--ranks 2] [--repeats 10] [--stages 0,2,3]

Both sides run the same model, sharded the same way (`fully_shard` on each layer and the root,
the stage's settings: dcp.executor.fsdp), on the same micro-batches: every rank runs
`MICROBATCHES` micro-batches of two samples, SP 1, no checkpointing. The plain loop is what a
user would write by hand: per micro-batch, gradient sync and reshard-after-backward on only for
the last (stages 0-2; every one at stage 3), forward of the packed samples, the loss summed,
backward; then one all-reduce of the token count and a division of the gradients. The executor
runs a plan of the same micro-batches, so every difference is its own work (plan checks and
agreement, packing, checkpoint switches, timing). Steps alternate between the two; medians of
wall time and of rank 0's CPU time are compared (CPU time is the steadier number on a shared
machine), and the median of per-round ratios (rounds run back to back, so slow drifts of the
machine's load cancel). "own" is 1 + the executor's own time (its step less its micro-batches and
the final normalization, from its StepStats) over the plain step: the steadiest of the four, since
it compares nothing across runs (cProfile of rank 0 at stage 2 agrees: the plan agreement's
all-gather about 17 ms of a 3.5 s step, checks and packing under 1 ms).

Prints a table and writes benchmarks/results/executor_overhead.json. Not a test: nothing asserts
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
from dcp.costmodel.precision import get_recipe
from dcp.executor import Executor, ParallelState
from dcp.executor.fsdp import set_sync, shard_model
from dcp.executor.reference import manual_plan
from dcp.models import PackedSeqs, build_model, lm_loss, sample_tensors
from dcp.planner import Sample

RESULTS = Path(__file__).parent / "results" / "executor_overhead.json"
# Big enough that a step is compute, as in training, small enough for two CPU cores.
SPEC = dataclasses.replace(load_model("tiny-llama"), name="bench-llama", num_layers=4, hidden=256, heads=8,
                           kv_heads=4, ffn_hidden=688, vocab=1024, memory={})  # tiny-llama's footprint is not this shape's
MICROBATCHES = [[384, 96], [200, 64], [512, 150], [33, 260]]  # per rank: sample lengths of each micro-batch


def plain_step(model: torch.nn.Module, microbatches: list[list[int]], tensors: dict[int, dict[str, torch.Tensor]],
               stage: int) -> float:
    """The hand-written FSDP2 loop: accumulate over the micro-batches, sync on the last (stage 3:
    on each), then divide the gradients by the global token count."""
    model.zero_grad(set_to_none=True)
    count = torch.zeros(1, dtype=torch.float64)
    for j, ids in enumerate(microbatches):
        set_sync(model, stage == 3 or j == len(microbatches) - 1)
        inputs = torch.cat([tensors[i]["inputs"] for i in ids])
        labels = torch.cat([tensors[i]["labels"] for i in ids])
        loss, tokens = lm_loss(model(inputs, PackedSeqs.pack([tensors[i]["inputs"].shape[0] for i in ids])), labels)
        loss.backward()
        count += float(tokens)
    dist.all_reduce(count)
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(count.item())
    return count.item()


def worker(rank: int, world: int, store: str, repeats: int, stages: list[int], out: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(minutes=5))
    state = ParallelState.create(timeout_s=300)
    batch, groups, mine = [], [], []
    for r in range(world):
        ids = []
        for mb in MICROBATCHES:
            ids.append([])
            for n in mb:
                batch.append(Sample(len(batch), n, attention_pairs("causal", n)))
                ids[-1].append(batch[-1].id)
        groups.append((r, 1, [(mb, 0) for mb in ids]))
        if r == rank:
            mine = ids
    plan = manual_plan(batch, world, SPEC.num_layers, groups)
    tensors = {s.id: sample_tensors(SPEC, s) for s in batch if any(s.id in mb for mb in mine)}

    def loss_fn(o, b):  # noqa: ANN001, ANN202
        return lm_loss(o, b["labels"])

    results = {}
    for stage in stages:
        model = build_model(SPEC, seed=0)
        plain = copy.deepcopy(model)  # without the executor's attention swap and checkpoint switches
        shard_model(plain, list(plain.layers), state, get_recipe("fp32"), stage)
        executor = Executor(model, state, recipe="fp32", zero_stage=stage)
        times: dict[str, list[float]] = {"executor": [], "plain": [], "executor_cpu": [], "plain_cpu": [],
                                         "executor_own": []}
        for rep in range(repeats + 2):  # two warm-up rounds
            for name in ("executor", "plain") if rep % 2 else ("plain", "executor"):
                dist.barrier()
                t0, c0 = time.perf_counter(), time.process_time()
                if name == "executor":
                    stats = executor.step(plan, tensors, loss_fn)
                else:
                    plain_step(plain, mine, tensors, stage)
                c1 = time.process_time()
                dist.barrier()
                if rep >= 2:
                    times[name].append(time.perf_counter() - t0)
                    times[name + "_cpu"].append(c1 - c0)
                    if name == "executor":  # outside its micro-batches and the final normalization
                        times["executor_own"].append(stats.measured_step_s - stats.grad_sync_s
                                                     - sum(m.measured_s for m in stats.microbatches))
        results[f"stage{stage}"] = times
    if rank == 0:
        out.update(results)
    dist.destroy_process_group()


def summarize(times: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """Per stage: medians, their ratio, the median per-round ratio, rank 0's CPU-time ratio and
    1 + the executor's own time (plan checks and agreement, sync switches, empty passes: its step
    less its micro-batches and the final normalization) over the plain step's median; the last
    needs no second run to compare with, so the machine's load moves it least."""
    print(f"{'stage':8s} {'executor s':>10s} {'plain s':>10s} {'ratio':>7s} {'paired':>7s} {'cpu':>7s} {'own':>7s}")
    summary = {}
    for stage, t in times.items():
        med = {k: statistics.median(v) for k, v in t.items()}
        paired = statistics.median(e / p for e, p in zip(t["executor"], t["plain"], strict=True))
        summary[stage] = {"executor_s": med["executor"], "plain_s": med["plain"],
                          "ratio": med["executor"] / med["plain"], "paired_ratio": paired,
                          "cpu_ratio": med["executor_cpu"] / med["plain_cpu"],
                          "own_s": med["executor_own"], "own_ratio": 1 + med["executor_own"] / med["plain"]}
        print(f"{stage:8s} {med['executor']:10.4f} {med['plain']:10.4f} {summary[stage]['ratio']:7.3f} "
              f"{paired:7.3f} {summary[stage]['cpu_ratio']:7.3f} {summary[stage]['own_ratio']:7.3f}")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--stages", default="0,2,3", help="ZeRO stages (1 is 2 under FSDP2)")
    args = parser.parse_args()
    stages = [int(s) for s in args.stages.split(",") if s]
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(worker, args=(args.ranks, os.path.join(tmp, "store"), args.repeats, stages, out), nprocs=args.ranks)
        times = dict(out)
    summary = summarize(times)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "executor_overhead", "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs", "torch": torch.__version__,
        "ranks": args.ranks, "repeats": args.repeats, "model": dataclasses.asdict(SPEC),
        "microbatch_lengths_per_rank": MICROBATCHES, "summary": summary, "times_s": times,
    }, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
