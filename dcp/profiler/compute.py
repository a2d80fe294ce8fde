"""Compute and activation-memory microbenchmarks of one layer and of 1- and 2-layer models.

One layer at SP size 1 is what the cost model's per-layer coefficients describe; a
checkpointed run of the same micro-batch gives the cost of recomputation (its forward runs
without saving, its backward re-runs the forward first). The whole model with one and with
two layers isolates what lies outside the layers (embedding, head, loss): t1 = M + L and
t2 = M + 2L give M = 2 t1 - t2 (the DCP paper's dual-layer profile).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from dcp.profiler.bench import Call, LayerBench, SampleShape
from dcp.profiler.timing import (
    Stopwatch,
    compute_clock,
    count_saved_bytes,
    cuda_memory,
    median_time,
    synchronize,
)


@dataclass(frozen=True)
class Repeats:
    """How hard to measure: untimed warm-up runs, then timed repeats (their median is kept)."""

    warmup: int = 2
    repeats: int = 5


@dataclass(frozen=True)
class LayerPoint:
    """One layer on one micro-batch: medians of forward, backward and checkpointed fwd+bwd."""

    tokens: int
    attn_pairs: int
    num_samples: int
    fwd_s: float
    bwd_s: float
    ckpt_s: float
    """Forward without saving + recompute + backward: the layer's time when checkpointed."""
    act_bytes: int
    """Activation bytes the non-checkpointed layer keeps until its backward."""
    ckpt_act_bytes: int
    """Bytes a checkpointed layer keeps (its input)."""

    @property
    def train_s(self) -> float:
        return self.fwd_s + self.bwd_s


@dataclass(frozen=True)
class ModelPoint:
    """Forward+backward of the whole model (loss included) with `layers` layers."""

    tokens: int
    attn_pairs: int
    layers: int
    ckpt_layers: int
    """Layers the model checkpointed in this run (0 in the dual-layer profile)."""
    seconds: float
    act_bytes: int
    """CUDA: peak bytes above the idle model during the step; CPU: bytes saved for backward."""


def _leaf(call: Call) -> torch.Tensor:
    """A fresh input leaf, requiring grad as a layer's input inside a stack does."""
    return call.hidden.detach().requires_grad_(call.requires_grad and call.hidden.is_floating_point())


def measure_layer(layer: torch.nn.Module, bench: LayerBench, samples: Sequence[SampleShape],
                  reps: Repeats) -> LayerPoint:
    """Time one layer's forward, backward and checkpointed step on one packed micro-batch."""
    dev, call = bench.device, bench.layer_inputs(samples)
    watch = Stopwatch(dev, compute_clock())
    grad_out = torch.randn_like(layer(call.hidden, *call.args, **call.kwargs)).detach()

    def plain(timed: bool) -> tuple[float, float]:
        x = _leaf(call)
        watch.start()
        out = layer(x, *call.args, **call.kwargs)
        watch.stop()
        fwd = watch.seconds() if timed else 0.0
        watch.start()
        torch.autograd.backward(out, grad_out)
        watch.stop()
        return fwd, watch.seconds() if timed else 0.0

    def ckpt() -> float:
        x = _leaf(call)
        watch.start()
        out = checkpoint(layer, x, *call.args, use_reentrant=False, **call.kwargs)
        torch.autograd.backward(out, grad_out)
        watch.stop()
        return watch.seconds()

    for _ in range(reps.warmup):
        plain(False)
        ckpt()
    synchronize(dev)
    fwd, bwd, ck = [], [], []
    for _ in range(reps.repeats):
        f, b = plain(True)
        fwd.append(f)
        bwd.append(b)
        ck.append(ckpt())
    return LayerPoint(
        tokens=sum(s.tokens for s in samples), attn_pairs=bench.pairs(samples), num_samples=len(samples),
        fwd_s=statistics.median(fwd), bwd_s=statistics.median(bwd), ckpt_s=statistics.median(ck),
        act_bytes=_layer_act_bytes(layer, call, dev), ckpt_act_bytes=_layer_act_bytes(layer, call, dev, ckpt=True),
    )


def _layer_act_bytes(layer: torch.nn.Module, call: Call, dev: torch.device, ckpt: bool = False) -> int:
    """Bytes a layer holds between its forward and its backward, checkpointed or not."""
    x = _leaf(call)

    def forward() -> torch.Tensor:
        if ckpt:
            return checkpoint(layer, x, *call.args, use_reentrant=False, **call.kwargs)
        return layer(x, *call.args, **call.kwargs)

    if dev.type == "cuda":
        # Held after forward: saved tensors plus the output, which stands for the next layer's
        # input in a stack (this layer's own input was allocated before and is not counted).
        with cuda_memory(dev) as mem:
            out = forward()
        out.sum().backward()
        return mem[0].held_bytes
    if ckpt:
        # A checkpointed layer keeps only its input for the recompute (Korthikanti et al.,
        # arXiv 2205.05198); the checkpoint's own hooks hide its saved tensors from ours.
        return call.hidden.nelement() * call.hidden.element_size()
    with count_saved_bytes(list(layer.parameters())) as saved:
        out = forward()
    out.sum().backward()
    return saved.total


def measure_model(model: torch.nn.Module, bench: LayerBench, samples: Sequence[SampleShape],
                  layers: int, reps: Repeats, ckpt_layers: int = 0) -> ModelPoint:
    """Time forward+backward of the whole model (it returns its loss) on one micro-batch;
    `layers` and `ckpt_layers` describe the model as built, for the record."""
    assert bench.model_inputs is not None
    dev, call = bench.device, bench.model_inputs(samples)

    def step() -> None:
        x = _leaf(call)
        model(x, *call.args, **call.kwargs).backward()

    # The first step allocates .grad of every parameter; later ones accumulate into them, as
    # gradient accumulation does, so the measured peak is activations and not grad buffers.
    seconds = median_time(step, dev, warmup=max(1, reps.warmup), repeats=reps.repeats)
    if dev.type == "cuda":
        with cuda_memory(dev) as mem:
            step()
        act = mem[0].peak_bytes
    else:
        with count_saved_bytes(list(model.parameters())) as saved:
            loss = model(_leaf(call), *call.args, **call.kwargs)
        loss.backward()
        act = saved.total
    return ModelPoint(tokens=sum(s.tokens for s in samples), attn_pairs=bench.pairs(samples), layers=layers,
                      ckpt_layers=ckpt_layers, seconds=seconds, act_bytes=act)

