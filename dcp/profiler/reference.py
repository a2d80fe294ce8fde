"""dcp's reference models (dcp.models) as profiler benches.

The layer is exactly what the executor runs: `LlamaLayer` / `STDiTLayer` over a packed varlen
hidden state with its `PackedSeqs`, attention through the same fast path (a varlen kernel on
GPU, flash-attn's or torch's own, per-sample SDPA otherwise; the profile's
`meta["attention_kernel"]` says which). The model bench wraps the reference model
with its loss; `LossModel.set_ckpt_layers(r)` checkpoints its first r layers (validation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from dcp.costmodel import ModelSpec
from dcp.profiler.bench import Call, LayerBench, SampleShape

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

COND_TOKENS_PER_SAMPLE = 16
"""Caption tokens per sample for cross-attending models. Cross-attention's cost is its q/kv/o
projections (per token) plus a few short attentions; 16 keeps the latter small, as a caption
is short next to a video's tokens."""

IN_CHANNELS = 8
"""Latent channels of the spatial-temporal model's input (dcp.models.build_model's default)."""


class Checkpointed(nn.Module):
    """A layer whose activations are recomputed in backward (non-reentrant checkpoint)."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, *args: object) -> torch.Tensor:
        return checkpoint(self.layer, *args, use_reentrant=False)


class LossModel(nn.Module):
    """The reference model plus its loss, with the first `ckpt_layers` layers checkpointed."""

    def __init__(self, model: nn.Module, spec: ModelSpec, ckpt_layers: int = 0) -> None:
        super().__init__()
        self.model, self.spec = model, spec
        self._plain = list(model.layers)
        self.set_ckpt_layers(ckpt_layers)

    def set_ckpt_layers(self, ckpt_layers: int) -> None:
        """Checkpoint the first r layers (and no others). Switching in place saves rebuilding a
        multi-GB model for every r."""
        if not 0 <= ckpt_layers <= len(self._plain):
            raise ValueError(f"cannot checkpoint {ckpt_layers} of {len(self._plain)} layers")
        for i, layer in enumerate(self._plain):
            self.model.layers[i] = Checkpointed(layer) if i < ckpt_layers else layer

    def forward(self, inputs: torch.Tensor, seqs: object, target: torch.Tensor,
                cond: torch.Tensor | None = None) -> torch.Tensor:
        from dcp.models import lm_loss, mse_loss

        if self.spec.attention == "spatial_temporal":
            pred = self.model(inputs, seqs, cond)
            loss, count = mse_loss(pred, target, torch.ones_like(target[:, 0], dtype=torch.bool))
        else:
            loss, count = lm_loss(self.model(inputs, seqs), target)
        return loss / count


def reference_bench(spec: ModelSpec, device: torch.device | str, dtype: str, *, seed: int = 0) -> LayerBench:
    """A bench for `spec`'s reference model on `device` in `dtype` (bf16, fp16 or fp32)."""
    from dcp.models import PackedSeqs, build_layer, build_model

    dev, dt = torch.device(device), DTYPES[dtype]
    # Inputs are drawn on the device: a 128K x 4096 hidden state drawn on the host and copied
    # would cost seconds per grid point.
    gen = torch.Generator(device=dev).manual_seed(seed)

    def pack(samples: Sequence[SampleShape]) -> PackedSeqs:
        cond = [COND_TOKENS_PER_SAMPLE] * len(samples) if spec.cross_attention else None
        return PackedSeqs.pack([s.tokens for s in samples], [s.frames for s in samples],
                               cond_lengths=cond, device=dev)

    def cond_tensor(samples: Sequence[SampleShape]) -> torch.Tensor | None:
        if not spec.cross_attention:
            return None
        return torch.randn(COND_TOKENS_PER_SAMPLE * len(samples), spec.hidden, generator=gen, device=dev, dtype=dt)

    def layer_inputs(samples: Sequence[SampleShape]) -> Call:
        seqs = pack(samples)
        hidden = torch.randn(seqs.total, spec.hidden, generator=gen, device=dev, dtype=dt)
        cond = cond_tensor(samples)
        return Call(hidden, (seqs,) if cond is None else (seqs, cond))

    def model_inputs(samples: Sequence[SampleShape]) -> Call:
        seqs = pack(samples)
        n = seqs.total
        if spec.attention == "spatial_temporal":
            x = torch.randn(n, IN_CHANNELS, generator=gen, device=dev, dtype=dt)
            target = torch.randn(n, IN_CHANNELS, generator=gen, device=dev, dtype=dt)
            return Call(x, (seqs, target, cond_tensor(samples)), requires_grad=False)
        ids = torch.randint(spec.vocab, (n,), generator=gen, device=dev)
        labels = torch.randint(spec.vocab, (n,), generator=gen, device=dev)
        return Call(ids, (seqs, labels), requires_grad=False)

    # Modules are created directly on the device (torch.device as the default device): a
    # 7B-wide model initialized on the host first would spend seconds in CPU normal_() and copies.
    def make_layer() -> nn.Module:
        torch.manual_seed(seed)
        with dev:
            return build_layer(spec, dtype=dt, device=dev)

    def make_model(layers: int) -> nn.Module:
        sub = replace(spec, num_layers=max(layers, 1))  # a spec has at least one layer
        with dev:
            model = build_model(sub, dtype=dt, device=dev, in_channels=IN_CHANNELS, seed=seed)
        if layers == 0:  # embedding, head and loss alone: what a micro-batch runs besides its layers
            model.layers = nn.ModuleList()
        return LossModel(model, sub)

    return LayerBench(name=spec.name, device=dev, attention=spec.attention, build_layer=make_layer,
                      layer_inputs=layer_inputs, build_model=make_model, model_inputs=model_inputs)


REFERENCE_WORK = "one tiny-llama layer (fp32), forward and backward of one 1,024-token sample"
"""The reference kernel (`ReferenceKernel`): a fixed piece of work, the same in every profile and
on every machine, whose time says how fast the machine ran when it was timed."""


class ReferenceKernel:
    """`REFERENCE_WORK` on a device, timed on the compute clock (`dcp.profiler.timing`: CPU time
    with one torch thread), the fastest of a few runs. A profile records its time beside what it
    measures (at the start, after every pass, at the end: `meta.reference`) and
    `benchmarks/selfcheck.py` times it beside the executor: the machine's own speed then reads
    apart from the cost model's error, and two profiles' disagreement apart from the machine's
    drift between them (a virtual machine's CPU ran 9% slower ten minutes later, nothing else
    running)."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        from dcp.costmodel import load_model

        self.bench = reference_bench(load_model("tiny-llama"), device, "fp32")
        self.layer = self.bench.build_layer()
        self.call = self.bench.layer_inputs([self.bench.shape(1024)])

    def seconds(self, repeats: int = 5) -> float:
        """The fastest of `repeats` runs after one untimed."""
        from dcp.profiler.timing import min_time

        call, layer = self.call, self.layer

        def run() -> None:
            x = call.hidden.detach().requires_grad_(True)
            layer(x, *call.args, **call.kwargs).sum().backward()

        return min_time(run, self.bench.device, warmup=1, repeats=repeats).seconds
