"""Cost-model terms against hand-computed values, memory consistency, presets and refusals."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import cost_model
from hypothesis import given
from hypothesis import strategies as st

from dcp.costmodel import (
    Cluster,
    CostModel,
    CostModelError,
    HardwareProfile,
    LayerFit,
    ModelSpec,
    TrainingSetup,
    attention_pairs,
    load_hardware,
    load_model,
    preset_names,
    save_hardware,
)

LLAMA_7B_PARAMS = 6_738_415_616  # Llama 2 7B, as reported by HF for meta-llama/Llama-2-7b-hf


def test_llama_7b_param_count() -> None:
    # Per layer: q,k,v,o 4 h^2 + SwiGLU 3 h f + two norms 2 h; embedding + LM head 2 V h; final norm h.
    h, f, v, k = 4096, 11008, 32000, 32
    hand = k * (4 * h * h + 3 * h * f + 2 * h) + 2 * v * h + h
    assert hand == LLAMA_7B_PARAMS
    assert load_model("llama-7b").param_count() == LLAMA_7B_PARAMS


@pytest.mark.parametrize(("kind", "tokens", "frames", "pairs"), [
    ("causal", 4, 1, 10),  # 1 + 2 + 3 + 4
    ("causal", 1, 1, 1),
    ("full", 4, 1, 16),
    ("spatial_temporal", 12, 3, 3 * 4 * 4 + 4 * 3 * 3),  # F S^2 + S F^2 with F=3, S=4
    ("spatial_temporal", 5, 1, 25 + 5),  # an image: one frame
])
def test_attention_pairs(kind: str, tokens: int, frames: int, pairs: int) -> None:
    assert attention_pairs(kind, tokens, frames) == pairs


def test_attention_pairs_refuses_bad_input() -> None:
    with pytest.raises(CostModelError, match="not 3 equal frames"):
        attention_pairs("spatial_temporal", 10, 3)
    with pytest.raises(CostModelError, match="unknown attention kind 'sliding'"):
        attention_pairs("sliding", 10)


def test_static_bytes_bf16_zero1() -> None:
    # FSDP2 between steps: (fp32 master 4 B + Adam 8 B) / N per parameter, gradients freed.
    p, n = LLAMA_7B_PARAMS, 32
    assert TrainingSetup().static_bytes(p, n) == pytest.approx(12 * p / n)
    cm = cost_model()
    assert cm.resident_bytes == pytest.approx(12 * p / n, rel=1e-6)
    # During a step at stage 1 (= 2): every layer gathered in bf16 (2 B) with the whole local fp32
    # gradient (4 B), which its shards replace layer by layer in the last backward.
    assert cm.in_step_bytes == pytest.approx(6 * p, rel=1e-6)
    # A micro-batch's token-independent memory adds the peak's fixed part (bf16: no weight copies).
    assert cm.static_bytes == pytest.approx(cm.resident_bytes + cm.in_step_bytes + cm.footprint.working_fixed_bytes)
    assert TrainingSetup(zero_stage=0).static_bytes(p, n) == pytest.approx(12 * p)
    assert TrainingSetup(zero_stage=3).static_bytes(p, n) == pytest.approx(12 * p / n)
    assert TrainingSetup(zero_stage=3, shard_group=8).static_bytes(p, n) == pytest.approx(12 * p / 8)


def test_comm_is_zero_without_sp() -> None:
    cm = cost_model()
    assert cm.layer_times(8192, 8192 * 8193 // 2, 1).comm_s == 0.0


def test_comm_at_sp8_matches_hand_formula() -> None:
    cm, t = cost_model(), 8192
    # Four all-to-alls (q, k, v, out) each of the h200-sxm preset's 10 us floor inside a node; each
    # token carries q + out (h) and k + v (h, no GQA) in bf16: 4 h * 2 B = 32768 B, (p-1)/p of T/p
    # leaving the rank at NCCL's 370 GB/s all-to-all bus bandwidth in an 8-GPU NVLink 4 node.
    hand = 4 * 1e-5 + 32768 * t / 8 * 7 / 8 / 370e9
    assert cm.layer_times(t, 0, 8).comm_s == pytest.approx(hand, rel=1e-12)
    # Across 2 nodes (p=16): 46 us floor, 2 x 48.5 GB/s (half the traffic stays on NVLink).
    assert cm.layer_times(t, 0, 16).comm_s == pytest.approx(4 * 46e-6 + 32768 * t / 16 * 15 / 16 / 97e9)
    # 4 nodes (p=32): 4/3 x 48.5 GB/s, the node count and not the group size keys the curve.
    assert cm.layer_times(t, 0, 32).comm_s == pytest.approx(4 * 46e-6 + 32768 * t / 32 * 31 / 32 / 64.7e9)


def test_executor_all_to_all_extra_is_paid_per_call_and_per_shard_token() -> None:
    cm, t = cost_model(), 8192
    measured = dataclasses.replace(cm.fit, a2a_call_s=30e-6, a2a_token_s=2e-9)
    with_extra = CostModel(cm.model, dataclasses.replace(cm.hardware, fits={cm.model.name: measured}), cm.cluster,
                           cm.training)
    plain = CostModel(cm.model, dataclasses.replace(cm.hardware, fits={cm.model.name: cm.fit}), cm.cluster,
                      cm.training)
    # Each of a direction's four all-to-alls costs 30 us more, plus 2 ns per token of the rank's T/8.
    assert with_extra.layer_times(t, 0, 8).comm_s - plain.layer_times(t, 0, 8).comm_s == pytest.approx(
        4 * (30e-6 + 2e-9 * t / 8), rel=1e-9)
    # A micro-batch pays it for every all-to-all it issues: forward and backward of each of the 32
    # layers, and the recompute of each checkpointed one; none at SP 1.
    a, r = t * (t + 1) // 2, 3
    assert with_extra.time_s(t, a, 8, r) - plain.time_s(t, a, 8, r) == pytest.approx(
        (2 * 32 + r) * 4 * (30e-6 + 2e-9 * t / 8), rel=1e-9)
    assert with_extra.time_s(t, a, 1, r) == plain.time_s(t, a, 1, r)


def test_time_is_layers_plus_head() -> None:
    cm, t, a, p, r = cost_model(), 4096, 4096 * 4097 // 2, 4, 10
    lt, k, f = cm.layer_times(t, a, p), 32, cm.fit
    hand = k * (lt.fwd_compute_s + lt.bwd_compute_s + 2 * lt.comm_s) + r * (lt.fwd_compute_s + lt.comm_s)
    hand += f.head_per_token_s * t / p + f.microbatch_fixed_s
    assert cm.time_s(t, a, p, r) == pytest.approx(hand, rel=1e-12)
    assert cm.time_s(t, a, p, r + 1) > cm.time_s(t, a, p, r)  # recompute costs time


def test_grad_sync_ring_allreduce() -> None:
    # The embedding and LM head (a unit of 2 x 32000 x 4096 + 4096 fp32 gradients, 1 GB) all-reduced
    # over 4 nodes of 8 at the curve's bus bandwidth for that size, 2 (N-1)/N of the bytes; with
    # layer 0's and the loss scalars' (16 bytes, the small-message floor) the least a step adds,
    # then the optimizer's step: foreach AdamW over the rank's 1/32 of the parameters at 82 bytes
    # each (bf16 recipe) over the H200's 4.3 TB/s.
    cm = cost_model()
    adam = 82 * LLAMA_7B_PARAMS / 32 / 4.3e12
    curve = cm.hardware.collective("all_reduce", 32, 8)
    root = 2 * 32000 * 4096 + 4096
    assert curve.time_s(4 * root) == pytest.approx(2 * 31 / 32 * 4 * root / curve.bus_bw(4 * root))
    layer = cm.model.layer_params()  # layer 0's all-reduce runs after the backward too
    assert cm.grad_sync_s() == pytest.approx(curve.time_s(4 * root) + curve.time_s(4 * layer) + curve.time_s(16)
                                             + cm.sync_terms()["param_all_gather"] + adam)
    assert set(cost_model(zero_stage=0).sync_terms()) == {"grad_reduce", "loss_all_reduce"}
    # One GPU has nothing to reduce; it steps every parameter.
    assert cost_model(gpus=1).grad_sync_s() == pytest.approx(82 * LLAMA_7B_PARAMS / 4.3e12)


@given(tokens=st.integers(1, 6_000_000), p=st.sampled_from([1, 2, 4, 8, 16, 32]))
def test_min_ckpt_layers_consistent_with_memory(tokens: int, p: int) -> None:
    cm = cost_model()
    k, room = cm.model.num_layers, cm.cluster.memory_bytes
    r = cm.min_ckpt_layers(tokens, p)
    if r is None:
        assert cm.memory_bytes(tokens, p, k) > room
    else:
        assert cm.memory_bytes(tokens, p, r) <= room * (1 + 1e-9)
        assert r == 0 or cm.memory_bytes(tokens, p, r - 1) > room


@pytest.mark.parametrize("p", [1, 8, 32])
@pytest.mark.parametrize("r", [0, 16, 32])
def test_max_tokens_is_the_memory_edge(p: int, r: int) -> None:
    cm = cost_model()
    m = cm.max_tokens(p, r)
    assert cm.memory_bytes(m, p, r) <= cm.cluster.memory_bytes < cm.memory_bytes(m + 1, p, r)


def test_no_room_for_model_states() -> None:
    cm = cost_model(model="llama-70b", gpus=8, zero_stage=0)
    assert cm.max_tokens(8, 80) == 0


def test_refuses_beyond_fitted_range() -> None:
    hw = load_hardware("h200-sxm")
    derived = cost_model().fit
    fit = dataclasses.replace(derived, max_fitted_tokens=1000)
    fitted = dataclasses.replace(hw, fits={"llama-7b": fit}, extrapolation_factor=4.0)
    cm = CostModel(load_model("llama-7b"), fitted, Cluster(num_gpus=8, gpus_per_node=8, memory_bytes=hw.memory_bytes))
    assert cm.time_s(4000, 0, 1, 0) > 0  # at 4x the largest fitted point: still answered
    assert cm.time_s(32000, 0, 8, 0) > 0  # per GPU it is 4000 tokens
    with pytest.raises(CostModelError, match="beyond the profile's fitted range"):
        cm.time_s(4001, 0, 1, 0)
    with pytest.raises(CostModelError, match="beyond the profile's fitted range"):
        cm.memory_bytes(40000, 8, 0)
    # Planners ask min_ckpt_layers / max_tokens: beyond the range is "does not fit", not a crash.
    assert cm.min_ckpt_layers(4000, 1) is not None
    assert cm.min_ckpt_layers(4001, 1) is None
    assert cm.max_tokens(1, 0) == 4000
    from dcp.planner import BucketOptions, InfeasibleError, Sample, solve

    batch = [Sample(0, 100, 5050), Sample(7, 40000, 800020000)]
    with pytest.raises(InfeasibleError, match="sample 7 .* beyond what the profile can price"):
        solve(batch, cm.cluster, cm, BucketOptions())


def test_check_refuses_bad_sp_and_ckpt() -> None:
    cm = cost_model(gpus=8)
    with pytest.raises(CostModelError, match="SP size 3"):
        cm.time_s(100, 100, 3, 0)
    with pytest.raises(CostModelError, match="SP size 16"):
        cm.time_s(100, 100, 16, 0)
    with pytest.raises(CostModelError, match="checkpointed layers 33"):
        cm.time_s(100, 100, 1, 33)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_gpus": 0, "gpus_per_node": 8}, "number of GPUs must be positive"),
    ({"num_gpus": 12, "gpus_per_node": 8}, "12 GPUs is not a whole number of nodes of 8"),
    ({"num_gpus": 8, "gpus_per_node": 0}, "GPUs per node must be positive"),
])
def test_cluster_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(CostModelError, match=message):
        Cluster(memory_bytes=1e9, **kwargs)


def test_cluster_sp_sizes() -> None:
    assert Cluster(num_gpus=32, gpus_per_node=8, memory_bytes=1).sp_sizes() == [1, 2, 4, 8, 16, 32]
    assert Cluster(num_gpus=24, gpus_per_node=8, memory_bytes=1).sp_sizes() == [1, 2, 4, 8]


def test_presets_load_and_round_trip(tmp_path) -> None:
    assert {"llama-7b", "opensora-stdit-1.1b"} <= set(preset_names("models"))
    assert "h200-sxm" in preset_names("hardware")
    for name in preset_names("models"):
        spec = load_model(name)
        assert ModelSpec.from_dict(spec.to_dict()) == spec
    hw = load_hardware("h200-sxm")
    save_hardware(hw, tmp_path / "hw.json")
    assert load_hardware(str(tmp_path / "hw.json")) == hw
    assert HardwareProfile.from_dict(hw.to_dict()) == hw


def test_fitted_profile_round_trips(tmp_path) -> None:
    fit = LayerFit(fwd_fixed_s=1e-5, fwd_per_token_s=1e-8, fwd_per_pair_s=1e-12, bwd_fixed_s=2e-5,
                   bwd_per_token_s=2e-8, bwd_per_pair_s=2.5e-12, act_full_bytes_per_token=1e4,
                   act_ckpt_bytes_per_token=1e3, max_fitted_tokens=8192)
    hw = dataclasses.replace(load_hardware("cpu"), fits={"tiny-llama": fit})
    save_hardware(hw, tmp_path / "p.json")
    assert load_hardware(str(tmp_path / "p.json")).fits["tiny-llama"] == fit


@pytest.mark.parametrize(("call", "message"), [
    (lambda: load_model("gpt-9"), "unknown model preset 'gpt-9'"),
    (lambda: load_hardware("tpu-v9"), "unknown hardware preset 'tpu-v9'"),
    (lambda: load_model("/nonexistent/model.json"), "does not exist"),
    (lambda: HardwareProfile.from_dict({"kind": "dcp-hardware-profile", "schema_version": 99}),
     "schema_version 99"),
    (lambda: HardwareProfile.from_dict({"name": "x"}), "not a dcp hardware profile"),
    (lambda: ModelSpec.from_dict({**load_model("llama-7b").to_dict(), "depth": 3}), r"unknown field\(s\) \['depth'\]"),
    (lambda: dataclasses.replace(load_model("llama-7b"), hidden=4100), "not divisible by heads"),
])
def test_bad_specs_are_named(call, message: str) -> None:
    with pytest.raises(CostModelError, match=message):
        call()


def test_malformed_profile_json(tmp_path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(CostModelError, match="not valid JSON"):
        load_hardware(str(path))


def test_recipes_bytes() -> None:
    from dcp.costmodel import RECIPES

    want = {  # param, grad, reduce, compute, optimizer state, master, autocast
        "bf16": (2, 4, 4, 2, 8, 4, False),
        "autocast-bf16": (4, 4, 4, 2, 8, 0, True),
        "fp32": (4, 4, 4, 4, 8, 0, False),
    }
    for name, row in want.items():
        r = RECIPES[name]
        got = (r.param_bytes, r.grad_bytes, r.reduce_bytes, r.compute_bytes, r.optimizer_state_bytes_per_param,
               r.master_weight_bytes_per_param, r.autocast)
        assert got == row, name
        assert TrainingSetup(precision=name).recipe is r
    assert TrainingSetup(precision="bf16").param_bytes == 2


def test_static_bytes_autocast_zero1() -> None:
    # FSDP2 between steps: fp32 weights 4 B + Adam 8 B, both / N: 2.53 GB for Llama 2 7B on 32 GPUs.
    p, n = LLAMA_7B_PARAMS, 32
    setup = TrainingSetup(precision="autocast-bf16", zero_stage=1)
    assert setup.static_bytes(p, n) == pytest.approx(12 * p / n)
    assert setup.static_bytes(p, n) / 1e9 == pytest.approx(2.527, abs=0.001)  # 12 x 6,738,415,616 / 32 = 2.5269e9


def test_unknown_recipe_is_refused() -> None:
    with pytest.raises(CostModelError, match="unknown precision recipe 'fp8'"):
        TrainingSetup(precision="fp8")
