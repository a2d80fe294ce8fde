"""Planner benchmark: the ILP's solve time and plan quality at scale, against every baseline.

    .venv/bin/python benchmarks/planner.py                    # the grid: about 6 minutes on 2 cores
    .venv/bin/python benchmarks/planner.py --quick --time-limit 0.2   # 64 GPUs x 512 samples
    .venv/bin/python benchmarks/planner.py --gpus 32 --batch 8192 --workloads wikipedia --steps 2
    .venv/bin/python benchmarks/planner.py --cells wikipedia,256,512 opensora,1024,2048 --time-limit 5
    .venv/bin/python benchmarks/planner.py --model llama-70b --zero-stage 3 --cells wikipedia,256,8192

The grid is {32, 256, 1024} GPUs x {512, 2048, 8192, 32768} samples per global batch on
wikipedia, lognormal (scale 16: up to 128K tokens) and opensora (balanced), `--steps` batches per
cell (default 5). For every cell it plans each batch with the ILP and with dcp-greedy,
dcp-greedy-inter, bucket and packed (the static baselines: one SP size for the workload's longest
sample), and reports for the ILP: solve time p50/p95 (wall clock of
the whole `solve` call; cpu95 is its process CPU time, which other load on the machine does not
inflate), mean and worst gap to the plan's proven lower bound (valid for every plan, multi-phase
included), mean and worst gap of the single-layout ILP (`max_phases=1`, below) to its own bound
(valid for single-layout plans only: a large headline gap with a small one here is the bound's,
not the plan's), the worst ratio of its step time
to each baseline's (<= 1 means never worse), how many of its solves the time limit cut short;
and dcp-greedy's speedup over bucket (the worst over the cell's batches); per workload, how often
and by how much multi-phase plans beat the single-layout ILP (benchmarks/phase_wins.py: each batch
is planned once more with `max_phases=1`, JSON `phases`). The machine's load
average is recorded per cell: wall times on a shared machine are inflated by the others' work;
and its speed once, as the budget's probe (`budget.machine_probe_s`, fastest of 50; JSON
`probe_ms`, against the `knobs.PROBE_S` the time budget was measured with): wall times from two
machines compare only with it.
Prints a table and writes JSON (default benchmarks/results/planner.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from phase_wins import phase_columns, phase_lines, phase_summary  # noqa: E402
from rank_patterns import rank_pattern_bound  # noqa: E402

import dcp.planner.knobs as knobs
from dcp.data.batches import make_batches  # noqa: E402
from dcp.data.lengths import WorkloadError  # noqa: E402
from dcp.data.workloads import Workload, load_workload  # noqa: E402
from dcp.planner import Sample, solve  # noqa: E402
from dcp.planner.ilp.budget import machine_probe_s
from dcp.planner.options import IlpOptions  # noqa: E402
from dcp.planner.run import build_cost_model, default_model, resolve_options  # noqa: E402
from dcp.planner.status import program_outcome  # noqa: E402

WORKLOADS = ("wikipedia", "lognormal:scale=16", "opensora")
GPUS = (32, 256, 1024)
BATCHES = (512, 2048, 8192, 32768)
BASELINES = ("dcp-greedy", "dcp-greedy-inter", "bucket", "packed")
LABELS = {"dcp-greedy": "xgreedy", "dcp-greedy-inter": "xinter", "bucket": "xbucket", "packed": "xpacked"}
"""Table headers: the worst ratio of the ILP's step time to the baseline's over a cell's batches."""
PATTERN_PER_GPU = 2
"""`--pattern-bound` prices cells of at most this many samples a GPU: with more, the short ones
fill every rank's time and the rank-pattern bound stays the pooled one (Open-Sora on 256 GPUs,
batch 0: +0.00% at 4 and at 8 videos a GPU, in 5 s each)."""


def _timed_solve(batch: list[Sample], cm, options) -> tuple[object, float, float]:  # noqa: ANN001
    t0, c0 = time.perf_counter(), time.process_time()
    plan = solve(batch, cm.cluster, cm, options)
    return plan, time.perf_counter() - t0, time.process_time() - c0


def run_case(workload: str, data: Workload, gpus: int, batch: int, steps: int, ilp: IlpOptions,
             hardware: str, model: str | None = None, zero_stage: int = 1, pattern_s: float = 0.0) -> dict:
    """Plan `steps` batches of one cell (`data`: the workload `workload` names, loaded) with the
    ILP and every baseline; per-step rows and a summary. `model` defaults to the workload's. With
    `pattern_s` > 0, on cells of at most `PATTERN_PER_GPU` samples a GPU, each plan's gap is also
    measured against the rank-pattern bound, given that many seconds (after the timed solves)."""
    model = model or default_model(workload)
    cm = build_cost_model(model, hardware, gpus, zero_stage=zero_stage)
    longest = int(data.tokens.max())  # bucket and packed: one SP size for the dataset's longest sample
    # One batch per seed: a full batch each, however large against the workload's 100,000 samples.
    batches = [make_batches(data, cm, global_batch=batch, steps=1, seed=seed)[0] for seed in range(steps)]
    load_before = os.getloadavg()[0]
    rows = []
    for k, b in enumerate(batches):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plan, wall, cpu = _timed_solve(b, cm, ilp)
        row = {"step": k, "samples": len(b), "tokens": sum(s.tokens for s in b),
               "ilp_step_s": plan.step_time_s, "lower_bound_s": plan.lower_bound_s, "gap": plan.gap,
               "solve_time_s": plan.solve_time_s, "wall_s": wall, "cpu_s": cpu, "status": plan.solver_status,
               "program": program_outcome(plan),
               "source": next((n.split(": ", 1)[1] for n in plan.notes if n.startswith("best plan from")), ""),
               "phases": next((n for n in plan.notes if n.startswith("seconds:")), ""),
               "warnings": [str(w.message) for w in caught if "ilp" in str(w.message)]}
        row.update(phase_columns(plan, b, cm, ilp, _timed_solve))
        for name in BASELINES:
            other, other_wall, _ = _timed_solve(b, cm, resolve_options(name, dataset_longest_tokens=longest))
            row[f"{name}_step_s"] = other.step_time_s
            row[f"{name}_solve_s"] = other_wall
        rows.append(row)
    # After every timed solve of the cell: a measurement of seconds over large arrays does not sit
    # between two timed solves (one run with it between them, one after: Open-Sora 2,048 on 1,024
    # GPUs 3.07% and 2.75% mean gap, within the cell's run-to-run spread; a precaution, not a fix).
    for row, b in zip(rows, batches, strict=True):
        if pattern_s > 0 and len(b) <= PATTERN_PER_GPU * gpus:
            t0 = time.perf_counter()
            bound = max(row["lower_bound_s"], rank_pattern_bound(b, cm, time_limit_s=pattern_s))
            row.update(pattern_bound_s=bound, pattern_gap=1 - bound / row["ilp_step_s"],  # as `Plan.gap`
                       pattern_wall_s=time.perf_counter() - t0)
    wall_s = [r["wall_s"] for r in rows]
    summary = {
        "workload": workload, "model": model, "zero_stage": zero_stage, "gpus": gpus, "batch": batch, "steps": len(rows),
        "solve_p50_s": float(np.percentile(wall_s, 50)), "solve_p95_s": float(np.percentile(wall_s, 95)),
        "cpu_p50_s": float(np.percentile([r["cpu_s"] for r in rows], 50)),
        "cpu_p95_s": float(np.percentile([r["cpu_s"] for r in rows], 95)),
        "ilp_step_s": statistics.mean(r["ilp_step_s"] for r in rows),
        "lower_bound_s": statistics.mean(r["lower_bound_s"] for r in rows),
        "gap_mean": statistics.mean(r["gap"] for r in rows), "gap_max": max(r["gap"] for r in rows),
        "single_gap_mean": statistics.mean(r["single_layout_gap"] for r in rows),
        "single_gap_max": max(r["single_layout_gap"] for r in rows),
        "cut_short": sum(r["program"] in ("cut short", "not run") for r in rows),
        "greedy_vs_bucket_min": min(r["bucket_step_s"] / r["dcp-greedy_step_s"] for r in rows),
        "greedy_vs_bucket_mean": statistics.mean(r["bucket_step_s"] / r["dcp-greedy_step_s"] for r in rows),
        "load_avg_1min": [load_before, os.getloadavg()[0]],
    }
    if all("pattern_gap" in r for r in rows):
        summary["pattern_gap_mean"] = statistics.mean(r["pattern_gap"] for r in rows)
        summary["pattern_gap_max"] = max(r["pattern_gap"] for r in rows)
    for name in BASELINES:
        ratios = [r["ilp_step_s"] / r[f"{name}_step_s"] for r in rows]
        summary[f"worst_vs_{name}"] = max(ratios)  # <= 1: the ILP never lost to it
        summary[f"lost_to_{name}"] = sum(x > 1 + 1e-9 for x in ratios)
        summary[f"speedup_vs_{name}"] = statistics.mean(1 / x for x in ratios)
        summary[f"{name}_solve_mean_s"] = statistics.mean(r[f"{name}_solve_s"] for r in rows)
    return {"summary": summary, "steps": rows}


def cell(text: str) -> tuple[str, int, int]:
    """One cell of `--cells`: WORKLOAD,GPUS,BATCH (the workload may hold colons: lognormal:scale=16)."""
    parts = text.rsplit(",", 2)
    try:
        gpus, batch = int(parts[1]), int(parts[2])
    except (IndexError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r}: expected WORKLOAD,GPUS,BATCH (wikipedia,256,512)") from None
    if not parts[0] or gpus < 1 or batch < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a workload and positive GPUS and BATCH")
    return parts[0], gpus, batch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="only 64 GPUs x 512 samples (all workloads)")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    ap.add_argument("--gpus", nargs="+", type=int, default=None)
    ap.add_argument("--batch", nargs="+", type=int, default=None)
    ap.add_argument("--cells", nargs="+", type=cell, default=None, metavar="WORKLOAD,GPUS,BATCH",
                    help="only these cells (instead of the grid of --workloads x --gpus x --batch)")
    ap.add_argument("--steps", type=int, default=5, help="global batches per cell")
    ap.add_argument("--time-limit", type=float, default=1.0, help="ILP time limit per batch (s)")
    ap.add_argument("--solver", default="highs", choices=("highs", "cbc"))
    ap.add_argument("--hardware", default="h200-sxm")
    ap.add_argument("--model", default=None, help="model preset (default: the workload's, llama-7b or STDiT)")
    ap.add_argument("--zero-stage", type=int, default=1, choices=(0, 1, 2, 3))
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/planner[-quick].json)")
    ap.add_argument("--pattern-bound", type=float, default=0.0, metavar="SECONDS",
                    help=f"also the gap to the rank-pattern bound, given SECONDS a batch, where a GPU runs at most "
                         f"{PATTERN_PER_GPU} samples (default 0: not measured)")
    args = ap.parse_args(argv)
    gpus = args.gpus or ([64] if args.quick else list(GPUS))
    sizes = args.batch or ([512] if args.quick else list(BATCHES))
    ilp = IlpOptions(time_limit_s=args.time_limit, solver=args.solver)
    out = Path(args.out or Path(__file__).parent / "results" / ("planner-quick.json" if args.quick else "planner.json"))
    # Import the solvers and warm them up outside the timed solves.
    warm_cm = build_cost_model("llama-7b", args.hardware, 8)
    solve(make_batches("wikipedia", warm_cm, global_batch=64, steps=1)[0], warm_cm.cluster, warm_cm, ilp)
    # The machine's speed, the budget's probe at its fastest of 50 (the module docstring says why).
    probe_ms = 1e3 * min(machine_probe_s() for _ in range(50))
    print(f"machine probe {probe_ms:.3f} ms (the budget's reference machine: {1e3 * knobs.PROBE_S:.3f} ms)")
    header = (f"{'workload':<19}{'gpus':>5}{'batch':>6}{'p50 s':>7}{'p95 s':>7}{'cpu95':>7}{'gap%':>6}{'max%':>6}"
              f"{'1gap%':>6}{'1max%':>6}{'cut':>4}" + "".join(f"{LABELS[n]:>9}" for n in BASELINES) + f"{'grd/bkt':>8}{'load':>6}"
              + (f"{'pgap%':>6}{'pmax%':>6}" if args.pattern_bound > 0 else ""))
    print(header)
    cases, started = [], time.perf_counter()
    cells = args.cells or [(w, n, b) for w in args.workloads for n in gpus for b in sizes]
    loaded = {}
    for workload in dict.fromkeys(w for w, _, _ in cells):  # once each; a bad name stops the run before any cell
        try:
            loaded[workload] = load_workload(workload)
        except WorkloadError as e:
            ap.error(str(e))
    for workload, n, b in cells:
        case = run_case(workload, loaded[workload], n, b, args.steps, ilp, args.hardware, args.model, args.zero_stage,
                        args.pattern_bound)
        s = case["summary"]
        print(f"{workload:<19}{n:>5}{b:>6}{s['solve_p50_s']:>7.3f}{s['solve_p95_s']:>7.3f}{s['cpu_p95_s']:>7.3f}"
              f"{100 * s['gap_mean']:>6.2f}{100 * s['gap_max']:>6.2f}"
              f"{100 * s['single_gap_mean']:>6.2f}{100 * s['single_gap_max']:>6.2f}{s['cut_short']:>4}"
              + "".join(f"{s[f'worst_vs_{name}']:>9.3f}" for name in BASELINES)
              + f"{s['greedy_vs_bucket_min']:>8.2f}{max(s['load_avg_1min']):>6.1f}"
              + (f"{100 * s['pattern_gap_mean']:>6.2f}{100 * s['pattern_gap_max']:>6.2f}" if "pattern_gap_mean" in s else ""),
              flush=True)
        cases.append(case)
    meta = {"argv": sys.argv[1:], "time_limit_s": args.time_limit, "solver": args.solver, "steps": args.steps,
            "hardware": args.hardware, "model": args.model, "zero_stage": args.zero_stage,
            "pattern_bound_s": args.pattern_bound,
            "python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "duration_s": time.perf_counter() - started, "probe_ms": probe_ms, "probe_ref_ms": 1e3 * knobs.PROBE_S}
    phases = phase_summary(cases)
    print("\n".join(phase_lines(phases)))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "cases": cases, "phases": phases}, indent=1) + "\n")
    print(f"wrote {out} ({meta['duration_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
