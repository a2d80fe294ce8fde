"""Reproduce the DCP paper's table in the simulator, and show how each strategy's advantage moves
with the cluster and the model.

    .venv/bin/python benchmarks/paper.py --out docs/     # JSON, docs/results.md, docs/figures/*.png
    .venv/bin/python benchmarks/paper.py --quick         # the 32-GPU table only (JSON + markdown)

Without --quick it also runs `benchmarks/long_context.py` (128K-2M-token samples, Ulysses alone
against Ulysses x ring, its own JSON), whose table the page includes. The page's HSDP and CPU
self-check sections come from `benchmarks/hsdp_scale.py` and `benchmarks/selfcheck.py` runs: they
are carried over from the page as it stands, between their markers (`paper_report.KEPT`).

The paper's setting ("Training Variable Long Sequences With Data-centric Parallel", NUS; code
NUS-HPC-AI-Lab/VideoSys, docs/dcp.md): 32 H200 in nodes of 8; a 1D (text) and a 2D (video)
transformer; short, balanced and long datasets; speedups over bucket parallel of 1.68x to 2.70x
for DCP-inter and up to 2.88x with pyramid checkpointing. Here: llama-7b and opensora-stdit-1.1b
on the best H200 profile present (`h200-measured` if committed, else the `h200-sxm` preset), the
`opensora` short/balanced/long workloads for both models and wikipedia and lognormal x16 for the
text model. Every case plans the same `--steps` global batches with each strategy and simulates
the plans on the cost model; nothing here runs on a GPU.

Bucket and packed use ONE SP size for the whole training, the smallest that fits the dataset's
longest sample fully checkpointed (the paper's static configuration, `BucketOptions.static_sp`);
`*-best-static` is the static size (at least that one) with the best mean step time on the
measured batches, and `bucket-per-batch` is the same name's strategy in dcp (smallest SP that fits each
batch's longest sample), kept to show why that baseline exaggerates speedups.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dcp.costmodel import DEFAULT_HARDWARE, MEASURED_H200, CostModel, CostModelError  # noqa: E402
from dcp.data.batches import make_batches  # noqa: E402
from dcp.data.workloads import load_workload  # noqa: E402
from dcp.planner import BucketOptions, GreedyOptions, IlpOptions, PackedOptions, solve  # noqa: E402
from dcp.planner.baselines import smallest_fitting_sp  # noqa: E402
from dcp.planner.feasibility import allowed_sp_sizes  # noqa: E402
from dcp.planner.options import StrategyOptions  # noqa: E402
from dcp.planner.plan import InfeasibleError, Plan  # noqa: E402
from dcp.planner.run import build_cost_model, gap, groups_label, plan_steps  # noqa: E402
from dcp.planner.sample import Sample  # noqa: E402
from dcp.planner.simulate import COMM_KINDS, EVENT_KINDS, Timeline, simulate  # noqa: E402

MODEL_1D, MODEL_2D = "llama-7b", "opensora-stdit-1.1b"
VIDEO_WORKLOADS = ("opensora:short", "opensora:balanced", "opensora:long")
TEXT_WORKLOADS = ("wikipedia", "lognormal:scale=16")
SAMPLES_PER_GPU = {"wikipedia": 16, "lognormal:scale=16": 4, "opensora:short": 8,
                   "opensora:balanced": 4, "opensora:long": 2}
"""Global batch = samples per GPU x GPUs (weak scaling, as the paper's runtime gives every rank
micro-batches each step): about 0.5M (wikipedia) to 7M (opensora:long) tokens on 32 GPUs."""
PAPER_GPUS, GPUS_PER_NODE = 32, 8
SCALING_GPUS = (8, 64, 128, 256)
SCALING_MODELS = ("llama-13b", "llama-70b")
ZERO_STAGE = {"llama-70b": 3}
"""ZeRO stage per model (default 1, as the paper trained): 70B's states overflow a GPU at stage 1."""
PAPER_RANGE = {"dcp-greedy-inter": (1.68, 2.70), "dcp-greedy": (1.68, 2.88)}
"""The paper's speedups over bucket (the DCP paper, as above): DCP-inter 1.68x-2.70x; with pyramid
checkpointing up to 2.88x (its lower end, 1.68x, is inferred: pyramid only adds to DCP-inter)."""
STRATEGIES = ("bucket", "bucket-per-batch", "bucket-best-static", "packed", "packed-best-static",
              "dcp-greedy-inter", "dcp-greedy", "ilp")
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Case:
    """One model trained on one workload on one cluster; `section` names the table it feeds."""

    section: str
    model: str
    workload: str
    gpus: int

    @property
    def zero_stage(self) -> int:
        return ZERO_STAGE.get(self.model, 1)

    @property
    def global_batch(self) -> int:
        return SAMPLES_PER_GPU[self.workload] * self.gpus


def paper_cases() -> list[Case]:
    """The 32-GPU table: the 2D model on the video workloads, the 1D model on all five."""
    return ([Case("paper", MODEL_1D, w, PAPER_GPUS) for w in (*TEXT_WORKLOADS, *VIDEO_WORKLOADS)]
            + [Case("paper", MODEL_2D, w, PAPER_GPUS) for w in VIDEO_WORKLOADS])


def scaling_cases() -> list[Case]:
    """The paper's cases on 8 to 256 GPUs, and the 1D workloads with 13B and 70B models."""
    gpus = [dataclasses.replace(c, section="gpus", gpus=n) for n in SCALING_GPUS for c in paper_cases()]
    models = [Case("models", m, w, PAPER_GPUS) for m in SCALING_MODELS for w in (*TEXT_WORKLOADS, *VIDEO_WORKLOADS)]
    return gpus + models


def _metrics(plans: Sequence[Plan], timelines: Sequence[Timeline]) -> dict[str, Any]:
    """Means over steps; shares of rank-seconds weighted by step time (as `dcp compare`)."""
    total = sum(t.step_time_s for t in timelines)
    by_kind = [t.seconds_by_kind() for t in timelines]
    shares = {k: sum(b[k] for b in by_kind) / (plans[0].num_gpus * total) for k in EVENT_KINDS}
    return {
        "mean_step_time_s": total / len(plans), "step_times_s": [p.step_time_s for p in plans],
        "idle_fraction": shares["idle"], "comm_fraction": sum(shares[k] for k in COMM_KINDS),
        "recompute_fraction": shares["recompute"], "shares": shares,
        # A step set by one micro-batch: the longest one's time over the step's.
        "straggler_share": sum(max(mb.time_s for g in p.groups for mb in g.microbatches) / p.step_time_s
                               for p in plans) / len(plans),
        "mean_gap": sum(gap(p) for p in plans) / len(plans),
        "mean_solve_time_s": sum(p.solve_time_s for p in plans) / len(plans),
        "max_solve_time_s": max(p.solve_time_s for p in plans), "groups": groups_label(plans[0]),
    }


def _evaluate(batches: Sequence[Sequence[Sample]], cm: CostModel, options: StrategyOptions) -> dict[str, Any]:
    plans = plan_steps(batches, cm, options)
    return _metrics(plans, [simulate(p, cm) for p in plans])


def _best_static(batches: Sequence[Sequence[Sample]], cm: CostModel, sizes: Sequence[int],
                 make: Callable[[int], StrategyOptions]) -> dict[str, Any]:
    """The static SP size (from `sizes`) with the best mean step time, and its metrics."""
    best: dict[str, Any] | None = None
    for p in sizes:
        row = {**_evaluate(batches, cm, make(p)), "sp": p}
        if best is None or row["mean_step_time_s"] < best["mean_step_time_s"]:
            best = row
    assert best is not None
    return best


def run_case(case: Case, hardware: str, steps: int, time_limit_s: float) -> dict[str, Any]:
    """Plan `steps` global batches of one case with every strategy; metrics per strategy."""
    out: dict[str, Any] = {**dataclasses.asdict(case), "zero_stage": case.zero_stage,
                           "global_batch": case.global_batch, "hardware": hardware}
    started = time.perf_counter()
    try:
        cm = build_cost_model(case.model, hardware, case.gpus, GPUS_PER_NODE, zero_stage=case.zero_stage)
        batches = make_batches(case.workload, cm, global_batch=case.global_batch, steps=steps)
        sizes = allowed_sp_sizes(cm)
        longest = int(load_workload(case.workload).tokens.max())
        static = smallest_fitting_sp(longest, cm, sizes)
        larger = [p for p in sizes if p >= static]
        s: dict[str, dict[str, Any]] = {
            "bucket": {**_evaluate(batches, cm, BucketOptions(static_sp=static)), "sp": static},
            "bucket-per-batch": _evaluate(batches, cm, BucketOptions()),
            "bucket-best-static": _best_static(batches, cm, larger, lambda p: BucketOptions(static_sp=p)),
            "packed": {**_evaluate(batches, cm, PackedOptions(static_sp=static)), "sp": static},
            "packed-best-static": _best_static(batches, cm, larger, lambda p: PackedOptions(static_sp=p)),
            "dcp-greedy-inter": _evaluate(batches, cm, GreedyOptions(pyramid=False)),
            "dcp-greedy": _evaluate(batches, cm, GreedyOptions()),
            "ilp": _evaluate(batches, cm, IlpOptions(time_limit_s=time_limit_s)),
        }
    except (InfeasibleError, CostModelError) as e:
        return {**out, "status": f"cannot plan: {e}", "wall_s": time.perf_counter() - started}
    ref = s["bucket"]["mean_step_time_s"]
    for row in s.values():
        row["speedup_vs_bucket"] = ref / row["mean_step_time_s"]
    lost = [{"step": i, "ilp_s": a, "dcp_greedy_s": b} for i, (a, b) in
            enumerate(zip(s["ilp"]["step_times_s"], s["dcp-greedy"]["step_times_s"], strict=True)) if a > b * (1 + 1e-9)]
    tokens = [x.tokens for b in batches for x in b]
    return {**out, "status": "ok", "steps": len(batches), "dataset_longest_tokens": longest,
            "static_gb": cm.static_bytes / 1e9, "memory_gb": cm.cluster.memory_bytes / 1e9,
            "batch_longest_tokens": max(tokens), "batch_tokens": sum(tokens) / len(batches),
            "static_sp": static, "allowed_sp": sizes, "strategies": s, "ilp_lost_to_greedy": lost,
            "wall_s": time.perf_counter() - started}


def gantt_figures(case: Case, hardware: str, figures: Path, time_limit_s: float) -> list[str]:
    """Every rank's first step under bucket and under ilp, for one case (docs/figures)."""
    from dcp.viz import plan_gantt

    cm = build_cost_model(case.model, hardware, case.gpus, GPUS_PER_NODE, zero_stage=case.zero_stage)
    batch = make_batches(case.workload, cm, global_batch=case.global_batch, steps=1)[0]
    static = smallest_fitting_sp(int(load_workload(case.workload).tokens.max()), cm, allowed_sp_sizes(cm))
    names = []
    for name, options in (("bucket", BucketOptions(static_sp=static)), ("ilp", IlpOptions(time_limit_s=time_limit_s))):
        plan = solve(batch, cm.cluster, cm, options)
        timeline = simulate(plan, cm)
        path = figures / f"gantt-{name}.png"
        plan_gantt(plan, timeline, path, title=f"{name}: {case.model}, {case.workload}, {case.gpus} GPUs, step 0, "
                   f"{plan.step_time_s:.2f} s, idle {timeline.idle_fraction:.0%}")
        names.append(path.name)
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="write results.md and figures/ here (e.g. docs/)")
    ap.add_argument("--json", type=Path, default=None, help="JSON path (default benchmarks/results/paper[-quick].json)")
    ap.add_argument("--quick", action="store_true", help="the 32-GPU table only")
    ap.add_argument("--steps", type=int, default=5, help="global batches per 32-GPU case")
    ap.add_argument("--scaling-steps", type=int, default=3, help="global batches per scaling case")
    ap.add_argument("--time-limit", type=float, default=1.0, help="ILP time limit per global batch (s)")
    ap.add_argument("--hardware", default=DEFAULT_HARDWARE,
                    help=f"hardware profile (default: {MEASURED_H200} if committed, else the datasheet preset)")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    cases = [(c, args.steps) for c in paper_cases()]
    cases += [] if args.quick else [(c, args.scaling_steps) for c in scaling_cases()]
    results = []
    for i, (case, steps) in enumerate(cases):
        r = run_case(case, args.hardware, steps, args.time_limit)
        results.append(r)
        speed = " ".join(f"{k}={v['speedup_vs_bucket']:.2f}" for k, v in r.get("strategies", {}).items())
        print(f"[{i + 1}/{len(cases)}] {case.section} {case.model} {case.workload} {case.gpus} GPUs "
              f"({r['wall_s']:.1f} s): {speed or r['status']}", flush=True)
    doc = {"meta": {"hardware": args.hardware, "hardware_kind": "measured" if args.hardware == MEASURED_H200 else "preset",
                    "steps": args.steps, "scaling_steps": args.scaling_steps, "ilp_time_limit_s": args.time_limit,
                    "samples_per_gpu": SAMPLES_PER_GPU, "zero_stage": ZERO_STAGE, "paper_range": PAPER_RANGE,
                    "gpus_per_node": GPUS_PER_NODE, "quick": args.quick, "argv": sys.argv[1:],
                    "python": platform.python_version(), "cpus": os.cpu_count(),
                    "date": time.strftime("%Y-%m-%d %H:%M:%S")}, "cases": results}
    if args.out is not None:
        figures = args.out / "figures"
        figures.mkdir(parents=True, exist_ok=True)
        doc["meta"]["gantt"] = gantt_figures(Case("paper", MODEL_2D, "opensora:balanced", PAPER_GPUS),
                                             args.hardware, figures, args.time_limit)
    if not args.quick:  # the long-context table (Ulysses alone vs Ulysses x ring), its own JSON
        import long_context

        lc = long_context.run(args.hardware, args.time_limit)
        long_context.JSON_PATH.write_text(json.dumps(lc, indent=1) + "\n")
        print(f"wrote {long_context.JSON_PATH}")
    doc["meta"]["wall_s"] = time.perf_counter() - started
    path = args.json or ROOT / "benchmarks" / "results" / ("paper-quick.json" if args.quick else "paper.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")
    from paper_report import write_report
    from paper_tables import main_table

    print(main_table(doc))
    if args.out is not None:
        print(f"wrote {write_report(doc, args.out, started)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
