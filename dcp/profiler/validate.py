"""Check a profile against fresh measurements of whole micro-batches (`dcp profile --validate`).

The profile was fitted on single layers; the planner prices whole micro-batches. So validation
runs the reference model with n layers (embedding, head and loss included) on random mixed
micro-batches never fitted on, with 0, some and all layers checkpointed, and compares the
measured time with `CostModel.time_s` at SP size 1 (SP-free: no all-to-alls in the way).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from dcp.costmodel import Cluster, CostModel, HardwareProfile, ModelSpec, TrainingSetup
from dcp.profiler.anchor import UNANCHORED, Anchor
from dcp.profiler.bench import heldout_batches
from dcp.profiler.compute import Repeats, measure_model
from dcp.profiler.executor_cost import bare_modules
from dcp.profiler.fitting import mape
from dcp.profiler.profile import cpu_threads, fit_of, torch_device, track
from dcp.profiler.reference import DTYPES, ReferenceKernel, reference_bench
from dcp.profiler.timing import held_state_bytes, peak_allocated

VALIDATION_LAYERS = 4
"""Default depth of the validation model: enough layers that per-layer error dominates the
head's, few enough that a 128K-token micro-batch of a 7B-wide model fits an H200 unrecomputed."""


@dataclass(frozen=True)
class ValidationRow:
    tokens: int
    attn_pairs: int
    samples: int
    layers: int
    ckpt_layers: int
    predicted_s: float
    measured_s: float
    predicted_memory_bytes: float = 0.0
    """What the bench holds (parameters, gradients) plus the cost model's memory of the micro-batch."""
    max_memory_allocated: int | None = None
    """torch.cuda.max_memory_allocated over the micro-batch's runs; None on a CPU."""

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1


@dataclass(frozen=True)
class ValidationReport:
    model: str
    rows: list[ValidationRow]
    mape: float
    truncated: bool = False
    """The deadline came before every planned micro-batch was measured."""
    machine_speed: float | None = None
    """Anchored (`profile_anchor`): the reference kernel's median reading here over the profile's
    (above 1: the machine ran slower than when it was profiled); measured times are at the
    profile's speed. None: measured times are as read."""


def predicted_bench_memory(cm: CostModel, model: torch.nn.Module, tokens: int, ckpt_layers: int) -> float:
    """Predicted peak of a profiler bench's micro-batch: what the bench holds between steps
    (parameters and their gradients, no optimizer) plus the cost model's memory of the
    micro-batch beyond the training state (weight copies, activations, working memory)."""
    return held_state_bytes(model) + cm.memory_bytes(tokens, 1, ckpt_layers) - cm.resident_bytes


def validate_profile(profile: HardwareProfile, spec: ModelSpec, *, device: str = "cpu", dtype: str | None = None,
                     layers: int | None = None, count: int = 4, seed: int = 7, quick: bool = True,
                     max_tokens: int | None = None, progress: Any = None,
                     deadline: float | None = None) -> ValidationReport:
    """Measured vs predicted time of `count` random micro-batches for each of r = 0, n/2, n.

    `deadline` (a `time.monotonic()` reading): no micro-batch starts after it, so a run under a
    hard time limit keeps what it measured; the report then says `truncated`."""
    fit = fit_of(profile, spec.name)
    fit_meta = profile.meta.get("fits", {}).get(spec.name, {})
    dtype = dtype or fit_meta.get("dtype") or ("bf16" if device == "cuda" else "fp32")
    dev = torch_device(device)
    n = layers or min(spec.num_layers, VALIDATION_LAYERS)
    sub = replace(spec, num_layers=n)  # same name: CostModel picks up fits[spec.name]
    # The bench runs the modules without the executor: price them without its extras.
    cm = CostModel(sub, bare_modules(profile, spec.name), Cluster(num_gpus=1, gpus_per_node=1, memory_bytes=profile.memory_bytes),
                   TrainingSetup(precision="fp32" if DTYPES[dtype] == torch.float32 else "bf16", zero_stage=0))
    lo, hi = fit_meta.get("tokens_range") or [min(256, fit.max_fitted_tokens), fit.max_fitted_tokens]
    reps = Repeats(warmup=1, repeats=3) if quick else Repeats(warmup=2, repeats=5)
    rows = []
    truncated = False
    bench = reference_bench(sub, dev, dtype, seed=seed)
    anchor = profile_anchor(profile, dev)
    # Time the way the profile was timed (see dcp.profiler.timing.compute_clock).
    with cpu_threads(dev, profile.meta.get("threads") or 1):
        model = bench.build_model(n)  # type: ignore[misc]
        for r in sorted({0, n // 2, n}):
            model.set_ckpt_layers(r)
            # Only micro-batches that fit memory by the profile's own estimate (a 128K-token
            # batch of a 7B-wide model does not fit unrecomputed).
            top = min(hi, max_tokens or hi, max(lo, cm.max_tokens(1, r)))
            for samples in track(progress, heldout_batches(bench, lo, top, count, seed=seed + r), f"validate r={r}"):
                if deadline is not None and time.monotonic() >= deadline:
                    truncated = True
                    break
                with peak_allocated(dev) as peak:
                    point = anchor.seconds(anchor(lambda m=model, s=samples, r=r: measure_model(
                        m, bench, s, n, reps, ckpt_layers=r)))
                rows.append(ValidationRow(point.tokens, point.attn_pairs, len(samples), n, r,
                                          cm.time_s(point.tokens, point.attn_pairs, 1, r), point.seconds,
                                          predicted_bench_memory(cm, model, point.tokens, r), peak[0]))
    del model
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    error = mape([r.measured_s for r in rows], [r.predicted_s for r in rows]) if rows else float("nan")
    speed = statistics.median(anchor.readings) / anchor.speed_s if anchor.readings and anchor.speed_s else None
    return ValidationReport(spec.name, rows, error, truncated=truncated, machine_speed=speed)


def profile_anchor(profile: HardwareProfile, device: torch.device) -> Anchor:
    """How to read measurements against `profile`: an anchored profile (a CPU's, `meta.reference`
    with `anchored`) recorded its points at its reference kernel's median reading, so each new
    reading is taken in units of the kernel timed beside it and turned into seconds at that
    speed; the machine's speed since then is the kernel's, not the model's error. Otherwise
    readings are seconds as measured."""
    ref = profile.meta.get("reference") or {}
    if device.type != "cpu" or not ref.get("anchored"):
        return UNANCHORED
    return Anchor(ReferenceKernel(device), speed_s=ref["median_s"])
