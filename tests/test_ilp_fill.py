"""`pricing.Pricer`'s exact vectorized prices, and `fill`, the ILP's warm start under ZeRO-3's heavy fixed costs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dcp.data.batches import make_batches
from dcp.planner import IlpOptions, lower_bound, solve
from dcp.planner.bounds import one_size_busy
from dcp.planner.common import assemble_indices
from dcp.planner.feasibility import allowed_sp_sizes
from dcp.planner.ilp.fill import fill_layouts
from dcp.planner.ilp.warm import baseline_plans
from dcp.planner.pricing import BatchArrays, Pricer
from tests.conftest import ZERO3_LENGTHS, cost_model, make_batch


def fill_plans(batch, cm, sizes, lower_bound_s):
    """`fill_layouts` as plans (assembled and validated)."""
    arrays = BatchArrays.of(batch)
    return [assemble_indices("ilp", batch, cm, layout, lower_bound_s=lower_bound_s, arrays=arrays)
            for layout in fill_layouts(arrays, cm, sizes, Pricer(cm, sizes))]


@pytest.mark.parametrize("model,zero_stage", [("llama-70b", 3), ("llama-7b", 1)])
def test_prices_match_the_cost_model(model: str, zero_stage: int) -> None:
    cm = cost_model(model=model, gpus=32, zero_stage=zero_stage)
    pricer = Pricer(cm, allowed_sp_sizes(cm))
    for p in allowed_sp_sizes(cm):
        tokens = np.array([0, 1, 100, cm.max_tokens(p, 0), cm.max_tokens(p, 0) + 1, 50_000, cm.max_tokens(p, cm.model.num_layers // 2),
                           cm.max_tokens(p, cm.model.num_layers), cm.max_tokens(p, cm.model.num_layers) + 1], float)
        pairs = tokens * (tokens + 1) / 2
        for t, a, got in zip(tokens, pairs, pricer.times(p, tokens, pairs), strict=True):
            r = cm.min_ckpt_layers(t, p) if t > 0 else 0
            want = 0.0 if t == 0 else math.inf if r is None else cm.time_s(t, a, p, r)
            assert got == pytest.approx(want, rel=1e-12), (p, t)


def test_zero3_plans_balanced_slots_ahead_of_the_baselines() -> None:
    """Llama-70B, ZeRO-3, 32 GPUs: stage 3 runs lockstep slots (every rank joins every layer's
    gather), so the ILP's plan, the best priced of its candidates, gives its groups equal numbers
    of micro-batches lined up (`slots.align`): the schedule adds under 4% to its slowest group
    (a single slot per group added 0.2%, at a 3.8% slower step), it is ahead of every
    static baseline by more than 5% (the best of them packs the batch into one 8 x 4 Ulysses x
    ring group of 32, no lockstep waits; the ILP's eight groups of 4 beat it by 10%), no slower
    than dcp-greedy and dcp-greedy-inter (which merge a group's short micro-batches at stage 3:
    inter's plan is 2.4% behind) and within 15% of the bound."""
    cm = cost_model(model="llama-70b", gpus=32, zero_stage=3)
    batch = make_batch(ZERO3_LENGTHS)
    plan = solve(batch, cm.cluster, cm, IlpOptions())
    # ratchet: ZeRO-3 plan within 15% of the lower bound; a margin under what this case gave when written (`pytest tests/test_ilp_fill.py::test_zero3_plans_balanced_slots_ahead_of_the_baselines`)
    assert plan.step_time_s <= lower_bound(batch, cm) * 1.15
    baselines = baseline_plans(batch, cm, allowed_sp_sizes(cm))
    static = [p.step_time_s for p in baselines if not p.strategy.startswith("dcp-greedy")]
    # ratchet: ZeRO-3 plan 5% ahead of the static baselines; a margin under what this case gave when written (`pytest tests/test_ilp_fill.py::test_zero3_plans_balanced_slots_ahead_of_the_baselines`)
    assert plan.step_time_s <= min(static) * 0.95
    assert plan.step_time_s <= min(p.step_time_s for p in baselines)
    assert len({len(g.microbatches) for g in plan.groups}) == 1
    # ratchet: gradient sync at most 4% of the ZeRO-3 step; a margin under what this case gave when written (`pytest tests/test_ilp_fill.py::test_zero3_plans_balanced_slots_ahead_of_the_baselines`)
    assert plan.grad_sync_s <= 0.04 * plan.step_time_s


def test_zero3_at_scale_plans_no_slower_than_the_first_fill(unhurried: None) -> None:
    """Llama-70B, ZeRO-3, 4,096 wikipedia samples on 128 GPUs: the fill runs first there, and the
    plan is never slower than the fill it tries first (its lowest bound). Before, a fill whose
    bound on its busy time was above the least-busy candidate's was not run, though its one slot
    steps faster than that candidate's many unaligned ones (45.9 s against 37.4 s). Unhurried: on
    a loaded machine the limit cut the warm start before its fills, and the check is of which
    plans the solve tries, not of how fast this machine runs them."""
    cm = cost_model(model="llama-70b", gpus=128, zero_stage=3)
    batch = make_batches("wikipedia", cm, global_batch=4096, steps=1, seed=0)[0]
    plan = solve(batch, cm.cluster, cm, IlpOptions())
    first = fill_plans(batch, cm, allowed_sp_sizes(cm), lower_bound(batch, cm))[0]
    assert plan.step_time_s <= first.step_time_s * (1 + 1e-9)


def test_fill_plans_are_valid_and_skip_cheap_fixed_costs() -> None:
    cm = cost_model(model="llama-70b", gpus=32, zero_stage=3)
    batch = make_batch(ZERO3_LENGTHS)
    bound = lower_bound(batch, cm)
    plans = fill_plans(batch, cm, allowed_sp_sizes(cm), bound)
    assert plans
    arrays, pricer = BatchArrays.of(batch), Pricer(cm, allowed_sp_sizes(cm))
    for plan in plans:
        plan.validate()
        assert sorted(i for g in plan.groups for mb in g.microbatches for i in mb.samples) == list(range(len(batch)))
        # Each fill holds groups of one size p: its busy time is above that size's bound.
        (p,) = {g.sp for g in plan.groups}
        assert plan.busy_s() >= one_size_busy(arrays, cm, p, pricer) * (1 - 1e-9)
    # STDiT 1.1B, ZeRO-1: a micro-batch's fixed cost (its weight traffic, 9-29 ms) is under a tenth
    # of what full checkpointing adds to a full micro-batch: canonical micro-batching is right. (Llama-7B
    # pays 31-42 ms of casts and gradient accumulation per micro-batch, 0.09-0.12 of it: filled.)
    cm1 = cost_model(model="opensora-stdit-1.1b", gpus=32)
    assert fill_plans(batch, cm1, allowed_sp_sizes(cm1), lower_bound(batch, cm1)) == []
    cm7 = cost_model(model="llama-7b", gpus=32)
    assert fill_plans(batch, cm7, allowed_sp_sizes(cm7), lower_bound(batch, cm7))


def test_fill_tries_the_most_promising_size_first() -> None:
    """The warm start's share may end after one fill: the first one filled is the one whose bound
    on its busy time is lowest, and on lognormal's 512 samples on 1,024 GPUs that is the fastest
    (SP 16, where largest first filled SP 64's, 14% slower, first)."""
    cm = cost_model(gpus=1024)
    batch = make_batches("lognormal:scale=16", cm, global_batch=512, steps=1, seed=0)[0]
    plans = fill_plans(batch, cm, allowed_sp_sizes(cm), lower_bound(batch, cm))
    assert len(plans) >= 2
    assert plans[0].step_time_s == min(p.step_time_s for p in plans)
    assert {g.sp for g in plans[0].groups} == {16}
