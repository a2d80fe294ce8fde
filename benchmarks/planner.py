"""Planner benchmark: ILP solve time and plan quality against dcp-greedy, bucket and packed.

    .venv/bin/python benchmarks/planner.py --quick          # 64 GPUs x 512 samples, all workloads
    .venv/bin/python benchmarks/planner.py                  # the full grid (long on 2 cores)
    .venv/bin/python benchmarks/planner.py --gpus 8 32 --batch 128 --steps 3

For every (workload, GPUs, global batch) it plans `--steps` global batches with each strategy
and reports, for the ILP: solve time p50/p95 (wall clock, as the plan records it; cpu95 is the
process CPU time, which other load on the machine does not inflate), mean predicted step time, mean proven lower bound,
mean and max gap; and the ILP's speedup (mean over batches of other_step / ilp_step) over
dcp-greedy, bucket and packed, plus how many batches the ILP lost to dcp-greedy. `<=xbnd` is
dcp-greedy's step time over the proven lower bound: no plan can beat dcp-greedy by more. Prints a table
and writes JSON (default benchmarks/results/planner.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dcp.data.batches import make_batches  # noqa: E402
from dcp.planner import solve  # noqa: E402
from dcp.planner.options import IlpOptions  # noqa: E402
from dcp.planner.run import build_cost_model, default_model, resolve_options  # noqa: E402

WORKLOADS = ("wikipedia", "lognormal:scale=16", "opensora:short", "opensora:balanced", "opensora:long")
GPUS = (8, 32, 64, 128)
BATCHES = (128, 512, 2048)
BASELINES = ("dcp-greedy", "bucket", "packed")


def run_case(workload: str, gpus: int, batch: int, steps: int, ilp: IlpOptions, hardware: str) -> dict:
    """Plan `steps` batches of one case with every strategy; per-step numbers and a summary."""
    model = default_model(workload)
    cm = build_cost_model(model, hardware, gpus)
    batches = make_batches(workload, cm, global_batch=batch, steps=steps)
    rows = []
    for k, b in enumerate(batches):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0, c0 = time.perf_counter(), time.process_time()
            plan = solve(b, cm.cluster, cm, ilp)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        row = {"step": k, "samples": len(b), "tokens": sum(s.tokens for s in b),
               "ilp_step_s": plan.step_time_s, "lower_bound_s": plan.lower_bound_s, "gap": plan.gap,
               "solve_time_s": plan.solve_time_s, "wall_s": wall, "cpu_s": cpu, "status": plan.solver_status,
               "source": next((n.split(": ", 1)[1] for n in plan.notes if n.startswith("best plan from")), ""),
               "warnings": [str(w.message) for w in caught if "ilp" in str(w.message)]}
        for name in BASELINES:
            t0 = time.perf_counter()
            other = solve(b, cm.cluster, cm, resolve_options(name))
            row[f"{name}_step_s"] = other.step_time_s
            row[f"{name}_solve_s"] = time.perf_counter() - t0
        rows.append(row)
    solve_s = [r["solve_time_s"] for r in rows]
    summary = {
        "workload": workload, "model": model, "gpus": gpus, "batch": batch, "steps": len(rows),
        "solve_p50_s": float(np.percentile(solve_s, 50)), "solve_p95_s": float(np.percentile(solve_s, 95)),
        "cpu_p50_s": float(np.percentile([r["cpu_s"] for r in rows], 50)),
        "cpu_p95_s": float(np.percentile([r["cpu_s"] for r in rows], 95)),
        "ilp_step_s": statistics.mean(r["ilp_step_s"] for r in rows),
        "lower_bound_s": statistics.mean(r["lower_bound_s"] for r in rows),
        "gap_mean": statistics.mean(r["gap"] for r in rows), "gap_max": max(r["gap"] for r in rows),
        "lost_to_greedy": sum(r["ilp_step_s"] > r["dcp-greedy_step_s"] * (1 + 1e-9) for r in rows),
        # The most any planner could gain over dcp-greedy: its step time over the proven bound.
        "greedy_over_bound": statistics.mean(r["dcp-greedy_step_s"] / r["lower_bound_s"] for r in rows),
    }
    for name in BASELINES:
        summary[f"speedup_vs_{name}"] = statistics.mean(r[f"{name}_step_s"] / r["ilp_step_s"] for r in rows)
        summary[f"{name}_solve_mean_s"] = statistics.mean(r[f"{name}_solve_s"] for r in rows)
    return {"summary": summary, "steps": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="only 64 GPUs x 512 samples (all workloads)")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    ap.add_argument("--gpus", nargs="+", type=int, default=None)
    ap.add_argument("--batch", nargs="+", type=int, default=None)
    ap.add_argument("--steps", type=int, default=10, help="global batches per case")
    ap.add_argument("--time-limit", type=float, default=1.0, help="ILP time limit per batch (s)")
    ap.add_argument("--solver", default="highs", choices=("highs", "cbc"))
    ap.add_argument("--hardware", default="h200-sxm")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/planner[-quick].json)")
    args = ap.parse_args(argv)
    gpus = args.gpus or ([64] if args.quick else list(GPUS))
    sizes = args.batch or ([512] if args.quick else list(BATCHES))
    ilp = IlpOptions(time_limit_s=args.time_limit, solver=args.solver)
    out = Path(args.out or Path(__file__).parent / "results" / ("planner-quick.json" if args.quick else "planner.json"))
    header = (f"{'workload':<20}{'gpus':>5}{'batch':>6}{'p50 s':>7}{'p95 s':>7}{'cpu95':>7}{'ilp s':>10}{'bound s':>10}"
              f"{'gap%':>6}{'max%':>6}{'xgreedy':>8}{'<=xbnd':>8}{'xbucket':>8}{'xpacked':>8}{'lost':>5}")
    print(header)
    cases = []
    for workload in args.workloads:
        for n in gpus:
            for b in sizes:
                case = run_case(workload, n, b, args.steps, ilp, args.hardware)
                s = case["summary"]
                print(f"{workload:<20}{n:>5}{b:>6}{s['solve_p50_s']:>7.3f}{s['solve_p95_s']:>7.3f}{s['cpu_p95_s']:>7.3f}"
                      f"{s['ilp_step_s']:>10.3f}{s['lower_bound_s']:>10.3f}{100 * s['gap_mean']:>6.2f}"
                      f"{100 * s['gap_max']:>6.2f}{s['speedup_vs_dcp-greedy']:>8.3f}{s['greedy_over_bound']:>8.3f}"
                      f"{s['speedup_vs_bucket']:>8.3f}"
                      f"{s['speedup_vs_packed']:>8.3f}{s['lost_to_greedy']:>5}", flush=True)
                cases.append(case)
    meta = {"argv": sys.argv[1:], "time_limit_s": args.time_limit, "solver": args.solver,
            "hardware": args.hardware, "python": platform.python_version(), "machine": platform.machine(),
            "cpus": __import__("os").cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "cases": cases}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
