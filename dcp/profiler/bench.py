"""What the profiler runs: a layer (and optionally a whole model) described by factories.

`LayerBench` is the Python API for profiling any model, not only dcp's reference ones: give
a layer factory and an input builder (and, for the embedding/head and the micro-batch's fixed
cost, a model factory taking a layer count), and `dcp.profiler.profile_bench` measures it
exactly as `dcp profile` measures the reference models.

Also here: which micro-batches to measure. At each token count of a geometric grid we run
several packings -- one long sample, and many short ones -- because at a fixed token count
only the packing changes the attention pairs; without that spread the per-token and
per-pair coefficients are collinear and least squares cannot tell them apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dcp.costmodel import ATTENTION_KINDS, attention_pairs
from dcp.profiler.fitting import geometric_grid


@dataclass(frozen=True)
class SampleShape:
    """One sample of a micro-batch: its tokens and (for spatial-temporal models) frames."""

    tokens: int
    frames: int = 1


@dataclass(frozen=True)
class Call:
    """How to call a layer (or model): layer(hidden, *args, **kwargs). `hidden` becomes a fresh
    leaf on every run; it requires grad for a layer, whose input's gradient a stack computes."""

    hidden: torch.Tensor
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    requires_grad: bool = True
    """False for a model's inputs (token ids, latents): nothing upstream needs their gradient."""


@dataclass(frozen=True, kw_only=True)
class LayerBench:
    """A model as the profiler sees it. Factories return modules already on `device`."""

    name: str
    """The key of the fit in the profile (`fits[name]`): use the ModelSpec's name."""
    device: torch.device
    attention: str = "causal"
    """How attention pairs are counted: causal, full or spatial_temporal."""
    build_layer: Callable[[], torch.nn.Module]
    """One transformer layer (for spatial_temporal: one spatial + one temporal block)."""
    layer_inputs: Callable[[Sequence[SampleShape]], Call]
    """Packed input of one micro-batch for the layer."""
    build_model: Callable[[int], torch.nn.Module] | None = None
    """The whole model with n layers; its forward returns the scalar loss. n = 0 (embedding, head
    and loss alone) times what a micro-batch runs besides its layers; n = 1 and 2 give the head's
    memory and a check of the parts' sum."""
    model_inputs: Callable[[Sequence[SampleShape]], Call] | None = None
    """Arguments of the model's forward: model(call.hidden, *call.args, **call.kwargs), e.g.
    token ids as `hidden` with requires_grad=False."""
    tokens_per_frame: int = 256
    """spatial_temporal only: latent tokens per frame of the generated samples."""

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention {self.attention!r}; expected one of {ATTENTION_KINDS}")
        if (self.build_model is None) != (self.model_inputs is None):
            raise ValueError("build_model and model_inputs go together (both or neither)")

    def shape(self, length: int, frames: int | None = None) -> SampleShape:
        """A sample of about `length` tokens: whole frames for spatial-temporal models (default
        `tokens_per_frame` tokens each), one frame otherwise."""
        if self.attention != "spatial_temporal":
            return SampleShape(length)
        frames = min(length, frames or max(1, length // self.tokens_per_frame))
        return SampleShape(length // frames * frames, frames)

    def pairs(self, samples: Sequence[SampleShape]) -> int:
        return sum(attention_pairs(self.attention, s.tokens, s.frames) for s in samples)


def split_tokens(total: int, length: int) -> list[int]:
    """`total` tokens as samples of `length` (the last one shorter), in order."""
    full, rest = divmod(total, length)
    return [length] * full + ([rest] if rest else [])


def packing_grid(bench: LayerBench, min_tokens: int, max_tokens: int, *,
                 min_sample: int = 64, factor: float = 2.0) -> list[list[SampleShape]]:
    """Micro-batches to fit on: a geometric grid of token counts (each `factor` times the last)
    x packings.

    Per token count T: one sample of T tokens (most attention), samples of T/8 and of T/64
    tokens (least attention, most samples), never shorter than `min_sample` tokens. Spatial-temporal samples
    come both as one frame (all spatial attention) and as 16 frames (pairs F S^2 + S F^2 shrink
    16-fold), which is what separates the per-pair term for video models."""
    frame_options = (1, 16) if bench.attention == "spatial_temporal" else (1,)
    grid: list[list[SampleShape]] = []
    for total in geometric_grid(min_tokens, max_tokens, factor):
        for length in sorted({max(min_sample, total // d) for d in (1, 8, 64)}, reverse=True):
            for frames in frame_options:
                if frames == 1 or length >= 16 * frames:  # at least 16 tokens per frame
                    grid.append([bench.shape(n, frames) for n in split_tokens(total, min(length, total))])
    return grid


def heldout_batches(bench: LayerBench, min_tokens: int, max_tokens: int, count: int,
                    seed: int = 0, min_sample: int = 32) -> list[list[SampleShape]]:
    """Random mixed micro-batches inside the fitted range, unlike any grid point: a token count
    log-uniform in the range, filled with log-normally distributed sample lengths (the shape
    of real length distributions, e.g. Wikipedia's: FlexSP, arXiv 2412.01523)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        total = int(np.exp(rng.uniform(np.log(min_tokens), np.log(max_tokens))))
        # At most ~256 samples per micro-batch, as packed real data holds (Wikipedia's mean
        # length is 1,014 tokens: a 128K-token micro-batch has ~130 samples, not thousands).
        shortest = max(min_sample, total // 256)
        median = np.exp(rng.uniform(np.log(shortest), np.log(total)))
        lengths: list[int] = []
        while sum(lengths) < total:
            n = int(np.clip(rng.lognormal(np.log(median), 1.0), shortest, total))
            # The last sample takes what is left (at least `shortest`, so the total may
            # overshoot by a few tokens: the point only needs to lie inside the range).
            lengths.append(max(min(n, total - sum(lengths)), shortest))
        # Video samples get a random frame count (1..16, at least 16 tokens per frame).
        frames = [int(rng.choice([f for f in (1, 2, 4, 8, 16) if n >= 16 * f] or [1])) for n in lengths]
        out.append([bench.shape(n, f) for n, f in zip(lengths, frames, strict=True)])
    return out
