"""Plans for one global batch: types, strategies, bounds and simulation. Never imports torch."""

from __future__ import annotations

from collections.abc import Sequence

from dcp.costmodel import Cluster, CostModel
from dcp.planner.bounds import lower_bound
from dcp.planner.options import (
    BucketOptions,
    GreedyOptions,
    IlpOptions,
    PackedOptions,
    StrategyOptions,
)
from dcp.planner.plan import Group, InfeasibleError, MicroBatch, Plan, PlanError
from dcp.planner.sample import Sample

STRATEGIES: dict[str, StrategyOptions] = {
    "ilp": IlpOptions(),
    "dcp-greedy": GreedyOptions(),
    "dcp-greedy-inter": GreedyOptions(pyramid=False),
    "bucket": BucketOptions(),
    "packed": PackedOptions(),
}


def strategy_options(name: str) -> StrategyOptions:
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def solve(batch: Sequence[Sample], cluster: Cluster, cost_model: CostModel,
          options: StrategyOptions | None = None) -> Plan:
    """Plan one global batch. A pure function: the same inputs give the same plan."""
    if cluster != cost_model.cluster:
        raise ValueError("cluster differs from the one the cost model was built for")
    if not batch:
        raise ValueError("cannot plan an empty batch")
    options = options or IlpOptions()
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
    "STRATEGIES", "BucketOptions", "GreedyOptions", "Group", "IlpOptions", "InfeasibleError",
    "MicroBatch", "PackedOptions", "Plan", "PlanError", "Sample", "StrategyOptions", "lower_bound", "solve",
    "strategy_options",
]
