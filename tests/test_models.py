"""Reference models, one process: attention paths agree, packing changes nothing, shapes and sizes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dcp.costmodel import ModelSpec, attention_pairs, load_model
from dcp.models import (
    IGNORE_INDEX,
    PackedSeqs,
    attention_mask,
    build_layer,
    build_model,
    cross_attention,
    layer_class,
    lm_loss,
    mse_loss,
    reference_attention,
    sample_tensors,
    sdpa_attention,
)
from dcp.planner import Sample

LLAMA = load_model("tiny-llama")
STDIT = load_model("tiny-stdit")


@pytest.mark.parametrize("kind", ["causal", "full", "spatial", "temporal"])
def test_sdpa_matches_reference_attention(kind: str) -> None:
    torch.manual_seed(0)
    seqs = PackedSeqs.pack([12, 6, 5, 1], frames=[3, 2, 1, 1], sp_size=4).full()  # 24 tokens + 0 pads
    seqs_pad = PackedSeqs.pack([12, 7], frames=[4, 1], sp_size=4).full()  # 19 tokens + 1 pad
    for s in (seqs, seqs_pad):
        q = torch.randn(s.total, 4, 8, dtype=torch.float64)
        k, v = torch.randn(2, s.total, 2, 8, dtype=torch.float64)  # GQA: 2 KV heads for 4 query heads
        torch.testing.assert_close(sdpa_attention(q, k, v, s, kind), reference_attention(q, k, v, s, kind))


def test_attention_masks_follow_the_definitions() -> None:
    seqs = PackedSeqs.pack([6, 2], frames=[2, 1])  # sample 0: 2 frames x 3 tokens, frame-major
    spatial, temporal = attention_mask(seqs, "spatial"), attention_mask(seqs, "temporal")
    causal = attention_mask(seqs, "causal")
    assert spatial[1].tolist() == [True, True, True, False, False, False, False, False]
    assert temporal[1].tolist() == [False, True, False, False, True, False, False, False]
    assert causal[7].tolist() == [False] * 6 + [True, True]  # never across samples


def test_local_attention_refuses_a_shard() -> None:
    seqs = PackedSeqs.pack([8], sp_size=2, sp_rank=1)
    q = torch.randn(seqs.local, 4, 8)
    with pytest.raises(ValueError, match="Ulysses"):
        sdpa_attention(q, q, q, seqs, "causal")


def test_packed_seqs_shards_cover_the_sequence() -> None:
    full = PackedSeqs.pack([5, 3, 6], sp_size=4)
    assert full.num_pad == 2 and full.total == 16 and full.num_real == 3
    shards = [PackedSeqs.pack([5, 3, 6], sp_size=4, sp_rank=r) for r in range(4)]
    assert torch.equal(torch.cat([s.positions() for s in shards]), full.full().positions())
    assert torch.cat([s.valid() for s in shards]).tolist() == [True] * 14 + [False] * 2
    assert full.full().positions()[:9].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0]
    with pytest.raises(ValueError, match="frames"):
        PackedSeqs.pack([5], frames=[2])


def _inputs(spec: ModelSpec, batch: list[Sample]) -> tuple[torch.Tensor, torch.Tensor | None, list]:
    """Packed inputs, packed conditioning (or None) and each sample's conditioning."""
    tensors = [sample_tensors(spec, s, dtype=torch.float64) for s in batch]
    x = torch.cat([t["inputs"] for t in tensors])
    cond = torch.cat([t["cond"] for t in tensors]) if "cond" in tensors[0] else None
    return x, cond, [t.get("cond") for t in tensors]


@pytest.mark.parametrize("spec", [LLAMA, STDIT, dataclasses.replace(STDIT, cross_attention=True)],
                         ids=["llama", "stdit", "stdit-cross"])
def test_packing_equals_running_samples_alone(spec: ModelSpec) -> None:
    model = build_model(spec, dtype=torch.float64, seed=0)
    frames = [1, 1] if spec.attention != "spatial_temporal" else [2, 3]
    batch = [Sample(i, n, attention_pairs(spec.attention, n, f), f) for i, (n, f) in enumerate(zip([6, 9], frames, strict=True))]
    x, cond, conds = _inputs(spec, batch)
    cond_lengths = None if cond is None else [c.shape[0] for c in conds]
    packed = model(x, PackedSeqs.pack([6, 9], frames, cond_lengths=cond_lengths), *([cond] if cond is not None else []))
    alone = []
    for s, c in zip(batch, conds, strict=True):
        xi = sample_tensors(spec, s, dtype=torch.float64)["inputs"]
        seqs = PackedSeqs.pack([s.tokens], [s.frames], cond_lengths=None if c is None else [c.shape[0]])
        alone.append(model(xi, seqs, *([c] if c is not None else [])))
    torch.testing.assert_close(packed, torch.cat(alone))


@pytest.mark.parametrize("spec", [LLAMA, STDIT, dataclasses.replace(STDIT, cross_attention=True)],
                         ids=["llama", "stdit", "stdit-cross"])
def test_float64_gradients_agree_across_packings(spec: ModelSpec) -> None:
    """Float64 means float64 in every op, the norms included: each parameter's gradient of a
    weighted sum of the outputs is the same to 1e-12 whether the samples run packed, alone, or
    packed in the other order. (STDiT's LayerNorm computed in fp32 moved its gradients by about
    1e-8 with the packing; every other parameter agreed to 1e-16.)"""
    model = build_model(spec, dtype=torch.float64, seed=0)
    lengths, frames = [6, 9, 4], [1, 1, 1] if spec.attention != "spatial_temporal" else [2, 3, 1]
    batch = [Sample(i, n, attention_pairs(spec.attention, n, f), f)
             for i, (n, f) in enumerate(zip(lengths, frames, strict=True))]
    x, cond, conds = _inputs(spec, batch)
    weights: list[torch.Tensor] = []  # per output row, made at the first forward
    starts = [0, 6, 15, 19]

    def grads(order: list[list[int]]) -> dict[str, torch.Tensor]:
        """Gradients with the samples run in packs of `order` (indices into the batch)."""
        model.zero_grad()
        for pack in order:
            rows = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in pack])
            c = None if cond is None else [conds[i] for i in pack]
            seqs = PackedSeqs.pack([lengths[i] for i in pack], [frames[i] for i in pack],
                                   cond_lengths=None if c is None else [t.shape[0] for t in c])
            out = model(x[rows], seqs, *([torch.cat(c)] if c is not None else []))
            if not weights:
                weights.append(torch.randn(x.shape[0], out.shape[-1], dtype=torch.float64,
                                           generator=torch.Generator().manual_seed(1)))
            (out * weights[0][rows]).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    packed = grads([[0, 1, 2]])
    assert any("norm" in n for n in packed)
    for order in ([[0], [1], [2]], [[2, 0], [1]]):
        other = grads(order)
        assert other.keys() == packed.keys()
        for name, g in packed.items():
            torch.testing.assert_close(other[name], g, rtol=1e-12, atol=1e-12, msg=name)


def test_norms_compute_in_their_input_dtype_at_least_fp32() -> None:
    """The norms widen bf16 to fp32 and keep float64 (checked against the formulas in float64)."""
    from dcp.models.layers import FP32LayerNorm, RMSNorm

    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 16, dtype=torch.float64, generator=g) * 1e3 + 1.0
    ln, rms = FP32LayerNorm(16).double(), RMSNorm(16).double()
    with torch.no_grad():
        ln.weight.copy_(torch.randn(16, dtype=torch.float64, generator=g))
        ln.bias.copy_(torch.randn(16, dtype=torch.float64, generator=g))
        rms.weight.copy_(torch.randn(16, dtype=torch.float64, generator=g))
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    want_ln = (x - mean) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias
    want_rms = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + rms.eps) * rms.weight
    assert ln(x).dtype == rms(x).dtype == torch.float64
    torch.testing.assert_close(ln(x), want_ln, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(rms(x), want_rms, rtol=1e-13, atol=1e-13)
    rms_b, xb = RMSNorm(16).to(torch.bfloat16), x.to(torch.bfloat16)  # bf16 in and out, fp32 inside
    x32 = xb.float()
    want_b = (x32 / torch.sqrt(x32.pow(2).mean(-1, keepdim=True) + rms_b.eps)).to(torch.bfloat16) * rms_b.weight
    assert rms_b(xb).dtype == torch.bfloat16
    torch.testing.assert_close(rms_b(xb), want_b, rtol=0, atol=0)


def test_model_shapes_and_sizes() -> None:
    llama = build_model(LLAMA, seed=0)
    assert sum(p.numel() for p in llama.parameters()) == LLAMA.param_count()
    seqs = PackedSeqs.pack([7, 4])
    assert llama(torch.randint(0, LLAMA.vocab, (11,)), seqs).shape == (11, LLAMA.vocab)
    stdit = build_model(STDIT, in_channels=5, seed=0)
    assert stdit(torch.randn(11, 5), seqs).shape == (11, 5)
    for spec in (LLAMA, STDIT):
        layer = build_layer(spec)
        assert isinstance(layer, layer_class(spec))
        assert layer(torch.randn(11, spec.hidden), seqs).shape == (11, spec.hidden)
    same_seed = build_model(LLAMA, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(llama.parameters(), same_seed.parameters(), strict=True))


def test_cross_attention_needs_cond_and_skips_pads() -> None:
    spec = dataclasses.replace(STDIT, cross_attention=True)
    model = build_model(spec, seed=0)
    with pytest.raises(ValueError, match="cond"):
        model(torch.randn(4, 8), PackedSeqs.pack([4]))
    seqs = PackedSeqs.pack([3], sp_size=4, cond_lengths=[2]).full()  # one pad token
    q, kv = torch.randn(4, 2, 8), torch.randn(2, 2, 8)
    out = cross_attention(q, kv, kv, seqs)
    assert out[3].abs().sum() == 0 and out[:3].abs().sum() > 0


def test_losses_sum_over_loss_tokens() -> None:
    logits = torch.randn(4, 10)
    labels = torch.tensor([1, 2, IGNORE_INDEX, 3])
    loss, count = lm_loss(logits, labels)
    assert count == 3
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits[[0, 1, 3]], labels[[0, 1, 3]],
                                                                       reduction="sum"))
    pred, target = torch.randn(3, 2), torch.randn(3, 2)
    loss, count = mse_loss(pred, target, torch.tensor([True, False, True]))
    assert count == 2
    torch.testing.assert_close(loss, ((pred - target) ** 2).mean(-1)[[0, 2]].sum())
