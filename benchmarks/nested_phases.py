"""What-if: a nested two-phase plan for batches of fewer samples than GPUs, against the ILP's.

    .venv/bin/python benchmarks/nested_phases.py                       # lognormal, 512 samples on 1,024 GPUs
    .venv/bin/python benchmarks/nested_phases.py --workload wikipedia --gpus 256 --batch 512

The planner's nested plan (`dcp.planner.nested`) tries the targets `knobs.NESTED_LEVELS` with q1 the
largest size a sample runs at; this what-if tries every q1 > 1 at the targets `LEVELS` (1.0 to
1.05 times the batch's busy bound), each plan priced on the executor's schedule (the backfill's
assembly) and reported against `bounds.multi_phase_bound`, beside the planner's own plan
(`solve`, 1 s), which includes the nested plan's best. Prints one line per batch and writes JSON
(default benchmarks/results/nested-phases.json): whether more targets or other phase-1 sizes
would gain what the planner leaves.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dcp.data.batches import make_batches  # noqa: E402
from dcp.data.workloads import load_workload  # noqa: E402
from dcp.planner import solve  # noqa: E402
from dcp.planner.backfill import assemble_candidate  # noqa: E402
from dcp.planner.bounds import multi_phase_bound, multi_phase_busy  # noqa: E402
from dcp.planner.feasibility import allowed_sp_sizes  # noqa: E402
from dcp.planner.ilp.costs import batch_costs  # noqa: E402
from dcp.planner.nested import nested_candidate  # noqa: E402
from dcp.planner.options import IlpOptions  # noqa: E402
from dcp.planner.pricing import BatchArrays  # noqa: E402
from dcp.planner.run import build_cost_model, default_model  # noqa: E402

LEVELS = (1.0, 1.01, 1.02, 1.03, 1.05)
"""Targets T, as multiples of the batch's busy bound."""


def run(workload: str, gpus: int, batch: int, seeds: list[int], time_limit_s: float) -> dict:
    cm = build_cost_model(default_model(workload), "h200-sxm", gpus)
    sizes = allowed_sp_sizes(cm, None)
    data = load_workload(workload)
    rows = []
    for seed in seeds:
        b = make_batches(data, cm, global_batch=batch, steps=1, seed=seed)[0]
        arrays = BatchArrays.of(b)
        pair = (arrays.tokens, arrays.pairs)
        bound, busy = multi_phase_bound(b, cm, sizes, pair), multi_phase_busy(b, cm, sizes, pair)
        planned = solve(b, cm.cluster, cm, IlpOptions(time_limit_s=time_limit_s))
        t0 = time.perf_counter()
        pricer, table = batch_costs(arrays, cm, sizes)
        best = None
        for q1 in [q for q in sizes if q > 1]:
            for level in LEVELS:
                cand = nested_candidate(table, cm, arrays, pricer, busy * level, q1)
                if cand is None:
                    continue
                plan = assemble_candidate(b, cm, arrays, pricer, cand)
                if best is None or plan.step_time_s < best[0]:
                    best = (plan.step_time_s, q1, level)
        row = {"seed": seed, "bound_s": bound, "planner_step_s": planned.step_time_s,
               "planner_gap": 1 - bound / planned.step_time_s, "search_s": time.perf_counter() - t0}
        if best is not None:
            row.update({"nested_step_s": best[0], "nested_gap": 1 - bound / best[0], "q1": best[1], "level": best[2]})
        rows.append(row)
        print(f"seed {seed}: bound {bound:.4f} s, planner {planned.step_time_s:.4f} s ({100 * row['planner_gap']:.2f}%)"
              + (f", nested {best[0]:.4f} s ({100 * row['nested_gap']:.2f}%, q1 {best[1]}, T {best[2]} x busy bound)"
                 if best else ", nested: none fits") + f", {row['search_s']:.1f} s", flush=True)
    nested = [r["nested_gap"] for r in rows if "nested_gap" in r]
    summary = {"workload": workload, "gpus": gpus, "batch": batch, "time_limit_s": time_limit_s,
               "planner_gap_mean": statistics.mean(r["planner_gap"] for r in rows),
               "planner_gap_max": max(r["planner_gap"] for r in rows),
               "nested_gap_mean": statistics.mean(nested) if nested else None,
               "nested_gap_max": max(nested) if nested else None}
    return {"summary": summary, "batches": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="lognormal:scale=16")
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--time-limit", type=float, default=1.0, help="the planner's time limit (s)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "nested-phases.json"))
    args = ap.parse_args(argv)
    out = run(args.workload, args.gpus, args.batch, list(range(args.seeds)), args.time_limit)
    s = out["summary"]
    print(f"planner mean/worst gap {100 * s['planner_gap_mean']:.2f}/{100 * s['planner_gap_max']:.2f}%"
          + (f", nested {100 * s['nested_gap_mean']:.2f}/{100 * s['nested_gap_max']:.2f}%" if s["nested_gap_mean"] is not None else ""))
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
