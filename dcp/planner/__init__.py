"""Plans for one global batch: types, strategies, bounds and simulation. Never imports torch.

`solve` checks its inputs and runs one strategy: dcp-greedy, bucket or packed (milliseconds), or
ilp, whose stages `phases.solve_phased` runs within one time limit divided by `timebudget`:
backfill or nested plan -> single-layout ILP (its warm start runs every baseline first) -> nested
column plans -> phase splits -> the fastest plan, with its bound and gap. Modules sit in layers
that import only their own or lower ones (tests/test_layers.py; docs/design.md, "The planner's
layout"): kit, core, bounds, baselines, search (`ilp`), phased, api.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy.ma  # noqa: F401  (np.unique imports it on first use: here, not inside a timed solve)

from dcp.costmodel import Cluster, CostModel
from dcp.planner.baselines import solve_bucket, solve_packed
from dcp.planner.bounds import lower_bound
from dcp.planner.greedy import solve_greedy
from dcp.planner.inputs import check_batch, check_options
from dcp.planner.options import (
    DATASET,
    STRATEGIES,
    STRATEGY_HELP,
    BucketOptions,
    GreedyOptions,
    IlpOptions,
    PackedOptions,
    StrategyOptions,
    strategy_options,
    with_dataset,
)
from dcp.planner.plan import Group, InfeasibleError, MicroBatch, Plan, PlanError
from dcp.planner.sample import Sample

_NO_SOLVER: ImportError | None = None
"""Why the ILP could not be loaded (None where it was): what asking for ilp raises."""
try:  # the ILP and its solver, loaded with the package so that no solve's time limit pays for it
    from dcp.planner.ilp.budget import paused_gc
    from dcp.planner.phases import solve_phased
except ImportError as e:  # no PuLP or HiGHS here (the GPU machines run the executor): ilp fails when asked for
    _NO_SOLVER = e


def solve(batch: Sequence[Sample] | Sequence[int], cluster: Cluster, cost_model: CostModel,
          options: StrategyOptions | str | None = None) -> Plan:
    """Plan one global batch: Samples (or token counts) on `cluster` priced by `cost_model`, with a
    strategy's options or name (default: ilp, the stages of `phases.solve_phased`); inputs checked
    first, the cost model's notes last. All strategies are deterministic but ilp when its limit cuts
    a stage short (`solver_status` says so): in training plan on one rank and broadcast
    (`dcp.executor.broadcast_plan`). The solver loads on import, not in a solve's limit."""
    started = time.perf_counter()
    if cluster != cost_model.cluster:
        raise ValueError("cluster differs from the one the cost model was built for")
    batch = check_batch(batch, cost_model)
    options = IlpOptions() if options is None else check_options(options)
    plan = _solve(batch, cost_model, options, started)
    plan.notes += [n for n in cost_model.notes() if n not in plan.notes]
    return plan


def _solve(batch: Sequence[Sample], cost_model: CostModel, options: StrategyOptions, started: float) -> Plan:
    if isinstance(options, IlpOptions):
        if _NO_SOLVER is not None:
            raise _NO_SOLVER
        with paused_gc():  # within its time limit, whatever the caller's heap
            return solve_phased(batch, cost_model, options, started)
    if isinstance(options, GreedyOptions):
        return solve_greedy(batch, cost_model, options)
    if isinstance(options, BucketOptions):
        return solve_bucket(batch, cost_model, options)
    if isinstance(options, PackedOptions):
        return solve_packed(batch, cost_model, options)
    raise TypeError(f"unknown options type {type(options).__name__}")


__all__ = [
    "DATASET", "STRATEGIES", "STRATEGY_HELP", "BucketOptions", "GreedyOptions", "Group", "IlpOptions", "InfeasibleError",
    "MicroBatch", "PackedOptions", "Plan", "PlanError", "Sample", "StrategyOptions", "lower_bound", "solve",
    "strategy_options", "with_dataset",
]
