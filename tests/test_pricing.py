"""The planner's vectorized prices are the cost model's own: every checkpoint level, time and
memory figure a plan carries equals `CostModel.min_ckpt_layers`, `time_s` and `memory_bytes`
(each GPU holds ceil(T/p) tokens), for every strategy."""

from __future__ import annotations

import numpy as np
import pytest

from dcp.costmodel import CostModel
from dcp.data.batches import make_batches
from dcp.planner import STRATEGIES, solve
from dcp.planner.feasibility import allowed_sp_sizes
from dcp.planner.pricing import BatchArrays, Pricer, group_layout, price_layout
from dcp.planner.run import resolve_options
from tests.conftest import cost_model, heavy_cost_model, make_batch


def _cost_models() -> list[CostModel]:
    return [cost_model(), cost_model(model="llama-70b", zero_stage=3), cost_model(model="opensora-stdit-1.1b"),
            heavy_cost_model()]


def _tokens_around_shards(cm: CostModel, p: int) -> np.ndarray:
    """Token counts at, just below and just above multiples of p and every level's capacity."""
    k = cm.model.num_layers
    caps = [cm.max_tokens(p, r) for r in range(k + 1)]
    rng = np.random.default_rng(p)
    around = [c + d for c in caps for d in (-p - 1, -p, -1, 0, 1, p - 1, p, p + 1)]
    return np.array(sorted({t for t in [1, 2, p - 1, p, p + 1, 3 * p + 1, *around,
                                        *rng.integers(1, caps[-1] + 1, 200).tolist()] if 1 <= t <= caps[-1]}),
                    dtype=np.float64)


@pytest.mark.parametrize("which", range(4))
def test_levels_and_memory_are_the_cost_models(which: int) -> None:
    cm = _cost_models()[which]
    sizes = allowed_sp_sizes(cm)
    pricer = Pricer(cm, sizes)
    for p in sizes:
        tokens = _tokens_around_shards(cm, p)
        levels = pricer.levels(p, tokens)
        memory = pricer.memory_bytes(p, tokens, np.minimum(levels, cm.model.num_layers))
        for t, r, got in zip(tokens.tolist(), levels.tolist(), memory.tolist(), strict=True):
            assert r == cm.min_ckpt_layers(t, p), (p, t)
            assert got == cm.memory_bytes(t, p, r), (p, t, r)  # the same rounding, bit for bit
            assert got <= cm.cluster.memory_bytes
            if r > 0:  # one layer fewer does not fit: the padded shard is over
                assert cm.memory_bytes(t, p, r - 1) > cm.cluster.memory_bytes


def test_a_layout_is_priced_as_the_cost_model_prices_each_micro_batch() -> None:
    cm = cost_model()
    batch = make_batches("wikipedia", cm, global_batch=300, steps=1, seed=3)[0]
    arrays = BatchArrays.of(batch)
    rng = np.random.default_rng(0)
    layout = [(start, p, [list(mb) for mb in np.array_split(rng.permutation(len(batch))[:60], 7)])
              for start, p in [(0, 8), (8, 4), (12, 2)]]
    priced = price_layout(layout, arrays, Pricer(cm, [2, 4, 8]))
    m = 0
    for g, (_, p, mbs) in enumerate(layout):
        busy = 0.0
        for mb in mbs:
            t, a = sum(batch[i].tokens for i in mb), sum(batch[i].attn_pairs for i in mb)
            r = cm.min_ckpt_layers(t, p)
            assert priced.levels[m] == r
            assert priced.times_s[m] == pytest.approx(cm.time_s(t, a, p, r), rel=1e-12)
            busy += priced.times_s[m]
            m += 1
        assert priced.busy_s[g] == pytest.approx(busy, rel=1e-12)


@pytest.mark.parametrize("which", range(4))
def test_every_strategys_plan_carries_the_cost_models_numbers(which: int) -> None:
    cm = _cost_models()[which]
    workload = "opensora" if cm.model.attention == "spatial_temporal" else "wikipedia"
    batch = make_batches(workload, cm, global_batch=257, steps=1, seed=which)[0]  # odd totals: shards pad
    longest = max(s.tokens for s in batch)
    for name in STRATEGIES:
        options = resolve_options(name, 0.5 if name == "ilp" else None, dataset_longest_tokens=longest)
        plan = solve(batch, cm.cluster, cm, options)
        by_id = plan.sample_map()
        for g in plan.groups:
            for mb in g.microbatches:
                t = sum(by_id[i].tokens for i in mb.samples)
                a = sum(by_id[i].attn_pairs for i in mb.samples)
                # In the group's layout (Ulysses x ring), which is at most what any layout of p needs.
                sp = group_layout(g)
                assert mb.memory_bytes == cm.memory_bytes(t, g.sp, mb.ckpt_layers, sp), (name, g.sp, t)
                assert mb.memory_bytes <= cm.memory_bytes(t, g.sp, mb.ckpt_layers) <= cm.cluster.memory_bytes
                assert mb.time_s == pytest.approx(cm.time_s(t, a, g.sp, mb.ckpt_layers, sp), rel=1e-12), name
                assert mb.time_s >= cm.time_s(t, a, g.sp, mb.ckpt_layers) * (1 - 1e-12), name


def test_short_microbatches_after_a_billion_token_sample_price_exactly() -> None:
    """Each micro-batch's tokens and pairs are summed on their own: with a 1.27e9-token sample
    (pairs ~8e17) first in the layout, the 40 short micro-batches after it price exactly as
    `CostModel.time_s` does (differences of one running sum were off by ~1e-6 relative, and
    `simulate` refused the plan)."""
    from dcp.planner.common import assemble
    from dcp.planner.simulate import simulate

    cm = cost_model(model="tiny-llama", gpus=256, gpus_per_node=4, zero_stage=2)
    batch = make_batch([1_266_266_364] + [300 + 37 * i for i in range(40)])
    plan = assemble("x", batch, cm, [(0, 128, [[0]]), (128, 1, [[i] for i in range(1, 41)])], lower_bound_s=0.0)
    short = plan.groups[1]
    for mb in short.microbatches:
        s = batch[mb.samples[0]]
        assert mb.time_s == pytest.approx(cm.time_s(s.tokens, s.attn_pairs, 1, mb.ckpt_layers, group_layout(short)),
                                          rel=1e-12)
    assert simulate(plan, cm).step_time_s == pytest.approx(plan.step_time_s)
