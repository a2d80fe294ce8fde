"""Plans for one global batch: types, strategies, bounds and simulation. Never imports torch."""

from __future__ import annotations

from collections.abc import Sequence

from dcp.costmodel import Cluster, CostModel
from dcp.data.workloads import Sample
from dcp.planner.bounds import lower_bound
from dcp.planner.inputs import check_batch, check_options
from dcp.planner.options import (
    DATASET,
    BucketOptions,
    GreedyOptions,
    IlpOptions,
    PackedOptions,
    StrategyOptions,
    with_dataset,
)
from dcp.planner.plan import Group, InfeasibleError, MicroBatch, Plan, PlanError

STRATEGIES: dict[str, StrategyOptions] = {
    "ilp": IlpOptions(),
    "dcp-greedy": GreedyOptions(),
    "dcp-greedy-inter": GreedyOptions(pyramid=False),
    "bucket": BucketOptions(static_sp=DATASET),
    "bucket-per-batch": BucketOptions(),
    "packed": PackedOptions(static_sp=DATASET),
    "packed-per-batch": PackedOptions(),
}
"""Strategies by name. `bucket` and `packed` are the DCP paper's static baselines: one SP size for
the whole training, the smallest that fits the dataset's longest sample (they need
`dataset_longest_tokens`, see `with_dataset`); the `-per-batch` variants choose it for every
global batch, the smallest that fits that batch's longest sample (docs/results.md compares them)."""

STRATEGY_HELP = {
    "ilp": "the exact planner (MILP over SP group sizes, assignment and checkpointing)",
    "dcp-greedy": "the DCP paper's runtime: per-bucket SP and batch size, pyramid checkpointing",
    "dcp-greedy-inter": "dcp-greedy with every layer checkpointed (the paper's DCP-inter)",
    "bucket": "bucket parallel with one SP size for the whole training (the paper's baseline)",
    "bucket-per-batch": "bucket parallel re-choosing its SP size for every global batch",
    "packed": "token-budget packing at one SP size for the whole training",
    "packed-per-batch": "token-budget packing re-choosing its SP size for every global batch",
}
"""One line per strategy, for help texts."""


def strategy_options(name: str) -> StrategyOptions:
    """The options of a strategy name (see STRATEGIES); ValueError naming the known ones."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def solve(batch: Sequence[Sample] | Sequence[int], cluster: Cluster, cost_model: CostModel,
          options: StrategyOptions | str | None = None) -> Plan:
    """Plan one global batch: Samples (or bare token counts) on `cluster` priced by `cost_model`,
    with a strategy's options or name (default: ilp). Inputs are checked first (`dcp.planner.inputs`).
    The plan's notes end with the cost model's own (e.g. that a ZeRO-3 plan is simulation only).

    Deterministic: dcp-greedy, dcp-greedy-inter, bucket and packed give the same plan for the same
    inputs, always. ilp does whenever no phase is cut short by its wall-clock `time_limit_s`
    (the plan's `solver_status` then says `time limit reached`); where it is, runs (and ranks)
    can differ, so in training plan on one rank and broadcast (`dcp.executor.broadcast_plan`)."""
    if cluster != cost_model.cluster:
        raise ValueError("cluster differs from the one the cost model was built for")
    batch = check_batch(batch, cost_model)
    options = IlpOptions() if options is None else check_options(options)
    plan = _solve(batch, cost_model, options)
    plan.notes += [n for n in cost_model.notes() if n not in plan.notes]
    return plan


def _solve(batch: Sequence[Sample], cost_model: CostModel, options: StrategyOptions) -> Plan:
    if isinstance(options, IlpOptions):
        from dcp.planner.ilp import solve_ilp

        return solve_ilp(batch, cost_model, options)
    if isinstance(options, GreedyOptions):
        from dcp.planner.greedy import solve_greedy

        return solve_greedy(batch, cost_model, options)
    if isinstance(options, BucketOptions):
        from dcp.planner.baselines import solve_bucket

        return solve_bucket(batch, cost_model, options)
    if isinstance(options, PackedOptions):
        from dcp.planner.baselines import solve_packed

        return solve_packed(batch, cost_model, options)
    raise TypeError(f"unknown options type {type(options).__name__}")


__all__ = [
    "DATASET", "STRATEGIES", "STRATEGY_HELP", "BucketOptions", "GreedyOptions", "Group", "IlpOptions", "InfeasibleError",
    "MicroBatch", "PackedOptions", "Plan", "PlanError", "StrategyOptions", "lower_bound", "solve",
    "strategy_options", "with_dataset",
]
