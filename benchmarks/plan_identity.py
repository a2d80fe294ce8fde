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


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "dump":
        dump(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit("Error: usage: plan_identity.py dump OUT.json | compare BEFORE.json AFTER.json")
