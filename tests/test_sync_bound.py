"""The step bound's synchronization part (`schedule.least_step_s`): no plan hides more of the
gradient reductions than the slowest group's last backward and the longest samples allow, and
where the reductions outlast the backward passes (wikipedia on 1024 GPUs) the bound meets the
ILP's plan."""

from __future__ import annotations

import numpy as np
import pytest

from dcp.costmodel.schedule import least_step_s, reduction_chain_s
from dcp.data.batches import make_batches
from dcp.planner import IlpOptions, lower_bound, solve
from dcp.planner.bounds import _bounds, distinct_samples, multi_phase_bound, sample_arrays
from dcp.planner.bounds.release import _released, _Spread
from dcp.planner.bounds.work import _makespan_bound, _Work
from dcp.planner.common import chain
from dcp.planner.feasibility import allowed_sp_sizes
from dcp.planner.pricing import BatchArrays, Pricer, group_layout, price_layout
from dcp.planner.sync import layout_step_s
from tests.brute_helpers import random_plans
from tests.conftest import cost_model, make_batch

# Many GPUs for few, mostly short samples: each layer's all-reduce over 64 GPUs outlasts one
# layer's backward of a short micro-batch, so most of the reduction chain is exposed.
LENGTHS = [120, 300, 700, 1500, 2500, 4000, 6000, 9000, 14_000, 30_000]


def _plans(cm, batch, seed):  # noqa: ANN001, ANN202
    """Random single-layout plans, and two-phase plans chaining random plans of two halves."""
    singles = random_plans(batch, cm, seed=seed, count=40)
    head, tail = batch[len(batch) // 2:], batch[:len(batch) // 2]
    phased = [chain("random", batch, [a, b], cm)
              for a, b in zip(random_plans(head, cm, seed=seed + 1, count=15),
                              random_plans(tail, cm, seed=seed + 2, count=15), strict=True)]
    return singles + phased


@pytest.mark.parametrize("gpus,zero_stage,binds", [(64, 0, True), (64, 2, False), (16, 1, False)])
def test_no_plan_hides_more_than_the_bound_allows(gpus: int, zero_stage: int, binds: bool) -> None:
    """Every random plan's priced step (its schedule, `sync.price_step` / `phased_step_s`) is at
    least the bound at its own busy time, and at least the batch's bound. With ZeRO-0's
    all-reduces over 64 GPUs the chain raises the batch's bound; reduce-scatters (stage 2) and 16
    GPUs hide under the longest sample's backward."""
    cm = cost_model(gpus=gpus, zero_stage=zero_stage)
    batch = make_batch(LENGTHS)
    sizes = allowed_sp_sizes(cm)
    released = _bounds(batch, cm, sizes, None).released
    bound = multi_phase_bound(batch, cm)
    plans = _plans(cm, batch, seed=gpus + zero_stage)
    assert sum(p.num_phases > 1 for p in plans) == 15
    tight = 0
    for plan in plans:
        own = least_step_s(cm, plan.busy_s(), sizes, released)
        assert own <= plan.step_time_s * (1 + 1e-9)
        assert bound <= plan.step_time_s * (1 + 1e-9)
        tight += own > plan.step_time_s * (1 - 0.05)
    assert tight >= 3  # not vacuous: some plans' steps are within 5% of it
    tokens, pairs = sample_arrays(batch)
    makespan = _makespan_bound(_Work(*distinct_samples(tokens, pairs), cm, sizes), gpus)
    rise = lower_bound(batch, cm) - (makespan + cm.grad_sync_s())
    assert rise >= -1e-12
    if binds:  # above the busy bound plus the least any plan adds, by part of the exposed chain
        assert rise > 0.1 * (reduction_chain_s(cm)[-1] - cm.grad_sync_s())


def test_released_is_below_the_longest_samples_micro_batches() -> None:
    """`_released` (the longest sample's time outside the backward below each layer, alone, at
    its best layout) is at most when any group holding it in its last micro-batch issues each
    reduction: micro-batches of the longest sample and random others, at every layout and
    checkpointed-layer count where they fit."""
    cm = cost_model(gpus=64)
    batch = make_batch(LENGTHS)
    sizes = allowed_sp_sizes(cm)
    released = _released(cm, sizes, *sample_arrays(batch))
    k, fit = cm.model.num_layers, cm.fit
    rng = np.random.default_rng(3)
    checked = 0
    for _ in range(300):
        p = int(rng.choice(sizes))
        layout = cm.layouts(p)[int(rng.integers(len(cm.layouts(p))))]
        others = [t for t in LENGTHS[:-1] if rng.random() < 0.3]
        tokens = float(LENGTHS[-1] + sum(others))
        pairs = float(sum(t * (t + 1) / 2 for t in [LENGTHS[-1], *others]))
        r = int(rng.integers(k + 1))
        if tokens > cm.priceable_tokens(p) or cm.memory_bytes(tokens, p, r, layout) > cm.cluster.memory_bytes:
            continue
        lt = cm.layer_times(tokens, pairs, p, layout)
        bwd = lt.bwd_compute_s + lt.comm_s + lt.ring_bwd_s
        rec = lt.rec_compute_s + lt.comm_s + lt.ring_fwd_s
        time = cm.time_s(tokens, pairs, p, r, layout)
        below = np.array([u * bwd + min(u, r) * rec for u in range(k)])
        assert (released <= (time - below) * (1 + 1e-12)).all()
        assert fit.microbatch_fixed_s <= time
        checked += 1
    assert checked >= 50


def _group_releases(cm, plan, by_id) -> np.ndarray:  # noqa: ANN001
    """Per layer, the latest time any group of a single-layout plan issues its reduction: its
    busy time less its last micro-batch's backward (and recompute) of the layers below."""
    k = cm.model.num_layers
    latest = np.zeros(k)
    for g in plan.groups:
        if not g.microbatches:
            continue
        last = g.microbatches[-1]
        tokens = sum(by_id[i].tokens for i in last.samples)
        pairs = sum(by_id[i].attn_pairs for i in last.samples)
        lt = cm.layer_times(tokens, pairs, g.sp, group_layout(g))
        below = np.array([u * lt.backward_s + min(u, last.ckpt_layers) * lt.recompute_s for u in range(k)])
        latest = np.maximum(latest, g.busy_s - below)
    return latest


def test_spread_release_is_below_every_plans_and_raises_the_bound() -> None:
    """128 short samples (100-1,500 tokens) on 64 GPUs (ZeRO-1): no random plan's groups issue
    each layer's reduction, at the latest, before `_Spread.at` its busy time (the batch's forward
    work outside the backward below the layer, over 64 GPUs, each sample in a layout where it
    runs within that time), and every plan's step is above the bound. It is the part that binds
    here: the bound rises by more than 2% over the longest samples' releases (`_released`: 11.8%),
    and the ILP's plan is within 2% of it. (Up to 3,000 tokens, where this was written, the
    counted cost model's per-token work puts the bound where the spread adds nothing, seeds 0-3;
    up to 1,500 it adds 11.8% at seeds 0-2 and 12.5% on 128 GPUs.)"""
    cm = cost_model(gpus=64, zero_stage=1)
    rng = np.random.default_rng(0)
    batch = make_batch([int(t) for t in rng.integers(100, 1500, 128)])
    by_id = {s.id: s for s in batch}
    sizes = allowed_sp_sizes(cm)
    tokens, pairs = sample_arrays(batch)
    spread = _Spread(cm, sizes, *distinct_samples(tokens, pairs))
    bound = multi_phase_bound(batch, cm)
    for plan in _plans(cm, batch, seed=5):
        if plan.num_phases == 1:
            releases = _group_releases(cm, plan, by_id)
            assert (spread.at(plan.busy_s()) <= releases * (1 + 1e-9)).all()
            assert (spread.at(float("inf")) <= spread.at(plan.busy_s())).all()
        assert bound <= plan.step_time_s * (1 + 1e-9)
    floors = _bounds(batch, cm, sizes, None)
    without = least_step_s(cm, floors.makespan, sizes, _released(cm, sizes, tokens, pairs))
    # ratchet: the spread release raises the bound 2%; a margin under what this case gave when written (`pytest tests/test_sync_bound.py::test_spread_release_is_below_every_plans_and_raises_the_bound`)
    assert floors.lower > without * 1.02
    plan = solve(batch, cm.cluster, cm, IlpOptions(time_limit_s=1.0))
    # ratchet: the plan's gap to that bound under 2%; a margin under what this case gave when written (`pytest tests/test_sync_bound.py::test_spread_release_is_below_every_plans_and_raises_the_bound`)
    assert plan.gap <= 0.02


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_wikipedia_on_1024_gpus_bound_meets_the_plan(zero_stage: int) -> None:
    """512 wikipedia samples on 1024 GPUs: the busy time is the longest sample's (0.17 s), the
    32 layers' all-reduces take about as long, and the longest sample's forward leaves them
    exposed; the bound rises by that, and the ILP's plan, the candidate of the fastest scheduled
    step among many of the same busy time, is within 2% of it."""
    cm = cost_model(gpus=1024, zero_stage=zero_stage)
    batch = make_batches("wikipedia", cm, global_batch=512, steps=1, seed=0)[0]
    sizes = allowed_sp_sizes(cm)
    tokens, pairs = sample_arrays(batch)
    makespan = _makespan_bound(_Work(*distinct_samples(tokens, pairs), cm, sizes), 1024)
    plan = solve(batch, cm.cluster, cm, IlpOptions(time_limit_s=1.0))
    assert plan.lower_bound_s > makespan + cm.grad_sync_s() + 0.03
    # ratchet: wikipedia on 1,024 GPUs: gap under 2%; a margin under what this case gave when written (`pytest tests/test_sync_bound.py::test_wikipedia_on_1024_gpus_bound_meets_the_plan`)
    assert plan.gap <= 0.02


@pytest.mark.parametrize("zero_stage", [0, 2, 3])
def test_layout_step_is_the_assembled_plans_step(zero_stage: int) -> None:
    """What the ILP's incumbent computes for a priced layout (`sync.layout_step_s`, from each
    group's last or longest micro-batch alone at stages 0-2) is the step `price_step` gives the
    plan assembled from it."""
    cm = cost_model(gpus=64, zero_stage=zero_stage)
    batch = make_batch(LENGTHS * 3)
    arrays, pricer = BatchArrays.of(batch), Pricer(cm, allowed_sp_sizes(cm))
    position = {s.id: k for k, s in enumerate(batch)}
    for plan in random_plans(batch, cm, seed=7 + zero_stage, count=25):
        layout = [(g.ranks[0], g.sp, [[position[i] for i in mb.samples] for mb in g.microbatches])
                  for g in plan.groups]
        covered = sum(g.sp for g in plan.groups)
        step = layout_step_s(cm, layout, price_layout(layout, arrays, pricer), covered < cm.cluster.num_gpus)
        assert step == pytest.approx(plan.step_time_s, rel=1e-9)
