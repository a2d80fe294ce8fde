"""Memory from the model itself: a model's `MemoryFootprint` in a precision recipe, measured on
fake tensors at real shapes (a llama-7b-wide model costs no memory and about a second).

A `FootprintTarget` is a model given by factories (the reference models: `reference_target`;
Hugging Face models: dcp.executor.hf.hf_target). `measure_footprint` builds it with `depth`
layers under FakeTensorMode, runs one micro-batch through forward, loss and backward as the
executor does (gradients accumulated into buffers allocated beforehand, the loss computed under
the recipe's autocast, the first r layers checkpointed), with its attention on flash-attention
stand-ins (dcp.profiler.flash_standin), and counts:

- act_full: bytes one layer saves for backward (saved-tensor hooks), per token;
- act_ckpt: bytes a checkpointed layer keeps (its input), per token;
- weight copies: the low-precision casts of the weights autocast makes and keeps;
- working: the peak of live bytes beyond the layers' saved activations, in the head phase (last
  layer's output to the gradient of it: norm, LM head, loss) and in the layers' forward and
  backward (recompute included when checkpointed), at r = 0 and r = depth and at two token
  counts. Each phase's peak is linear in tokens, so the line through its two points is exact
  there, and the largest slope and the largest intercept of all phases bound every one of them.

CPU autocast stands in for CUDA's: for the ops these models run under it (linear and matmul cast
to bf16; norms, softmax and loss written with explicit dtypes) the two policies agree.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.checkpoint import checkpoint

from dcp.costmodel import RECIPES, HardwareProfile, ModelSpec
from dcp.costmodel.memory import MemoryFootprint, shape_of
from dcp.costmodel.precision import PrecisionRecipe, get_recipe
from dcp.models.attention import forced_kernels
from dcp.models.precision import forward_autocast, torch_dtype
from dcp.profiler.flash_standin import flash_dense_standin, flash_varlen_standin
from dcp.profiler.live_bytes import StepCount, layer_counting

DEFAULT_TOKENS = (64, 4096, 16384)
"""Token counts of the measured micro-batches (one sample each): a tiny one, where the
token-independent part of the peak shows, and two large ones, where the steepest part does."""
DEPTH = 2
"""Layers of the measured model: per-layer figures are the mean over them."""


@dataclass(frozen=True, kw_only=True)
class FootprintTarget:
    """A model as the memory profiler sees it; factories are called under FakeTensorMode."""

    name: str
    build: Callable[[int, torch.dtype], nn.Module]
    """The model with n layers, parameters in the given dtype."""
    layers: Callable[[nn.Module], Sequence[nn.Module]]
    """Its transformer layers, in order (the first r are checkpointed)."""
    inputs: Callable[[int], Any]
    """Real (not fake) inputs of one micro-batch of that many tokens (built outside fake mode:
    packing layouts need their values)."""
    run: Callable[[nn.Module, Any], torch.Tensor]
    """Forward and loss of one micro-batch: the scalar to back-propagate."""
    shape: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The model shape the footprint belongs to (dcp.costmodel.memory.shape_of)."""


def _attach_grads(model: nn.Module, recipe: PrecisionRecipe) -> tuple[list[torch.Tensor], list[Any]]:
    """Gradient buffers as the executor keeps them: in the parameter's own dtype, `.grad`
    accumulates in place; otherwise each backward's gradient is added into a buffer of the
    recipe's gradient dtype and dropped (dcp.executor.sharding.ZeroSchedule)."""
    dtype = torch_dtype(recipe.grad_dtype)
    buffers, handles = [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        if p.dtype == dtype:
            p.grad = torch.zeros_like(p)
            buffers.append(p.grad)
            continue
        buf = torch.zeros(p.shape, dtype=dtype, device=p.device)
        buffers.append(buf)

        def accumulate(param: torch.Tensor, buf: torch.Tensor = buf) -> None:
            buf.add_(param.grad)
            param.grad = None

        handles.append(p.register_post_accumulate_grad_hook(accumulate))
    return buffers, handles


@contextmanager
def _checkpointed(layers: Sequence[nn.Module]) -> Iterator[None]:
    """Run these layers under non-reentrant checkpointing, as the executor's switches do."""
    originals = [layer.forward for layer in layers]
    for layer, forward in zip(layers, originals, strict=True):
        def run(*args: Any, _forward: Callable[..., Any] = forward, **kwargs: Any) -> Any:
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        layer.forward = run
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Create modules' parameters in `dtype` inside the block."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _count_step(target: FootprintTarget, model: nn.Module, recipe: PrecisionRecipe, payload: Any,
                tokens: int, ckpt: int) -> StepCount:
    layers = list(target.layers(model))
    buffers, grad_hooks = _attach_grads(model, recipe)
    params = list(model.parameters())
    try:
        with ExitStack() as stack:
            stack.enter_context(_checkpointed(layers[:ckpt]))
            stack.enter_context(forced_kernels(flash_varlen_standin, flash_dense_standin))
            counters = stack.enter_context(layer_counting(layers, params, resident=buffers, ckpt=ckpt))
            counters.live.in_autocast = recipe.autocast
            with forward_autocast(recipe, "cpu"):
                loss = target.run(model, payload)
            counters.live.in_autocast = False
            loss.backward()
            del loss
    finally:
        for h in grad_hooks:
            h.remove()
        for p in params:
            p.grad = None
    return counters.step_count(tokens, ckpt)


def measure_steps(target: FootprintTarget, recipe: str | PrecisionRecipe, *, tokens: Sequence[int] = DEFAULT_TOKENS,
                  depth: int = DEPTH) -> list[StepCount]:
    """Count a `depth`-layer model's micro-batches of each token count at r = 0 and r = depth."""
    r = get_recipe(recipe)
    payloads = [(t, target.inputs(t)) for t in tokens]
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = target.build(depth, torch_dtype(r.param_dtype))
        return [_count_step(target, model, r, payload, t, ckpt) for t, payload in payloads for ckpt in (0, depth)]


def upper_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of a line above every (tokens, bytes) point of a convex function (a
    peak over phases, each linear in tokens): the slope of its last segment, the steepest, and
    the least intercept that puts every point under it. Between two points the function lies
    under their chord, so under the line; beyond the last one it keeps that slope once the
    steepest phase dominates."""
    pts = sorted(points)
    slope = max(0.0, (pts[-1][1] - pts[-2][1]) / (pts[-1][0] - pts[-2][0]))
    return max(y - slope * t for t, y in pts), slope


def footprint_from_steps(steps: Sequence[StepCount], recipe: str, *, shape: dict[str, Any] | None = None,
                         how: str = "") -> MemoryFootprint:
    """The footprint of measured steps (r = 0 and r = depth at two token counts or more)."""
    plain = sorted((s for s in steps if s.ckpt == 0), key=lambda s: s.tokens)
    full = sorted((s for s in steps if s.ckpt > 0 and s.ckpt == len(s.saved_by_layer)), key=lambda s: s.tokens)
    if len({s.tokens for s in plain}) < 2 or len({s.tokens for s in full}) < 2:
        raise ValueError("a footprint needs plain and fully checkpointed steps at two token counts or more")
    depth = len(plain[-1].saved_by_layer)
    act_full = plain[-1].held_bytes / depth / plain[-1].tokens
    act_ckpt = full[-1].held_bytes / depth / full[-1].tokens
    head, layer = [], []
    for runs in (plain, full):
        for phase, into in (("head", head), ("forward", layer), ("backward", layer)):
            into.append(upper_line([(s.tokens, s.phase_peaks.get(phase, 0) - s.held_bytes) for s in runs]))
    fixed = max(0.0, *(b for b, _ in head + layer))
    head_k, layer_k = max(k for _, k in head), max(k for _, k in layer)
    big = plain[-1]
    return MemoryFootprint(
        recipe=recipe, act_full_bytes_per_token=act_full, act_ckpt_bytes_per_token=act_ckpt,
        working_bytes_per_token=max(head_k, layer_k), working_fixed_bytes=fixed,
        head_bytes_per_token=head_k, layer_working_bytes_per_token=layer_k,
        weight_copy_bytes_per_layer=sum(big.copies_by_layer) / depth, weight_copy_bytes_outside=big.copies_outside,
        shape=shape or {}, how=how)


def measure_footprint(target: FootprintTarget, recipe: str | PrecisionRecipe, *,
                      tokens: Sequence[int] = DEFAULT_TOKENS, depth: int = DEPTH) -> MemoryFootprint:
    """The measured `MemoryFootprint` of `target` in `recipe`."""
    r = get_recipe(recipe)
    steps = measure_steps(target, r, tokens=tokens, depth=depth)
    mismatches = sorted({op for s in steps for op in s.autocast_mismatches})
    if mismatches:
        warnings.warn(f"{target.name} ({r.name}): {', '.join(mismatches)} ran in 16 bits under CPU autocast; CUDA "
                      "autocast runs them in fp32, so a GPU holds more than this measurement counts", stacklevel=2)
    how = (f"dcp.profiler.memory on fake tensors (torch {torch.__version__.split('+')[0]} FakeTensorMode, CPU"
           f"{', autocast ' + r.compute_dtype if r.autocast else ''}): saved-tensor hooks and live storages of a "
           f"{depth}-layer {target.name}, one sample of {'/'.join(map(str, tokens))} tokens, checkpointing none "
           "and all layers, attention through flash-attn 2 stand-ins (q, k, v, out, fp32 log-sum-exp saved)"
           + (f"; CPU and CUDA autocast differ on {', '.join(mismatches)}" if mismatches else ""))
    return footprint_from_steps(steps, r.name, shape=target.shape, how=how)


# -- the reference models ------------------------------------------------------------------------
FRAMES = 16
"""Frames of a measured spatial-temporal sample (tokens per frame follow from the token count)."""
COND_TOKENS = 16
"""Caption tokens of a measured sample (as the profiler's layer bench uses)."""
IN_CHANNELS = 8


def reference_target(spec: ModelSpec) -> FootprintTarget:
    """dcp.models' reference model of `spec`, run as the executor runs it (forward, then the
    loss: lm_loss for language models, a per-token MSE for spatial-temporal ones)."""
    from dcp.models import PackedSeqs, build_model, lm_loss

    video = spec.attention == "spatial_temporal"

    def build(n: int, dtype: torch.dtype) -> nn.Module:
        # Built in `dtype` rather than converted: fake parameters cannot be swapped by .to().
        with default_dtype(dtype):
            return build_model(dataclasses.replace(spec, num_layers=n), dtype=dtype, in_channels=IN_CHANNELS, seed=0)

    def inputs(tokens: int) -> dict[str, Any]:
        gen = torch.Generator().manual_seed(0)
        if video:
            per_frame = max(1, tokens // FRAMES)
            seqs = PackedSeqs.pack([per_frame * FRAMES], [FRAMES], cond_lengths=[COND_TOKENS])
        else:
            seqs = PackedSeqs.pack([tokens])
        seqs.positions(), seqs.segment_ids_full()  # cached now: their values cannot be computed on fake tensors
        n = seqs.total
        if video:
            return {"seqs": seqs, "x": torch.randn(n, IN_CHANNELS, generator=gen),
                    "target": torch.randn(n, IN_CHANNELS, generator=gen),
                    "cond": torch.randn(COND_TOKENS, spec.hidden, generator=gen)}
        return {"seqs": seqs, "ids": torch.randint(spec.vocab, (n,), generator=gen),
                "labels": torch.randint(spec.vocab, (n,), generator=gen)}

    def run(model: nn.Module, b: dict[str, Any]) -> torch.Tensor:
        if video:  # latents and captions arrive in the parameters' dtype (autocast casts them itself)
            dtype = next(model.parameters()).dtype
            pred = model(b["x"].to(dtype), b["seqs"], b["cond"].to(dtype))
            # dcp.models.mse_loss without its pad mask (no pads here; a boolean mask has no fake shape)
            return (pred.float() - b["target"].float()).pow(2).mean(-1).sum()
        return lm_loss(model(b["ids"], b["seqs"]), b["labels"])[0]

    return FootprintTarget(name=spec.name, build=build, layers=lambda m: m.layers, inputs=inputs, run=run,
                           shape=shape_of(spec))


def reference_footprint(spec: ModelSpec, recipe: str | PrecisionRecipe, *, tokens: Sequence[int] = DEFAULT_TOKENS
                        ) -> MemoryFootprint:
    """The measured footprint of `spec`'s reference model (dcp.models) in `recipe`."""
    return measure_footprint(reference_target(spec), recipe, tokens=tokens)


# -- recorded by `dcp profile` -------------------------------------------------------------------------
DTYPE_RECIPES = {"bf16": "bf16", "fp32": "fp32"}
"""The recipe whose parameters a profiled dtype holds (its layer was timed in that dtype)."""


def record_memory(profile: HardwareProfile, spec: ModelSpec, dtype: str) -> HardwareProfile:
    """`profile` with `spec`'s measured footprints: every recipe's in the fit's meta, and the
    profiled dtype's recipe in the fit itself (its activation fields and `memory`, which the cost
    model prefers to the spec's). The device's own per-layer measurement (allocator bytes on CUDA)
    stays beside it in the meta, for comparison."""
    fit = profile.fits[spec.name]
    footprints = {r: reference_footprint(spec, r) for r in RECIPES}
    meta_fits = dict(profile.meta.get("fits", {}))
    meta_fits[spec.name] = {**meta_fits.get(spec.name, {}), "memory": {r: f.to_dict() for r, f in footprints.items()},
                            "device_act_bytes_per_token": {"full": fit.act_full_bytes_per_token,
                                                           "ckpt": fit.act_ckpt_bytes_per_token}}
    fp = footprints.get(DTYPE_RECIPES.get(dtype, ""))
    if fp is not None:
        fit = dataclasses.replace(fit, act_full_bytes_per_token=fp.act_full_bytes_per_token,
                                  act_ckpt_bytes_per_token=fp.act_ckpt_bytes_per_token,
                                  head_bytes_per_token=fp.working_bytes_per_token, memory=fp)
    return dataclasses.replace(profile, fits={**profile.fits, spec.name: fit},
                               meta={**profile.meta, "fits": meta_fits})
