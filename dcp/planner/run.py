"""Orchestration shared by the CLI, notebooks and benchmarks: batches -> plans -> numbers.

    cm = build_cost_model("llama-7b", "h200-sxm", gpus=32)
    workload = load_workload("wikipedia")                                  # dcp.data
    batches = make_batches(workload, cm, global_batch=512, steps=10)       # dcp.data.batches
    plans = plan_steps(batches, cm, "dcp-greedy")
    compare(batches, cm, ["bucket", "dcp-greedy"], dataset_longest_tokens=int(workload.tokens.max()))

`bucket` and `packed` size one SP size for the whole training by `dataset_longest_tokens` (default:
the longest sample of the batches given). Never imports torch or click.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from dcp.costmodel import (
    DEFAULT_MODEL,
    Cluster,
    CostModel,
    TrainingSetup,
    load_hardware,
    load_model,
)
from dcp.planner import STRATEGIES, solve
from dcp.planner.inputs import check_options
from dcp.planner.options import IlpOptions, StrategyOptions, with_dataset
from dcp.planner.plan import Plan
from dcp.planner.sample import Sample
from dcp.planner.simulate import Timeline, simulate
from dcp.planner.status import program_outcome

REFERENCE_STRATEGY = "bucket"


def default_model(workload: str) -> str:
    """A workload's usual model: Open-Sora STDiT for video (the paper's 2D), else Llama 7B."""
    return "opensora-stdit-1.1b" if workload.startswith("opensora") else DEFAULT_MODEL


def build_cost_model(model: str, hardware: str, gpus: int, gpus_per_node: int | None = None,
                     memory_gb: float | None = None, zero_stage: int = 1, precision: str = "bf16",
                     shard_group: int | None = None) -> CostModel:
    """A cost model from presets (or JSON paths), cluster shape, precision recipe and shard group
    (HSDP; None: world); gpus_per_node and memory_gb (usable, 1e9 B) default to the hardware's."""
    spec, hw = load_model(model), load_hardware(hardware)
    cluster = Cluster(num_gpus=gpus, gpus_per_node=gpus_per_node or hw.gpus_per_node,
                      memory_bytes=hw.memory_bytes if memory_gb is None else memory_gb * 1e9)
    return CostModel(spec, hw, cluster, TrainingSetup(precision=precision, zero_stage=zero_stage,
                                                      shard_group=shard_group))


def resolve_options(name: str | StrategyOptions, time_limit_s: float | None = None,
                    dataset_longest_tokens: int | None = None) -> StrategyOptions:
    """Options for a strategy name (or the options themselves); `time_limit_s` applies to the ILP
    only, `dataset_longest_tokens` to the static baselines (`bucket`, `packed`)."""
    options = check_options(name)  # raises ValueError naming an unknown strategy
    if time_limit_s is not None and isinstance(options, IlpOptions):
        options = dataclasses.replace(options, time_limit_s=time_limit_s)
    if dataset_longest_tokens is not None:
        options = with_dataset(options, dataset_longest_tokens)
    return options


Progress = Callable[[str, int, int], None]
"""progress(what, done, total): called before each global batch is planned and once at the end."""


def _longest(batches: Sequence[Sequence[Sample]]) -> int:
    return max((s.tokens for b in batches for s in b), default=1)


def plan_steps(batches: Sequence[Sequence[Sample]], cm: CostModel, strategy: str | StrategyOptions = "ilp",
               time_limit_s: float | None = None, *, dataset_longest_tokens: int | None = None,
               progress: Progress | None = None) -> list[Plan]:
    """One validated plan per global batch; the static baselines size their SP group for
    `dataset_longest_tokens`, or else for the longest sample in `batches`."""
    longest = dataset_longest_tokens if dataset_longest_tokens is not None else _longest(batches)
    options = resolve_options(strategy, time_limit_s, longest)
    what = strategy if isinstance(strategy, str) else options.name
    plans = []
    for i, batch in enumerate(batches):
        if progress is not None:
            progress(what, i, len(batches))
        plans.append(solve(batch, cm.cluster, cm, options))
    if progress is not None:
        progress(what, len(batches), len(batches))
    return plans


def gap(plan: Plan) -> float:
    """Fraction of the step the plan could still lose against its lower bound."""
    return (plan.step_time_s - plan.lower_bound_s) / plan.step_time_s if plan.step_time_s > 0 else 0.0


def groups_label(plan: Plan) -> str:
    """Groups by SP size and layout, largest first: "1x8 4x2" is one group of 8 GPUs and four of 2;
    "1x(8x4)" one of 32 as Ulysses 8 x ring 4; phases apart by " | " ("1x32 | 4x8")."""
    labels = []
    for phase in plan.phases():
        counts: dict[tuple[int, int], int] = {}
        for g in phase:
            counts[(g.sp, g.ulysses)] = counts.get((g.sp, g.ulysses), 0) + 1
        labels.append(" ".join(f"{n}x{p}" if u == p else f"{n}x({u}x{p // u})"
                               for (p, u), n in sorted(counts.items(), reverse=True)))
    return " | ".join(labels)


def step_rows(plans: Sequence[Plan], timelines: Sequence[Timeline]) -> Any:
    """Per step (pandas DataFrame): what the plan is, how long it takes, how far from the bound."""
    import pandas as pd

    rows = []
    for i, (plan, tl) in enumerate(zip(plans, timelines, strict=True)):
        rows.append({
            "step": i, "samples": len(plan.samples), "tokens": sum(s.tokens for s in plan.samples),
            "groups": groups_label(plan), "microbatches": sum(len(g.microbatches) for g in plan.groups),
            "step_time_s": plan.step_time_s, "lower_bound_s": plan.lower_bound_s, "gap": gap(plan),
            "solve_time_s": plan.solve_time_s, "program": program_outcome(plan), "solver_status": plan.solver_status,
            "idle_fraction": tl.idle_fraction, "comm_fraction": tl.comm_fraction,
        })
    return pd.DataFrame(rows)


def summarize(plans: Sequence[Plan], timelines: Sequence[Timeline]) -> dict[str, float]:
    """Means over steps; idle and comm shares weighted by step time (shares of all rank-seconds)."""
    total_s = sum(p.step_time_s for p in plans)
    tokens = sum(s.tokens for p in plans for s in p.samples)

    def weighted(attr: str) -> float:
        return sum(getattr(t, attr) * t.step_time_s for t in timelines) / total_s if total_s else 0.0

    n = len(plans)
    return {
        "steps": n, "mean_step_time_s": total_s / n,
        "throughput_tokens_per_s": tokens / total_s if total_s else 0.0,
        "idle_fraction": weighted("idle_fraction"), "comm_fraction": weighted("comm_fraction"),
        "mean_gap": sum(gap(p) for p in plans) / n,
        "mean_solve_time_s": sum(p.solve_time_s for p in plans) / n,
        "cut_short_steps": sum(program_outcome(p) in ("cut short", "not run") for p in plans),
    }


def simulate_all(plans: Sequence[Plan], cm: CostModel) -> list[Timeline]:
    return [simulate(p, cm) for p in plans]


def strategy_metrics(plans: Sequence[Plan], cm: CostModel) -> dict[str, float]:
    """What `dcp compare` reports for one strategy's plans of the same batches."""
    s = summarize(plans, simulate_all(plans, cm))
    return {"mean_step_time_s": s["mean_step_time_s"], "idle_fraction": s["idle_fraction"],
            "comm_fraction": s["comm_fraction"], "gap_to_lower_bound": s["mean_gap"],
            "mean_solve_time_s": s["mean_solve_time_s"], "throughput_tokens_per_s": s["throughput_tokens_per_s"],
            "mean_lower_bound_s": sum(p.lower_bound_s for p in plans) / len(plans),
            "time_limited": _limited(plans)}


def _limited(plans: Sequence[Plan]) -> str:
    """How many ILP plans the limit cut short or left without the program ("2/5"), or "-"."""
    outcomes = [program_outcome(p) for p in plans]
    if all(o == "-" for o in outcomes):
        return "-"
    return f"{sum(o in ('cut short', 'not run') for o in outcomes)}/{len(plans)}"


def compare(batches: Sequence[Sequence[Sample]], cm: CostModel, strategies: Sequence[str] | None = None,
            time_limit_s: float | None = None, *, dataset_longest_tokens: int | None = None,
            progress: Progress | None = None) -> Any:
    """The same batches through every strategy: one row per strategy (pandas DataFrame).
    speedup_vs_bucket is bucket's mean step time over the strategy's (NaN without bucket)."""
    import pandas as pd

    names = list(strategies) if strategies is not None else list(STRATEGIES)
    for name in names:
        resolve_options(name, time_limit_s)  # fail on a bad name before any solving
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"strategy {twice[0]!r} is listed more than once")
    rows = []
    for name in names:
        plans = plan_steps(batches, cm, name, time_limit_s, dataset_longest_tokens=dataset_longest_tokens,
                           progress=progress)
        rows.append({"strategy": name, **strategy_metrics(plans, cm)})
    frame = pd.DataFrame(rows)
    ref = frame.loc[frame["strategy"] == REFERENCE_STRATEGY, "mean_step_time_s"]
    frame.insert(2, "speedup_vs_bucket", ref.iloc[0] / frame["mean_step_time_s"] if len(ref) else float("nan"))
    return frame
