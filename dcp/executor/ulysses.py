"""Sequence-parallel attention: Ulysses (DeepSpeed-Ulysses, arXiv 2309.14509), alone or with a ring.

An SP group of p = u x c ranks runs Ulysses over u consecutive ranks and ring attention over c
(USP, Fang and Zhao, arXiv 2405.07719; LoongTrain, arXiv 2406.18485): q, k, v go from
sequence-sharded [S/p, H, D] to head-sharded [S/c, H/u, D] by all-to-all among the u ranks, so each
rank holds its ring rank's shard of the sequence for its heads; without a ring (c = 1) that is the
*whole* sequence and ordinary varlen attention runs on it, so block-diagonal, causal, spatial and
temporal masks need no special care. With a ring, `dcp.executor.ring` passes key/value blocks
around the c ranks holding the same heads. The output goes back to sequence shards by the inverse
all-to-all.

Ulysses shards whole heads, so u must divide the query heads. With fewer KV heads than u, each
KV head is replicated before the all-to-all so that every rank receives the one KV head its query
heads use (the all-to-all then moves u instead of Hkv KV heads).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from dcp.executor.comm import heads_to_seq, seq_to_heads
from dcp.executor.ring import ring_attention
from dcp.executor.ring_comm import RingPeers
from dcp.models.attention import AttentionFn
from dcp.models.packing import PackedSeqs


@dataclass
class SPContext:
    """The SP group the current micro-batch runs in; the executor sets it before each one."""

    group: dist.ProcessGroup | None = None
    """The Ulysses group: this rank's u consecutive ranks (None when u = 1)."""
    size: int = 1
    """SP size p = ulysses x ring."""
    rank: int = 0
    """This rank's index in the SP group."""
    ring: RingPeers | None = None
    """This rank's ring (None when the ring degree is 1)."""

    @property
    def ring_size(self) -> int:
        return 1 if self.ring is None else self.ring.size

    @property
    def ulysses(self) -> int:
        return self.size // self.ring_size


def ulysses_heads_error(heads: int, kv_heads: int, ulysses: int) -> str | None:
    """Why Ulysses over `ulysses` ranks cannot shard these heads, or None if it can: u must divide
    the query heads, and the KV heads must divide by u or u by them (then they are replicated)."""
    if heads % ulysses:
        return f"Ulysses degree {ulysses} does not divide the model's {heads} heads"
    if kv_heads % ulysses and ulysses % kv_heads:
        return f"Ulysses degree {ulysses} and the model's {kv_heads} KV heads do not divide one another"
    return None


class UlyssesAttention:
    """Wraps a local attention function; a plain callable (not a module) so swapping it into a
    layer's `attn_fn` leaves parameters and state dict untouched."""

    def __init__(self, inner: AttentionFn, ctx: SPContext) -> None:
        self.inner, self.ctx = inner, ctx

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: PackedSeqs,
                 kind: str) -> torch.Tensor:
        ctx = self.ctx
        if ctx.size == 1:
            return self.inner(q, k, v, seqs, kind)
        u = ctx.ulysses
        problem = ulysses_heads_error(q.shape[1], k.shape[1], u)
        if problem:  # the executor checks this before any collective; this guards direct use
            raise ValueError(problem)
        if seqs.local * ctx.size != seqs.total or q.shape[0] != seqs.local or seqs.ring != ctx.ring_size:
            raise ValueError(f"shard of {q.shape[0]} tokens (ring {seqs.ring}) does not match {seqs.total} tokens "
                             f"over {ctx.size} ranks (ring {ctx.ring_size})")
        if u > 1:
            if u > k.shape[1]:  # one KV head per rank: repeat each for the ranks holding its query heads
                k, v = (t.repeat_interleave(u // t.shape[1], dim=1) for t in (k, v))
            q, k, v = (seq_to_heads(t, ctx.group) for t in (q, k, v))
        view = seqs.ring_view()
        if ctx.ring is None:
            out = self.inner(q, k, v, view, kind)
        else:
            out = ring_attention(q, k, v, view, kind, ctx.ring)
        return heads_to_seq(out, ctx.group) if u > 1 else out


def install_ulysses(model: torch.nn.Module, ctx: SPContext) -> list[torch.nn.Module]:
    """Swap SP attention into every module with an `attn_fn` attribute; returns them."""
    modules = [m for m in model.modules() if hasattr(m, "attn_fn")]
    for m in modules:
        if not isinstance(m.attn_fn, UlyssesAttention):
            m.attn_fn = UlyssesAttention(m.attn_fn, ctx)
    return modules
