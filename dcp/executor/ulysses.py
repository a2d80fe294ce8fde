"""Ulysses sequence-parallel attention (DeepSpeed-Ulysses, arXiv 2309.14509).

Each rank of an SP group of size p holds a contiguous shard of the packed (padded) sequence.
q, k, v go from sequence-sharded [S/p, H, D] to head-sharded [S, H/p, D] by all-to-all in the
group; every rank then runs ordinary varlen attention over the *whole* sequence for its heads,
so block-diagonal, causal, spatial (per frame) and temporal (across frames) masks need no
special care: each is computed on the full sequence exactly as on one process. The output
goes back to sequence shards by the inverse all-to-all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from dcp.executor.comm import heads_to_seq, seq_to_heads
from dcp.models.attention import AttentionFn
from dcp.models.packing import PackedSeqs


@dataclass
class SPContext:
    """The SP group the current micro-batch runs in; the executor sets it before each one."""

    group: dist.ProcessGroup | None = None
    size: int = 1


class UlyssesAttention:
    """Wraps a local attention function; a plain callable (not a module) so swapping it into a
    layer's `attn_fn` leaves parameters and state dict untouched."""

    def __init__(self, inner: AttentionFn, ctx: SPContext) -> None:
        self.inner, self.ctx = inner, ctx

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: PackedSeqs,
                 kind: str) -> torch.Tensor:
        p, group = self.ctx.size, self.ctx.group
        if p == 1:
            return self.inner(q, k, v, seqs, kind)
        if q.shape[1] % p or k.shape[1] % p:
            # The executor checks this before any collective; this guards direct use.
            raise ValueError(f"Ulysses SP of size {p} needs heads ({q.shape[1]}) and KV heads "
                             f"({k.shape[1]}) divisible by {p}")
        if seqs.local * p != seqs.total or q.shape[0] != seqs.local:
            raise ValueError(f"shard of {q.shape[0]} tokens does not match {seqs.total} tokens over {p} ranks")
        q, k, v = (seq_to_heads(t, group) for t in (q, k, v))
        return heads_to_seq(self.inner(q, k, v, seqs.full(), kind), group)


def install_ulysses(model: torch.nn.Module, ctx: SPContext) -> list[torch.nn.Module]:
    """Swap Ulysses attention into every module with an `attn_fn` attribute; returns them."""
    modules = [m for m in model.modules() if hasattr(m, "attn_fn")]
    for m in modules:
        if not isinstance(m.attn_fn, UlyssesAttention):
            m.attn_fn = UlyssesAttention(m.attn_fn, ctx)
    return modules
