"""What a micro-batch costs beyond its layers and head when the executor runs it.

The profile's layer and head fits time bare modules. The executor adds work to every
micro-batch: packing the samples, FSDP2's hooks around every sharded unit (the layers and the
root), the checkpoint switches and the SP context (the parameters' gather and the gradients'
reduction are the step's, priced apart). On a GPU most of it hides under queued
kernels; on a CPU it runs in line with the compute (tiny-llama on one thread: about 2.7 ms of a
13.7 ms 512-token micro-batch). So for a reference model `dcp profile` runs the executor itself
on one rank over a few single-sample micro-batches and fits what it measures beyond the fitted
layers and head, (measured - predicted without the fixed cost) = fixed + per_token * T, by
non-negative least squares: `fixed` becomes the fit's `microbatch_fixed_s` and `per_token` is
added to `head_per_token_s`. The intercept is the micro-batch's fixed cost as the executor pays
it, which the head's own intercept (kept in the meta) only starts. The step also gathers the
parameters (in its first micro-batch), reduces the gradients (in its last) and does its own work
around the micro-batches: what the step takes beyond three middle micro-batches, less what the
step price gives that step for its collectives, is the executor's per-step cost, `step_fixed_s`.

With two ranks or more it also runs SP groups (every power of two p up to the world that the
heads allow, aligned blocks of ranks), the same tokens a rank, without and with every layer
checkpointed. What their middle micro-batch takes beyond the micro-batch's price (the fit above,
the all-to-all curve's latency and bandwidth included) grows with the Ulysses all-to-alls it
issues, (2K + r) x `a2a_per_layer` calls: (measured - priced) = calls x per_call by non-negative
least squares gives `LayerFit.a2a_call_s`. A per-token part (`a2a_token_s`) is not fitted: the
largest rows' extra is a few percent of their time, as large as their noise, and a slope fitted on
it swung from 0 to 0.57 us a shard token between passes minutes apart, moving the SP plans' prices
by up to 24% (tiny-llama, 2 gloo ranks, 2026-12-07; one parameter: 3%). On a CPU an
all-to-all costs the executor more than the curve's isolated, back-to-back calls: the autograd
wrapper, the contiguous send buffer, the fresh receive buffer, gloo's CPU time between layers
(tiny-llama on 2 gloo ranks: a 512-token SP-2 micro-batch ran 1.45x its price, an SP-1 one 1.1x).

Launched with torchrun, every rank runs the executor together (FSDP2 then gathers and reduces
over them, as a run on these ranks does) and rank 0 fits; otherwise on a one-rank gloo or NCCL
group of its own.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from dcp.costmodel import (
    Cluster,
    CostModel,
    HardwareProfile,
    LayerFit,
    ModelSpec,
    TrainingSetup,
    attention_pairs,
)
from dcp.costmodel.ring import SPLayout
from dcp.costmodel.schedule import GroupShape, MicroBatchShape
from dcp.profiler.anchor import UNANCHORED, Anchor
from dcp.profiler.compute import Repeats
from dcp.profiler.fitting import fit_nnls, geometric_grid, r_squared


@contextmanager
def one_rank_group(device: torch.device) -> Iterator[None]:
    """A process group of this process alone, for the block (FSDP2 needs one)."""
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                init_method=f"file://{os.path.join(tmp, 'store')}", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def sizes(min_tokens: int, max_tokens: int) -> list[int]:
    """Micro-batch sizes from a sixteenth of the grid's smallest point to four times it (the fixed
    cost is the intercept: it needs small micro-batches, and a few larger ones give the slope)."""
    lo = max(16, min_tokens // 16)
    return geometric_grid(lo, max(lo, min(max_tokens, 4 * min_tokens)), 4.0)


def measure_executor(spec: ModelSpec, dtype: torch.dtype, device: torch.device, tokens: Sequence[int],
                     reps: Repeats, anchor: Anchor = UNANCHORED) -> list[dict[str, float]]:
    """Each size's fastest micro-batch through the executor (compute clock: CPU time with one torch
    thread, else the micro-batch's wall or CUDA-event time), on every rank of the world (a
    collective when distributed), this rank's times. Each step runs three micro-batches per rank
    and the middle one is read as the micro-batch (the first gathers the parameters and the last
    reduces the gradients: the step's work, not every micro-batch's), the whole step beside it
    (`step_s`, for the per-step cost). The rows run round-robin, one step of each in turn per
    repeat: every row's readings then span the same stretch of time, so what the SP rows take
    beyond the SP-1 ones (the all-to-all's extra, `a2a_fit`) is not a spell of the machine that
    one row met and another did not. Each timed step is read by `anchor` (in units of the
    reference kernel timed beside it, where it has one)."""
    from dcp.executor import Executor, ParallelState
    from dcp.executor.reference import manual_plan
    from dcp.models import build_model, lm_loss, mse_loss, sample_tensors
    from dcp.planner import Sample

    cpu_clock = device.type == "cpu" and torch.get_num_threads() == 1
    state = ParallelState.create(device=device)
    with device:
        model = build_model(spec, dtype=dtype, device=device, seed=0)
    executor = Executor(model, state, recipe=recipe_of(dtype), zero_stage=1)

    def loss_fn(out: torch.Tensor, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if spec.attention == "spatial_temporal":
            return mse_loss(out, batch["target"], batch.valid)
        return lm_loss(out, batch["labels"])

    world = state.world_size

    def row(n: int, sp: int, ckpt: int) -> tuple[dict[str, float], Any, dict[int, Any]]:
        """Groups of `sp` aligned ranks over the world, each three micro-batches of one `n`-token
        sample with `ckpt` checkpointed layers: the row's description, its plan and tensors."""
        groups = world // sp
        batch = [Sample(i, n, attention_pairs(spec.attention, n)) for i in range(3 * groups)]
        tensors = {s.id: sample_tensors(spec, s, dtype=dtype) for s in batch}
        plan = manual_plan(batch, world, spec.num_layers,
                           [(g * sp, sp, [([3 * g + j], ckpt) for j in range(3)]) for g in range(groups)],
                           gpus_per_node=state.gpus_per_node)
        return {"tokens": n, "attn_pairs": batch[0].attn_pairs, "sp": sp, "ckpt_layers": ckpt}, plan, tensors

    rows = [row(n, 1, 0) for n in tokens]
    for sp in sp_sizes(spec, world):  # the same tokens a rank: n x sp a micro-batch
        rows += [row(n * sp, sp, ckpt) for ckpt in (0, spec.num_layers) for n in tokens]
    def timed(plan: Any, tensors: dict[int, Any]) -> dict[str, float]:
        stats = executor.step(plan, tensors, loss_fn)
        mb = stats.microbatches[1]
        return {"measured_s": mb.cpu_s if cpu_clock else mb.measured_s,
                "step_s": stats.cpu_step_s if cpu_clock else stats.measured_step_s}

    for _ in range(reps.warmup):
        for _, plan, tensors in rows:
            executor.step(plan, tensors, loss_fn)
    anchor.gap()
    readings: list[list[dict[str, float]]] = [[] for _ in rows]
    for _ in range(reps.repeats):
        for (_, plan, tensors), mine in zip(rows, readings, strict=True):
            mine.append(anchor(lambda p=plan, t=tensors: timed(p, t)))
    return [{**r, "measured_s": min(x["measured_s"] for x in mine), "step_s": min(x["step_s"] for x in mine)}
            for (r, _, _), mine in zip(rows, readings, strict=True)]


def sp_sizes(spec: ModelSpec, world: int) -> list[int]:
    """The SP sizes above 1 whose all-to-alls the executor's fit measures: powers of two that divide
    the world and whose Ulysses groups the model's heads allow."""
    from dcp.executor.ulysses import ulysses_heads_error

    return [p for p in (1 << i for i in range(1, world.bit_length()))
            if world % p == 0 and ulysses_heads_error(spec.heads, spec.kv_heads, p) is None]


def recipe_of(dtype: torch.dtype) -> str:
    return "fp32" if dtype == torch.float32 else "bf16"


def executor_fit(profile: HardwareProfile, spec: ModelSpec, dtype: torch.dtype, rows: Sequence[dict[str, float]],
                 world: int) -> tuple[LayerFit, dict[str, Any]]:
    """The fit with the executor's fixed cost and per-token extra (module docstring), and its record."""
    fit = profile.fits[spec.name]
    cm = CostModel(spec, profile, Cluster(num_gpus=1, gpus_per_node=1, memory_bytes=profile.memory_bytes),
                   TrainingSetup(precision=recipe_of(dtype), zero_stage=1))
    sp_rows = [r for r in rows if r.get("sp", 1) > 1]
    rows = [{**r, "layers_and_head_s": cm.time_s(r["tokens"], r["attn_pairs"], 1, 0) - fit.microbatch_fixed_s}
            for r in rows if r.get("sp", 1) == 1]
    extra = fit_nnls([[1.0, r["tokens"]] for r in rows], [r["measured_s"] - r["layers_and_head_s"] for r in rows],
                     ("fixed", "per_token"), weights=[1.0 / r["measured_s"] for r in rows])
    # What the step takes beyond three middle micro-batches (the first's gather of the parameters,
    # the last's reduction of the gradients, the step's own work around its micro-batches), less
    # what the step price already gives the same step of three micro-batches a rank: the executor's
    # per-step cost, the median over the sizes (it does not grow with tokens).
    synced = CostModel(spec, profile, Cluster(num_gpus=world, gpus_per_node=world, memory_bytes=profile.memory_bytes),
                       TrainingSetup(precision=recipe_of(dtype), zero_stage=1))
    step_extra = statistics.median(r["step_s"] - 3 * r["measured_s"] for r in rows)
    priced = statistics.median(_priced_extra_s(synced, r["tokens"], r["attn_pairs"], world) for r in rows)
    new = replace(fit, microbatch_fixed_s=extra.coef[0], head_per_token_s=fit.head_per_token_s + extra.coef[1],
                  step_fixed_s=max(0.0, step_extra - priced), a2a_call_s=0.0, a2a_token_s=0.0)
    # R^2 of the micro-batch as priced (layers, head and this extra) against the measured one.
    r2 = r_squared([r["measured_s"] for r in rows],
                   [r["layers_and_head_s"] + extra.coef[0] + extra.coef[1] * r["tokens"] for r in rows])
    record = {"measured": True, "points": rows, "coef": extra.as_dict(), "fit_mape_of_residual": extra.mape,
              "r2": r2, "head_intercept_s": fit.microbatch_fixed_s, "zero_stage": 1, "ranks": world,
              "step_extra_s": step_extra, "priced_extra_s": priced,
              "priced_sync_s": synced.sync_terms() if world > 1 else None}
    if sp_rows:
        new, record["all_to_all"] = a2a_fit(replace(profile, fits={**profile.fits, spec.name: new}), spec,
                                            recipe_of(dtype), sp_rows, world)
    return new, record


def a2a_fit(profile: HardwareProfile, spec: ModelSpec, recipe: str, rows: Sequence[dict[str, float]],
            world: int) -> tuple[LayerFit, dict[str, Any]]:
    """`profile`'s fit of `spec` with the executor's cost per all-to-all beyond the curve, fitted
    on SP rows (module docstring): measured - priced = calls x a2a_call_s (a2a_token_s 0)."""
    cm = CostModel(spec, profile, Cluster(num_gpus=world, gpus_per_node=world, memory_bytes=profile.memory_bytes),
                   TrainingSetup(precision=recipe, zero_stage=1))
    rows = [{**r, "calls": (2 * spec.num_layers + r["ckpt_layers"]) * spec.a2a_per_layer,
             "priced_s": cm.time_s(r["tokens"], r["attn_pairs"], r["sp"], r["ckpt_layers"], SPLayout(r["sp"]))}
            for r in rows]
    extra = fit_nnls([[r["calls"]] for r in rows], [r["measured_s"] - r["priced_s"] for r in rows], ("per_call",),
                     weights=[1.0 / r["measured_s"] for r in rows])
    fit = replace(profile.fits[spec.name], a2a_call_s=extra.coef[0], a2a_token_s=0.0)
    # R^2 of the SP micro-batches as priced with this extra against the measured ones.
    r2 = r_squared([r["measured_s"] for r in rows], [r["priced_s"] + r["calls"] * extra.coef[0] for r in rows])
    return fit, {"points": rows, "coef": extra.as_dict(), "fit_mape_of_residual": extra.mape, "r2": r2}


def _priced_extra_s(cm: CostModel, tokens: float, pairs: float, world: int) -> float:
    """What `cm.step_price` adds to a step of three single-sample micro-batches on each of `world`
    ranks beyond the micro-batches themselves (the step `measure_executor` runs), less the
    optimizer's step: `Executor.step` runs none (the training loop steps its optimizer after it)."""
    mbs = (MicroBatchShape(float(tokens), float(pairs), 0),) * 3
    return (cm.step_price([GroupShape(1, mbs)] * world).step_time_s - 3 * cm.time_s(tokens, pairs, 1, 0)
            - cm.optimizer_s)


def executor_rows(spec: ModelSpec, dtype: torch.dtype, device: torch.device, min_tokens: int, max_tokens: int,
                  reps: Repeats, anchor: Anchor = UNANCHORED) -> list[dict[str, float]] | None:
    """`measure_executor` on this job's ranks (or on a group of this process alone); None where no
    precision recipe runs `dtype`."""
    if dtype not in (torch.float32, torch.bfloat16):
        return None
    tokens = sizes(min_tokens, max_tokens)
    if dist.is_initialized():
        return measure_executor(spec, dtype, device, tokens, reps, anchor)
    with one_rank_group(device):
        return measure_executor(spec, dtype, device, tokens, reps, anchor)


def bare_modules(profile: HardwareProfile, name: str) -> HardwareProfile:
    """The profile with model `name`'s fit as the bare modules measured it: the executor's fixed
    cost and per-token extra taken back out (the head's own intercept restored). What `dcp profile
    --validate` prices, as it times the modules without the executor."""
    record = profile.meta.get("fits", {}).get(name, {}).get("executor") or {}
    if not record.get("measured"):
        return profile
    fit = profile.fits[name]
    bare = replace(fit, microbatch_fixed_s=record["head_intercept_s"], step_fixed_s=0.0, a2a_call_s=0.0, a2a_token_s=0.0,
                   head_per_token_s=fit.head_per_token_s - record["coef"]["per_token"])
    return replace(profile, fits={**profile.fits, name: bare})
