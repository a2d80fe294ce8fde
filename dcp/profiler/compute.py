"""Compute and activation-memory microbenchmarks of one layer and of 1- and 2-layer models.

One layer at SP size 1 is what the cost model's per-layer coefficients describe; a
checkpointed run of the same micro-batch gives the cost of recomputation (its forward runs
without saving, its backward re-runs the forward first). What lies outside the layers
(embedding, head, loss, and the micro-batch's fixed cost) is timed on the model with no layers,
directly: the DCP paper's dual-layer difference M = 2 t1 - t2 subtracts two times each several
times M, so a few percent of noise in them becomes tens of percent in M (on one CPU thread
tiny-llama's head is a fifth of a 1-layer step and the difference's R^2 fell below 0.5). The
whole model with one and two layers is still measured: its memory gives the head's bytes, and
its time checks the sum of the parts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from dcp.profiler.bench import Call, LayerBench, SampleShape
from dcp.profiler.timing import (
    Stopwatch,
    Timed,
    compute_clock,
    count_saved_bytes,
    cuda_memory,
    min_time,
    synchronize,
)


@dataclass(frozen=True)
class Repeats:
    """How hard to measure: untimed warm-up runs, then timed repeats (the fastest is kept)."""

    warmup: int = 2
    repeats: int = 5


@dataclass(frozen=True)
class LayerPoint:
    """One layer on one micro-batch: the fastest forward, backward and checkpointed fwd+bwd of the
    repeats, on the compute clock (`dcp.profiler.timing`), and on the wall clock beside them."""

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
    fwd_wall_s: float = 0.0
    bwd_wall_s: float = 0.0
    ckpt_wall_s: float = 0.0

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
    """Layers the model checkpointed in this run (0 in the head and whole-model profile)."""
    seconds: float
    act_bytes: int
    """CUDA: peak bytes above the idle model during the step; CPU: bytes saved for backward."""
    wall_s: float = 0.0
    """`seconds` on the wall clock (the fastest repeat's)."""


def _leaf(call: Call) -> torch.Tensor:
    """A fresh input leaf, requiring grad as a layer's input inside a stack does."""
    return call.hidden.detach().requires_grad_(call.requires_grad and call.hidden.is_floating_point())


def measure_layer(layer: torch.nn.Module, bench: LayerBench, samples: Sequence[SampleShape],
                  reps: Repeats) -> LayerPoint:
    """Time one layer's forward, backward and checkpointed step on one packed micro-batch."""
    dev, call = bench.device, bench.layer_inputs(samples)
    watch = Stopwatch(dev, compute_clock())
    grad_out = torch.randn_like(layer(call.hidden, *call.args, **call.kwargs)).detach()

    def reading() -> tuple[float, float]:
        return watch.seconds(), watch.wall_seconds()

    def plain() -> tuple[tuple[float, float], tuple[float, float]]:
        x = _leaf(call)
        watch.start()
        out = layer(x, *call.args, **call.kwargs)
        watch.stop()
        fwd = reading()
        watch.start()
        torch.autograd.backward(out, grad_out)
        watch.stop()
        return fwd, reading()

    def ckpt() -> tuple[float, float]:
        x = _leaf(call)
        watch.start()
        out = checkpoint(layer, x, *call.args, use_reentrant=False, **call.kwargs)
        torch.autograd.backward(out, grad_out)
        watch.stop()
        return reading()

    for _ in range(reps.warmup):
        plain()
        ckpt()
    synchronize(dev)
    fwd, bwd, ck = [], [], []
    for _ in range(reps.repeats):
        f, b = plain()
        fwd.append(f)
        bwd.append(b)
        ck.append(ckpt())
    f, b, c = Timed.best(fwd), Timed.best(bwd), Timed.best(ck)
    return LayerPoint(
        tokens=sum(s.tokens for s in samples), attn_pairs=bench.pairs(samples), num_samples=len(samples),
        fwd_s=f.seconds, bwd_s=b.seconds, ckpt_s=c.seconds,
        act_bytes=_layer_act_bytes(layer, call, dev), ckpt_act_bytes=_layer_act_bytes(layer, call, dev, ckpt=True),
        fwd_wall_s=f.wall_s, bwd_wall_s=b.wall_s, ckpt_wall_s=c.wall_s,
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
    timed = min_time(step, dev, warmup=max(1, reps.warmup), repeats=reps.repeats)
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
                      ckpt_layers=ckpt_layers, seconds=timed.seconds, act_bytes=act, wall_s=timed.wall_s)

