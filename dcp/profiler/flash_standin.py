"""Stand-ins for the GPU's flash-attention kernels that keep and allocate what those kernels do.

On the GPU dcp's attention runs a flash-style varlen kernel (flash-attn's, or torch's own
varlen_attn built from it), which saves q, k, v, its output and an fp32 log-sum-exp per query
row and head for backward, never the score matrix (Dao, FlashAttention-2, arXiv 2307.08691).
On CPU and on fake tensors SDPA takes its math path, which saves the scores. For memory
accounting (dcp.profiler.memory) the attention of the reference and Hugging Face models runs
these stand-ins instead (`dcp.models.attention.forced_kernels`):

- forward: saves q, k, v, out and the fp32 log-sum-exp (varlen: [heads, tokens]);
- backward: allocates what flash-attn 2's backward does (csrc/flash_attn/flash_api.cpp,
  mha_varlen_bwd): dq, dk, dv, an fp32 dq accumulator [tokens, heads, head_dim], fp32 row sums
  [heads, tokens], and under GQA dk, dv expanded to every query head before they are summed.

On fake tensors nothing is computed; on real tensors the values are exact (SDPA per segment),
so a stand-in can also run inside a real training step whose saved tensors are counted.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _is_fake(t: torch.Tensor) -> bool:
    return isinstance(t, FakeTensor)


class _FlashSaves(torch.autograd.Function):
    """Attention whose autograd footprint is a flash kernel's; `attend` computes real values."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attend: Attend,  # noqa: ANN001
                heads_dim: int) -> torch.Tensor:
        fake = _is_fake(q)
        out = torch.empty_like(q) if fake else attend(q, k, v)
        # The log-sum-exp: one fp32 per query row and head (every dim of q but the head size).
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.attend, ctx.fake, ctx.heads_dim = attend, fake, heads_dim
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # noqa: ANN001
        q, k, v, out, lse = ctx.saved_tensors
        if not ctx.fake:
            with torch.enable_grad():
                leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                grads = torch.autograd.grad(ctx.attend(*leaves), leaves, dout)
            return (*grads, None, None)
        d = ctx.heads_dim
        dq_accum = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        softmax_d = torch.empty_like(lse)
        dq = torch.empty_like(q)
        if k.shape[d] != q.shape[d]:  # GQA: gradients of every query head's K/V first, then summed
            expanded = list(k.shape)
            expanded[d] = q.shape[d]
            dk_all, dv_all = k.new_empty(expanded), v.new_empty(expanded)
            dk, dv = torch.empty_like(k), torch.empty_like(v)
            del dk_all, dv_all
        else:
            dk, dv = torch.empty_like(k), torch.empty_like(v)
        del dq_accum, softmax_d
        return dq, dk, dv, None, None


def _segments_attend(cu: torch.Tensor, causal: bool) -> Attend:
    """Exact varlen attention over the segments of cu_seqlens (GQA: KV heads repeated)."""
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        lengths = cu.diff().tolist()
        rep = q.shape[1] // k.shape[1]
        outs = []
        for qi, ki, vi in zip(q.split(lengths), k.split(lengths), v.split(lengths), strict=True):
            ki, vi = ki.repeat_interleave(rep, 1), vi.repeat_interleave(rep, 1)
            o = F.scaled_dot_product_attention(qi.transpose(0, 1), ki.transpose(0, 1), vi.transpose(0, 1),
                                               is_causal=causal)
            outs.append(o.transpose(0, 1))
        return torch.cat(outs)

    return attend


def flash_varlen_standin(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, longest: int,
                         causal: bool) -> torch.Tensor:
    """A `VarlenKernel` (q [N, H, D], k/v [N, Hkv, D]) with flash-attn varlen's memory footprint."""
    return _FlashSaves.apply(q, k, v, _segments_attend(cu, causal), 1)


def flash_dense_standin(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Unmasked attention (q [..., H, L, D], k/v [..., H, C, D]) with a flash kernel's footprint."""
    return _FlashSaves.apply(q, k, v, F.scaled_dot_product_attention, -3)
