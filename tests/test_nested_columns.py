"""Nested plans by column generation (`dcp.planner.nested_columns`): their program's groups at a
level, a plan that beats every single layout, and when the phase search asks for them."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from dcp.data.batches import make_batches
from dcp.planner import phases
from dcp.planner.bounds import capacity_busy, multi_phase_busy
from dcp.planner.feasibility import allowed_sp_sizes
from dcp.planner.ilp import columns
from dcp.planner.ilp.budget import Deadline
from dcp.planner.ilp.costs import batch_costs
from dcp.planner.nested_columns import _part_estimate, nested_column_plan, plan_at
from dcp.planner.options import IlpOptions
from dcp.planner.pricing import BatchArrays
from tests.conftest import cost_model


@pytest.fixture(scope="module")
def videos():  # noqa: ANN201
    """Open-Sora's first batch of 128 videos on 64 GPUs (two a GPU): its cost model, batch,
    sizes, arrays, pricer and cost table, and the bound of every plan's busy time."""
    cm = cost_model(model="opensora-stdit-1.1b", gpus=64)
    batch = make_batches("opensora", cm, global_batch=128, steps=1, seed=0)[0]
    sizes = allowed_sp_sizes(cm)
    arrays = BatchArrays.of(batch)
    pricer, table = batch_costs(arrays, cm, sizes)
    return cm, batch, sizes, arrays, pricer, table, multi_phase_busy(batch, cm, sizes, (arrays.tokens, arrays.pairs))


def test_groups_at_a_level_place_every_video_once_and_fit_it(videos) -> None:  # noqa: ANN001
    """At 1.05 times the bound: every video in exactly one group's part, the groups on at most
    the cluster's GPUs, each group's subgroups and own part within the level by the estimate
    (the micro-batches as the canonical packing makes them), and some group splits, into
    subgroups of a smaller size."""
    cm, batch, sizes, _, _, table, busy = videos
    shapes = columns.shapes_of(table)
    assert shapes is not None
    theta = 1.05 * busy
    groups = plan_at(table, shapes, cm.cluster.num_gpus, theta, Deadline(math.inf))
    assert groups is not None
    held = sorted(i for g in groups for i in g.own + [i for part in g.parts for i in part])
    assert held == list(range(len(batch)))
    assert sum(sizes[g.j] for g in groups) <= cm.cluster.num_gpus
    split = [g for g in groups if any(g.parts)]
    assert split and all(sizes[g.jq] < sizes[g.j] and len(g.parts) == sizes[g.j] // sizes[g.jq] for g in split)
    for g in groups:
        own = _estimate_of(g.own, g.j, table, shapes)
        parts = max((_estimate_of(ids, g.jq, table, shapes) for ids in g.parts), default=0.0)
        assert own + parts <= theta * (1 + 1e-9)


def _estimate_of(ids: list[int], j: int, table, shapes) -> float:  # noqa: ANN001
    """`_part_estimate` of the samples `ids` (table indices) at size index j."""
    a = np.zeros(len(shapes.first), dtype=np.int64)
    for t, members in enumerate(shapes.members):
        a[t] = int(np.isin(members, ids).sum())
    return _part_estimate(table, shapes.first, j, a)


def test_nested_plan_runs_below_every_single_layout(videos) -> None:  # noqa: ANN001
    """With time to spare, the nested plan is a validated two-phase plan whose busy time is
    below the configuration program's bound on every single layout's (0.967 s against 0.981 s;
    the bound of every plan: 0.948 s), each video in one micro-batch."""
    cm, batch, sizes, arrays, pricer, table, busy = videos
    plan = nested_column_plan(batch, cm, sizes, busy, arrays, None, (pricer, table))
    assert plan is not None and plan.num_phases == 2
    plan.validate()
    shapes = columns.shapes_of(table)
    lower = capacity_busy(batch, cm, sizes)
    single, _, _ = columns.column_bound(table, shapes, cm.cluster.num_gpus, lower, 3 * lower, Deadline(math.inf),
                                       steps=14)
    assert busy <= plan.busy_s() < single * (1 - 5e-3)


def test_phase_search_asks_for_nested_plans_only_with_the_time_for_them(monkeypatch, videos) -> None:  # noqa: ANN001
    """Two videos a GPU: the phase search asks for a nested column plan only when half the limit
    is at least `NESTED_COLUMNS_MIN_S` (here 0.3 s), after the single layout, which then gets at
    most that half, and until the search's deadline; with 4 videos a GPU it does not ask, nor for
    text (too many shapes for the column program)."""
    cm, batch, *_ = videos
    asked: list[tuple[float, float]] = []
    started = [0.0]

    def spy(batch_, cm_, sizes, busy_s, arrays, max_mb, costs, deadline_s):  # noqa: ANN001, ANN202
        asked.append((time.perf_counter() - started[0], deadline_s - started[0]))
        return None

    monkeypatch.setattr(phases, "nested_column_plan", spy)
    monkeypatch.setattr(phases, "NESTED_COLUMNS_MIN_S", 0.3)
    phases.solve_phased(batch, cm, IlpOptions(time_limit_s=0.5))
    assert not asked  # 0.25 s: below the minimum
    started[0] = time.perf_counter()
    phases.solve_phased(batch, cm, IlpOptions(time_limit_s=0.8), started[0])
    assert len(asked) == 1
    called_s, deadline_s = asked[0]
    assert called_s <= 0.4 + 0.05  # the single layout took at most half (and its assembly)
    assert 0.6 <= deadline_s <= 0.8  # the rest, less the reserve for the report
    more = make_batches("opensora", cm, global_batch=4 * cm.cluster.num_gpus, steps=1, seed=0)[0]
    phases.solve_phased(more, cm, IlpOptions(time_limit_s=0.8))
    assert len(asked) == 1
    text = make_batches("wikipedia", cm, global_batch=len(batch), steps=1, seed=0)[0]  # hundreds of shapes
    phases.solve_phased(text, cm, IlpOptions(time_limit_s=0.8))
    assert len(asked) == 1
