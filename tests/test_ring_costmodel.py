"""Ulysses x ring in the cost model, the planner and the plan file: which layouts a size offers, the
ring term against its linear lower bound, memory per layout, the long-sample numbers the hybrid
exists for, and plans that carry both degrees (old plans still read)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp.costmodel import (
    Cluster,
    CostModel,
    SPLayout,
    attention_pairs,
    load_hardware,
    load_model,
    sp_layouts,
)
from dcp.planner import IlpOptions, Sample, solve
from dcp.planner.feasibility import allowed_sp_sizes
from dcp.planner.plan import Plan, PlanError
from dcp.planner.simulate import simulate

H200 = load_hardware("h200-sxm")


def llama3_8b(gpus: int = 64) -> CostModel:
    return CostModel(load_model("llama-3-8b"), H200, Cluster(num_gpus=gpus, gpus_per_node=8, memory_bytes=H200.memory_bytes))


def labels(model: str, p: int, g: int = 8) -> list[str]:
    return [o.label for o in sp_layouts(load_model(model), p, g)]


def test_layouts_keep_ulysses_where_it_divides_and_fill_the_node_beyond() -> None:
    assert labels("llama-7b", 32) == ["32"]                         # 32 KV heads: Ulysses alone, as before rings
    assert labels("llama-7b", 64) == ["8x8", "16x4", "32x2"]        # Ulysses over a node at least
    assert labels("llama-3-8b", 16) == ["8x2", "16"]                 # 16 > 8 KV heads: replicated, or a ring
    assert labels("llama-3-8b", 64) == ["8x8", "16x4", "32x2"]
    assert labels("llama-3-8b", 64, g=4) == ["4x16", "8x8", "16x4", "32x2"]
    assert labels("opensora-stdit-1.1b", 32) == []                   # spatial-temporal attention: no ring
    six = dataclasses.replace(load_model("tiny-llama"), heads=6, kv_heads=3, hidden=48)
    assert [o.label for o in sp_layouts(six, 4, 8)] == ["1x4"]        # 3 KV heads: a ring alone
    cm = llama3_8b()
    assert allowed_sp_sizes(cm) == [1, 2, 4, 8, 16, 32, 64]


@settings(max_examples=60, deadline=None)
@given(tokens=st.integers(1, 2_000_000), packed=st.floats(0.0, 1.0), p=st.sampled_from([16, 32, 64]),
       r=st.integers(0, 32))
def test_linear_form_is_a_lower_bound_exact_where_the_ring_is_compute_bound(tokens: int, packed: float, p: int,
                                                                            r: int) -> None:
    """Whatever the micro-batch (a causal sample, or samples packed down to few pairs), every
    layout's exact time is at least the size's linear form, and equals its own linear part plus
    exactly the exposed transfers, which vanish when each step's attention outlasts its transfer."""
    cm = llama3_8b()
    pairs = max(tokens, int(attention_pairs("causal", tokens) * packed))
    lower = cm.linear_time(p, r)(tokens, pairs)
    for layout in cm.layouts(p):
        exact = cm.time_s(tokens, pairs, p, r, layout)
        assert exact >= lower * (1 - 1e-12)
        ring = cm.ring_terms(layout)
        fwd, bwd = ring.exposed_s(tokens, pairs)
        linear = cm.layout_linear_time(layout, r)(tokens, pairs)
        assert exact == pytest.approx(linear + (32 + r) * fwd + 32 * bwd, rel=1e-12)
        assert (fwd == bwd == 0.0) == (exact == linear)
    assert cm.time_s(tokens, pairs, p, r) == min(cm.time_s(tokens, pairs, p, r, o) for o in cm.layouts(p))


def test_a_long_sample_hides_the_ring_and_a_short_one_waits_on_it() -> None:
    cm = llama3_8b()
    layout = SPLayout(8, 8)
    long_t = 524_288
    assert cm.ring_terms(layout).exposed_s(long_t, attention_pairs("causal", long_t)) == (0.0, 0.0)
    short_t = 16_384  # 256 tokens per GPU: each step's attention is shorter than its transfer
    fwd, bwd = cm.ring_terms(layout).exposed_s(short_t, attention_pairs("causal", short_t))
    assert fwd > 0 and bwd > 0
    # Across nodes the ring's link is a NIC's (46 GB/s, NVIDIA/nccl-tests issue 290), inside one NVLink.
    assert H200.p2p(True).alpha_beta()[1] == 46e9 and H200.p2p(False).alpha_beta()[1] == 180e9


def test_memory_per_layout_counts_replicated_kv_heads_and_ring_buffers() -> None:
    cm = llama3_8b()
    t = 262_144
    ulysses8 = cm.memory_bytes(t, 8, 0)
    ring = cm.memory_bytes(t, 64, 0, SPLayout(8, 8))
    replicated = cm.memory_bytes(t, 64, 0, SPLayout(32, 2))
    assert ring > cm.static_bytes + (ulysses8 - cm.static_bytes) / 8  # the ring's buffers on top of 1/8 the tokens
    assert replicated > ring  # 32 KV-head widths saved per layer instead of 8
    assert cm.memory_bytes(t, 64, 0) == max(cm.memory_bytes(t, 64, 0, o) for o in cm.layouts(64))
    assert cm.memory_bytes(t + 1, 64, 0, SPLayout(8, 8)) > cm.memory_bytes(t, 64, 0, SPLayout(8, 8))  # pads to 2p


def test_llama3_8b_long_samples_plan_on_64_gpus() -> None:
    """The issue's table: one sample per batch on 64 H200s. Ulysses alone stops at SP 8; the hybrid
    plans 1M tokens, and 512K tokens in under a quarter of Ulysses' 123.8 s (its old-model time)."""
    cm = llama3_8b()
    steps = {}
    for tokens in (524_288, 1_048_576):
        batch = [Sample(0, tokens, attention_pairs("causal", tokens))]
        plan = solve(batch, cm.cluster, cm, IlpOptions(time_limit_s=1.0))
        assert [g.layout for g in plan.groups] == ["8x8"]
        assert simulate(plan, cm).step_time_s == pytest.approx(plan.step_time_s)
        steps[tokens] = plan.step_time_s
    assert steps[524_288] <= 123.8 / 4


def test_plans_carry_both_degrees_and_old_plans_still_read() -> None:
    cm = llama3_8b()
    batch = [Sample(0, 131_072, attention_pairs("causal", 131_072)), Sample(1, 4096, attention_pairs("causal", 4096))]
    plan = solve(batch, cm.cluster, cm, IlpOptions(time_limit_s=0.5))
    d = json.loads(plan.to_json())
    assert d["schema_version"] == 2
    rings = [(g["ulysses"], g["ring"], g["sp"]) for g in d["groups"]]
    assert any(c > 1 for _, c, _ in rings) and all(u * c == p for u, c, p in rings)
    back = Plan.from_json(plan.to_json())
    assert [(g.ulysses, g.ring) for g in back.groups] == [(g.ulysses, g.ring) for g in plan.groups]
    assert back.digest() == plan.digest()
    ring_free = dict(d, groups=[dict(g, ring=1, ulysses=g["sp"]) for g in d["groups"]])
    assert Plan.from_dict(ring_free).digest() != plan.digest()  # ranks must agree on the layout too
    v1 = dict(d, schema_version=1, groups=[{k: v for k, v in g.items() if k not in ("ring", "ulysses")}
                                           for g in d["groups"]])
    assert [g.ring for g in Plan.from_dict(v1).groups] == [1] * len(d["groups"])
    bad = dict(d, groups=[dict(d["groups"][0], ulysses=3)] + d["groups"][1:])
    with pytest.raises(PlanError, match="ulysses 3 x ring"):
        Plan.from_dict(bad)
    plan.groups[0].ring = 3
    with pytest.raises(PlanError, match="ring degree 3 is not a power of two"):
        plan.validate()
