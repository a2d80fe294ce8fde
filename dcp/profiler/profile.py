"""Calibrate a machine: measure a model's layer (and the device, and the network when launched
distributed), fit the cost model, and produce a `HardwareProfile` that records what it measured.

No number the planner relies on is a guess: each profile field is either measured here (its
`sources` entry says when, on what and how) or kept from the base preset (whose `sources` entry
names its own origin); `meta["measured"]` and `meta["from_preset"]` list which is which.
"""

from __future__ import annotations

import datetime
import platform
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist

from dcp.costmodel import HardwareProfile, LayerFit, ModelSpec
from dcp.models.attention import attention_backend
from dcp.profiler import comm
from dcp.profiler.anchor import UNANCHORED, Anchor, timed_fields
from dcp.profiler.bench import LayerBench, heldout_batches, packing_grid, split_tokens
from dcp.profiler.compute import LayerPoint, ModelPoint, Repeats, measure_layer, measure_model
from dcp.profiler.device_bench import measure_device
from dcp.profiler.executor_cost import executor_fit, executor_rows
from dcp.profiler.fitting import MAPE_THRESHOLD, R2_THRESHOLD, geometric_grid
from dcp.profiler.layer_fit import LAYER_COMPONENTS, LayerFitReport, fit_layer
from dcp.profiler.reference import DTYPES, REFERENCE_WORK, ReferenceKernel
from dcp.profiler.timing import clock_name


@dataclass(frozen=True, kw_only=True)
class ProfileOptions:
    """How much to measure. Token ranges default by device (see `resolved`)."""

    device: str = "cpu"
    dtype: str | None = None
    """bf16, fp16 or fp32; default bf16 on CUDA, fp32 on CPU."""
    quick: bool = False
    """A smaller grid and fewer repeats (CPU development, smoke tests)."""
    min_tokens: int | None = None
    max_tokens: int | None = None
    heldout: int | None = None
    """Held-out micro-batches for the MAPE."""
    head_max_tokens: int | None = None
    """Largest micro-batch of the whole-model (head; 1 and 2 layers) runs; default min(max_tokens, 32K): the head
    is linear in tokens, and a 128K-token batch's fp32 logits of a 32K vocabulary alone take 16 GB."""
    seed: int = 0
    device_bench: bool = True
    """Also measure matmul/attention FLOP/s and memory bandwidth (priced models without a fit)."""
    name: str | None = None
    """Profile name; default '<base>-profiled'."""
    threads: int | None = None
    """CPU only: torch threads while measuring; default 1. One thread gives timings that repeat
    to a few percent on a shared machine (two threads stall whenever either is descheduled),
    and CPU ranks of a gloo job share the cores anyway. 0 keeps torch's default."""

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")

    def resolved(self) -> ProfileOptions:
        """Defaults filled in. CPU: 256..4096 tokens (attention already dominates a 4K sample of
        a 64-wide layer, and a point takes milliseconds); CUDA: 1K..128K (the DCP paper's range
        for Llama 7B on H200; quick stops at 32K)."""
        cuda = self.device == "cuda"
        hi = self.max_tokens or ((32768 if self.quick else 131072) if cuda else (4096 if self.quick else 8192))
        return replace(self, dtype=self.dtype or ("bf16" if cuda else "fp32"),
                       min_tokens=self.min_tokens or (1024 if cuda else 256), max_tokens=hi,
                       heldout=self.heldout if self.heldout is not None else (8 if self.quick else 10),
                       head_max_tokens=self.head_max_tokens or min(hi, 32768))

    @property
    def repeats(self) -> Repeats:
        """Repeats of every point in each pass (`passes`). GPU kernels repeat to a fraction of a
        percent, so 3 repeats in one pass do there; a CPU's fastest run needs more draws to be
        found, spread over the profile (docs/tuning-log.md, `CPU_PASSES`)."""
        if self.quick or self.device == "cuda":
            return Repeats(warmup=1, repeats=3)
        return Repeats(warmup=1, repeats=CPU_REPEATS)

    @property
    def anchored(self) -> bool:
        """Whether every reading is taken in units of the reference kernel timed beside it
        (`Anchor`): on a CPU, whose speed wanders (a VM's by 13% in ten minutes, nothing else
        running); not on a GPU, whose clocks hold and where the small reference layer would time
        kernel launches rather than the machine's speed; nor in a quick profile, a smoke run whose
        one pass is not meant to repeat."""
        return self.device == "cpu" and not self.quick

    @property
    def passes(self) -> int:
        """Passes over every point (layer grid, held-out, head, whole models, the executor's
        micro-batches), each point keeping the median over the passes of its fastest reading in
        each (`merge_passes`): a spell of the machine, slow or fast, then touches every component
        alike instead of the one measured in it, and one pass's spell does not carry the profile."""
        return 1 if self.quick or self.device == "cuda" else CPU_PASSES


CPU_PASSES = 3
"""Passes over every CPU point, the median of the passes' fastest kept (docs/tuning-log.md)."""
CPU_REPEATS = 3
"""Timed repeats of every CPU point in each pass, the fastest kept for the pass (docs/tuning-log.md)."""
REFERENCE_DRIFT = 0.05
"""An unanchored profile (`ProfileOptions.anchored`) whose reference kernel (`ReferenceKernel`) ran
this much slower at its slowest than at its fastest reading says so in its warnings: the machine
changed speed while it measured. An anchored one took every point in the kernel's units."""
DENSER = 2.0 ** 0.5
"""Grid step of a re-measurement: the first pass's factor 2 halved in log space (twice the points)."""


def track(progress: Any, items: Sequence[Any], what: str) -> Iterable[Any]:
    """Iterate with a rich progress bar when one is given (the library never prints itself)."""
    if progress is None:
        yield from items
        return
    task = progress.add_task(what, total=len(items))
    for item in items:
        yield item
        progress.advance(task)


@dataclass
class Measured:
    """What a bench measured: layer grid points, whole-model points (0 layers: the head; 1 and 2),
    held-out points, and which components were re-measured."""

    points: list[LayerPoint]
    model_points: list[ModelPoint]
    heldout: list[LayerPoint]
    remeasured: list[str] = field(default_factory=list)


def layer_grid(bench: LayerBench, layer: torch.nn.Module, o: ProfileOptions, reps: Repeats, factor: float,
               progress: Any = None, anchor: Anchor = UNANCHORED) -> list[LayerPoint]:
    assert o.min_tokens and o.max_tokens
    grid = packing_grid(bench, o.min_tokens, o.max_tokens, factor=factor)
    anchor.gap()
    return [anchor(lambda s=s: measure_layer(layer, bench, s, reps)) for s in track(progress, grid, "layer grid")]


def head_grid(bench: LayerBench, o: ProfileOptions, reps: Repeats, factor: float,
              progress: Any = None, anchor: Anchor = UNANCHORED) -> list[ModelPoint]:
    """The model without layers from a sixteenth of the smallest grid point up: its fixed cost is
    the intercept, so the line needs points near zero tokens."""
    assert bench.build_model is not None and o.min_tokens and o.head_max_tokens
    model = bench.build_model(0)
    lo = max(16, o.min_tokens // 16)
    totals = geometric_grid(lo, max(lo, o.head_max_tokens), factor)
    anchor.gap()
    return [anchor(lambda t=total: measure_model(model, bench, [bench.shape(n) for n in split_tokens(t, min(t, 512))],
                                                 0, reps))
            for total in track(progress, totals, "head (no layers)")]


def measure_bench(bench: LayerBench, opts: ProfileOptions, progress: Any = None,
                  anchor: Anchor = UNANCHORED) -> Measured:
    """Grid points, whole-model points (0, 1 and 2 layers) and held-out points of one bench (one
    pass: `opts.repeats` of each), each taken by `anchor` (in its units where it has a kernel)."""
    o, reps = opts.resolved(), opts.repeats
    assert o.min_tokens and o.max_tokens and o.heldout is not None
    layer = bench.build_layer()
    # One untimed pass over the largest point first: thread pools, allocator growth and kernel
    # selection happen once per process and would otherwise inflate the first points.
    measure_layer(layer, bench, packing_grid(bench, o.min_tokens, o.max_tokens)[-1], Repeats(warmup=1, repeats=1))
    points = layer_grid(bench, layer, o, reps, 2.0, progress, anchor)
    heldout = heldout_batches(bench, o.min_tokens, o.max_tokens, o.heldout, seed=o.seed + 1)
    held = [anchor(lambda s=s: measure_layer(layer, bench, s, reps)) for s in track(progress, heldout, "held-out")]
    model_points: list[ModelPoint] = []
    if bench.build_model is not None:
        model_points += head_grid(bench, o, reps, 2.0, progress, anchor)
        # Whole 1- and 2-layer models: the head's memory, and a check of the parts' sum.
        assert o.head_max_tokens is not None
        totals = geometric_grid(o.min_tokens, max(o.min_tokens, o.head_max_tokens), 4.0 if o.quick else 2.0)
        models = {n: bench.build_model(n) for n in (1, 2)}
        anchor.gap()
        for total in track(progress, totals, "whole model (1 and 2 layers)"):
            samples = [bench.shape(n) for n in split_tokens(total, min(total, 512))]
            model_points += [anchor(lambda n=n, s=samples: measure_model(models[n], bench, s, n, reps)) for n in (1, 2)]
        del models
    return Measured(points, model_points, held)


def _layer_key(p: LayerPoint) -> tuple[int, ...]:
    return p.tokens, p.num_samples, p.attn_pairs


def _model_key(p: ModelPoint) -> tuple[int, ...]:
    return p.tokens, p.attn_pairs, p.layers


def merge_passes(passes: Sequence[Measured]) -> Measured:
    """Passes over the same points: each point's median over the passes of its fastest reading in
    each, field by field (`_median_of_passes`)."""
    return Measured(_median_of_passes([m.points for m in passes], _layer_key),
                    _median_of_passes([m.model_points for m in passes], _model_key),
                    _median_of_passes([m.heldout for m in passes], _layer_key),
                    [c for m in passes for c in m.remeasured])


def merge_rows(passes: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Passes of the executor's rows (`executor_cost.measure_executor`): each row's median over the
    passes of its fastest micro-batch and step in each."""
    def key(r: dict[str, Any]) -> tuple[int, int, int]:
        return r["tokens"], r.get("sp", 1), r.get("ckpt_layers", 0)

    return [{**rs[-1], "measured_s": statistics.median(r["measured_s"] for r in rs),
             "step_s": statistics.median(r["step_s"] for r in rs)} for rs in _by_point(passes, key)]


@dataclass
class Passes:
    """What `measure_passes` measured, in seconds: this bench's points (rank 0's; None on other
    ranks), the executor's rows (None when not asked for), the reference kernel's readings, and
    the `Anchor` that took them (settled: a re-measurement takes its points at the same speed)."""

    measured: Measured | None
    rows: list[dict[str, Any]] | None
    reference_s: list[float]
    anchor: Anchor = UNANCHORED


def measure_passes(bench: LayerBench, opts: ProfileOptions, progress: Any = None,
                   executor: Callable[[Repeats, Anchor], list[dict[str, Any]] | None] | None = None) -> Passes:
    """`opts.passes` passes of `measure_bench` and of `executor(repeats, anchor)` (where given), each point
    keeping the median over the passes of its fastest reading in each (`merge_passes`, `merge_rows`).
    Anchored (`ProfileOptions.anchored`, a CPU), every point and every executor step is
    read in units of the reference kernel timed beside them (`Anchor`), merged in those units and
    recorded in seconds at the median reading; unanchored (a GPU), the kernel is timed before
    each pass and after the last (`meta.reference`). Every rank measures, at once, and rank 0's
    readings are kept: the executor computes on every rank at once, and on a CPU a core computing
    beside another can run slower than beside an idle one (shared caches and memory bandwidth), so
    the bench's layers (and the kernel) are timed beside the same neighbours as the executor's
    micro-batches."""
    o = opts.resolved()
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    kernel = ReferenceKernel(bench.device)
    anchor = Anchor(kernel) if o.anchored else UNANCHORED
    measured: list[Measured] = []
    rows: list[list[dict[str, Any]]] = []
    reference = []
    for _ in range(o.passes):
        if not o.anchored:
            reference.append(kernel.seconds())
        new = measure_bench(bench, o, progress if rank0 else None, anchor)
        if rank0:
            measured.append(new)
        if executor is not None and (new_rows := executor(o.repeats, anchor)) is not None:
            rows.append(new_rows)
    if not o.anchored:
        reference.append(kernel.seconds())
    anchor.settle()
    return Passes(anchor.seconds(merge_passes(measured)) if measured else None,
                  anchor.seconds(merge_rows(rows)) if rows else None,
                  list(anchor.readings) if o.anchored else reference, anchor)


def _median_of_passes(passes: Sequence[Sequence[Any]], key: Callable[[Any], tuple[int, ...]]) -> list[Any]:
    """The points of every pass (the same `key`: the same point), each with every timed field the
    median of that field's readings over the passes that measured it. Each reading is its pass's
    fastest repeat: noise only adds time, so a repeat's minimum is the work itself where the pass
    met a moment without it; the median over passes then keeps the moment the machine typically
    offers rather than its one fastest spell (with three passes, the middle one). On the 2-core
    development VM the fastest spell is an outlier: a reference kernel's fastest reading ran 6.6%
    under another profile's ten minutes later (12.0 against 12.8 ms) and carried every component of
    that profile with it (docs/tuning-log.md, `CPU_PASSES`)."""
    return [replace(ps[-1], **{f: statistics.median(getattr(q, f) for q in ps) for f in timed_fields(ps[-1])})
            if len(ps) > 1 else ps[0]
            for ps in _by_point(passes, key)]


def _by_point(passes: Sequence[Sequence[Any]], key: Callable[[Any], tuple[int, ...]]) -> list[list[Any]]:
    """Every pass's readings grouped by point (the same `key`), in the order first seen."""
    groups: dict[tuple[int, ...], list[Any]] = {}
    for points in passes:
        for p in points:
            groups.setdefault(key(p), []).append(p)
    return list(groups.values())


def _fastest(old: Sequence[Any], new: Sequence[Any], key: Callable[[Any], tuple[int, ...]]) -> list[Any]:
    """`new` with each point that `old` also measured (same `key`) given the faster reading of
    every timed field (the minimum over both passes' repeats), then `old`'s other points."""
    before = {key(p): p for p in old}
    out = []
    for p in new:
        q = before.pop(key(p), None)
        if q is not None:
            p = replace(p, **{f: min(getattr(p, f), getattr(q, f)) for f in timed_fields(p)})
        out.append(p)
    return out + list(before.values())


def remeasure(bench: LayerBench, opts: ProfileOptions, m: Measured, failing: Iterable[str],
              progress: Any = None, anchor: Anchor = UNANCHORED) -> Measured:
    """Measure the failing components again on a grid twice as dense (`DENSER`) with twice the
    repeats (by the passes' settled `anchor`, in seconds at their speed); each point measured in
    both keeps its fastest reading."""
    o, reps = opts.resolved(), opts.repeats
    more = Repeats(warmup=reps.warmup, repeats=2 * o.passes * reps.repeats)
    failing = set(failing)
    points, model_points, again = m.points, m.model_points, []
    if failing & set(LAYER_COMPONENTS):
        new = anchor.seconds(layer_grid(bench, bench.build_layer(), o, more, DENSER, progress, anchor))
        points = _fastest(m.points, new, _layer_key)
        again += [c for c in LAYER_COMPONENTS if c in failing]
    if "head+loss" in failing and bench.build_model is not None:
        heads = [p for p in m.model_points if p.layers == 0]
        new = _fastest(heads, anchor.seconds(head_grid(bench, o, more, DENSER, progress, anchor)), _model_key)
        model_points = new + [p for p in m.model_points if p.layers != 0]
        again.append("head+loss")
    return Measured(points, model_points, m.heldout, m.remeasured + again)


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} torch thread(s)"


def stamp(device: torch.device) -> str:
    """"measured <date> by dcp profile on <device>", the start of every measured source."""
    return f"measured {datetime.date.today().isoformat()} by dcp profile on {device_description(device)}"


def build_profile(base: HardwareProfile, bench: LayerBench, report: LayerFitReport,
                  points: Sequence[LayerPoint], model_points: Sequence[ModelPoint], opts: ProfileOptions,
                  *, spec: ModelSpec | None = None, device_bench: Any = None, comm_result: Any = None,
                  remeasured: Sequence[str] = (), reference_s: Sequence[float] = ()) -> HardwareProfile:
    """The base profile with this measurement's fit, device numbers and network numbers. A
    component whose R^2 is below `R2_THRESHOLD` after its re-measurement is named in
    meta["fits"][model]["r2_below"] and in meta["warnings"]: the profile is kept, flagged."""
    o = opts.resolved()
    where = device_description(bench.device)
    when = stamp(bench.device)
    fields: dict[str, Any] = {}
    sources = dict(base.sources)
    measured = [f"fits.{bench.name}"]
    if device_bench is not None:
        for f, note in device_bench.notes.items():
            fields[f] = getattr(device_bench, f)
            sources[f] = f"{when}: {note}"
            measured.append(f)
    fit = report.fit
    # c0 of the FLOP-derived fits of other models: this layer's measured forward fixed cost.
    fields["kernel_overhead_s"] = fit.fwd_fixed_s
    sources["kernel_overhead_s"] = f"{when}: fixed forward cost of one {bench.name} layer"
    measured.append("kernel_overhead_s")
    comm_meta: dict[str, Any]
    if comm_result is not None:
        comm_fields, comm_sources, comm_meta = comm_result
        fields.update(comm_fields)
        sources.update({k: f"{when}: {v}" for k, v in comm_sources.items()})
        measured += list(comm_fields)
    else:
        comm_meta = {"measured": False, "why": "one device (world size 1): communication numbers kept "
                     f"from the base preset {base.name!r}; launch `dcp profile` with torchrun to measure them"}
    fits = {**base.fits, bench.name: fit}
    prior = base.meta.get("fits", {}) if base.meta.get("kind") == "dcp profile" else {}
    below = report.below_threshold()
    reps = o.repeats
    fit_meta = {**report.to_meta(points, model_points), "tokens_range": [o.min_tokens, o.max_tokens],
                "dtype": o.dtype, "quick": o.quick, "model": spec.to_dict() if spec else None,
                "r2": {name: f.r2 for name, f in report.components().items() if f is not None},
                "r2_threshold": R2_THRESHOLD, "r2_below": below, "remeasured": list(remeasured),
                "timing": {"clock": clock_name(bench.device), "kept": "median over the passes of each pass's fastest repeat",
                           "anchored": "each reading divided by the reference kernel timed beside it, "
                                       "recorded at the median reading (meta.reference)" if o.anchored else None,
                           "passes": o.passes, "warmup": reps.warmup, "repeats": reps.repeats,
                           "remeasured_repeats": 2 * o.passes * reps.repeats if remeasured else None,
                           "wall": "each point's fastest wall-clock reading beside it (*_wall_s, wall_s)"}}
    all_fields = [f for f in HardwareProfile.__dataclass_fields__ if f not in ("name", "sources", "fits", "meta")]
    warnings = []
    if fit.heldout_mape is not None and fit.heldout_mape > MAPE_THRESHOLD:
        warnings.append(f"{bench.name}: held-out MAPE {fit.heldout_mape:.1%} exceeds {MAPE_THRESHOLD:.0%}")
    warnings += [f"{bench.name}: {name} fit R^2 {r2:.3f} is below {R2_THRESHOLD} after re-measuring it"
                 for name, r2 in below.items()]
    reference = reference_record(reference_s, anchored=o.anchored)
    if reference and not o.anchored and reference["drift"] > REFERENCE_DRIFT:
        warnings.append(f"the reference kernel ran {reference['drift']:.1%} slower at its slowest than at its "
                        f"fastest during the profile: the machine changed speed while it measured")
    meta = {
        "kind": "dcp profile", "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "base": base.name, "device_name": where, "torch": torch.__version__,
        # dcp.models' attention kernel: what the reference layer ran (a user's layer has its own).
        "attention_kernel": attention_backend(bench.device, DTYPES[o.dtype])[0] if spec and o.dtype else None,
        "threads": torch.get_num_threads() if bench.device.type == "cpu" else None,
        "measured": measured,
        "from_preset": [f for f in all_fields if f not in measured and f not in ("device", "heldout_mape")],
        "mape_threshold": MAPE_THRESHOLD, "warnings": warnings, "comm": comm_meta,
        "attention_sweep": device_bench.attention_points if device_bench is not None else None,
        "reference": reference,
        "fits": {**prior, bench.name: fit_meta},
    }
    mapes = [f.heldout_mape for f in fits.values() if f.heldout_mape is not None]
    return replace(base, name=o.name or f"{base.name.removesuffix('-profiled')}-profiled", device=where,
                   sources=sources, fits=fits, meta=meta, heldout_mape=max(mapes) if mapes else None, **fields)


def reference_record(seconds: Sequence[float], *, anchored: bool = False) -> dict[str, Any] | None:
    """meta.reference: the reference kernel's readings (anchored: beside every point, `Anchor`;
    else before each pass and after the last), their median (the machine's speed the profile
    stands for), their fastest, and how far the slowest lay above the fastest."""
    if not seconds:
        return None
    return {"work": REFERENCE_WORK, "anchored": anchored, "seconds": list(seconds),
            "median_s": statistics.median(seconds), "fastest_s": min(seconds),
            "drift": max(seconds) / min(seconds) - 1.0}


def measure_comm(device: torch.device, dtype: torch.dtype, *, quick: bool, base: HardwareProfile,
                 progress: Any = None) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]] | None:
    """Collective curves (and GPUs per node) when running distributed (world > 1), else None. The
    measured curves replace the base profile's of the same collective and shape; the rest stay."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    world = dist.get_world_size()
    g = comm.gpus_per_node_from_env(device, world)
    top = 26 if device.type == "cuda" else 20  # 64 MiB on GPUs, 1 MiB over gloo
    sizes = [1 << i for i in range(top - (6 if quick else 10), top + 1, 2)]
    points = comm.measure_collectives(sizes, device=device, dtype=dtype, repeats=3 if quick else 5,
                                      progress=progress)
    backend = "nccl" if device.type == "cuda" else "gloo"
    curves = comm.curves_from_points(points, g, f"{stamp(device)}: {backend}, every aligned block at once")
    shapes = {(c.op, c.gpus_per_node, c.nodes) for c in curves}
    kept = [c for c in base.collectives if (c.op, c.gpus_per_node, c.nodes) not in shapes]
    fields: dict[str, Any] = {"collectives": tuple(curves + kept)}
    src = {"collectives": f"{len(curves)} curves measured over {world} ranks ({g} per node), {sizes[0]}.."
                          f"{sizes[-1]} bytes; {len(kept)} kept from {base.name!r} (each curve names its source)"}
    if device.type == "cuda":
        # A node's GPUs, not this run's ranks per node (CPU 'nodes' keep the preset's convention).
        fields["gpus_per_node"] = torch.cuda.device_count()
        src["gpus_per_node"] = "torch.cuda.device_count() on the profiled node"
    fits = {f"{c.op}:{c.gpus_per_node}x{c.nodes}": dict(zip(("latency_s", "bus_bw_bytes_per_s"), c.alpha_beta(),
                                                           strict=True)) for c in curves}
    meta = {"measured": True, "world": world, "gpus_per_node": g, "points": [asdict(p) for p in points],
            "alpha_beta": fits}
    if not any(c.nodes > 1 for c in curves):
        meta["inter_node"] = "no group spans nodes here: curves across nodes kept from the base preset"
    return fields, src, meta


def profile_bench(bench: LayerBench, base: HardwareProfile, opts: ProfileOptions, *,
                  spec: ModelSpec | None = None, progress: Any = None) -> HardwareProfile:
    """Profile any model given as a `LayerBench` (the Python API behind `dcp profile`)."""
    return _profile_bench(bench, base, opts, spec=spec, progress=progress)[0]


def _profile_bench(bench: LayerBench, base: HardwareProfile, opts: ProfileOptions, *,
                   spec: ModelSpec | None = None, progress: Any = None,
                   executor: Callable[[Repeats, Anchor], list[dict[str, Any]] | None] | None = None,
                   ) -> tuple[HardwareProfile, list[dict[str, Any]] | None]:
    """`profile_bench`, with `executor(repeats, anchor)` run on every rank in each pass; its merged rows
    beside the profile (on ranks other than 0, `base` and the rows)."""
    o = opts.resolved()
    assert o.dtype is not None
    comm_result = measure_comm(bench.device, DTYPES[o.dtype], quick=o.quick, base=base, progress=progress)
    with cpu_threads(bench.device, o.threads):  # every rank: the executor runs on all of them
        passes = measure_passes(bench, o, progress, executor)
    if passes.measured is None:
        return base, passes.rows  # the network is measured together; compute once, on rank 0
    with cpu_threads(bench.device, o.threads):
        m = passes.measured
        report = fit_layer(m.points, m.model_points, m.heldout)
        if report.below_threshold():  # one more, denser and longer pass for what fits badly
            m = remeasure(bench, o, m, report.below_threshold(), progress, passes.anchor)
            report = fit_layer(m.points, m.model_points, m.heldout)
        device_numbers = measure_device(bench.device, DTYPES[o.dtype], quick=o.quick) if o.device_bench else None
        return build_profile(base, bench, report, m.points, m.model_points, o, spec=spec,
                             device_bench=device_numbers, comm_result=comm_result, remeasured=m.remeasured,
                             reference_s=passes.reference_s), passes.rows


@contextmanager
def cpu_threads(device: torch.device, threads: int | None) -> Iterator[None]:
    """Run the block with `threads` torch threads on CPU (None: 1, 0: unchanged), then restore."""
    before = torch.get_num_threads()
    if device.type == "cpu" and threads != 0:
        torch.set_num_threads(threads or 1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def fit_of(profile: HardwareProfile, name: str) -> LayerFit:
    """The measured fit of model `name`, with a clear error when the profile has none."""
    if name not in profile.fits:
        raise KeyError(f"profile {profile.name!r} has no fit for model {name!r} (it has: "
                       f"{', '.join(profile.fits) or 'none'}); run `dcp profile --model {name}`")
    return profile.fits[name]


def profile_model(spec: ModelSpec, base: HardwareProfile, opts: ProfileOptions, *,
                  progress: Any = None) -> HardwareProfile:
    """Profile one layer of `spec`'s reference model (dcp.models) on this machine, its memory
    footprint in every precision recipe included (dcp.profiler.memory.record_memory)."""
    from dcp.profiler.memory import record_memory
    from dcp.profiler.reference import reference_bench

    o = opts.resolved()
    assert o.dtype is not None and o.min_tokens and o.max_tokens
    bench = reference_bench(spec, torch_device(o.device), o.dtype, seed=o.seed)
    dtype, lo, hi = DTYPES[o.dtype], o.min_tokens, o.max_tokens
    profile, rows = _profile_bench(bench, base, o, spec=spec, progress=progress,
                                   executor=lambda reps, anchor: executor_rows(spec, dtype, bench.device, lo, hi,
                                                                               reps, anchor))
    if dist.is_initialized() and dist.get_rank() != 0:
        return profile
    if rows is None:
        fit, record = profile.fits[spec.name], {"measured": False, "why": f"no precision recipe runs {o.dtype} "
                                                "parameters: the micro-batch's fixed cost is the head's intercept"}
    else:
        fit, record = executor_fit(profile, spec, DTYPES[o.dtype], rows,
                                   dist.get_world_size() if dist.is_initialized() else 1)
    fit_meta = {**profile.meta["fits"][spec.name], "executor": record}
    warnings = list(profile.meta["warnings"])
    if record["measured"]:  # the executor's fits are components too: their R^2, and named when below the bar
        fit_meta["r2"] = {**fit_meta["r2"], **executor_r2(record)}
        for name, r2 in executor_r2(record).items():
            if r2 < R2_THRESHOLD:
                fit_meta["r2_below"] = {**fit_meta["r2_below"], name: r2}
                warnings.append(f"{spec.name}: {name} fit R^2 {r2:.3f} is below {R2_THRESHOLD}")
    meta = {**profile.meta, "warnings": warnings, "fits": {**profile.meta["fits"], spec.name: fit_meta}}
    profile = replace(profile, fits={**profile.fits, spec.name: fit}, meta=meta)
    return record_memory(profile, spec, o.dtype)


def executor_r2(record: dict[str, Any]) -> dict[str, float]:
    """R^2 of the executor's fits (`executor_cost.executor_fit`'s record): the micro-batch's fixed
    cost ("executor") and, where SP groups ran, the all-to-all's extra ("all_to_all")."""
    out = {"executor": record["r2"]}
    if record.get("all_to_all"):
        out["all_to_all"] = record["all_to_all"]["r2"]
    return out


def torch_device(name: str) -> torch.device:
    if name == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda: no CUDA device is visible to torch")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
