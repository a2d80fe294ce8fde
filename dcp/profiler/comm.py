"""All-to-all (and gradient all-reduce) microbenchmarks under torch.distributed, and their fit.

Ulysses SP moves every activation through all-to-alls inside the SP group (DeepSpeed-Ulysses,
arXiv 2309.14509). Per call, a rank holding m bytes keeps m/p and sends m (p-1)/p, so

    t(m, p) = lat(p) + m (p-1)/p / bw(p)

which is the cost model's comm term (docs/design.md, "The cost model"). We fit lat and bw per group
size p by NNLS over a range of message sizes, and report groups inside a node (NVLink) and
groups spanning nodes (InfiniBand) separately, because their bandwidths differ by 10x (FlexSP,
arXiv 2412.01523: 119.5 GB/s for 2 GPUs in a node, 10.3 GB/s for 16 across nodes).

All aligned blocks of size p run their all-to-alls at the same time, as a plan's groups do,
so shared links (NICs, PCIe switches) are measured under the contention training sees.
"""

from __future__ import annotations

import functools
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dcp.profiler.fitting import fit_nnls
from dcp.profiler.timing import Stopwatch


@dataclass(frozen=True)
class A2APoint:
    """One all-to-all measurement: the slowest rank's median over repeats."""

    group_size: int
    message_bytes: int
    """Bytes each rank holds before the call (it sends (p-1)/p of them)."""
    seconds: float


@dataclass(frozen=True)
class A2AFit:
    """lat + bytes_sent / bw for one group size."""

    group_size: int
    intra_node: bool
    latency_s: float
    bw_bytes_per_s: float
    r2: float
    mape: float


def aligned_blocks(world: int, size: int) -> list[list[int]]:
    """Ranks of each aligned block of `size`: [0..size-1], [size..2 size-1], ..."""
    return [list(range(s, s + size)) for s in range(0, world - size + 1, size)]


def gpus_per_node_from_env(device: torch.device, world: int) -> int:
    """Ranks per node: torchrun's LOCAL_WORLD_SIZE, else the visible GPUs, else the world."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if local:
        return int(local)
    if device.type == "cuda":
        return max(1, min(torch.cuda.device_count(), world))
    return world


def _timed(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    """Median wall seconds of a collective over repeats, every repeat started together (barrier)."""
    watch = Stopwatch(device)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        dist.barrier()
        watch.start()
        fn()
        watch.stop()
        times.append(watch.seconds())
    return statistics.median(times)


def _slowest(seconds: float, device: torch.device) -> float:
    """The group's time is its slowest member's: max over every rank."""
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _all_to_all(out: torch.Tensor, x: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    """A rank outside every block of this size (world not a multiple of it) only waits."""
    if group is not None:
        dist.all_to_all_single(out, x, group=group)


def measure_all_to_all(message_bytes: Sequence[int], *, device: torch.device, dtype: torch.dtype,
                       warmup: int = 2, repeats: int = 5, progress: object = None) -> list[A2APoint]:
    """Time all_to_all_single for every aligned power-of-two group size and message size.

    Every rank of the (initialized) default process group must call this with the same
    arguments: every rank creates every group, in the same order, as torch requires."""
    world, rank = dist.get_world_size(), dist.get_rank()
    elem = torch.empty((), dtype=dtype).element_size()
    sizes = [1 << i for i in range(1, world.bit_length()) if (1 << i) <= world]
    points: list[A2APoint] = []
    task = progress.add_task("all-to-all", total=len(sizes) * len(message_bytes)) if progress else None
    for p in sizes:
        groups = [dist.new_group(ranks) for ranks in aligned_blocks(world, p)]
        mine = groups[rank // p] if rank < len(groups) * p else None
        for m in message_bytes:
            n = max(p, (m // elem) // p * p)  # whole elements, divisible among p ranks
            x = torch.ones(n, dtype=dtype, device=device)
            out = torch.empty_like(x)
            call = functools.partial(_all_to_all, out, x, mine)
            t = _slowest(_timed(call, device, warmup, repeats), device)
            points.append(A2APoint(p, n * elem, t))
            if progress is not None:
                progress.advance(task)  # type: ignore[attr-defined]
    return points


def measure_allreduce_bw(message_bytes: int, *, device: torch.device, dtype: torch.dtype,
                         warmup: int = 2, repeats: int = 5) -> float:
    """Bus bandwidth of a world all-reduce: a ring moves 2 (N-1)/N of the bytes per rank (the
    cost model's grad_sync_s uses the same convention)."""
    world = dist.get_world_size()
    elem = torch.empty((), dtype=dtype).element_size()
    x = torch.ones(max(1, message_bytes // elem), dtype=dtype, device=device)
    t = _slowest(_timed(lambda: dist.all_reduce(x), device, warmup, repeats), device)
    return 2 * (world - 1) / world * x.nelement() * elem / t


def fit_all_to_all(points: Sequence[A2APoint], gpus_per_node: int) -> dict[int, A2AFit]:
    """Latency and bandwidth per group size (NNLS of t on [1, bytes sent])."""
    fits = {}
    for p in sorted({pt.group_size for pt in points}):
        pts = [pt for pt in points if pt.group_size == p]
        sent = [pt.message_bytes * (p - 1) / p for pt in pts]
        f = fit_nnls([[1.0, s] for s in sent], [pt.seconds for pt in pts], ("latency", "per_byte"))
        lat, per_byte = f.coef
        # A zero slope (all sizes equally fast: latency-bound range) gives no bandwidth
        # information; report the fastest observed rate rather than infinity.
        bw = 1.0 / per_byte if per_byte > 0 else max(s / pt.seconds for s, pt in zip(sent, pts, strict=True))
        fits[p] = A2AFit(p, p <= gpus_per_node, lat, bw, f.r2, f.mape)
    return fits


def init_from_torchrun(device: str) -> bool:
    """Join the job torchrun started (WORLD_SIZE > 1): NCCL on GPUs, gloo on CPUs. False when
    not launched distributed, or already initialized by the caller."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return dist.is_initialized()
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    return True
