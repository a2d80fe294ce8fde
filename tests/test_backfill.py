"""Backfill plans: the samples that need SP > 1 first, the rest after them at SP 1 on every rank
as it frees up; their structure, their bound, the hidden reductions, the gates, and that the
planner keeps them only when they beat the single layout."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dcp.planner.knobs as knobs
from dcp.costmodel import TrainingSetup
from dcp.costmodel.model import CostModel
from dcp.costmodel.schedule import reduction_chain_s
from dcp.data.batches import make_batches
from dcp.planner import IlpOptions, backfill, solve
from dcp.planner.backfill import (
    _hiding_tokens,
    _lpt,
    _rebalance,
    _unexposed,
    backfill_plan,
    least_groups_gpus,
    pack_per_size,
)
from dcp.planner.bounds import multi_phase_bound, multi_phase_busy
from dcp.planner.feasibility import allowed_sp_sizes
from dcp.planner.ilp import Beaten, solve_ilp, solve_ilp_against
from dcp.planner.ilp.budget import final_pricing_s
from dcp.planner.ilp.costs import cost_table
from dcp.planner.plan import Plan
from dcp.planner.pricing import BatchArrays, Pricer
from dcp.planner.simulate import simulate
from tests.conftest import cost_model, make_batch


def mixed_batch(n_short: int = 1200, seed: int = 0) -> list:
    """A few samples too long for one GPU and many short ones (wikipedia-like)."""
    rng = np.random.default_rng(seed)
    lengths = [90_000, 60_000, 40_000, 30_000, 22_000] + rng.integers(100, 3000, n_short).tolist()
    return make_batch(lengths)


def test_cores_run_first_and_fillers_after_at_sp1_on_freed_ranks() -> None:
    cm = cost_model(gpus=64)
    batch = mixed_batch()
    sizes = allowed_sp_sizes(cm)
    busy = multi_phase_busy(batch, cm, sizes)
    plan = backfill_plan(batch, cm, sizes, busy)
    assert plan is not None and plan.num_phases == 2
    cap1 = cm.max_tokens(1, 0)
    tokens = {s.id: s.tokens for s in batch}
    first, second = plan.phases()
    # Phase 1 holds every sample too long for SP 1 without checkpointing; phase 2 only SP-1 groups
    # of samples that fit there, each on a rank once that rank's part of phase 1 is done.
    long_ids = {s.id for s in batch if s.tokens > cap1}
    assert long_ids <= {i for g in first for mb in g.microbatches for i in mb.samples}
    assert any(g.sp > 1 for g in first)
    assert all(g.sp == 1 and all(tokens[i] <= cap1 for mb in g.microbatches for i in mb.samples) for g in second)
    starts = plan.group_starts_s()
    ends = {r: starts[k] + g.busy_s for k, g in enumerate(plan.groups) if g.phase == 0 for r in g.ranks}
    for k, g in enumerate(plan.groups):
        if g.phase == 1:
            assert starts[k] == pytest.approx(ends.get(g.ranks[0], 0.0))
    assert plan.busy_s() >= busy * (1 - 1e-9)  # the multi-phase bound holds for it
    assert sorted(i for g in plan.groups for mb in g.microbatches for i in mb.samples) == list(range(len(batch)))
    # The executor's timeline replays it at the priced step, and it survives its JSON.
    assert simulate(plan, cm).step_time_s == pytest.approx(plan.step_time_s)
    assert Plan.from_json(plan.to_json()).digest() == plan.digest()


def test_no_short_backfill_ends_inside_the_reduction_chain() -> None:
    """A rank whose last micro-batch is a few hundred tokens near the step's end exposes the
    whole gradient-reduction chain: the backfill never leaves one there."""
    cm = cost_model(gpus=64)
    batch = mixed_batch(seed=1)
    sizes = allowed_sp_sizes(cm)
    plan = backfill_plan(batch, cm, sizes, multi_phase_busy(batch, cm, sizes))
    assert plan is not None
    arrays = BatchArrays.of(batch)
    chain = reduction_chain_s(cm)
    hide = _hiding_tokens(cm, cost_table(arrays, cm, sizes, Pricer(cm, sizes)), chain)
    assert hide > 0 and chain is not None
    starts, end = plan.group_starts_s(), plan.busy_s()
    tokens = {s.id: s.tokens for s in batch}
    for k, g in enumerate(plan.groups):
        if g.phase == 1 and sum(tokens[i] for mb in g.microbatches for i in mb.samples) < hide:
            assert starts[k] + g.busy_s <= end - float(chain[-1]) + 1e-9
    # ...so the step adds little to the busy time: the least any plan adds, plus one layer's share.
    assert plan.step_time_s - plan.busy_s() <= cm.grad_sync_s() + float(np.max(np.diff(chain))) * 2


def test_a_short_core_group_runs_after_its_ranks_fillers() -> None:
    """Wikipedia, 8,192 samples on 1,024 GPUs: where a core group's room is too short for a
    backfill after it, its ranks run their SP-1 fillers first and the core group after them,
    so its long micro-batch still ends the step there."""
    cm = cost_model(gpus=1024)
    batch = make_batches("wikipedia", cm, global_batch=8192, steps=1, seed=0)[0]
    sizes = allowed_sp_sizes(cm)
    plan = backfill_plan(batch, cm, sizes, multi_phase_busy(batch, cm, sizes))
    assert plan is not None and plan.num_phases == 2
    starts = plan.group_starts_s()
    late = [k for k, g in enumerate(plan.groups) if g.phase == 1 and g.sp > 1]
    assert late
    for k in late:
        g = plan.groups[k]
        before = [(i, h) for i, h in enumerate(plan.groups) if h.phase == 0 and set(h.ranks) & set(g.ranks)]
        assert before and all(h.sp == 1 for _, h in before)
        assert starts[k] == pytest.approx(max(starts[i] + h.busy_s for i, h in before))
    assert simulate(plan, cm).step_time_s == pytest.approx(plan.step_time_s)


def test_a_core_group_whose_size_costs_the_fillers_less_than_a_fixed_cost_takes_them_inside() -> None:
    """Wikipedia, 2,048 samples on 256 GPUs, batch 1 (a busy time near 1 s): a core group at a
    small size adds less to the fillers' marginal cost than a second micro-batch's fixed cost
    on each of its ranks, so it takes fillers into its own micro-batches; the plan ends within
    3% of the bound (3.7% when such fillers ran after it at SP 1, at targets 1.0 and 1.02)."""
    cm = cost_model(gpus=256)
    batch = make_batches("wikipedia", cm, global_batch=2048, steps=1, seed=1)[0]
    sizes = allowed_sp_sizes(cm)
    busy = multi_phase_busy(batch, cm, sizes)
    plan = backfill_plan(batch, cm, sizes, busy)
    assert plan is not None
    table = cost_table(BatchArrays.of(batch), cm, sizes)
    fits_one = {batch[i].id for i in np.flatnonzero((table.ckpt[:, 0] == 0) & (table.solo[:, 0] <= busy))}
    inside = [g for g in plan.phases()[0] if g.sp > 1 and any(i in fits_one for mb in g.microbatches for i in mb.samples)]
    assert inside
    # ratchet: backfill within 3% of the multi-phase bound; a margin under what this case gave when written (`pytest tests/test_backfill.py::test_a_core_group_whose_size_costs_the_fillers_less_than_a_fixed_cost_takes_them_inside`)
    assert plan.step_time_s <= 1.03 * multi_phase_bound(batch, cm, sizes)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 2.5), st.integers(0, 3)), min_size=1, max_size=60),
       st.floats(0.2, 2.0))
def test_least_groups_gpus_never_exceeds_the_packing(items: list[tuple[float, int]], target: float) -> None:
    """The count `pack_per_size` refuses a cluster by before packing: at most the GPUs of its
    groups (so no packing that fits is refused), and equal to them where each sample must be
    alone (every cost over half the target); with the cap, None exactly when they do not fit."""
    sizes = [1, 2, 4, 8]
    cost = np.zeros((len(items), len(sizes)))
    choice = np.array([j for _, j in items])
    cost[np.arange(len(items)), choice] = [c for c, _ in items]
    groups = pack_per_size(np.arange(len(items)), choice, cost, target, sizes, num_gpus=10**9)
    packed = sum(sizes[j] for _, j, _ in groups)
    least = least_groups_gpus(cost[np.arange(len(items)), choice], choice, target, sizes)
    assert least <= packed
    for cap in (packed - 1, packed):
        capped = pack_per_size(np.arange(len(items)), choice, cost, target, sizes, cap)
        assert capped == (None if cap < packed else groups)
    if all(c > target / 2 for c, _ in items):
        assert least == packed == sum(sizes[j] for _, j in items)


def test_a_target_whose_cores_cannot_fit_is_refused_as_packing_would() -> None:
    """Too many cores for the GPUs: the count refuses the target and the backfill gives no plan."""
    cm = cost_model(gpus=4)
    batch = mixed_batch(n_short=40)
    sizes = allowed_sp_sizes(cm)
    assert backfill_plan(batch, cm, sizes, multi_phase_busy(batch, cm, sizes)) is None
    table = cost_table(BatchArrays.of(batch), cm, sizes)
    cores = np.flatnonzero(table.ckpt[:, 0] != 0)
    choice = np.argmin(np.where(table.ckpt[cores] >= 0, table.solo[cores] * np.asarray(sizes), np.inf), axis=1)
    target = float(multi_phase_busy(batch, cm, sizes))
    least = least_groups_gpus(table.solo[cores, choice], choice, target, sizes)
    packed = sum(sizes[j] for _, j, _ in pack_per_size(cores, choice, table.solo, target, sizes, num_gpus=10**9))
    assert cm.cluster.num_gpus < least <= packed  # refused by the count, before any packing
    assert pack_per_size(cores, choice, table.solo, target, sizes, cm.cluster.num_gpus) is None


@pytest.mark.parametrize("n, free, busy", [(3000, 40, 24), (40_000, 10, 6)])  # rounds; rounds, then water
def test_lpt_places_every_filler_once_within_capacity_and_balanced(n: int, free: int, busy: int) -> None:
    rng = np.random.default_rng(3)
    tokens = rng.integers(50, 2000, n).astype(np.float64)
    marg = tokens * 1e-4
    order = np.argsort(-marg, kind="stable")
    ready = np.concatenate([np.zeros(free), rng.uniform(0.0, 1.5 * n / 3000, busy)])
    fixed, cap = 0.01, 16000.0
    fills, ends, total = _lpt(order, ready, tokens, marg, fixed, cap)
    placed = sorted(i for mbs in fills for mb in mbs for i in mb)
    assert placed == list(range(n))
    assert all(tokens[mb].sum() <= cap for mbs in fills for mb in mbs)
    # Next fit, in arrival order: a slot opens a micro-batch only when its next filler overflows
    # the open one (no fixed cost paid for room left behind).
    assert all(tokens[a].sum() + tokens[b[0]] > cap for mbs in fills for a, b in zip(mbs[:-1], mbs[1:], strict=True))
    for s, mbs in enumerate(fills):  # each slot's end is its ready time plus what it runs, exactly
        assert ends[s] == pytest.approx(ready[s] + sum(marg[mb].sum() + fixed for mb in mbs))
        assert total[s] == pytest.approx(sum(tokens[mb].sum() for mb in mbs))
    used = [s for s in range(len(fills)) if fills[s]]
    biggest = float(marg.max()) + fixed
    assert ends.max() - ends[used].min() <= 2 * biggest


def test_rebalance_lowers_the_last_end_and_keeps_every_filler() -> None:
    rng = np.random.default_rng(5)
    tokens = rng.integers(100, 1500, 400).astype(np.float64)
    marg = tokens * 1e-4
    fixed, cap, hide = 0.01, 400_000.0, 2000.0
    # An uneven start: slot 0 holds twice what each other one does, slot 4 nothing.
    fills: list[list[list[int]]] = [[list(range(0, 200))], [list(range(200, 267))], [list(range(267, 334))],
                                    [list(range(334, 400))], []]
    ready = np.array([0.0, 0.1, 0.1, 0.1, 0.0])
    ends = np.array([ready[s] + sum(fixed + marg[mb].sum() for mb in mbs) for s, mbs in enumerate(fills)])
    after = _rebalance(fills, ends.copy(), tokens, marg, cap, hide)
    assert after.max() < ends.max() - 1.0  # 16 moves (4 per slot) of fillers of 0.01-0.15 s
    assert sorted(i for mbs in fills for mb in mbs for i in mb) == list(range(400))
    for s, mbs in enumerate(fills[:4]):  # ends stay exact, capacity and hiding length hold
        assert after[s] == pytest.approx(ready[s] + fixed + marg[mbs[0]].sum())
        assert hide <= tokens[mbs[0]].sum() <= cap
    assert fills[4] == [] and after[4] == 0.0  # no micro-batch opened on the slot that had none


def test_a_short_late_backfill_moves_to_a_running_slot_not_an_empty_one() -> None:
    tokens = np.array([100.0, 100.0, 5000.0, 5000.0])
    marg = tokens * 1e-5
    fixed, cap, hide = 0.01, 16000.0, 1000.0
    chain = np.array([0.05, 0.1, 0.2])
    # Slot 0: 200 tokens ending last (inside the chain); slot 1: its fillers would run before its
    # core group (size inf) but it got none; slot 2: a long backfill that ends early.
    fills: list[list[list[int]]] = [[[0, 1]], [], [[2, 3]]]
    ends = np.array([1.0, 0.5, 0.6])
    after = _unexposed(fills, ends.copy(), np.array([200.0, np.inf, 10000.0]), tokens, marg, fixed, cap, hide, chain)
    assert fills == [[], [], [[2, 3, 0, 1]]]  # into slot 2's open micro-batch, none opened on slot 1
    assert after[2] == pytest.approx(0.6 + marg[0] + marg[1])
    assert after[0] == pytest.approx(1.0 - fixed - marg[0] - marg[1]) and after[1] == 0.5


def test_gates_give_none() -> None:
    cm = cost_model(gpus=64)
    sizes = allowed_sp_sizes(cm)
    few = mixed_batch(n_short=knobs.BACKFILL_MIN_PER_GPU * 64 - 6)  # one sample per GPU short of the gate
    assert backfill_plan(few, cm, sizes, multi_phase_busy(few, cm, sizes)) is None
    batch = mixed_batch()
    busy = multi_phase_busy(batch, cm, sizes)
    assert backfill_plan(batch, cm, [p for p in sizes if p > 1], busy) is None  # SP 1 not allowed
    zero3 = CostModel(cm.model, cm.hardware, cm.cluster, TrainingSetup(zero_stage=3))
    assert backfill_plan(batch, zero3, sizes, busy) is None  # stage 3 runs one layout
    # The micro-batch cap: never a plan past it (None instead), below the uncapped plan's most a
    # plan that keeps it, and the plan itself once the cap is its own. Wikipedia's batch 1 of 1,024
    # on 32 GPUs: 6 micro-batches uncapped, a plan under a cap of 5. On the counted cost model no
    # cap below the most gives a plan for the mixed batches (n_short 300-4,800 on 16-128 GPUs,
    # seeds 0-30 at 1,200 on 64) nor for wikipedia's 1,024 and 2,048 on 64 GPUs: every level's
    # plan there runs as many micro-batches in its busiest group, which would leave the cap's plan
    # untested. A roomy time limit: every level is tried at any load.
    cm = cost_model(gpus=32)
    sizes = allowed_sp_sizes(cm)
    batch = make_batches("wikipedia", cm, global_batch=1024, steps=1, seed=1)[0]
    busy = multi_phase_busy(batch, cm, sizes)
    uncapped = backfill_plan(batch, cm, sizes, busy, time_limit_s=100)
    most = max(len(g.microbatches) for g in uncapped.groups)
    assert most >= 2
    kept = []
    for cap in range(1, most + 1):
        capped = backfill_plan(batch, cm, sizes, busy, max_microbatches=cap, time_limit_s=100)
        assert capped is None or all(len(g.microbatches) <= cap for g in capped.groups)
        kept += [cap] if capped is not None and cap < most else []
    assert kept, f"no cap below {most} micro-batches gave a plan: the cap was never exercised"
    assert capped is not None and capped.digest() == uncapped.digest()


def test_few_per_gpu_on_a_cluster_too_large_for_the_limit_gets_no_backfill() -> None:
    # Its assembly alone (a group per GPU) would take more than knobs.BACKFILL_FEW_COST_SHARE of the limit: the
    # time goes to the single layout instead. Many per GPU keep it at any limit.
    cm = cost_model(gpus=64)
    sizes = allowed_sp_sizes(cm)
    few = mixed_batch(n_short=knobs.BACKFILL_MIN_PER_GPU * 64)
    assert len(few) < knobs.BACKFILL_FEW_PER_GPU * 64
    predicted = final_pricing_s(len(few), len(few), 64, 1.0)
    busy = multi_phase_busy(few, cm, sizes)
    assert backfill_plan(few, cm, sizes, busy, time_limit_s=predicted / knobs.BACKFILL_FEW_COST_SHARE * 1.01) is not None
    assert backfill_plan(few, cm, sizes, busy, time_limit_s=predicted / knobs.BACKFILL_FEW_COST_SHARE * 0.99) is None
    many = mixed_batch(n_short=knobs.BACKFILL_FEW_PER_GPU * 64)
    tight = final_pricing_s(len(many), len(many), 64, 1.0) / knobs.BACKFILL_FEW_COST_SHARE * 0.99
    assert backfill_plan(many, cm, sizes, multi_phase_busy(many, cm, sizes), time_limit_s=tight) is not None


@pytest.mark.parametrize("per_gpu", [knobs.BACKFILL_MIN_PER_GPU, knobs.BACKFILL_FEW_PER_GPU])
def test_targets_after_the_first_two_go_the_faster_ones_way(per_gpu: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Below knobs.BACKFILL_FEW_PER_GPU samples per GPU the backfill stops after the first two targets, however
    # much time is left; from it on it goes on through the targets on the side of the faster of
    # those two (knobs.BACKFILL_ONWARD). Targets are recorded as multiples of a floor far below any plan, so
    # no plan ends close enough to it to stop them early.
    cm = cost_model(gpus=32)
    batch = mixed_batch(n_short=per_gpu * 32 - 5)
    sizes = allowed_sp_sizes(cm)
    floor = multi_phase_busy(batch, cm, sizes) / 2
    tried: list[float] = []
    busy: dict[float, float] = {}
    original = backfill._candidate

    def recording(table, cm, arrays, pricer, target_s, *rest):  # noqa: ANN001, ANN002, ANN202
        level = round(target_s / floor, 6)
        tried.append(level)
        cand = original(table, cm, arrays, pricer, target_s, *rest)
        if cand is not None:
            busy[level] = min(busy.get(level, np.inf), cand.busy_s)
        return cand

    monkeypatch.setattr(backfill, "_candidate", recording)
    backfill_plan(batch, cm, sizes, floor)
    levels = list(dict.fromkeys(tried))  # each target once (two placements may try it)
    assert levels[:2] == list(knobs.BACKFILL_LEVELS)
    if per_gpu < knobs.BACKFILL_FEW_PER_GPU:
        assert levels == list(knobs.BACKFILL_LEVELS)
    else:
        up = busy.get(knobs.BACKFILL_LEVELS[1], np.inf) < busy.get(knobs.BACKFILL_LEVELS[0], np.inf)
        assert levels[2:] == [round(x, 6) for x in knobs.BACKFILL_ONWARD[up]]
        assert sorted(knobs.BACKFILL_ONWARD[0]) == sorted(knobs.BACKFILL_ONWARD[1])  # the same targets either way


def test_the_planner_keeps_a_backfill_only_when_it_beats_the_single_layout() -> None:
    """Wikipedia, 8,192 samples on 1,024 GPUs (batch 0): the single layout runs the short samples
    beside the long ones at SP 16-128; the backfill runs them at SP 1 after, and the planner
    returns it (1.036 s against 1.095 s for the single layout planned alone in the same second.
    On batch 1 the single layout planned alone, its best fit included, now runs 0.830 s, below
    the planner's backfill at 0.836 s: inside `solve` the phase search leaves it less time)."""
    cm = cost_model(gpus=1024)
    batch = make_batches("wikipedia", cm, global_batch=8192, steps=1, seed=0)[0]
    options = IlpOptions(time_limit_s=1.0)
    single = solve_ilp(batch, cm, options)
    plan = solve(batch, cm.cluster, cm, options)
    assert plan.num_phases == 2 and plan.notes[0].startswith("best plan from: backfill (the single layout's: ")
    assert plan.step_time_s < single.step_time_s
    assert plan.solver_status.endswith("2 phases") and plan.gap < (single.step_time_s - plan.lower_bound_s) / single.step_time_s


def test_solve_ilp_against_skips_assembly_only_when_it_cannot_win() -> None:
    cm = cost_model(gpus=8)
    batch = make_batch([300 + (37 * i) % 2500 for i in range(64)])
    options = IlpOptions(time_limit_s=0.3)
    beaten = solve_ilp_against(batch, cm, options, beat_s=0.0)
    assert isinstance(beaten, Beaten)
    assert beaten.solver_status.startswith("highs: ") and beaten.notes[0].startswith("best plan from: ")
    assert beaten.notes[-1].startswith("seconds: ")
    plan = solve_ilp_against(batch, cm, options, beat_s=float("inf"))
    assert isinstance(plan, Plan) and plan.step_time_s > 0
