"""Varlen kernels (flash-attn, torch's varlen_attn) behind the fast attention path, checked on CPU
with a stand-in kernel: the token layout that turns every attention kind into plain varlen
segments, torch's keyword changes across releases, and the self-check that skips a bad kernel."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from dcp.models import PackedSeqs, reference_attention
from dcp.models.attention import (
    attention_backend,
    first_working_kernel,
    kernel_attention,
    torch_varlen_kernel,
)


def segment_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, longest: int,
                   causal: bool) -> torch.Tensor:
    """What a varlen kernel computes, one SDPA per segment of `cu`: a CPU stand-in."""
    assert int((cu[1:] - cu[:-1]).max()) == longest and cu.dtype == torch.int32
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    bounds = cu.tolist()
    return torch.cat([F.scaled_dot_product_attention(q[a:b].transpose(0, 1), k[a:b].transpose(0, 1),
                                                     v[a:b].transpose(0, 1), is_causal=causal).transpose(0, 1)
                      for a, b in zip(bounds[:-1], bounds[1:], strict=True)])


def inputs(seqs: PackedSeqs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(seqs.total, 4, 8, dtype=torch.float64, generator=gen)
    k, v = torch.randn(2, seqs.total, 2, 8, dtype=torch.float64, generator=gen)  # GQA: 2 KV heads for 4
    return q, k, v


SEQS = [PackedSeqs.pack([12, 6, 5, 1], frames=[3, 2, 1, 1], sp_size=4).full(),  # 24 tokens, no pad
        PackedSeqs.pack([12, 7], frames=[4, 1], sp_size=4).full()]  # 19 tokens + 1 pad


@pytest.mark.parametrize("kind", ["causal", "full", "spatial", "temporal"])
def test_varlen_layout_matches_reference_attention(kind: str) -> None:
    for seqs in SEQS:
        q, k, v = inputs(seqs)
        torch.testing.assert_close(kernel_attention(q, k, v, seqs, kind, segment_kernel),
                                   reference_attention(q, k, v, seqs, kind))


def old_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, is_causal=False):  # noqa: ANN001, ANN201
    """torch 2.9/2.10's signature: is_causal, no GQA (heads must match)."""
    assert key.shape[1] == query.shape[1] and torch.equal(cu_seq_q, cu_seq_k) and max_q == max_k
    return segment_kernel(query, key, value, cu_seq_q, max_q, is_causal)


def new_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,  # noqa: ANN001, ANN201
                    window_size=(-1, -1), enable_gqa=False):
    """Later releases: window_size ((-1, 0) causal) and enable_gqa."""
    assert tuple(window_size) in ((-1, -1), (-1, 0)) and enable_gqa == (key.shape[1] != query.shape[1])
    return segment_kernel(query, key, value, cu_seq_q, max_q, tuple(window_size) == (-1, 0))


@pytest.mark.parametrize("api", [old_varlen_attn, new_varlen_attn])
@pytest.mark.parametrize("kind", ["causal", "full", "temporal"])
def test_torch_varlen_kernel_speaks_each_release_signature(api, kind: str) -> None:  # noqa: ANN001
    seqs = SEQS[1]
    q, k, v = inputs(seqs)
    got = kernel_attention(q, k, v, seqs, kind, torch_varlen_kernel(api))
    torch.testing.assert_close(got, reference_attention(q, k, v, seqs, kind))


def test_self_check_skips_a_failing_or_wrong_kernel() -> None:
    def raises(*args: object) -> torch.Tensor:
        raise RuntimeError("no kernel image for this device")

    def never_causal(q, k, v, cu, longest, causal):  # noqa: ANN001, ANN202
        return segment_kernel(q, k, v, cu, longest, False)

    cpu = torch.device("cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        name, kernel = first_working_kernel([("raises", raises), ("never causal", never_causal),
                                             ("good", segment_kernel)], cpu, torch.float32)
    assert name == "good" and kernel is segment_kernel
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2 and "RuntimeError: no kernel image" in messages[0]
    assert "never causal skipped" in messages[1] and "output differs from SDPA" in messages[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert first_working_kernel([("raises", raises)], cpu, torch.float32) == ("sdpa per sample", None)


def test_self_check_runs_apart_from_the_callers_autograd_state() -> None:
    """The first call comes from inside a forward: under no_grad the check must still run its
    backward (in a thread of its own), not reject a good kernel."""
    with torch.no_grad():
        assert first_working_kernel([("good", segment_kernel)], torch.device("cpu"), torch.float32)[0] == "good"


def test_cpu_uses_sdpa_per_sample() -> None:
    assert attention_backend(torch.device("cpu"), torch.float32) == ("sdpa per sample", None)
