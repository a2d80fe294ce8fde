"""Building blocks shared by the reference models: norms, RoPE, attention modules, MLPs.

All work on packed token-major tensors [N, hidden] (N = the tokens of a rank's shard), never on
padded [B, S, hidden] batches: variable lengths cost nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dcp.models.attention import AttentionFn, cross_attention, varlen_attention
from dcp.models.packing import PackedSeqs
from dcp.models.precision import wide


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019), as Llama uses."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in fp32 (float64 stays float64): bf16 sums of squares lose the small components.
        xw = wide(x)
        return (xw * torch.rsqrt(xw.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class FP32LayerNorm(nn.LayerNorm):
    """LayerNorm computed in fp32 (float64 in float64) and returned in its input's dtype,
    whatever autocast says.

    CUDA autocast runs layer_norm in fp32 and hands its fp32 output to every projection that
    follows, each of which casts it to bf16 again; CPU autocast keeps it in bf16. Explicit dtypes
    make both the same (and the saved tensors what dcp.profiler.memory counts on a CPU), with the
    numerics of CUDA autocast: the projections read the bf16 rounding of the fp32 result."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xw = wide(x)
        weight = self.weight.to(xw.dtype) if self.weight is not None else None
        bias = self.bias.to(xw.dtype) if self.bias is not None else None
        return F.layer_norm(xw, self.normalized_shape, weight, bias, self.eps).to(x.dtype)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding (Su et al., arXiv 2104.09864), rotate-half layout as in Llama.

    x [N, H, D], positions [N]: each token's position inside its own sample, so packed samples
    and shards of them get exactly the rotation they would get alone."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = positions.to(torch.float32).unsqueeze(1) * inv_freq  # [N, D/2]
    cos = torch.cat([angles.cos(), angles.cos()], -1).unsqueeze(1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], -1).unsqueeze(1).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class SelfAttention(nn.Module):
    """Multi-head self-attention with GQA; the attention itself is the swappable `attn_fn`.

    `attn_fn` is a plain attribute, not a submodule, so swapping it (Ulysses) leaves the
    parameters and the state dict unchanged."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, kind: str, *, rope: bool,
                 bias: bool = False) -> None:
        super().__init__()
        if hidden % heads or heads % kv_heads:
            raise ValueError(f"hidden {hidden}, heads {heads}, kv_heads {kv_heads} do not divide")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.kind, self.rope = kind, rope
        self.q_proj = nn.Linear(hidden, hidden, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(hidden, hidden, bias=bias)
        self.attn_fn: AttentionFn = varlen_attention

    def forward(self, x: torch.Tensor, seqs: PackedSeqs) -> torch.Tensor:
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.heads, self.head_dim)
        k = self.k_proj(x).view(n, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.kv_heads, self.head_dim)
        if self.rope:
            pos = seqs.positions()
            q, k = apply_rope(q, pos), apply_rope(k, pos)
        o = self.attn_fn(q, k, v, seqs, self.kind)
        return self.o_proj(o.reshape(n, -1))


class CrossAttention(nn.Module):
    """Tokens attend to their own sample's conditioning sequence (STDiT's caption cross-attention)."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.q_proj = nn.Linear(hidden, hidden)
        self.kv_proj = nn.Linear(hidden, 2 * hidden)
        self.o_proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, seqs: PackedSeqs) -> torch.Tensor:
        q = self.q_proj(x).view(x.shape[0], self.heads, self.head_dim)
        k, v = self.kv_proj(cond).view(cond.shape[0], 2, self.heads, self.head_dim).unbind(1)
        return self.o_proj(cross_attention(q, k, v, seqs).reshape(x.shape[0], -1))


class SwiGLU(nn.Module):
    """Gated MLP (Shazeer 2020): down(silu(gate(x)) * up(x)), three matrices."""

    def __init__(self, hidden: int, ffn_hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, ffn_hidden, bias=False)
        self.up = nn.Linear(hidden, ffn_hidden, bias=False)
        self.down = nn.Linear(ffn_hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class GeluMLP(nn.Module):
    """fc2(gelu(fc1(x))), two matrices (DiT/STDiT, tanh-approximate GELU)."""

    def __init__(self, hidden: int, ffn_hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn_hidden)
        self.fc2 = nn.Linear(ffn_hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


def make_mlp(kind: str, hidden: int, ffn_hidden: int) -> nn.Module:
    if kind == "swiglu":
        return SwiGLU(hidden, ffn_hidden)
    if kind == "gelu":
        return GeluMLP(hidden, ffn_hidden)
    raise ValueError(f"unknown mlp {kind!r}; expected swiglu or gelu")


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """GPT-2 style init: normal(0, std) weights, zero biases, unit norms."""
    for m in module.modules():
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
