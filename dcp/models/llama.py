"""A Llama-like causal transformer (RMSNorm, RoPE, GQA, SwiGLU) built from a ModelSpec."""

from __future__ import annotations

import torch
from torch import nn

from dcp.costmodel import ModelSpec
from dcp.models.layers import RMSNorm, SelfAttention, init_weights, make_mlp
from dcp.models.packing import PackedSeqs


class LlamaLayer(nn.Module):
    """Pre-norm decoder layer: x + attn(norm(x)), then x + mlp(norm(x)).

    forward(x [N, hidden], seqs) takes a packed varlen hidden-state tensor (the tokens of one
    shard) and the sample boundaries; the profiler times exactly this."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        kind = "causal" if spec.attention == "causal" else "full"
        self.attn_norm = RMSNorm(spec.hidden)
        self.attn = SelfAttention(spec.hidden, spec.heads, spec.kv_heads, kind, rope=True)
        self.mlp_norm = RMSNorm(spec.hidden)
        self.mlp = make_mlp(spec.mlp, spec.hidden, spec.ffn_hidden)

    def forward(self, x: torch.Tensor, seqs: PackedSeqs) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), seqs)
        return x + self.mlp(self.mlp_norm(x))


class LlamaModel(nn.Module):
    """Token ids [N] of a packed shard -> logits [N, vocab]."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        if spec.vocab <= 0:
            raise ValueError(f"model {spec.name!r}: a language model needs vocab > 0")
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab, spec.hidden)
        self.layers = nn.ModuleList(LlamaLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden)
        self.lm_head = nn.Linear(spec.hidden, spec.vocab, bias=False)
        init_weights(self)
        if spec.tied_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, input_ids: torch.Tensor, seqs: PackedSeqs) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x, seqs)
        return self.lm_head(self.norm(x))
