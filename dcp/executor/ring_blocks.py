"""Attention of one ring step: a query block against one key/value block, with its log-sum-exp.

Ring attention computes softmax attention a block of keys at a time and merges the partial
results exactly by their log-sum-exp (online softmax: Milakov and Gimelshein, arXiv 1805.02867;
FlashAttention, arXiv 2205.14135). A `BlockKernel` does one block:

    prepare(seqs, kind, mine, source, device) -> block   (once per step: which pairs are allowed)
    forward(q [n, H, D], k, v [m, Hkv, D], block) -> out [n, H, D], lse [n, H]         (acc dtype)
    backward(q, k, v, dout [n, H, D], out, lse, delta [n, H], block) -> dq, dk, dv    (acc dtype)

where `out` and `lse` in backward are the final (merged) output and log-sum-exp and delta =
rowsum(dout * out), so a block's gradient needs nothing from the other blocks (FlashAttention-2's
backward, arXiv 2307.08691). Rows without any allowed key have lse = -inf and contribute nothing.
`dcp.executor.ring_flash` has the fused-kernel path.

`ReferenceBlocks` is the plain path, every product in the accumulation dtype (float32, float64
for float64 inputs) with an explicit mask: obviously right, O(n m) memory, the CPU path and the
one the tests compare against single-process training.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch

from dcp.models.attention import pair_mask
from dcp.models.packing import PackedSeqs


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype partial outputs, log-sum-exps and gradients accumulate in: float64 for float64
    inputs, float32 for everything else."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class BlockKernel(Protocol):
    """Forward and backward of attention over one (query block, key/value block) pair."""

    def prepare(self, seqs: PackedSeqs, kind: str, mine: int, source: int, device: torch.device) -> Any: ...

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: Any
                ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def backward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, delta: torch.Tensor, block: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


def ring_rows(seqs: PackedSeqs, position: int) -> torch.Tensor:
    """Packed-sequence positions of the tokens of ring position `position`'s shard."""
    order = seqs.order()
    assert order is not None
    shard = seqs.total // seqs.ring
    return order[position * shard:(position + 1) * shard]


def _scores(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """Masked q k^T / sqrt(D) as [H, n, m] in `acc`, KV heads repeated for GQA."""
    rep = q.shape[1] // k.shape[1]
    kr = k.to(acc).repeat_interleave(rep, dim=1)
    s = torch.einsum("nhd,mhd->hnm", q.to(acc), kr) / math.sqrt(q.shape[-1])
    return s.masked_fill(~mask, float("-inf"))


def _probs(s: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """exp(s - lse) with rows of lse = -inf (no key allowed) all zero instead of NaN."""
    finite = torch.isfinite(lse)
    return torch.exp(s - torch.where(finite, lse, 0.0).unsqueeze(-1)) * finite.unsqueeze(-1)


class ReferenceBlocks:
    """Block attention by explicit masked matmuls in the accumulation dtype."""

    def prepare(self, seqs: PackedSeqs, kind: str, mine: int, source: int, device: torch.device) -> torch.Tensor:
        """The [n, m] mask of ring position `mine`'s queries against `source`'s keys."""
        return pair_mask(seqs, kind, ring_rows(seqs, mine), ring_rows(seqs, source)).to(device)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        acc = accumulation_dtype(q.dtype)
        s = _scores(q, k, mask, acc)
        lse = torch.logsumexp(s, dim=-1)  # [H, n]; -inf where no key is allowed
        rep = q.shape[1] // k.shape[1]
        out = torch.einsum("hnm,mhd->nhd", _probs(s, lse), v.to(acc).repeat_interleave(rep, dim=1))
        return out, lse.transpose(0, 1)

    def backward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, delta: torch.Tensor, mask: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        acc = accumulation_dtype(q.dtype)
        hkv, rep = k.shape[1], q.shape[1] // k.shape[1]
        scale = 1.0 / math.sqrt(q.shape[-1])
        p = _probs(_scores(q, k, mask, acc), lse.transpose(0, 1))
        qa, ka, va, do = q.to(acc), k.to(acc).repeat_interleave(rep, 1), v.to(acc).repeat_interleave(rep, 1), dout.to(acc)
        dv = torch.einsum("hnm,nhd->mhd", p, do)
        dp = torch.einsum("nhd,mhd->hnm", do, va)
        ds = p * (dp - delta.transpose(0, 1).unsqueeze(-1))
        dq = torch.einsum("hnm,mhd->nhd", ds, ka) * scale
        dk = torch.einsum("hnm,nhd->mhd", ds, qa) * scale
        m, d = k.shape[0], k.shape[2]
        # GQA: a KV head's gradient is the sum over the query heads it serves.
        return dq, dk.view(m, hkv, rep, d).sum(2), dv.view(m, hkv, rep, d).sum(2)


def merge(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Online-softmax merge of two partial results over disjoint key sets: each normalized over its
    own keys, weighted by exp(its lse - the joint lse). out [n, H, D], lse [n, H]."""
    joint = torch.logaddexp(lse, block_lse)
    finite = torch.isfinite(joint)
    safe = torch.where(finite, joint, 0.0)
    w_old = torch.where(finite, torch.exp(lse - safe), 0.0)
    w_new = torch.where(finite, torch.exp(block_lse - safe), 0.0)
    return out * w_old.unsqueeze(-1) + block_out * w_new.unsqueeze(-1), joint
