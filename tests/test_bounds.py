"""`lower_bound`: never above the brute-force optimum (ZeRO-1 and ZeRO-3), never below
`capacity_bound`, and tight where the per-micro-batch fixed costs of ZeRO-3 decide the step."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dcp.planner.knobs as knobs
from dcp.costmodel.schedule import least_link_s, least_step_s
from dcp.data.batches import make_batches
from dcp.planner import IlpOptions, bounds, lower_bound, solve
from dcp.planner.bounds import (
    _MEMO,
    _bounds,
    capacity_bound,
    distinct_samples,
    multi_phase_bound,
    multi_phase_busy,
    sample_arrays,
    single_layout_bound,
)
from dcp.planner.bounds.group import _exposure, _Own
from dcp.planner.bounds.release import _fewest_slots
from dcp.planner.bounds.work import _front, _makespan_bound, _Work
from dcp.planner.feasibility import allowed_sp_sizes
from dcp.planner.ilp.warm import baseline_plans
from dcp.planner.pricing import Pricer, exact_times
from tests.brute_helpers import (
    TINY_CASES,
    brute_force,
    brute_force_phases,
    fitting_tiny_case,
    random_plans,
    tiny_cm,
)
from tests.conftest import ZERO3_LENGTHS, cost_model, make_batch

BOUND_CASES = [
    *TINY_CASES,
    ([60] * 6, 2, 2),
    ([50] * 6, 4, 2),
    ([300] * 4 + [20, 20], 2, 2),
]


@pytest.mark.parametrize("lengths,gpus,cap", [([50] * 6, 4, 600), ([653, 1064], 2, 600), ([803, 2297], 2, 600),
                                              ([703, 585, 737, 536], 4, 300), ([529, 1852, 465], 2, 300)])
def test_weighed_fixed_costs_raise_the_bound_and_stay_below_every_multi_phase_plan(
        lengths: list[int], gpus: int, cap: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Charging fixed costs by marginal time, or whole to samples no other like them can join
    (`_Work.weigh`), raises the bound on these batches above the token shares' and keeps it
    below the best multi-phase plan. On six 50-token samples on 4 GPUs it reaches it: the best
    plan puts two samples in a micro-batch on two ranks, and a sample's token share leaves room
    for its partner's tokens but not for the partner's attention, which its time share counts."""
    cm = tiny_cm(gpus, 2, cap)
    batch = make_batch(lengths)
    weighed = multi_phase_bound(batch, cm)
    best = brute_force_phases(batch, cm)
    assert weighed <= best * (1 + 1e-9)

    def token_shares(self: _Work, makespan: float) -> dict[int, int]:
        self.weighting = None
        return {}

    monkeypatch.setattr(_Work, "weigh", token_shares)
    _MEMO.clear()
    plain = multi_phase_bound(batch, cm)
    assert weighed > plain * (1 + 1e-4)
    if lengths == [50] * 6:
        assert weighed >= best * (1 - 1e-4)


def test_each_size_takes_the_weighting_that_raises_the_work_most_given_the_others(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`_Work.weigh` on wikipedia's 2,048 samples on 256 GPUs (batch 0), at the pooled bound:
    with its choice the work is 2% above the token shares', and no size's other weighting
    raises it further (a choice by what each size's rows hold below the others' left 0.09% to
    gain); one pass over the sizes leaves it 0.5% lower, as a size gains from its weighting only
    once the sizes whose rows lay below its own have theirs. The batch's bound stays below the
    planner's plan. The weighting charges fixed costs, so it gains most where they are a large
    share of the work: on the counted cost model (eager elementwise traffic priced per token)
    batches 0-6 gain 0.6-2.1%, batch 0 the most (batch 2, where this was written, 0.75%)."""
    cm = cost_model(gpus=256)
    batch = make_batches("wikipedia", cm, global_batch=2048, steps=1, seed=0)[0]
    work = _Work(*distinct_samples(*sample_arrays(batch)), cm, allowed_sp_sizes(cm))
    m = _makespan_bound(work, cm.cluster.num_gpus)
    plain = work(m)
    work.weigh(m)
    weighed, weighting = work(m), work.weighting.copy()
    # ratchet: the weighting raises the bound 2% over token shares on this batch; a margin under what this case gave when written (`pytest tests/test_bounds.py::test_each_size_takes_the_weighting_that_raises_the_work_most_given_the_others`)
    assert weighed > plain * 1.02
    for p in np.unique(work.row_sizes).tolist():
        for k in range(4):
            work.weighting = np.where(work.row_sizes == p, k, weighting)
            assert work(m) <= weighed * (1 + 1e-12)
    monkeypatch.setattr(knobs, "BOUND_WEIGH_PASSES", 1)
    work.weigh(m)
    # ratchet: one weighing pass leaves the work 0.5% under the full passes'; a margin under what this case gave when written (`pytest tests/test_bounds.py::test_each_size_takes_the_weighting_that_raises_the_work_most_given_the_others`)
    assert work(m) < weighed * 0.995
    monkeypatch.undo()
    _MEMO.clear()
    assert lower_bound(batch, cm) <= solve(batch, cm.cluster, cm, IlpOptions(time_limit_s=0.3)).step_time_s


@pytest.mark.parametrize("zero_stage", [1, 3])
@pytest.mark.parametrize("lengths,gpus,per_node", BOUND_CASES)
def test_bound_never_exceeds_the_optimum(lengths: list[int], gpus: int, per_node: int, zero_stage: int) -> None:
    cm = tiny_cm(gpus, per_node, zero_stage=zero_stage)
    batch = make_batch(lengths)
    sizes = allowed_sp_sizes(cm)
    best = brute_force(batch, cm)  # the least busy time of any plan, plus the least sync any plan adds
    bound = lower_bound(batch, cm)
    tokens, pairs = sample_arrays(batch)
    makespan = _makespan_bound(_Work(*distinct_samples(tokens, pairs), cm, sizes), gpus) + cm.grad_sync_s()
    link = least_link_s(cm, _fewest_slots(float(tokens.sum()), cm, sizes))
    # The reductions no plan hides (`schedule.least_step_s`) may raise it above both parts.
    assert bound >= max(makespan, link) * (1 - 1e-12)
    assert makespan <= best * (1 + 1e-9)
    # The link part (stage 3) and the whole bound against every plan's priced step: random plans
    # of every slot count.
    for plan in random_plans(batch, cm, seed=gpus + len(lengths)):
        assert link <= plan.step_time_s * (1 + 1e-9)
        assert bound <= plan.step_time_s * (1 + 1e-9)
    # Never below the capacity bound (the ILP search's floor), itself valid.
    assert capacity_bound(batch, cm) * (1 - 1e-9) <= bound


@pytest.mark.parametrize("lengths,gpus,slots", [([500] * 8, 2, 2), ([1000, 800, 600, 400, 200, 100], 2, 2),
                                                 ([300] * 6 + [900], 2, 2), ([400] * 10, 4, 1), ([100, 200, 300], 2, 1)])
def test_zero3_bound_counts_every_slots_slowdown_and_stays_below_every_plan(
        lengths: list[int], gpus: int, slots: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """With compute slowed beside collectives (`overlap_slowdown`), every slot of a ZeRO-3 step
    pays s / (1 + s) of its gathers and reduce-scatters at least: the bound counts it for the
    fewest slots the batch runs in (here 300 tokens a GPU unrecomputed: `slots`), and stays below
    every random plan's priced step."""
    import dataclasses

    from dcp.costmodel import CostModel

    tiny = tiny_cm(gpus, 2, cap_tokens=300, zero_stage=3)
    cm = CostModel(tiny.model, dataclasses.replace(tiny.hardware, overlap_slowdown=0.189), tiny.cluster, tiny.training)
    batch = make_batch(lengths)
    bound = lower_bound(batch, cm)
    for plan in random_plans(batch, cm, seed=gpus + len(lengths)):
        assert bound <= plan.step_time_s * (1 + 1e-9)
    tokens, _ = sample_arrays(batch)
    assert _fewest_slots(float(tokens.sum()), cm, allowed_sp_sizes(cm)) == slots
    _MEMO.clear()
    monkeypatch.setattr(bounds, "_fewest_slots", lambda *a: 1)  # the step part as if one slot
    one = lower_bound(batch, cm)
    _MEMO.clear()
    assert bound > one if slots > 1 else bound == one  # tighter by the other slots' share


@settings(max_examples=60)
@given(lengths=st.lists(st.integers(min_value=5, max_value=2400), min_size=1, max_size=5),
       cap=st.sampled_from([300, 600, 1200]), zero_stage=st.sampled_from([1, 3]),
       cluster=st.sampled_from([(2, 2), (4, 2), (4, 4)]))
def test_bound_is_valid_on_random_tiny_batches(lengths: list[int], cap: int, zero_stage: int,
                                               cluster: tuple[int, int]) -> None:
    case = fitting_tiny_case(lengths, cap, zero_stage, cluster)
    if case is None:
        return  # some sample fits nowhere: nothing to bound
    cm, batch = case
    # `brute_force` is the least busy time plus the least sync, below the priced step where the
    # schedule adds more (stage 3's lockstep slots): the busy part against it, the whole bound
    # against plans priced on the schedule.
    tokens, pairs = sample_arrays(batch)
    makespan = _makespan_bound(_Work(*distinct_samples(tokens, pairs), cm, allowed_sp_sizes(cm)), cm.cluster.num_gpus)
    assert makespan + cm.grad_sync_s() <= brute_force(batch, cm) * (1 + 1e-9)
    bound = lower_bound(batch, cm)
    assert all(bound <= plan.step_time_s * (1 + 1e-9) for plan in random_plans(batch, cm, seed=len(lengths), count=8))


def test_zero3_many_short_samples_bound_is_the_optimum() -> None:
    """Six 60-token samples on 2 GPUs under ZeRO-3: the best plan runs three per GPU in one
    micro-batch. Charging each micro-batch's gathers only over the tokens that fit memory
    (`capacity_bound`) leaves the bound 25% below; over the tokens that fit a step of M, 1%."""
    cm = tiny_cm(2, 2, zero_stage=3)
    batch = make_batch([60] * 6)
    best = brute_force(batch, cm)
    busy = best - cm.grad_sync_s()
    assert busy == pytest.approx(cm.time_s(180, 3 * batch[0].attn_pairs, 1, 0))
    assert lower_bound(batch, cm) == pytest.approx(best, rel=0.02)
    assert capacity_bound(batch, cm) < 0.8 * best


def test_zero3_70b_bound_stays_below_every_plan() -> None:
    """Llama-70B under ZeRO-3 on 32 GPUs, a wikipedia-like batch of many short samples. Stage 3
    runs lockstep slots whose per-layer gathers are the step's, not a micro-batch's fixed cost, so
    the work argument no longer sees them; the bound (makespan plus the least sync, or the fewest
    slots' collectives) stays below every plan and within 20% of the best one found (the ILP's,
    whose groups run equal numbers of micro-batches)."""
    cm = cost_model(model="llama-70b", gpus=32, zero_stage=3)
    batch = make_batch(ZERO3_LENGTHS)
    bound = lower_bound(batch, cm)
    plans = baseline_plans(batch, cm, allowed_sp_sizes(cm)) + [solve(batch, cm.cluster, cm)]
    best = min(plans, key=lambda p: p.step_time_s)
    assert all(bound <= p.step_time_s * (1 + 1e-9) for p in plans)
    assert bound >= 0.8 * best.step_time_s
    assert best.strategy == "ilp" and len({len(g.microbatches) for g in best.groups}) == 1


def test_bound_memo_tells_batches_and_cost_models_apart() -> None:
    """The memo (every baseline plan of a batch reports its bound) keys on what the bound reads."""
    cm = tiny_cm(4, 2, zero_stage=3)
    batch = make_batch([100, 200, 300])
    first = lower_bound(batch, cm)
    assert lower_bound(make_batch([100, 200, 1300]), cm) > first
    assert lower_bound(batch, tiny_cm(2, 2, zero_stage=3)) != first  # half the GPUs
    assert lower_bound(batch, tiny_cm.__wrapped__(4, 2, zero_stage=3)) == first  # a twin, computed anew
    assert lower_bound(batch, cm, [1]) >= first  # fewer SP sizes
    assert lower_bound(batch, cm) == first


@pytest.mark.parametrize("lengths,gpus,per_node,cap,zero_stage", [([8, 834, 2399], 4, 2, 1200, 1),
                                                                  ([420, 62], 2, 2, 600, 3)])
def test_longest_sample_group_raises_the_bound_to_the_optimum(lengths: list[int], gpus: int, per_node: int,
                                                              cap: int, zero_stage: int) -> None:
    """The longest sample needs a group of 2 GPUs whose idle time the pooled work count prices
    at one GPU's rate: charging it (`bound_group`) lifts the bound from 2-4% below the optimum
    to within 0.1% of it. What the group leaves after the sample is shorter than any micro-batch
    takes, so the bound every plan respects, multi-phase ones included (`lower_bound`), charges
    it too, and stays below the best multi-phase plan."""
    cm = tiny_cm(gpus, per_node, cap, zero_stage=zero_stage)
    batch = make_batch(lengths)
    best = brute_force(batch, cm)
    bound = single_layout_bound(batch, cm)
    assert bound <= best * (1 + 1e-9)
    assert bound >= best * (1 - 1e-3)
    every = lower_bound(batch, cm)
    assert bound * (1 - 1e-9) <= every <= bound * (1 + 1e-9)
    if zero_stage < 3:  # stage 3 runs one layout
        assert every <= brute_force_phases(batch, cm) * (1 + 1e-9)


def test_longest_sample_group_on_wikipedia_256_gpus() -> None:
    """512 wikipedia samples on 256 GPUs: the 56K-token sample takes a 64- or 128-GPU group with
    rings; the single-layout bound on the busy time rises by 15% above the pooled work count
    and stays below the ILP's plan. The bound for every plan rises by 5% too: what the group
    leaves after the sample is too short for the pooled count's price of its idle time."""
    cm = cost_model(gpus=256)
    batch = make_batches("wikipedia", cm, global_batch=512, steps=1, seed=0)[0]
    sizes = allowed_sp_sizes(cm)
    pooled = _makespan_bound(_Work(*distinct_samples(*sample_arrays(batch)), cm, tuple(sizes)), cm.cluster.num_gpus)
    bound = single_layout_bound(batch, cm)
    sync = cm.grad_sync_s()
    # ratchet: the longest sample's group raises the busy bound 10% over the pooled work; a margin under what this case gave when written (`pytest tests/test_bounds.py::test_longest_sample_group_on_wikipedia_256_gpus`)
    assert bound - sync >= 1.1 * pooled
    assert 1.05 * pooled <= multi_phase_busy(batch, cm) <= bound - sync
    plan = solve(batch, cm.cluster, cm, IlpOptions(time_limit_s=0.5))
    assert bound <= plan.step_time_s * (1 + 1e-9)


def test_ring_exposure_form_stays_below_the_exact_time() -> None:
    """The second form of `bound_group` (a ring's transfers as if never hidden) is a lower bound
    on every micro-batch's exact time, in every ring layout, at every level."""
    cm = cost_model(gpus=256)
    sizes = allowed_sp_sizes(cm)
    pricer, k = Pricer(cm, sizes), cm.model.num_layers
    rng = np.random.default_rng(5)
    tokens = rng.integers(1, 2_000_000, 2000).astype(np.float64)
    pairs = np.maximum(tokens, tokens * (tokens + 1) / 2 * rng.uniform(0, 1, 2000) * rng.choice([1, 1e-3, 1e-6], 2000))
    rings = 0
    for p in sizes:
        for i, layout in enumerate(pricer.layouts(p)):
            if layout.ring == 1:
                continue
            rings += 1
            e0, e_tok, e_pair = _exposure(cm.ring_terms(layout), k)
            for r in (0, k // 2, k):
                lin = cm.layout_linear_time(layout, r)
                form = lin.fixed + lin.per_token * tokens + lin.per_pair * pairs + e0 + e_tok * tokens + e_pair * pairs
                exact = pricer._levels[p].times(i, tokens, pairs, np.full(len(tokens), r))
                assert (form <= exact * (1 + 1e-12)).all()
                if r == 0:  # tight where every transfer is exposed (K forward exposures at r = 0)
                    assert (form > exact * (1 - 1e-9)).any()
    assert rings >= 6


def test_longest_sample_alone_on_half_the_cluster_charges_the_other_half() -> None:
    """wikipedia's first batch of 2,048 on 1,024 GPUs: its 168,456-token sample runs 0.378 s
    alone on 512 GPUs, no less than the pooled work count (0.378 s), and leaves them less time
    than any micro-batch takes, while the other 2,047 samples need more than the other 512 GPUs
    give in that time. The bound for every plan rises by more than 3%, and stays below the
    planner's plan (which may have two phases)."""
    cm = cost_model(gpus=1024)
    batch = make_batches("wikipedia", cm, global_batch=2048, steps=1, seed=0)[0]
    sizes = allowed_sp_sizes(cm)
    pooled = _makespan_bound(_Work(*distinct_samples(*sample_arrays(batch)), cm, tuple(sizes)), cm.cluster.num_gpus)
    # ratchet: half the cluster charged to the longest sample: 3% over pooled (0.378 s case, docstring); a margin under what this case gave when written (`pytest tests/test_bounds.py::test_longest_sample_alone_on_half_the_cluster_charges_the_other_half`)
    assert multi_phase_busy(batch, cm) >= 1.03 * pooled
    plan = solve(batch, cm.cluster, cm, IlpOptions(time_limit_s=1.0))
    assert plan.lower_bound_s <= plan.step_time_s
    assert plan.lower_bound_s >= multi_phase_busy(batch, cm) + cm.grad_sync_s() - 1e-9


def test_coarse_classes_keep_the_bounds_valid_and_close() -> None:
    """Thousands of distinct lengths: the group and spread bounds run on at most 2,048 classes,
    the 16 longest samples as they are and the rest rounded down, so the group bound can only
    fall, and here by less than 0.1%; every sample is still counted once."""
    from dcp.planner.bounds.group import group_bound
    from dcp.planner.bounds.work import _coarse

    cm = cost_model(gpus=256)
    batch = make_batches("lognormal:scale=16", cm, global_batch=8192, steps=1, seed=0)[0]
    sizes = tuple(allowed_sp_sizes(cm))
    work = _Work(*distinct_samples(*sample_arrays(batch)), cm, sizes)
    assert len(work.tokens) > knobs.BOUND_COARSE
    tokens, pairs, weight = _coarse(work)
    assert len(tokens) <= knobs.BOUND_COARSE and weight.sum() == len(batch)
    top = np.sort(work.tokens)[-16:]
    assert np.array_equal(np.sort(tokens)[-16:], top)
    coarse = _Work(tokens, pairs, weight, cm, sizes)
    pooled = _makespan_bound(work, cm.cluster.num_gpus)
    for floor in (None, work.fixed_floor):
        exact, rounded = group_bound(work, cm, sizes, pooled, floor), group_bound(coarse, cm, sizes, pooled, floor)
        assert exact * (1 - 1e-3) <= rounded <= exact * (1 + 1e-4)  # 1e-4: the bisections' width


def test_the_longest_samples_group_leaves_the_reduction_chain_its_time() -> None:
    """Wikipedia's 55,995-token sample among 512 on 256 GPUs runs 0.181 s on 128 of them, 0.06 s
    of it forwards and the top backward, and the chain of gradient reductions takes 0.226 s: a
    rank of its group that runs anything after it ends the step past that, and what it runs
    before it must leave the chain its time. The bound rises by 3% above the work and group
    bounds plus the least synchronization, and stays below every plan the planner prices."""
    cm = cost_model(gpus=256)
    batch = make_batches("wikipedia", cm, global_batch=512, steps=1, seed=0)[0]
    sizes = allowed_sp_sizes(cm)
    bound = multi_phase_bound(batch, cm)
    floors = _bounds(batch, cm, sizes, None)
    # ratchet: the reduction chain's time raises the bound 3% over least_step_s; a margin under what this case gave when written (`pytest tests/test_bounds.py::test_the_longest_samples_group_leaves_the_reduction_chain_its_time`)
    assert bound > least_step_s(cm, floors.makespan, sizes, floors.released) * 1.03
    plans = [solve(batch, cm.cluster, cm, IlpOptions(time_limit_s=1.0))] + baseline_plans(batch, cm, sizes)
    assert all(bound <= p.step_time_s * (1 + 1e-9) for p in plans)


def test_time_less_the_backward_below_the_top_layer_stays_below_the_exact() -> None:
    """`CostModel.linear_less_below`, what the exposure bound charges a micro-batch, is at most
    its exact time less its exact backward and recomputes of layers K-2..0, in every layout (the
    ring's exposed transfers add more to the time than to that backward), and exact where a
    size has one layout, Ulysses alone."""
    cm = cost_model(gpus=256)
    k = cm.model.num_layers
    rng = np.random.default_rng(7)
    tokens = rng.integers(1, 1_000_000, 40).astype(np.float64)
    pairs = np.maximum(tokens, tokens * (tokens + 1) / 2 * rng.uniform(0, 1, 40))
    tight = rings = 0
    for p in allowed_sp_sizes(cm):
        for r in (0, k // 2, k - 1, k):
            form = cm.linear_less_below(p, r)
            for layout in cm.layouts(p):
                rings += layout.ring > 1
                for t, a in zip(tokens.tolist(), pairs.tolist(), strict=True):
                    lt = cm.layer_times(t, a, p, layout)
                    exact = cm.time_s(t, a, p, r, layout) - (k - 1) * lt.backward_s - min(k - 1, r) * lt.recompute_s
                    assert form(t, a) <= exact * (1 + 1e-12)
                    tight += len(cm.layouts(p)) == 1 and form(t, a) >= exact * (1 - 1e-9)
    assert rings and tight


def test_every_rank_leaves_the_reduction_chain_its_time_after_its_last_microbatch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Wikipedia, 512 samples on 256 GPUs (seed 6): a rank issues layer K-1's reduction once its
    last micro-batch is done but for its backward below the top layer, and the chain (0.226 s)
    follows, so the N ranks' ends less those backwards, plus N chains, are at most N steps
    (`_exposure_bound`). With about two samples a rank, few last micro-batches are long: the
    bound rises by more than 1% (1.6%), and stays below every plan the planner prices. On the
    counted cost model seeds 0-25 rise 0-1.9%, six of them over 1% (seed 2, where this was
    written, 0.86%)."""
    without, bound = _with_and_without(monkeypatch, 6, bounds, "_exposure_bound",
                                       lambda coarse, cm, sizes, start_s, chain: start_s)
    # ratchet: the chain after each rank's last micro-batch raises the bound 1%; a margin under what this case gave when written (`pytest tests/test_bounds.py::test_every_rank_leaves_the_reduction_chain_its_time_after_its_last_microbatch`)
    assert bound > without * 1.01


def test_the_release_caps_every_microbatchs_charge(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wikipedia, 512 samples on 256 GPUs (seed 2): the chain (0.226 s) is 80% of the step, and
    every micro-batch's charge (its time, less the backward below the top layer for a rank's
    last) is at most the step less the chain, a tighter cap than the busy time's. Charged on that
    cap too the bound rises by more than 0.5%, and stays below every plan the planner prices."""
    without, bound = _with_and_without(monkeypatch, 2, knobs, "BOUND_CAPPED_CHAIN_SHARE", math.inf)
    # ratchet: the release cap raises the bound 0.5%; a margin under what this case gave when written (`pytest tests/test_bounds.py::test_the_release_caps_every_microbatchs_charge`)
    assert bound > without * 1.005


def test_charges_capped_by_the_release_undercharge_every_microbatch_within_it() -> None:
    """`_Work(capped=True)`: micro-batches drawn at random (SP 1-8, 0, half or all layers
    checkpointed, one to four samples, fitting memory) whose charge, `linear_less_below`, is at
    most R: the capped work at R, token shares or each size's weighting as `weigh` picks, is at
    most their summed p x charge, and above the same work charged on the busy time's cap alone at
    the largest time among them (so the cap is what raises it)."""
    cm = cost_model(gpus=256)
    sizes = allowed_sp_sizes(cm)[:4]
    k = cm.model.num_layers
    rng = np.random.default_rng(3)
    cap_s = 0.05
    tokens: list[float] = []
    pairs: list[float] = []
    charged = longest = 0.0
    while len(tokens) < 400:
        p, r = int(rng.choice(sizes)), int(rng.choice([0, k // 2, k]))
        t = rng.integers(50, 2000 * p, int(rng.integers(1, 5))).astype(np.float64)
        a = t * (t + 1) / 2
        form = cm.linear_less_below(p, r)
        if cm.min_ckpt_layers(t.sum(), p) is None or cm.min_ckpt_layers(t.sum(), p) > r \
                or form(t.sum(), a.sum()) > cap_s:
            continue
        tokens += t.tolist()
        pairs += a.tolist()
        charged += p * form(t.sum(), a.sum())
        longest = max(longest, cm.time_s(t.sum(), a.sum(), p, r))
    t, a, w = np.array(tokens), np.array(pairs), np.ones(len(tokens))
    capped = _Work(t, a, w, cm, sizes, below=True, longest=0.0, capped=True)
    shares = capped(cap_s)
    assert shares <= charged * (1 + 1e-9)
    assert capped.weigh(cap_s) and shares <= capped(cap_s) <= charged * (1 + 1e-9)
    assert shares > _Work(t, a, w, cm, sizes, below=True, longest=0.0)(longest)


def _with_and_without(monkeypatch: pytest.MonkeyPatch, seed: int, owner: object, name: str,
                      stub: object) -> tuple[float, float]:
    """Wikipedia, 512 samples on 256 GPUs: `multi_phase_bound` with `owner.name` replaced by
    `stub`, then as it is; checks the latter is at most the single-layout bound and every plan
    the planner prices."""
    cm = cost_model(gpus=256)
    batch = make_batches("wikipedia", cm, global_batch=512, steps=1, seed=seed)[0]
    monkeypatch.setattr(owner, name, stub)
    _MEMO.clear()
    without = multi_phase_bound(batch, cm)
    monkeypatch.undo()
    _MEMO.clear()
    bound = multi_phase_bound(batch, cm)
    assert single_layout_bound(batch, cm) >= bound
    plans = [solve(batch, cm.cluster, cm, IlpOptions(time_limit_s=1.0))] + baseline_plans(batch, cm, allowed_sp_sizes(cm))
    assert all(bound <= p.step_time_s * (1 + 1e-9) for p in plans)
    return without, bound


def test_micro_batches_of_a_groups_own_take_at_most_the_rate_past_the_fixed_floor() -> None:
    """`_Own`: a rank with a few tens of milliseconds for micro-batches of its own (wikipedia,
    512 samples on 256 GPUs, the bound's weighting as `_bounds` sets it) fills them at random,
    at SP 1-8 and 0, 1 or all checkpointed layers, one to three micro-batches that fit memory
    and the time: what the bound charges their samples, per rank, stays within rate x (the time
    less the least fixed part), and above that time less the fixed part on some, so the rate's
    slack over one GPU-second a second is needed."""
    cm = cost_model(gpus=256)
    batch = make_batches("wikipedia", cm, global_batch=512, steps=1, seed=0)[0]
    sizes = allowed_sp_sizes(cm)
    tokens, pairs, weight = distinct_samples(*sample_arrays(batch))
    work = _Work(tokens, pairs, weight, cm, sizes)
    k, limit = cm.model.num_layers, cm.cluster.memory_bytes
    rng = np.random.default_rng(0)
    checked = over_plain = 0
    for m in (0.2459, 0.3):
        work.weigh(m)
        cost = work.costs(m)
        own = _Own.of(work, work.fixed_floor)
        for _ in range(150):
            own_s = float(rng.uniform(own.floor, 0.12))
            rate = own.rate(m, own_s)
            if rate is None:
                continue
            left, taken = own_s, 0.0
            for _ in range(int(rng.integers(1, 4))):
                q, r = int(rng.choice([p for p in sizes if p <= 8])), int(rng.choice([0, 1, k]))
                t = a = 0.0
                charged = 0.0
                for i in rng.permutation(len(tokens)).tolist():
                    nt, na = t + tokens[i], a + pairs[i]
                    if cm.memory_bytes(nt, q, r) > limit or cm.time_s(nt, na, q, r) > left:
                        continue
                    t, a, charged = nt, na, charged + float(cost[i])
                if t == 0:
                    break
                left -= cm.time_s(t, a, q, r)
                taken += charged / q
            checked += 1
            assert taken <= rate * max(own_s - own.floor, 0.0) * (1 + 1e-9)
            over_plain += taken > own_s - own.floor
    assert checked >= 100 and over_plain > 0


def test_a_groups_own_micro_batches_pay_their_fixed_part_in_the_multi_phase_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Wikipedia, 512 samples on 256 GPUs (seed 0): the 55,995-token sample's 128 ranks have
    0.02-0.05 s before it for micro-batches of their own, and each pays a fixed part of 0.03 s:
    counting what they take at `_Own`'s rate rather than a GPU-second a second raises the bound
    for every plan by more than 1.5%, to the single-layout one, and below every plan the planner
    prices."""
    without, bound = _with_and_without(monkeypatch, 0, _Own, "capped", lambda self, plain, *args: plain)
    # ratchet: a group's own fixed parts raise the multi-phase bound 1.5%; a margin under what this case gave when written (`pytest tests/test_bounds.py::test_a_groups_own_micro_batches_pay_their_fixed_part_in_the_multi_phase_bound`)
    assert bound > without * 1.015


@settings(max_examples=150, deadline=None)
@given(points=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=30))
def test_front_keeps_exactly_the_undominated_samples(points: list[tuple[int, int]]) -> None:
    tokens, pairs = (np.array(v, dtype=np.float64) for v in zip(*points, strict=True))
    undominated = {i for i, (t, a) in enumerate(points)
                   if not any(u >= t and b >= a and (u, b) != (t, a) for u, b in points)}
    assert set(_front(tokens, pairs).tolist()) == undominated


@pytest.mark.parametrize("model,gpus", [("llama-7b", 32), ("llama-3-8b", 64)])
def test_longest_priced_on_the_front_is_the_longest_of_all(model: str, gpus: int) -> None:
    # The work bound prices alone only the samples on the (tokens, pairs) front; with pairs drawn
    # apart from tokens (videos, documents packed or not) the largest least-time-alone over every
    # sample, each at every size where it fits (rings included on Llama-3-8B past its 8 KV heads),
    # must be the same.
    cm = cost_model(model, gpus=gpus)
    sizes = allowed_sp_sizes(cm, None)
    rng = np.random.default_rng(7)
    tokens = rng.integers(1_000, 400_000, 300).astype(np.float64)
    pairs = tokens * rng.uniform(1.0, tokens / 2)
    work = _Work(tokens, pairs, np.ones(len(tokens)), cm, tuple(sizes))
    k = cm.model.num_layers
    least = np.full(len(tokens), np.inf)
    for p in sizes:
        cap = np.array([cm.max_tokens(p, r, cm.cluster.memory_bytes * (1 + 1e-9)) for r in range(k + 1)], dtype=float)
        r0 = np.searchsorted(cap, tokens, side="left")
        least = np.minimum(least, np.where(r0 <= k, exact_times(cm, p, tokens, pairs, np.minimum(r0, k)), np.inf))
    assert work.longest == float(least.max())
    assert work.solo_best[int(np.argmax(work.solo_best))] == work.longest
