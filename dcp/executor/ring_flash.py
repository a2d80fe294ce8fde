"""Ring steps on a fused varlen kernel that returns its log-sum-exp (FlashAttention-2 on GPUs).

With zigzag chunks every ring step is plain varlen attention on a sub-block, whatever the packing
(causal attention; full attention is every block against every block):

    own block (step 0)      all queries vs all keys, causal (both chunks are in increasing order)
    an earlier rank's block all queries vs its first chunk, full (that chunk precedes both of ours)
    a later rank's block    our second chunk vs all its keys, full (both its chunks precede it)

each within a sample: the segments are the samples present on both sides, rows of the others
drop out (their log-sum-exp stays -inf). `FusedBlocks` prepares those rows and segment bounds
once per step on the host and calls a `VarlenLse` kernel: torch's FlashAttention-2 (`aten`
`_flash_attention_forward` / `_backward`, CUDA, fp16/bf16) or `ReferenceVarlen`, the same
contract in plain matmuls, which the CPU tests use. The backward gets the final (merged) output
and log-sum-exp, so each block's gradient is exact on its own (FlashAttention-2, arXiv 2307.08691).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from dcp.executor.ring_blocks import ReferenceBlocks, accumulation_dtype
from dcp.models.packing import PackedSeqs


class VarlenLse(Protocol):
    """Varlen attention over matching query/key segments, with its log-sum-exp [H, n_q] (float32 from
    the fused kernels)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                max_q: int, max_k: int, causal: bool) -> tuple[torch.Tensor, torch.Tensor]: ...

    def backward(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int,
                 causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


@dataclass(frozen=True)
class BlockRows:
    """One ring step's sub-block: which local query rows and which key rows of the block it holds
    take part, and their matching segments."""

    q_rows: torch.Tensor
    k_rows: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    causal: bool


def block_rows(seqs: PackedSeqs, kind: str, mine: int, source: int, device: torch.device) -> BlockRows | None:
    """The sub-block of ring position `mine`'s queries against position `source`'s keys (see the
    module docstring); None when no pair is allowed."""
    shard = seqs.total // seqs.ring
    half = shard // 2
    every = torch.arange(shard)
    if kind == "full" or source == mine:
        q_local, k_local = every, every
    elif source < mine:
        q_local, k_local = every, every[:half]
    else:
        q_local, k_local = every[half:], every
    order = seqs.order("cpu")
    assert order is not None
    seg = seqs.segment_ids_full().cpu()
    seg_q, seg_k = seg[order[mine * shard + q_local]], seg[order[source * shard + k_local]]
    common = seg_q[torch.isin(seg_q, seg_k)].unique()
    keep_q, keep_k = torch.isin(seg_q, common), torch.isin(seg_k, common)
    if not keep_q.any():
        return None
    counts_q = torch.unique_consecutive(seg_q[keep_q], return_counts=True)[1]
    counts_k = torch.unique_consecutive(seg_k[keep_k], return_counts=True)[1]

    def bounds(counts: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).to(device, torch.int32)

    return BlockRows(q_local[keep_q].to(device), k_local[keep_k].to(device), bounds(counts_q), bounds(counts_k),
                     int(counts_q.max()), int(counts_k.max()), kind == "causal" and source == mine)


class FusedBlocks:
    """`BlockKernel` on a varlen kernel with log-sum-exp; kinds other than causal and full (their
    blocks are no plain varlen sub-blocks) fall back to the reference blocks."""

    def __init__(self, varlen: VarlenLse) -> None:
        self.varlen = varlen
        self.reference = ReferenceBlocks()

    def prepare(self, seqs: PackedSeqs, kind: str, mine: int, source: int, device: torch.device
                ) -> BlockRows | torch.Tensor | None:
        if kind not in ("causal", "full"):
            return self.reference.prepare(seqs, kind, mine, source, device)
        return block_rows(seqs, kind, mine, source, device)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: BlockRows | torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(block, torch.Tensor):
            return self.reference.forward(q, k, v, block)
        acc = accumulation_dtype(q.dtype)
        out = torch.zeros(q.shape, dtype=acc, device=q.device)
        lse = torch.full(q.shape[:2], -math.inf, dtype=acc, device=q.device)
        if block is not None:
            o, l_ = self.varlen.forward(q[block.q_rows], k[block.k_rows], v[block.k_rows], block.cu_q, block.cu_k,
                                        block.max_q, block.max_k, block.causal)
            out[block.q_rows] = o.to(acc)
            lse[block.q_rows] = l_.transpose(0, 1).to(acc)
        return out, lse

    def backward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, delta: torch.Tensor, block: BlockRows | torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if isinstance(block, torch.Tensor):
            return self.reference.backward(q, k, v, dout, out, lse, delta, block)
        acc = accumulation_dtype(q.dtype)
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        dk = torch.zeros(k.shape, dtype=acc, device=k.device)
        dv = torch.zeros(v.shape, dtype=acc, device=v.device)
        if block is not None:
            rows = block.q_rows
            lse_rows = lse[rows].transpose(0, 1).contiguous()
            dq_b, dk_b, dv_b = self.varlen.backward(
                dout[rows].contiguous(), q[rows], k[block.k_rows], v[block.k_rows], out[rows].contiguous(), lse_rows,
                block.cu_q, block.cu_k, block.max_q, block.max_k, block.causal)
            dq[rows], dk[block.k_rows], dv[block.k_rows] = dq_b.to(acc), dk_b.to(acc), dv_b.to(acc)
        return dq, dk, dv


class ReferenceVarlen:
    """`VarlenLse` in plain matmuls, segment by segment (bottom-right causal alignment, as
    FlashAttention 2.1+): the CPU stand-in the tests run `FusedBlocks` on."""

    @staticmethod
    def _masks(cu_q: torch.Tensor, cu_k: torch.Tensor, causal: bool) -> torch.Tensor:
        seg_q = torch.repeat_interleave(torch.arange(len(cu_q) - 1), cu_q.diff().long().cpu())
        seg_k = torch.repeat_interleave(torch.arange(len(cu_k) - 1), cu_k.diff().long().cpu())
        allow = seg_q[:, None] == seg_k[None, :]
        if causal:
            pos_q = torch.arange(len(seg_q)) - cu_q.long().cpu()[seg_q]
            pos_k = torch.arange(len(seg_k)) - cu_k.long().cpu()[seg_k]
            shift = (cu_k.diff() - cu_q.diff()).long().cpu()[seg_q]  # bottom-right: the last rows align
            allow &= pos_q[:, None] + shift[:, None] >= pos_k[None, :]
        return allow

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                max_q: int, max_k: int, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = ReferenceBlocks().forward(q, k, v, self._masks(cu_q, cu_k, causal).to(q.device))
        return out.to(q.dtype), lse.transpose(0, 1)  # the accumulation dtype (float64 stays exact)

    def backward(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int,
                 causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        acc = accumulation_dtype(q.dtype)
        delta = (dout.to(acc) * out.to(acc)).sum(-1)
        return ReferenceBlocks().backward(q, k, v, dout, out, lse.transpose(0, 1).to(acc), delta,
                                          self._masks(cu_q, cu_k, causal).to(q.device))


class TorchFlashVarlen:
    """`VarlenLse` on torch's FlashAttention-2 varlen kernels (CUDA, fp16/bf16; GQA native)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                max_q: int, max_k: int, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = torch.ops.aten._flash_attention_forward(
            q.contiguous(), k.contiguous(), v.contiguous(), cu_q, cu_k, max_q, max_k, 0.0, causal, False)[:2]
        return out, lse

    def backward(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int,
                 causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rng = torch.zeros(2, dtype=torch.uint64, device=q.device)  # no dropout: the state is unused
        return torch.ops.aten._flash_attention_backward(
            dout, q.contiguous(), k.contiguous(), v.contiguous(), out, lse.float(), cu_q, cu_k, max_q, max_k, 0.0,
            causal, rng, torch.empty(0, device=q.device))[:3]


def block_kernel_for(device: torch.device, dtype: torch.dtype) -> FusedBlocks | ReferenceBlocks:
    """FlashAttention-2's varlen kernels on a CUDA GPU in fp16/bf16, the reference blocks elsewhere."""
    if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16):
        return FusedBlocks(TorchFlashVarlen())
    return ReferenceBlocks()
