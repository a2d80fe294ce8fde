"""Collective microbenchmarks under torch.distributed: the bus-bandwidth curves a profile keeps.

The cost model prices every collective the executor issues from bus bandwidth against message
size (dcp.costmodel.collectives, nccl-tests' conventions), keyed by the group's shape: GPUs per
node and nodes. Here we measure the same curves: the Ulysses all-to-all for every aligned
power-of-two group size (all blocks of a size at once, as a plan's groups run, so shared links
are measured under the contention training sees), the step's world collectives (all-reduce,
reduce-scatter, all-gather, broadcast), and ring attention's neighbour exchange (send_recv: every
pair of ranks inside a node, and of ranks a node apart, sending and receiving at once), each over
a geometric range of message sizes. A point's
bus bandwidth is size x factor(n) / seconds, the slowest rank's median; the profile stores the
points, and the cost model interpolates them (or fits latency + bytes / bandwidth, which keeps
its micro-batch model linear in tokens).

On CPUs this runs over gloo (the tests do), on GPUs over NCCL under torchrun.
"""

from __future__ import annotations

import functools
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dcp.costmodel import COLLECTIVES, CollectiveCurve, bus_factor, group_shape
from dcp.profiler.timing import Stopwatch


@dataclass(frozen=True)
class CommPoint:
    """One collective measurement: the slowest rank's median over repeats."""

    op: str
    group_size: int
    message_bytes: int
    """nccl-tests' size: the buffer for all-reduce, all-to-all and broadcast, the whole (n-shard)
    input of a reduce-scatter and output of an all-gather, what each rank sends in a send_recv."""
    seconds: float
    across_nodes: bool = False
    """send_recv only: the two ranks are in different nodes."""

    @property
    def bus_bw_bytes_per_s(self) -> float:
        return self.message_bytes * bus_factor(self.op, self.group_size) / self.seconds


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


def _world_call(op: str, m: int, device: torch.device, dtype: torch.dtype) -> tuple[Callable[[], object], int]:
    """A world collective on about `m` bytes (whole elements, divisible by the world) and its
    exact size in nccl-tests' terms."""
    world, elem = dist.get_world_size(), torch.empty((), dtype=dtype).element_size()
    n = max(world, (m // elem) // world * world)
    full, shard = torch.ones(n, dtype=dtype, device=device), torch.ones(n // world, dtype=dtype, device=device)
    # torch renamed the tensor variants (2.13: *_single); either name takes the same arguments.
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    calls: dict[str, Callable[[], object]] = {
        "all_reduce": lambda: dist.all_reduce(full),
        "reduce_scatter": lambda: reduce_scatter(shard, full),
        "all_gather": lambda: all_gather(full, shard),
        "broadcast": lambda: dist.broadcast(full, src=0),
    }
    return calls[op], n * elem


def measure_collectives(message_bytes: Sequence[int], *, device: torch.device, dtype: torch.dtype,
                        warmup: int = 2, repeats: int = 5, progress: object = None) -> list[CommPoint]:
    """Time all_to_all_single for every aligned power-of-two group size, the world's all-reduce,
    reduce-scatter, all-gather and broadcast, and the send/recv exchange of neighbours inside a
    node and across two (where the world has such pairs), at every message size.

    Every rank of the (initialized) default process group must call this with the same
    arguments: every rank creates every group, in the same order, as torch requires."""
    world, rank = dist.get_world_size(), dist.get_rank()
    elem = torch.empty((), dtype=dtype).element_size()
    sizes = [1 << i for i in range(1, world.bit_length()) if (1 << i) <= world]
    world_ops = [op for op in COLLECTIVES if op != "all_to_all"]
    points: list[CommPoint] = []
    g = gpus_per_node_from_env(device, world)
    pairs = [(across, mate) for across in (False, True) if (mate := _partner(rank, world, g, across)) != _NO_PAIRS]
    total = (len(sizes) + len(world_ops) + len(pairs)) * len(message_bytes)
    task = progress.add_task("collectives", total=total) if progress else None

    def record(op: str, p: int, nbytes: int, call: Callable[[], object], across: bool = False) -> None:
        points.append(CommPoint(op, p, nbytes, _slowest(_timed(call, device, warmup, repeats), device), across))
        if progress is not None:
            progress.advance(task)  # type: ignore[attr-defined]

    for p in sizes:
        groups = [dist.new_group(ranks) for ranks in aligned_blocks(world, p)]
        mine = groups[rank // p] if rank < len(groups) * p else None
        for m in message_bytes:
            n = max(p, (m // elem) // p * p)  # whole elements, divisible among p ranks
            x = torch.ones(n, dtype=dtype, device=device)
            record("all_to_all", p, n * elem, functools.partial(_all_to_all, torch.empty_like(x), x, mine))
    for op in world_ops:
        for m in message_bytes:
            call, nbytes = _world_call(op, m, device, dtype)
            record(op, world, nbytes, call)
    for across, mate in pairs:
        for m in message_bytes:
            x = torch.ones(max(1, m // elem), dtype=dtype, device=device)
            record("send_recv", 2, x.numel() * elem, functools.partial(_exchange, x, torch.empty_like(x), mate), across)
    return points


_NO_PAIRS = -2
"""`_partner`'s answer when no two ranks of the world form such a pair (every rank gets it)."""


def _partner(rank: int, world: int, gpus_per_node: int, across_nodes: bool) -> int | None:
    """The rank this one exchanges with in the send_recv benchmark (ring attention's neighbour
    transfer): its neighbour in the node (rank ^ 1), or its peer in the next node (rank +- G); None
    for a rank without one (it only waits); _NO_PAIRS when the world has no such pair at all."""
    if not across_nodes:
        if gpus_per_node < 2:
            return _NO_PAIRS
        mate = rank ^ 1
        return mate if mate < world and mate // gpus_per_node == rank // gpus_per_node else None
    if world < 2 * gpus_per_node or gpus_per_node >= world:
        return _NO_PAIRS
    node = rank // gpus_per_node
    mate = rank + gpus_per_node if node % 2 == 0 else rank - gpus_per_node
    return mate if mate < world else None


def _exchange(send: torch.Tensor, recv: torch.Tensor, partner: int | None) -> None:
    """Send `send` to the partner while receiving its block (both directions at once)."""
    if partner is None:
        return
    ops = [dist.P2POp(dist.isend, send, partner), dist.P2POp(dist.irecv, recv, partner)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()


def curves_from_points(points: Sequence[CommPoint], gpus_per_node: int, source: str) -> list[CollectiveCurve]:
    """One curve per (collective, group size), keyed by the group's shape in nodes of
    `gpus_per_node`; a size measured twice keeps its faster point (sizes must increase)."""
    curves = []
    for op, p, across in sorted({(pt.op, pt.group_size, pt.across_nodes) for pt in points}):
        best: dict[int, float] = {}
        for pt in points:
            if (pt.op, pt.group_size, pt.across_nodes) == (op, p, across):
                best[pt.message_bytes] = max(best.get(pt.message_bytes, 0.0), pt.bus_bw_bytes_per_s)
        if op == "send_recv":  # two ranks, in one node or in two
            (g, nodes), what = ((1, 2), "between two nodes") if across else ((2, 1), "inside a node")
        else:
            (g, nodes), what = group_shape(p, gpus_per_node), f"among {p} ranks"
        curves.append(CollectiveCurve(op=op, gpus_per_node=g, nodes=nodes, points=tuple(sorted(best.items())),
                                      source=f"{source}: {op} {what}, {min(best)}..{max(best)} bytes"))
    return curves


def init_from_torchrun(device: str) -> bool:
    """Join the job torchrun started (WORLD_SIZE > 1): NCCL on GPUs, gloo on CPUs. False when
    not launched distributed, or already initialized by the caller."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return dist.is_initialized()
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    return True
