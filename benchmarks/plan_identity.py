"""The deterministic strategies' plans, dumped to compare two versions of the planner.

    .venv/bin/python benchmarks/plan_identity.py dump after.json
    git worktree add /tmp/before 3060613 && PLAN_ROOT=/tmp/before .venv/bin/python benchmarks/plan_identity.py dump before.json
    .venv/bin/python benchmarks/plan_identity.py compare before.json after.json

`dump` plans every batch below with dcp-greedy, dcp-greedy-inter, bucket and packed and writes
each plan's JSON but its wall-clock solve time; `compare` lists the plans that differ and exits 1
if any does. The batches: `benchmarks/planner.py --quick`'s (its three workloads, 64 GPUs, 512
samples, 5 seeds) and the test suite's workloads (wikipedia on Llama 7B, the ZeRO-3 batch, the
heavy cost model, a long-tail batch). With `PLAN_ROOT` set, the planner (and the tests' helpers)
are imported from that checkout instead of this one: a restructuring of the planner must leave
every plan here unchanged.

    .venv/bin/python benchmarks/plan_identity.py dump-backfill after.json   (and before, as above)
    .venv/bin/python benchmarks/plan_identity.py compare-backfill before.json after.json

`dump-backfill` runs `backfill.backfill_plan` (no time limit: the plan depends on the batch
alone) on `WORKLOADS` at 16-256 GPUs and 4-64 samples per GPU (5 seeds, 2 above 8,192 samples),
and at 16-64 GPUs with 300 and 600 per GPU (2 seeds: the fillers' water-filled tail), and writes
each plan's step time (null where the gates give none); `compare-backfill` counts the plans
whose step is the same, shorter and longer, and exits 1 if any is longer or gated differently:
a change to the backfill's packing may change its plans, but none may get slower.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(os.environ.get("PLAN_ROOT") or Path(__file__).resolve().parents[1])
sys.path.insert(0, str(ROOT))

STRATEGIES = ("dcp-greedy", "dcp-greedy-inter", "bucket", "packed")
QUICK = ("wikipedia", "lognormal:scale=16", "opensora")
WORKLOADS = ("wikipedia", "lognormal:scale=16", "opensora", "lognormal:scale=4")
GRID = [(gpus, per_gpu, seeds) for gpus in (16, 32, 64, 128, 256) for per_gpu in (4, 16, 64)
        for seeds in [5 if gpus * per_gpu <= 8192 else 2]] + \
       [(gpus, per_gpu, 2) for gpus in (16, 32, 64) for per_gpu in (300, 600)]


def cases() -> list[tuple[str, object, list, int]]:
    """(name, cost model, batch, the dataset's longest sample for the static baselines: the
    batch's own for the test suite's batches)."""
    from dcp.data.batches import make_batches
    from dcp.data.workloads import load_workload
    from dcp.planner.run import build_cost_model, default_model
    from tests.conftest import ZERO3_LENGTHS, cost_model, heavy_cost_model, make_batch

    out = []
    for workload in QUICK:
        data = load_workload(workload)
        cm = build_cost_model(default_model(workload), "h200-sxm", 64)
        for seed in range(5):
            batch = make_batches(data, cm, global_batch=512, steps=1, seed=seed)[0]
            out.append((f"quick {workload} seed {seed}", cm, batch, int(data.tokens.max())))
    llama = cost_model()
    for k, batch in enumerate(make_batches("wikipedia", llama, global_batch=512, steps=3)):
        out.append((f"wiki_batches {k}", llama, batch))
    heavy = heavy_cost_model()
    out += [("zero3", cost_model(gpus=32, zero_stage=3), make_batch(ZERO3_LENGTHS)),
            ("heavy", heavy, make_batches("wikipedia", heavy, global_batch=512, steps=1)[0]),
            ("long tail", llama, make_batch([200 + (97 * i) % 5000 for i in range(128)] + [70_000, 40_000, 40_000]))]
    return [(c[0], c[1], c[2], c[3] if len(c) > 3 else max(s.tokens for s in c[2])) for c in out]


def dump(path: str) -> None:
    from dcp.planner import solve
    from dcp.planner.run import resolve_options

    plans = {}
    for name, cm, batch, longest in cases():
        for strategy in STRATEGIES:
            plan = solve(batch, cm.cluster, cm, resolve_options(strategy, dataset_longest_tokens=longest))
            d = plan.to_dict()
            d.pop("solve_time_s")
            plans[f"{name} / {strategy}"] = d
    Path(path).write_text(json.dumps(plans, sort_keys=True))
    print(f"{len(plans)} plans from {ROOT} written to {path}")


def compare(before: str, after: str) -> int:
    a, b = json.loads(Path(before).read_text()), json.loads(Path(after).read_text())
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    for k in differ:
        print(f"differs: {k}")
    print(f"{len(a.keys() & b.keys()) - len(differ)} of {len(a.keys() | b.keys())} plans identical")
    return 1 if differ else 0


def dump_backfill(path: str) -> None:
    from dcp.data.batches import make_batches
    from dcp.data.workloads import load_workload
    from dcp.planner.backfill import backfill_plan
    from dcp.planner.bounds import multi_phase_busy
    from dcp.planner.feasibility import allowed_sp_sizes
    from dcp.planner.run import build_cost_model, default_model

    out = {}
    for workload in WORKLOADS:
        data = load_workload(workload)
        for gpus, per_gpu, seeds in GRID:
            cm = build_cost_model(default_model(workload), "h200-sxm", gpus)
            sizes = allowed_sp_sizes(cm)
            for seed in range(seeds):
                batch = make_batches(data, cm, global_batch=gpus * per_gpu, steps=1, seed=seed)[0]
                plan = backfill_plan(batch, cm, sizes, multi_phase_busy(batch, cm, sizes))
                out[f"{workload} {gpus} {per_gpu} {seed}"] = None if plan is None else plan.step_time_s
    Path(path).write_text(json.dumps(out, indent=0))
    print(f"{sum(v is not None for v in out.values())} plans of {len(out)} cases from {ROOT} written to {path}")


def compare_steps(before_path: str, after_path: str) -> int:
    before, after = json.loads(Path(before_path).read_text()), json.loads(Path(after_path).read_text())
    counts = {"same": 0, "shorter": 0, "longer": 0, "gated differently": 0}
    for case in sorted(set(before) | set(after)):
        a, b = before.get(case), after.get(case)
        if (a is None) != (b is None):
            counts["gated differently"] += 1
            print(f"{case}: {a} -> {b}")
        elif a is not None:
            kind = "same" if a == b else "shorter" if b < a else "longer"
            counts[kind] += 1
            if kind != "same":
                print(f"{case}: {a:.6f} -> {b:.6f} s ({(b / a - 1) * 100:+.3f}%)")
    print(", ".join(f"{v} {k}" for k, v in counts.items()))
    return 1 if counts["longer"] or counts["gated differently"] else 0


MODES = {"dump": (dump, 1), "compare": (compare, 2), "dump-backfill": (dump_backfill, 1), "compare-backfill": (compare_steps, 2)}

if __name__ == "__main__":
    mode = MODES.get(sys.argv[1] if len(sys.argv) > 1 else "")
    if mode is None or len(sys.argv) != 2 + mode[1]:
        sys.exit("Error: usage: plan_identity.py dump|dump-backfill OUT.json | compare|compare-backfill BEFORE.json AFTER.json")
    sys.exit(mode[0](*sys.argv[2:]) or 0)
