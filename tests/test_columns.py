"""The configuration program by column generation (`dcp.planner.ilp.columns` on `dcp.planner.colgen`): its knapsack
against enumeration, its bound and, when its integer program finds nothing in time, the rounded
fractional optimum."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import dcp.planner.knobs as knobs
from dcp.data.batches import make_batches
from dcp.planner import colgen
from dcp.planner.bounds import capacity_busy
from dcp.planner.feasibility import allowed_sp_sizes
from dcp.planner.ilp import columns
from dcp.planner.ilp import search as search_module
from dcp.planner.ilp.budget import Budget, Deadline
from dcp.planner.ilp.costs import cost_table
from dcp.planner.ilp.pack import estimate, improve
from dcp.planner.ilp.search import Search
from dcp.planner.options import IlpOptions
from dcp.planner.pricing import BatchArrays, Pricer
from tests.conftest import cost_model


def test_knapsack_and_its_items_match_enumeration() -> None:
    """`colgen.knapsack` (weights in whole steps here), bounded knapsacks of up to four items
    (limits from 0 to past what fits): the best value
    within every capacity is the enumerated one, and the items read back keep to their limits,
    cost at most the room and are worth that value."""
    rng = np.random.default_rng(0)
    for _ in range(40):
        n = int(rng.integers(1, 5))
        costs = rng.integers(1, 9, n).astype(np.float64)
        values = rng.random(n) * (rng.random(n) > 0.2)  # some worth nothing
        limits = rng.integers(0, 12, n)
        capacity = int(rng.integers(0, 40))
        best, taken = colgen.knapsack(values, costs, capacity, limits, np.ones(n, dtype=bool), False, capacity)
        for room in range(capacity + 1):
            ranges = [range(min(room // int(c), int(m)) + 1) for c, m in zip(costs, limits, strict=True)]
            expected = max(float(np.dot(k, values)) for k in itertools.product(*ranges) if np.dot(k, costs) <= room)
            assert best[room] == pytest.approx(expected)
        counts = taken(capacity)
        assert (counts <= limits).all() and counts @ costs <= capacity
        assert counts @ values == pytest.approx(best[capacity])



@pytest.fixture(scope="module")
def video():  # noqa: ANN201
    """Open-Sora's 512 videos (a few dozen shapes) on 64 GPUs: the ILP search's cost table,
    shapes, proven busy bound and warm start's busy time."""
    cm = cost_model(model="opensora-stdit-1.1b", gpus=64)
    batch = make_batches("opensora", cm, global_batch=512, steps=1, seed=0)[0]
    search = Search(batch, cm, allowed_sp_sizes(cm), IlpOptions(), Budget.start(60.0, len(batch)))
    search.warm_start()
    shapes = columns.shapes_of(search.table)
    assert shapes is not None
    return cm, batch, search.table, shapes, search.proven, search.incumbent.busy_s


def test_rounded_fractional_optimum_places_every_sample_within_the_gpus(video, monkeypatch) -> None:  # noqa: ANN001
    """With the integer program failing, `column_plan` still returns groups: every sample once,
    at sizes where it runs, on at most N GPUs; the local search brings them within 3% of the
    level asked for (by the estimate), below the bound's 1.1 times."""
    cm, batch, table, shapes, lower, upper = video
    n = cm.cluster.num_gpus
    bound, feasible, start = columns.column_bound(table, shapes, n, lower, upper, Deadline(math.inf), steps=12)
    assert lower <= bound < feasible < upper
    assert feasible <= bound * (1 + 1e-3)  # 12 bisection steps: the two levels close in
    short, found, _ = columns.column_bound(table, shapes, n, lower, upper, Deadline(math.inf), steps=1)
    assert found == pytest.approx((lower + upper) / 2) and short == lower  # one step: feasible halfway
    theta = 1.03 * bound
    monkeypatch.setattr(columns, "integer_copies", lambda *a, **k: None)
    groups = columns.column_plan(table, shapes, n, theta, Deadline(math.inf), start)
    assert groups is not None
    assert sorted(i for _, ids in groups for i in ids) == list(range(len(batch)))
    assert sum(table.sizes[j] for j, _ in groups) <= n
    assert all(table.ckpt[i, j] >= 0 for j, ids in groups for i in ids)
    assert estimate(improve(groups, table, math.inf, 300, n), table) <= theta * 1.03


def test_rounding_places_the_largest_unplaced_videos_on_the_free_gpus(monkeypatch) -> None:  # noqa: ANN001
    """Open-Sora's batch 3 of 512 on 256 GPUs at 1.015 times the column bound: rounded down,
    the fractional optimum leaves GPUs free and videos unplaced. The free GPUs go to the columns
    that place the most of what is left per GPU, so the rounded groups (before any local search)
    stay within 2% of the level by the estimate (0.8% above it here); rounding up the largest
    fractions first left the first batch's 194,400-token video to a group already at the level,
    21% above it. Not every batch rounds this close: batches 0-7 end 0.8-75% above the level
    (within 2%: batches 2 and 3; batch 0, where this was written, 8%) on the counted cost model,
    and 0.6-38% (5 of 8 within 2%) on the estimate before it."""
    cm = cost_model(model="opensora-stdit-1.1b", gpus=256)
    batch = make_batches("opensora", cm, global_batch=512, steps=1, seed=3)[0]
    sizes = allowed_sp_sizes(cm)
    arrays = BatchArrays.of(batch)
    table = cost_table(arrays, cm, sizes, Pricer(cm, sizes))
    shapes = columns.shapes_of(table)
    assert shapes is not None
    lower = capacity_busy(batch, cm, sizes)
    bound, _, start = columns.column_bound(table, shapes, 256, lower, 3 * lower, Deadline(math.inf), steps=14)
    theta = 1.015 * bound
    monkeypatch.setattr(columns, "integer_copies", lambda *a, **k: None)
    groups = columns.column_plan(table, shapes, 256, theta, Deadline(math.inf), start)
    assert groups is not None
    assert sorted(i for _, ids in groups for i in ids) == list(range(len(batch)))
    assert sum(table.sizes[j] for j, _ in groups) <= 256
    assert estimate(groups, table) <= 1.02 * theta


def test_column_levels_are_bisected_below_the_first_that_gives_a_plan(monkeypatch, unhurried) -> None:  # noqa: ANN001
    """Open-Sora's batch 3 of 512 on 256 GPUs, with time to spare: the first column level
    (1.015 times the bound) gives a plan, then levels halfway between the highest without one and
    the lowest with one are tried (`knobs.COLUMN_SPLITS`), each inside the last pair, and the
    plan of a lower level ends the program with a less busy incumbent than the first level's
    alone (1.1312 s against 1.1354 s; the second level, 1.1214 s, gives a plan, the next two
    none). On the counted cost model batches 0, 1 (where this was written), 2 and 4 gain 0-0.12%
    from the lower levels, under the 0.3% asserted."""
    cm = cost_model(model="opensora-stdit-1.1b", gpus=256)
    batch = make_batches("opensora", cm, global_batch=512, steps=1, seed=3)[0]

    def run(splits: int) -> tuple[float, list[tuple[float, bool]]]:
        monkeypatch.setattr(knobs, "COLUMN_SPLITS", splits)
        levels: list[tuple[float, bool]] = []
        plan = columns.column_plan

        def recorded(table, shapes, n, theta, *args, **kwargs):  # noqa: ANN001, ANN202
            groups = plan(table, shapes, n, theta, *args, **kwargs)
            levels.append((theta, groups is not None))
            return groups

        monkeypatch.setattr(search_module, "column_plan", recorded)
        search = Search(batch, cm, allowed_sp_sizes(cm), IlpOptions(), Budget.start(60.0, len(batch)))
        search.warm_start()
        search.column_program()
        return search.incumbent.busy_s, levels

    first_busy, first_levels = run(0)
    busy, levels = run(3)
    assert first_levels == levels[:1] and levels[0][1]  # the first level gives a plan
    lo, hi = levels[0][0] / knobs.COLUMN_LEVELS[0], levels[0][0]  # from the bound up
    for theta, found in levels[1:]:
        assert theta == pytest.approx((lo + hi) / 2)
        lo, hi = (lo, theta) if found else (theta, hi)
    assert len(levels) == 4 and any(found for _, found in levels[1:])
    assert busy < first_busy * (1 - 3e-3)
