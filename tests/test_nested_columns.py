"""Nested plans by column generation (`dcp.planner.nested_columns`): their program's groups at a
level, a plan that beats every single layout, and when the phase search asks for them."""

from __future__ import annotations

import dataclasses
import math
import time

import fakeclock
import numpy as np
import pytest

from dcp.data.batches import make_batches
from dcp.planner import knobs, nested_columns, phases, solve
from dcp.planner.bounds import capacity_busy, multi_phase_busy
from dcp.planner.feasibility import allowed_sp_sizes
from dcp.planner.ilp import columns
from dcp.planner.ilp.budget import Deadline
from dcp.planner.ilp.costs import batch_costs, pack_tokens
from dcp.planner.ilp.pack import group_estimate
from dcp.planner.nested_columns import (
    Nested,
    _Estimates,
    _integer,
    _Program,
    _seed_columns,
    nested_column_plan,
    plan_at,
)
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
    groups, fits = plan_at(table, shapes, cm.cluster.num_gpus, theta, Deadline(math.inf))
    assert groups is not None and fits
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
    """The estimate (`_Estimates`) of the samples `ids` (table indices) at size index j."""
    a = np.zeros(len(shapes.first), dtype=np.int64)
    for t, members in enumerate(shapes.members):
        a[t] = int(np.isin(members, ids).sum())
    return _Estimates(table, shapes.first)(j, a)


def test_nested_plan_runs_below_every_single_layout(videos) -> None:  # noqa: ANN001
    """With time to spare, the nested plan is a validated two-phase plan whose busy time is
    below the configuration program's bound on every single layout's (0.973 s against 0.981 s;
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
    """Two videos a GPU: the phase search asks for a nested column plan only when its share of the
    limit (`NESTED_COLUMNS_SHARE`, 0.7) is at least `NESTED_COLUMNS_MIN_S` (here 0.3 s), after the
    single layout, which then gets at most the rest, and until the search's deadline; with 4
    videos a GPU it does not ask, nor for text (too many shapes for the column program). On a
    clock that moves 1 ms at every reading (`fakeclock.stepping`): the shares are checked, not
    this machine's speed."""
    cm, batch, *_ = videos
    asked: list[tuple[float, float]] = []
    started = [0.0]

    def spy(batch_, cm_, sizes, busy_s, arrays, max_mb, costs, deadline_s, seed=None):  # noqa: ANN001, ANN202
        asked.append((time.perf_counter() - started[0], Deadline.of(deadline_s).at - started[0]))
        assert seed is not None and seed.num_phases == 1  # the single layout's plan starts its programs
        return None

    monkeypatch.setattr(phases, "nested_column_plan", spy)
    monkeypatch.setattr(knobs, "NESTED_COLUMNS_MIN_S", 0.3)
    with fakeclock.stepping(1e-3):
        _ask_for_nested_plans(cm, batch, asked, started)


def _ask_for_nested_plans(cm, batch, asked, started) -> None:  # noqa: ANN001
    phases.solve_phased(batch, cm, IlpOptions(time_limit_s=0.4))
    assert not asked  # 0.28 s: below the minimum
    started[0] = time.perf_counter()
    phases.solve_phased(batch, cm, IlpOptions(time_limit_s=0.8), started[0])
    assert len(asked) == 1
    called_s, deadline_s = asked[0]
    assert called_s <= 0.3 * 0.8 + 0.05  # the single layout took at most its share (and its assembly)
    assert 0.6 <= deadline_s <= 0.8  # the rest, less the reserve for the report
    more = make_batches("opensora", cm, global_batch=4 * cm.cluster.num_gpus, steps=1, seed=0)[0]
    phases.solve_phased(more, cm, IlpOptions(time_limit_s=0.8))
    assert len(asked) == 1
    text = make_batches("wikipedia", cm, global_batch=len(batch), steps=1, seed=0)[0]  # hundreds of shapes
    phases.solve_phased(text, cm, IlpOptions(time_limit_s=0.8))
    assert len(asked) == 1


def test_part_estimates_count_the_canonical_packings_micro_batches(videos) -> None:  # noqa: ANN001
    """The remembered estimate of a part equals `pack.group_estimate` with as many micro-batches
    as `costs.pack_tokens` makes of its videos' shared tokens, on random parts at every size
    (those that fit one micro-batch take the short cut: one), and asking again gives the same."""
    _, _, sizes, _, _, table, _ = videos
    shapes = columns.shapes_of(table)
    estimate = _Estimates(table, shapes.first)
    short_tok, short_pairs, base = (x[shapes.first] for x in table.estimate_terms())
    rng = np.random.default_rng(0)
    one_bin = many = 0
    for _ in range(200):
        j = int(rng.integers(len(sizes)))
        a = rng.integers(0, 3, len(shapes.counts)) * (rng.random(len(shapes.counts)) < 0.3)
        tokens = np.repeat(short_tok[:, j], a)
        tokens = tokens[tokens > 0]
        bins = len(pack_tokens(tokens, np.arange(len(tokens)), float(table.cap0[j])))
        one_bin, many = one_bin + (bins == 1), many + (bins > 1)
        want = 0.0 if not a.any() else float(group_estimate(table, a @ base[:, j], a @ short_tok[:, j],
                                                                a @ short_pairs[:, j], j, bins))
        assert estimate(j, a) == pytest.approx(want, rel=1e-12, abs=1e-15)
        assert estimate(j, a.copy()) == estimate(j, a)
    assert one_bin and many  # both ways were asked


def test_integer_copies_cover_every_video_within_the_cluster(videos) -> None:  # noqa: ANN001
    """At 1.05 times the bound, the fractional optimum's whole copies and the integer program over
    what they leave: at least those whole copies of each column, every video covered, the
    cluster's GPUs at most."""
    cm, _, sizes, _, _, table, busy = videos
    shapes = columns.shapes_of(table)
    program = _Program(table, shapes, cm.cluster.num_gpus, 1.05 * busy, [])
    assert program.generate(Deadline(math.inf)) is True
    copies = _integer(program.master, shapes, cm.cluster.num_gpus, Deadline(math.inf))
    assert copies is not None
    whole = np.floor(program.master.last_values() + 1e-6).astype(np.int64)
    assert (copies >= whole).all() and whole.any()
    cover = np.stack([a for _, a in program.master.cols]).T @ copies
    assert (cover >= shapes.counts).all()
    assert sum(sizes[j] * int(n) for (j, _), n in zip(program.master.cols, copies, strict=True)) <= cm.cluster.num_gpus


def test_topped_up_columns_hold_more_and_still_fit_their_level(videos) -> None:  # noqa: ANN001
    """`_top_up` on the fractional optimum's columns at 1.02 times the bound: each keeps what it
    held, holds no more of a shape than the batch, fits the level by the estimate and is worth at
    least as much at the prices; some grow (the knapsack's rounded weights left them room)."""
    cm, _, sizes, _, _, table, busy = videos
    shapes = columns.shapes_of(table)
    theta = 1.02 * busy
    program = _Program(table, shapes, cm.cluster.num_gpus, theta, [])
    assert program.generate(Deadline(math.inf)) is not None
    _, y = program.master.solve(Deadline(math.inf))
    estimate, grown = program.estimate, 0
    for j, jq, a1, a2 in program.optimum():
        b1, b2 = nested_columns._top_up(estimate, j, jq, a1, a2, y, theta, shapes.counts, program.ok[j], program.ok[jq])
        r = sizes[j] // sizes[jq]
        assert (b1 >= a1).all() and (b2 >= a2).all()
        assert (b1 + r * b2 <= np.maximum(shapes.counts, a1 + r * a2)).all()
        assert estimate(j, b1) + (estimate(jq, b2) if jq != j else 0.0) <= theta
        assert b1 @ y + r * (b2 @ y) >= a1 @ y + r * (a2 @ y)
        grown += int((b1 != a1).any() or (b2 != a2).any())
    assert grown


def test_a_levels_optimum_starts_the_next_level_cut_to_fit(videos) -> None:  # noqa: ANN001
    """`plan_at` leaves its fractional optimum's columns in `carry`; a lower level's program starts
    with them, each cut (videos out) until its parts fit that level."""
    cm, _, sizes, _, _, table, busy = videos
    shapes = columns.shapes_of(table)
    carry: list = []
    plan_at(table, shapes, cm.cluster.num_gpus, 1.05 * busy, Deadline(math.inf), [], (), None, carry)
    assert carry and any(jq != j for j, jq, _, _ in carry)
    low = 1.01 * busy
    estimate = _Estimates(table, shapes.first)
    assert any(estimate(j, a1) + (estimate(jq, a2) if jq != j else 0.0) > low for j, jq, a1, a2 in carry)
    cold = _Program(table, shapes, cm.cluster.num_gpus, low, [])
    program = _Program(table, shapes, cm.cluster.num_gpus, low, [], (), estimate, carry)
    added = [(j, *kind) for (j, _), kind in zip(program.master.cols, program.kinds, strict=True)][len(cold.master.cols):]
    assert len(added) >= len(carry) // 2
    for j, jq, a1, a2 in added:
        assert 0 < estimate(j, a1) + (estimate(jq, a2) if jq != j else 0.0) <= low


def test_other_optima_cover_every_video_and_leave_the_program_as_it_was(videos) -> None:  # noqa: ANN001
    """`Master.values_at` with the columns' GPUs perturbed as `_integer` does (up to
    `knobs.NESTED_PERTURB` more, seeded): values covering every shape within the cluster's GPUs,
    a vertex other than the optimum for some seed, the same ones for the same seed, and the
    program's costs restored (it solves to the same optimum after)."""
    cm, _, sizes, _, _, table, busy = videos
    shapes = columns.shapes_of(table)
    program = _Program(table, shapes, cm.cluster.num_gpus, 1.05 * busy, [])
    assert program.generate(Deadline(math.inf)) is True
    master = program.master
    optimum, _ = master.solve(Deadline(math.inf))
    first = master.last_values()
    a = np.stack([col for _, col in master.cols]).T
    gpus = np.array([sizes[j] for j, _ in master.cols])

    def other(seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        values = master.values_at(gpus * (1 + knobs.NESTED_PERTURB * rng.random(len(gpus))), Deadline(math.inf))
        assert values is not None
        return values

    others = []
    for seed in range(3):
        values = other(seed)
        assert (a @ values >= shapes.counts - 1e-6).all()
        assert values @ gpus <= cm.cluster.num_gpus + 1e-6
        others.append(values)
    assert np.allclose(other(0), others[0])
    assert any(not np.allclose(v, first, atol=1e-6) for v in others)
    assert master.solve(Deadline(math.inf))[0] == pytest.approx(optimum, rel=1e-9)


def test_a_plans_groups_start_the_program_below_its_single_video_columns(videos) -> None:  # noqa: ANN001
    """The single layout's groups as columns (`_seed_columns`: each group's videos by shape, every
    video once) start the program: at a level they all fit, its first optimum needs fewer GPUs
    than over the single-video columns alone, and no more than the plan's own; at a lower level
    they are cut (videos out) until each fits it."""
    cm, batch, sizes, _, _, table, busy = videos
    shapes = columns.shapes_of(table)
    single = solve(batch, cm.cluster, cm, IlpOptions(time_limit_s=0.5, max_phases=1))
    starts = _seed_columns(single, batch, shapes, table)
    assert sum(int(a.sum()) * sum(1 for g in single.groups if g.sp == sizes[j] and _counts(g, batch, shapes) == a.tolist())
               for j, a in starts) == len(batch)
    theta = 1.05 * single.busy_s()  # every group fits by its estimate: nothing is cut
    estimate = _Estimates(table, shapes.first)
    assert all(estimate(j, a) <= theta for j, a in starts)
    cold, _ = _Program(table, shapes, cm.cluster.num_gpus, theta, []).master.solve(Deadline(math.inf))
    seeded, _ = _Program(table, shapes, cm.cluster.num_gpus, theta, [], starts).master.solve(Deadline(math.inf))
    assert seeded < cold
    assert seeded <= sum(g.sp for g in single.groups) + 1e-9
    low = 0.99 * single.busy_s()  # below some groups' estimates: they are cut to fit it
    assert any(estimate(j, a) > low for j, a in starts)
    program = _Program(table, shapes, cm.cluster.num_gpus, low, [], starts)
    added = program.master.cols[len(_Program(table, shapes, cm.cluster.num_gpus, low, []).master.cols):]
    assert len(added) >= len(starts) // 2
    assert all(0 < estimate(j, a) <= low for j, a in added)


def _counts(group, batch, shapes) -> list[int]:  # noqa: ANN001
    """A plan group's videos by shape."""
    index = {s.id: i for i, s in enumerate(batch)}
    ids = [index[i] for mb in group.microbatches for i in mb.samples]
    return [int(np.isin(members, ids).sum()) for members in shapes.members]


def test_levels_go_up_from_the_first_until_a_plan_then_halve_from_the_guess(monkeypatch, videos) -> None:  # noqa: ANN001
    """The levels asked, as multiples of the bound: `FIRST`, then up through `UP` while they give
    no plan; then `GUESS` where it lies between the highest level without a plan and the lowest
    with one, then halfway between those two, until they are `FINEST` apart. A level without a
    plan bounds the search from below whether its fractional program did not fit or only its
    integer program found none."""
    cm, batch, sizes, arrays, pricer, table, busy = videos
    shapes = columns.shapes_of(table)
    groups, fits = plan_at(table, shapes, cm.cluster.num_gpus, 1.07 * busy, Deadline(math.inf))
    assert groups is not None and fits
    cases = (  # (least level whose fractional program fits, levels where the integer program finds none, asked)
        (1.0195, (), [1.0225, 1.0175, 1.02, 1.01875, 1.019375]),
        (1.032, (), [1.0225, 1.0275, 1.035, 1.03125, 1.033125, 1.0321875]),
        (1.0145, (1.0225, 1.02), [1.0225, 1.0275, 1.025, 1.02375, 1.023125]),
        (1.0185, (1.02,), [1.0225, 1.0175, 1.02, 1.02125, 1.020625]),
        (1.015, (), [1.0225, 1.0175, 1.00875, 1.013125, 1.0153125, 1.01421875, 1.014765625]),
    )
    for least, no_integer, want in cases:
        asked: list[float] = []

        def fake(table_, shapes_, n, theta, deadline, pool=None, starts=(), estimate=None, carry=None,  # noqa: ANN001, ANN202
                 least=least, no_integer=no_integer, asked=asked):
            asked.append(theta / busy)
            if theta < least * busy * (1 - 1e-12):
                return None, False
            return (None, True) if any(abs(theta - x * busy) < 1e-9 * busy for x in no_integer) else (groups, True)

        monkeypatch.setattr(nested_columns, "plan_at", fake)
        plan = nested_column_plan(batch, cm, sizes, busy, arrays, None, (pricer, table))
        assert asked == pytest.approx(want, abs=1e-9)
        assert plan is not None


def test_each_groups_part_with_the_longest_sample_runs_last(videos) -> None:  # noqa: ANN001
    """A group's own part runs after its subgroups when it holds the longer sample, before them
    when a subgroup does (its backward pass at the step's end hides the reductions: a 0.014 s
    own part after 0.44 s of subgroups exposed 0.041 s of them)."""
    cm, _, sizes, _, _, table, _ = videos
    j, jq = sizes.index(4), sizes.index(1)
    order = np.argsort(table.solo[:, jq])
    short, longs = [int(order[0])], [[int(i)] for i in order[-4:]]
    assert table.solo[short[0], j] < min(table.solo[i[0], jq] for i in longs)
    late = nested_columns._candidate([Nested(j, short, jq, longs)], table, cm)
    assert [(p, mbs) for _, p, mbs in late.first] == [(4, [short])]
    assert sorted(p for _, p, _ in late.second) == [1, 1, 1, 1]
    early = nested_columns._candidate([Nested(j, [longs[0][0]], jq, [short, [], [], []])], table, cm)
    assert [(p, mbs) for _, p, mbs in early.first] == [(1, [short])]
    assert [(p, mbs) for _, p, mbs in early.second] == [(4, [longs[0]])]


def _with_shape_unrunnable_at(table, row: int, j: int):  # noqa: ANN001, ANN202
    """`table` with sample `row` marked as `cost_table` marks a size it cannot run at: no
    checkpointing level (-1) and infinite costs at size index j."""
    cells = {name: getattr(table, name).copy() for name in ("ckpt", "solo", "load", "add", "marg")}
    cells["ckpt"][row, j] = -1
    for name in ("solo", "load", "add", "marg"):
        cells[name][row, j] = np.inf
    return dataclasses.replace(table, **cells)


def test_a_shape_that_cannot_run_at_a_size_leaves_the_columns_without_it_alone(videos, monkeypatch) -> None:  # noqa: ANN001
    """The longest video of a batch often cannot run at the smallest sizes: its costs there are
    infinite. A part or start column at that size that does not hold it must be priced as if it
    were not in the batch (0 copies of an infinite cost are nothing, not nan): the part estimate
    equals the unmodified table's, and the configuration program keeps a start column that fits."""
    cm, _, sizes, _, _, table, busy = videos
    shapes = columns.shapes_of(table)
    longest = int(np.argmax(table.tokens[shapes.first]))
    gone = _with_shape_unrunnable_at(table, int(shapes.first[longest]), 0)
    a = np.zeros(len(shapes.first), dtype=np.int64)
    a[(longest + 1) % len(a)] = 1  # one other video
    want = _Estimates(table, shapes.first)(0, a)
    assert math.isfinite(want)
    assert _Estimates(gone, shapes.first)(0, a) == want
    # The configuration program at a level the column fits starts from it.
    kept = []
    real = columns.master_at
    monkeypatch.setattr(columns, "master_at", lambda t, s, theta, cols=(): kept.extend(cols) or real(t, s, theta, cols))
    columns.column_plan(gone, shapes, cm.cluster.num_gpus, 1.05 * busy, Deadline(math.inf), start=[(0, a)])
    assert [(j, list(c)) for j, c in kept] == [(0, list(a))]
