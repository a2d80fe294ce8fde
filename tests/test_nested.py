"""Nested plans for batches of fewer samples than the backfill needs: the samples at the largest
size first, the rest after them on groups of their own sizes; their structure, the gates, and
that the planner keeps them only when they beat the single layout."""

from __future__ import annotations

import dcp.planner.knobs as knobs
from dcp.costmodel import TrainingSetup
from dcp.costmodel.model import CostModel
from dcp.data.batches import make_batches
from dcp.planner import IlpOptions, solve
from dcp.planner.bounds import multi_phase_bound, multi_phase_busy
from dcp.planner.feasibility import allowed_sp_sizes
from dcp.planner.ilp import solve_ilp
from dcp.planner.ilp.costs import cost_table
from dcp.planner.nested import nested_plan
from dcp.planner.pricing import BatchArrays
from tests.conftest import cost_model


def lognormal_batch(gpus: int = 1024, samples: int = 512, seed: int = 0) -> tuple[CostModel, list]:
    """Heavy-tailed lengths (a few samples past 100K tokens) and fewer samples than GPUs."""
    cm = cost_model(gpus=gpus)
    return cm, make_batches("lognormal:scale=16", cm, global_batch=samples, steps=1, seed=seed)[0]


def test_longest_run_first_at_the_largest_size_and_the_rest_after_on_smaller_groups() -> None:
    cm, batch = lognormal_batch()
    sizes = allowed_sp_sizes(cm)
    busy = multi_phase_busy(batch, cm, sizes)
    plan = nested_plan(batch, cm, sizes, busy)
    assert plan is not None and plan.num_phases == 2
    first = [g for g in plan.groups if g.phase == 0]
    second = [g for g in plan.groups if g.phase == 1]
    q1 = max(g.sp for g in plan.groups)
    assert {g.sp for g in first} == {q1} and min(g.sp for g in second) < q1
    # Every sample exactly once, and each of phase 1's first members needs q1 to run within the step.
    placed = sorted(i for g in plan.groups for mb in g.microbatches for i in mb.samples)
    assert placed == sorted(s.id for s in batch)
    table = cost_table(BatchArrays.of(batch), cm, sizes)
    by_id = {s.id: k for k, s in enumerate(batch)}
    j = sizes.index(q1)
    longest = max((i for g in first for mb in g.microbatches for i in mb.samples), key=lambda i: table.tokens[by_id[i]])
    assert table.solo[by_id[longest], :j].min() > busy  # below q1 it alone runs past the busy bound
    assert plan.step_time_s >= multi_phase_bound(batch, cm, sizes) * (1 - 1e-9)


def test_gates_give_none() -> None:
    cm, batch = lognormal_batch(gpus=64, samples=knobs.BACKFILL_MIN_PER_GPU * 64)  # the backfill's batch
    sizes = allowed_sp_sizes(cm)
    assert nested_plan(batch, cm, sizes, multi_phase_busy(batch, cm, sizes)) is None
    cm, batch = lognormal_batch(gpus=64, samples=100)
    busy = multi_phase_busy(batch, cm, sizes)
    assert nested_plan(batch, cm, [16], busy) is None  # one size
    zero3 = CostModel(cm.model, cm.hardware, cm.cluster, TrainingSetup(zero_stage=3))
    assert nested_plan(batch, zero3, sizes, busy) is None  # stage 3 runs one layout
    # The micro-batch cap: never a plan past it, and below the uncapped plan's most a plan that
    # keeps it. 100 samples on 128 GPUs (seed 2): 3 micro-batches uncapped, a plan of 2 under a cap
    # of 2. On the counted cost model no cap below the uncapped plan's most gives a plan for 100
    # samples on 64 GPUs (seeds 0-6) nor 70-120 samples (seeds 0-2): there every target's plan runs
    # as many micro-batches in its busiest group as the uncapped one, leaving the cap untested.
    cm, batch = lognormal_batch(gpus=128, samples=100, seed=2)
    sizes = allowed_sp_sizes(cm)
    busy = multi_phase_busy(batch, cm, sizes)
    most = max(len(g.microbatches) for g in nested_plan(batch, cm, sizes, busy).groups)
    assert most >= 2
    kept = []
    for cap in range(1, most):
        capped = nested_plan(batch, cm, sizes, busy, max_microbatches=cap)
        assert capped is None or all(len(g.microbatches) <= cap for g in capped.groups)
        kept += [cap] if capped is not None else []
    assert kept, f"no cap below {most} micro-batches gave a plan: the cap was never exercised"


def test_the_planner_keeps_a_nested_plan_that_beats_the_single_layout() -> None:
    """Lognormal, 512 samples on 1,024 GPUs: the single layout runs every group at SP 16, the
    short samples beside the long ones; the nested plan runs them after at SP 1-8. How far the
    single layout's time-limited program gets varies with the machine (4.920-5.003 s at 1 s, 4.937 s
    at 3 s, 4.945 s at 10 s, against the nested plan's 4.913 s), so only the order is asserted."""
    cm, batch = lognormal_batch()
    options = IlpOptions(time_limit_s=1.0)
    single = solve_ilp(batch, cm, options)
    plan = solve(batch, cm.cluster, cm, options)
    assert plan.num_phases == 2 and plan.notes[0].startswith("best plan from: nested (the single layout's: ")
    assert plan.step_time_s < single.step_time_s
    # ratchet: the nested plan's gap under 3%; a margin under what this case gave when written (`pytest tests/test_nested.py::test_the_planner_keeps_a_nested_plan_that_beats_the_single_layout`)
    assert plan.gap < 0.03
