"""The step's pricing orders each group's micro-batches so that the reductions hide (dcp.planner.sync)."""

from __future__ import annotations

import pytest
from conftest import cost_model

from dcp.planner.common import assemble
from dcp.planner.sample import Sample
from dcp.planner.simulate import simulate
from dcp.planner.sync import group_shapes


def _batch() -> list[Sample]:
    return [Sample(0, 30_000, 30_000 * 30_001 // 2), Sample(1, 64, 64 * 65 // 2), Sample(2, 8_000, 8_000 * 8_001 // 2)]


def test_the_longest_microbatch_goes_last_where_it_hides_the_reductions() -> None:
    """Stage 1, 32 GPUs: a group that ends on a 64-token micro-batch hides none of its layers'
    reductions; moving its 30K-token one last hides all but the least any plan exposes, and the
    step equals its replay (what the executor runs)."""
    cm = cost_model(gpus=32, zero_stage=1)
    batch = _batch()
    plan = assemble("test", batch, cm, [(0, 8, [[0], [1]]), (8, 8, [[2]])])
    assert [mb.samples for mb in plan.groups[0].microbatches] == [[1], [0]]
    assert plan.grad_sync_s == pytest.approx(cm.grad_sync_s(), rel=1e-9)
    simulate(plan, cm)  # checks the step against the schedule's replay
    # The same plan without the move: everything after the tiny backward is exposed.
    plan.groups[0].microbatches.reverse()
    shapes, idle = group_shapes(plan)
    unmoved = cm.step_price(shapes, idle).step_time_s - plan.busy_s()
    assert unmoved > plan.grad_sync_s + 0.5 * cm.sync_terms()["grad_reduce"]


def test_an_order_that_already_hides_them_is_kept() -> None:
    cm = cost_model(gpus=32, zero_stage=2)
    plan = assemble("test", _batch(), cm, [(0, 8, [[1], [2], [0]])])
    assert [mb.samples for mb in plan.groups[0].microbatches] == [[1], [2], [0]]
    assert plan.grad_sync_s == pytest.approx(cm.grad_sync_s(), rel=1e-9)


def test_step_price_takes_the_groups_busy_times_when_the_caller_has_them() -> None:
    cm = cost_model(gpus=32, zero_stage=1)
    plan = assemble("test", _batch(), cm, [(0, 8, [[0], [1]]), (8, 8, [[2]])])
    shapes, idle = group_shapes(plan)
    given = cm.step_price(shapes, idle, busy_s=[g.busy_s for g in plan.groups]).step_time_s
    assert given == pytest.approx(cm.step_price(shapes, idle).step_time_s, rel=1e-12)
    with pytest.raises(ValueError, match="1 busy times for 2 groups"):
        cm.step_price(shapes, idle, busy_s=[1.0])
