"""Reference transformers built from a ModelSpec: a Llama-like causal model and an STDiT-like
spatial-temporal model. Layers take packed varlen hidden states [N, hidden] plus the sample
boundaries (`PackedSeqs`) and call attention through a swappable `attn_fn`.

Profiling one layer::

    layer = build_layer(spec)
    seqs = PackedSeqs.pack([1024, 512], frames=[1, 1])
    y = layer(torch.randn(seqs.total, spec.hidden), seqs)
"""

from __future__ import annotations

import torch
from torch import nn

from dcp.costmodel import ModelSpec
from dcp.models.attention import (
    AttentionFn,
    attention_mask,
    cross_attention,
    reference_attention,
    sdpa_attention,
    varlen_attention,
)
from dcp.models.layers import SelfAttention
from dcp.models.llama import LlamaLayer, LlamaModel
from dcp.models.losses import IGNORE_INDEX, lm_loss, mse_loss
from dcp.models.packing import PackedSeqs
from dcp.models.stdit import STDiTLayer, STDiTModel
from dcp.models.synthetic import sample_tensors


def build_model(spec: ModelSpec, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                in_channels: int = 8, seed: int | None = None) -> nn.Module:
    """The reference model for `spec`: STDiTModel for spatial_temporal attention, else LlamaModel
    (causal or full attention). `seed` makes the initial weights identical on every rank."""
    if seed is not None:
        torch.manual_seed(seed)
    if spec.attention == "spatial_temporal":
        model: nn.Module = STDiTModel(spec, in_channels=in_channels)
    else:
        model = LlamaModel(spec)
    if all(p.dtype == dtype and p.device == torch.device(device) for p in model.parameters()):
        return model  # nothing to convert (and fake parameters could not be swapped)
    return model.to(device=device, dtype=dtype)


def layer_class(spec: ModelSpec) -> type[nn.Module]:
    """The class of one transformer layer of `spec`'s reference model."""
    return STDiTLayer if spec.attention == "spatial_temporal" else LlamaLayer


def build_layer(spec: ModelSpec, *, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> nn.Module:
    """One layer of `spec`'s reference model: forward(x [N, hidden], seqs[, cond]) -> [N, hidden]."""
    return layer_class(spec)(spec).to(device=device, dtype=dtype)


__all__ = [
    "IGNORE_INDEX", "AttentionFn", "LlamaLayer", "LlamaModel", "PackedSeqs", "STDiTLayer", "STDiTModel",
    "SelfAttention", "attention_mask", "build_layer", "build_model", "cross_attention", "layer_class",
    "lm_loss", "mse_loss", "reference_attention", "sample_tensors", "sdpa_attention", "varlen_attention",
]
