"""A 2D spatial-temporal transformer in the style of OpenSora's STDiT, built from a ModelSpec.

A sample is F frames of S patch tokens, frame-major. Each layer is a spatial block (attention
inside each frame) followed by a temporal block (attention across the frames at each position),
each with optional caption cross-attention and a GELU MLP (STDiT3 in hpcaitech/Open-Sora v1.2).
Timestep modulation is left out: it does not change the shape of the work the planner prices.
"""

from __future__ import annotations

import torch
from torch import nn

from dcp.costmodel import ModelSpec
from dcp.models.layers import CrossAttention, FP32LayerNorm, SelfAttention, init_weights, make_mlp
from dcp.models.packing import PackedSeqs


class STBlock(nn.Module):
    """x + attn(norm(x)) [+ x + cross(norm(x), cond)] + mlp(norm(x)), attention of one `kind`."""

    def __init__(self, spec: ModelSpec, kind: str) -> None:
        super().__init__()
        self.attn_norm = FP32LayerNorm(spec.hidden)
        self.attn = SelfAttention(spec.hidden, spec.heads, spec.kv_heads, kind, rope=False, bias=True)
        self.cross = CrossAttention(spec.hidden, spec.heads) if spec.cross_attention else None
        self.cross_norm = FP32LayerNorm(spec.hidden) if spec.cross_attention else None
        self.mlp_norm = FP32LayerNorm(spec.hidden)
        self.mlp = make_mlp(spec.mlp, spec.hidden, spec.ffn_hidden)

    def forward(self, x: torch.Tensor, seqs: PackedSeqs, cond: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), seqs)
        if self.cross is not None:
            if cond is None:
                raise ValueError("this model cross-attends: pass the conditioning tokens (cond)")
            x = x + self.cross(self.cross_norm(x), cond, seqs)
        return x + self.mlp(self.mlp_norm(x))


class STDiTLayer(nn.Module):
    """One spatial and one temporal block: forward(x [N, hidden], seqs, cond=None)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spatial = STBlock(spec, "spatial")
        self.temporal = STBlock(spec, "temporal")

    def forward(self, x: torch.Tensor, seqs: PackedSeqs, cond: torch.Tensor | None = None) -> torch.Tensor:
        return self.temporal(self.spatial(x, seqs, cond), seqs, cond)


class STDiTModel(nn.Module):
    """Patch embeddings [N, in_channels] of a packed shard -> per-token prediction [N, in_channels]
    (trained with an MSE loss against a target, as diffusion models regress noise)."""

    def __init__(self, spec: ModelSpec, in_channels: int = 8, cond_channels: int | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.in_proj = nn.Linear(in_channels, spec.hidden)
        # Caption features arrive at their encoder's width and are projected (OpenSora's y_embedder).
        self.cond_proj = nn.Linear(cond_channels or spec.hidden, spec.hidden) if spec.cross_attention else None
        self.layers = nn.ModuleList(STDiTLayer(spec) for _ in range(spec.num_layers))
        self.norm = FP32LayerNorm(spec.hidden)
        self.out_proj = nn.Linear(spec.hidden, in_channels)
        init_weights(self)

    def forward(self, x: torch.Tensor, seqs: PackedSeqs, cond: torch.Tensor | None = None) -> torch.Tensor:
        h = self.in_proj(x)
        c = self.cond_proj(cond) if self.cond_proj is not None and cond is not None else None
        for layer in self.layers:
            h = layer(h, seqs, c)
        return self.out_proj(self.norm(h))
