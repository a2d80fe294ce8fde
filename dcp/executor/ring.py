"""Ring attention over the c ranks of a ring (Liu et al., "Ring Attention with Blockwise
Transformers", arXiv 2310.01889), forward and backward, exact.

Each rank of the ring holds the queries, keys and values of its shard of the packed sequence (its
two zigzag chunks, `PackedSeqs`; after the Ulysses all-to-all, for its heads). In step s = 0..c-1
it holds the key/value block of ring position j - s: it starts passing that block on to the next
rank, computes its queries' attention on it (a `BlockKernel`), merges the partial output into the
running one by the log-sum-exp (float32, float64 for float64 inputs), and waits for the next
block. So the transfer overlaps the block's attention, and c - 1 transfers move every block once
around the ring.

Backward repeats the trip: the key/value blocks travel again, and with each block an accumulator of
its key/value gradient, to which every rank adds its queries' contribution before passing it on;
after the last step the accumulator arrives, complete, back at the block's owner (one exchange
more). The masks come from the packed layout (samples apart, causal within a sample, or the
spatial/temporal structure), so packed micro-batches of several samples work as they are.

The sequence of exchanges depends only on the ring size, so every rank of a ring issues the same
sends and receives in the same order, in forward, backward and a checkpointed layer's recompute.
"""

from __future__ import annotations

from typing import Any

import torch

from dcp.executor.ring_blocks import BlockKernel, accumulation_dtype, merge
from dcp.executor.ring_comm import GRAD_TAG, KV_TAG, Exchange, RingPeers
from dcp.executor.ring_flash import block_kernel_for
from dcp.models.packing import PackedSeqs


def _blocks(kernel: BlockKernel, seqs: PackedSeqs, kind: str, ring: RingPeers, device: torch.device) -> list[Any]:
    """What the kernel needs for this rank's queries against the block it holds at each step."""
    return [kernel.prepare(seqs, kind, ring.index, ring.source(s), device) for s in range(ring.size)]


def _split(kv: torch.Tensor, k_shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
    k, v = kv.chunk(2)
    return k.view(k_shape), v.view(k_shape)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: PackedSeqs, kind: str,
                ring: RingPeers, kernel: BlockKernel) -> torch.Tensor:
        blocks = _blocks(kernel, seqs, kind, ring, q.device)
        kv = torch.cat([k.reshape(-1), v.reshape(-1)])
        out = lse = None
        for step in range(ring.size):
            pending = Exchange(kv, ring, KV_TAG) if step < ring.size - 1 else None
            block_out, block_lse = kernel.forward(q, *_split(kv, k.shape), blocks[step])
            out, lse = (block_out, block_lse) if out is None else merge(out, lse, block_out, block_lse)
            if pending is not None:
                kv = pending.wait()
        assert out is not None and lse is not None
        result = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, result, lse)
        ctx.seqs, ctx.kind, ctx.ring, ctx.kernel = seqs, kind, ring, kernel
        return result

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        ring: RingPeers = ctx.ring
        acc = accumulation_dtype(q.dtype)
        delta = (dout.to(acc) * out.to(acc)).sum(-1)  # [n, H]: rowsum(dout * out), FlashAttention-2's D
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        kv = torch.cat([k.reshape(-1), v.reshape(-1)])
        blocks = _blocks(ctx.kernel, ctx.seqs, ctx.kind, ring, q.device)  # rebuilt, not kept through every layer
        arriving: Exchange | None = None  # the accumulator of the block held next step
        for step in range(ring.size):
            pending = Exchange(kv, ring, KV_TAG) if step < ring.size - 1 else None
            dq_s, dk_s, dv_s = ctx.kernel.backward(q, *_split(kv, k.shape), dout, out, lse, delta, blocks[step])
            dq += dq_s
            dkv = torch.cat([dk_s.reshape(-1), dv_s.reshape(-1)])
            if arriving is not None:
                dkv += arriving.wait()
            arriving = Exchange(dkv, ring, GRAD_TAG)
            if pending is not None:
                kv = pending.wait()
        assert arriving is not None
        dk, dv = _split(arriving.wait(), k.shape)  # this rank's own block, every rank's part summed
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: PackedSeqs, kind: str,
                   ring: RingPeers, kernel: BlockKernel | None = None) -> torch.Tensor:
    """Attention of this ring rank's shard (q [n, H, D], k/v [n, Hkv, D], n = tokens / ring size, as
    `seqs.ring_view()` lays them out) over the whole packed sequence; returns [n, H, D]."""
    if seqs.ring != ring.size:
        raise ValueError(f"layout of ring degree {seqs.ring} run on a ring of {ring.size} ranks")
    if q.shape[0] != seqs.local or seqs.local * ring.size != seqs.total:
        raise ValueError(f"ring shard of {q.shape[0]} tokens does not match {seqs.total} tokens over {ring.size} ranks")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} KV heads")
    return _RingAttention.apply(q, k, v, seqs, kind, ring, kernel or block_kernel_for(q.device, q.dtype))
