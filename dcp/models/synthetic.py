"""Learnable synthetic sample tensors for the reference models (examples, tests, benchmarks).

Text: arithmetic token sequences (start and stride drawn per sample), so the next token is
predictable from context and the loss can fall. Video: the target mixes each token with the
mean of its position across frames, so the model must use temporal attention to fit it."""

from __future__ import annotations

import torch

from dcp.costmodel import ModelSpec
from dcp.models.losses import IGNORE_INDEX
from dcp.planner.sample import Sample


def sample_tensors(spec: ModelSpec, sample: Sample, *, seed: int = 0, in_channels: int = 8,
                   dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Per-token tensors of one sample: {inputs, labels} for a language model, {inputs, target}
    (plus {cond} with cross-attention) for a spatial-temporal model. Seeded by (seed, sample id)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + sample.id)
    n = sample.tokens
    if spec.attention != "spatial_temporal":
        start = torch.randint(spec.vocab, (1,), generator=g)
        stride = torch.randint(1, 8, (1,), generator=g)
        ids = (start + stride * torch.arange(n)) % spec.vocab
        labels = torch.cat([ids[1:], torch.tensor([IGNORE_INDEX])])
        return {"inputs": ids, "labels": labels}
    f = sample.frames
    x = torch.randn(f, n // f, in_channels, generator=g, dtype=dtype)
    target = 0.5 * x + x.mean(0, keepdim=True)
    out = {"inputs": x.reshape(n, in_channels), "target": target.reshape(n, in_channels)}
    if spec.cross_attention:
        out["cond"] = torch.randn(int(torch.randint(1, 5, (1,), generator=g)), spec.hidden,
                                  generator=g, dtype=dtype)
    return out
