"""The derived cost model's terms from issue 54, each against a hand derivation: the attention
kernel a run names, the causal backward's own rate, the loss's bytes over the vocabulary, the
optimizer's step, and GPU variants' presets carrying a source for every number."""

from __future__ import annotations

import dataclasses

import pytest

from dcp.costmodel import (
    Cluster,
    CostModel,
    CostModelError,
    TrainingSetup,
    get_recipe,
    load_hardware,
    load_model,
)
from dcp.costmodel.elementwise import loss_bytes_per_token
from dcp.costmodel.traffic import optimizer_bytes_per_param
from dcp.profiler.memory import reference_footprint

CLUSTER = Cluster(num_gpus=8, gpus_per_node=8, memory_bytes=1e11)
EAGER = TrainingSetup(kernels="eager")
"""The counted derivation with eager kernels (`TrainingSetup.kernels`, the default), named where a
test compares it with another setup."""


def test_the_named_kernel_sets_the_pair_coefficients() -> None:
    """llama-7b (causal) on h100-sxm: per pair 4h FLOPs over the kernel's forward rate, 2.5 x 4h over
    its causal backward rate where it has one (fa2: 327 TFLOP/s), else its unmasked one (fa3), each
    at the sustained clock (0.849 of the benchmarks' burst, 702.9 / 828.0 on the H200)."""
    spec, hw = load_model("llama-7b"), load_hardware("h100-sxm")
    flops = 4 * spec.hidden / 0.849
    fa2 = CostModel(spec, hw, CLUSTER, EAGER).fit
    fa3 = CostModel(spec, hw, CLUSTER, TrainingSetup(kernels="eager", attention="fa3")).fit
    assert fa2.fwd_per_pair_s == pytest.approx(flops / 350.6e12)
    assert fa2.bwd_per_pair_s == pytest.approx(2.5 * flops / 327e12)
    assert fa3.fwd_per_pair_s == pytest.approx(flops / 655.4e12)
    assert fa3.bwd_per_pair_s == pytest.approx(2.5 * flops / 591.6e12)
    # The short-sequence term moves the per-token coefficient by the kernel's pairs per token.
    assert fa3.fwd_per_token_s - fa2.fwd_per_token_s == pytest.approx(
        300.5 * fa3.fwd_per_pair_s - 200.5 * fa2.fwd_per_pair_s)
    # A full-attention model reads the unmasked backward rate.
    full = dataclasses.replace(spec, attention="full", memory={})
    full = dataclasses.replace(full, memory={"bf16": reference_footprint(full, "bf16")})
    assert CostModel(full, hw, CLUSTER, EAGER).fit.bwd_per_pair_s == pytest.approx(2.5 * flops / 329.1e12)
    # The default setup is the eager one: the same causal backward rate.
    assert CostModel(spec, hw, CLUSTER).fit == fa2
    with pytest.raises(CostModelError, match="no attention kernel 'fa4'.*known: cudnn, fa3, flash-attn-2, triton"):
        CostModel(spec, hw, CLUSTER, TrainingSetup(attention="fa4"))


def test_the_loss_moves_its_bytes_over_the_vocabulary() -> None:
    """Per token, upcast: (c + 4) V to upcast, 8V log-softmax, 4V the nll gradient, 12V its
    backward, (4 + c) V back: 36V in bf16; fused: 3cV = 6V. The head's per-token cost differs by
    the 30V bytes over the bandwidth."""
    spec, hw = load_model("llama-7b"), load_hardware("h200-sxm")
    bf16 = get_recipe("bf16")
    assert loss_bytes_per_token(spec, bf16) == 36 * spec.vocab
    assert loss_bytes_per_token(spec, bf16, "fused") == 6 * spec.vocab
    upcast = CostModel(spec, hw, CLUSTER, EAGER).fit.head_per_token_s
    fused = CostModel(spec, hw, CLUSTER, TrainingSetup(kernels="eager", loss="fused")).fit.head_per_token_s
    assert upcast - fused == pytest.approx(30 * spec.vocab / hw.memory_bw_bytes_per_s)


def test_optimizer_bytes_by_recipe_and_implementation() -> None:
    """fused AdamW reads weights, gradient and two moments and writes weights and moments: bf16
    with fp32 master weights 4+4+8 + 4+8 + the bf16 copy 2 = 30; fp32 parameters 28. foreach runs
    eight passes: 80 bytes in fp32, 82 with the bf16 copy."""
    assert optimizer_bytes_per_param(get_recipe("bf16"), "fused") == 30
    assert optimizer_bytes_per_param(get_recipe("autocast-bf16"), "fused") == 28
    assert optimizer_bytes_per_param(get_recipe("autocast-bf16")) == 80
    assert optimizer_bytes_per_param(get_recipe("bf16")) == 82
    spec, hw = load_model("llama-7b"), load_hardware("h200-sxm")
    a = CostModel(spec, hw, CLUSTER, TrainingSetup(kernels="eager", optimizer="fused"))
    b = CostModel(spec, hw, CLUSTER, EAGER)
    assert a.optimizer_s / b.optimizer_s == pytest.approx(30 / 82)
    assert CostModel(spec, hw, CLUSTER).optimizer_s == b.optimizer_s > 0  # the default prices foreach
    with pytest.raises(CostModelError, match="optimizer must be foreach or fused"):
        TrainingSetup(optimizer="lion")


def test_compiled_kernels_price_less_elementwise_work() -> None:
    spec, hw = load_model("llama-7b"), load_hardware("h200-sxm")
    eager = CostModel(spec, hw, CLUSTER, EAGER).fit
    compiled = CostModel(spec, hw, CLUSTER, TrainingSetup(kernels="compiled")).fit
    assert compiled.fwd_per_token_s < eager.fwd_per_token_s and compiled.bwd_per_token_s < eager.bwd_per_token_s
    assert compiled.fwd_per_pair_s == eager.fwd_per_pair_s
    with pytest.raises(CostModelError, match="kernels must be eager or compiled"):
        TrainingSetup(kernels="fused")


@pytest.mark.parametrize("name", ["h100-sxm-500w", "a100-80gb", "a100-80gb-flexsp", "h100-sxm", "h200-sxm"])
def test_variant_presets_name_a_source_for_each_number(name: str) -> None:
    hw = load_hardware(name)
    for field in ("matmul_flops", "memory_bw_bytes_per_s", "attention_fwd_flops", "attention_bwd_flops"):
        assert hw.sources.get(field), f"{name}: {field} has no source"
    if hw.attention_bwd_causal_flops:
        assert hw.sources.get("attention_bwd_causal_flops")
    if hw.matmul_tokens_offset:
        assert hw.sources.get("matmul_tokens_offset")
    assert all(k.source for k in hw.attention_kernels.values())
    for curve in hw.collectives:
        assert curve.source


def test_a100_presets_differ_in_the_fabric_only() -> None:
    """a100-80gb prices a standard fabric; a100-80gb-flexsp keeps FlexSP's measured congested one
    (4.9 GB/s all-to-all per device across 8 nodes): the same GPU, a 64-GPU all-gather far slower."""
    std, flexsp = load_hardware("a100-80gb"), load_hardware("a100-80gb-flexsp")
    assert std.matmul_flops == flexsp.matmul_flops and std.attention_fwd_flops == flexsp.attention_fwd_flops
    assert flexsp.collective("all_to_all", 64, 8).bus_bw(1 << 30) == pytest.approx(4.9e9, rel=1e-3)  # 30 us latency
    assert std.collective_time_s("all_gather", 4e8, 64, 8) < flexsp.collective_time_s("all_gather", 4e8, 64, 8) / 10


def test_the_optimizer_step_ends_every_step_price() -> None:
    """llama-7b on 32 GPUs at stage 1, bf16 recipe, torch's foreach AdamW: the rank's 1/32 of the
    parameters at 82 bytes each (weight decay 8, m.lerp 12, v.mul 8, v.addcmul 12, sqrt, its
    division and + eps 8 each, addcdiv 16, the bf16 copy 2) over the memory bandwidth, added to the
    least any step adds; one GPU steps every parameter."""
    from dcp.costmodel.zero import unit_params

    spec, hw = load_model("llama-7b"), load_hardware("h200-sxm")
    cluster = Cluster(num_gpus=32, gpus_per_node=8, memory_bytes=1e11)
    counted = CostModel(spec, hw, cluster, EAGER)
    fused = CostModel(spec, hw, cluster, TrainingSetup(kernels="eager", optimizer="fused"))
    params = sum(unit_params(spec))
    assert counted.optimizer_s == pytest.approx(82 * params / 32 / hw.memory_bw_bytes_per_s, rel=1e-3)
    # The collectives are the same in both: the step differs by the (82 - 30) bytes a parameter.
    assert counted.grad_sync_s() - fused.grad_sync_s() == pytest.approx(
        (82 - 30) * params / 32 / hw.memory_bw_bytes_per_s, rel=1e-3)
    one = CostModel(spec, hw, Cluster(num_gpus=1, gpus_per_node=1, memory_bytes=1e11), EAGER)
    assert one.grad_sync_s() == pytest.approx(82 * params / hw.memory_bw_bytes_per_s, rel=1e-3)


def test_gemm_offset_is_a_fixed_cost() -> None:
    """A matmul over M tokens costs as M + m0 tokens (h200-sxm: m0 = 192): each layer's forward
    and recompute gain m0 tokens of matmul time, its backward twice that, and the LM head's three
    matmuls per micro-batch m0 tokens of theirs; the per-token coefficients do not move."""
    spec = load_model("llama-7b")
    hw = load_hardware("h200-sxm")
    flat = dataclasses.replace(hw, matmul_tokens_offset=0.0)
    a, b = CostModel(spec, hw, CLUSTER, EAGER).fit, CostModel(spec, flat, CLUSTER, EAGER).fit
    rate = 828e12 * 0.849  # the H200's burst matmul rate at the clock a step sustains (702.9 TFLOP/s)
    layer = 192 * spec.layer_fwd_flops_per_token() / rate
    assert a.fwd_fixed_s - b.fwd_fixed_s == pytest.approx(layer)
    assert a.bwd_fixed_s - b.bwd_fixed_s == pytest.approx(2 * layer)
    assert a.rec_fixed_s - b.rec_fixed_s == pytest.approx(layer)
    assert a.microbatch_fixed_s - b.microbatch_fixed_s == pytest.approx(192 * 6 * spec.hidden * spec.vocab / rate)
    assert (a.fwd_per_token_s, a.bwd_per_token_s) == (b.fwd_per_token_s, b.bwd_per_token_s)
    # 512 tokens a GPU (SP 8 at 4K) run at 512 / (512 + 192) = 73% of the large-shape rate.
    assert 512 / (512 + hw.matmul_tokens_offset) == pytest.approx(0.727, abs=1e-3)


def test_sustained_clock_scales_every_tensor_core_term() -> None:
    """Halving the sustained clock doubles the matmul and attention terms (per pair, the fixed
    matmul cost) and leaves the memory-bound ones (elementwise, loss) where they were."""
    spec, hw = load_model("llama-7b"), load_hardware("h100-sxm")
    full, half = (CostModel(spec, dataclasses.replace(hw, sustained_clock=c), CLUSTER, EAGER).fit for c in (1.0, 0.5))
    assert half.fwd_per_pair_s == pytest.approx(2 * full.fwd_per_pair_s)
    assert half.bwd_per_pair_s == pytest.approx(2 * full.bwd_per_pair_s)
    matmul = spec.layer_fwd_flops_per_token() / hw.matmul_flops
    pairs = 200.5 * full.fwd_per_pair_s  # the kernel's short-sequence term, per token
    assert half.fwd_per_token_s - full.fwd_per_token_s == pytest.approx(matmul + pairs)
    with pytest.raises(CostModelError, match="sustained_clock must be in"):
        dataclasses.replace(hw, sustained_clock=1.2)
