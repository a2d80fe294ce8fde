"""Collectives priced from bus-bandwidth-versus-message-size curves, in nccl-tests' conventions.

nccl-tests (NVIDIA/nccl-tests, doc/PERFORMANCE.md) reports, per collective and message size, the
algorithm bandwidth algbw = size / time and the bus bandwidth busbw = algbw x factor(n), the
factor making one rate comparable across rank counts n:

    all_reduce      2 (n-1)/n   size: the buffer each rank reduces (ring: reduce-scatter + all-gather)
    reduce_scatter  (n-1)/n     size: the whole input, n shards
    all_gather      (n-1)/n     size: the whole output, n shards
    all_to_all      (n-1)/n     size: each rank's send buffer; 1/n of it stays on the rank
    broadcast       1           size: the buffer
    send_recv       1           size: what each rank sends (and receives) in the exchange

so time(size, n) = size x factor(n) / busbw(size). A `CollectiveCurve` holds the busbw of one
collective against message size for one shape of group: `gpus_per_node` GPUs in each of `nodes`
nodes (NVLink inside a node, the network across; the two differ tenfold). It is either a list of
(size, busbw) points, published (nccl-tests runs) or measured (`dcp profile` under torchrun),
interpolated in log size, or a latency and a bus bandwidth (alpha-beta) where only those two
are known. Points also give an alpha-beta fit, `alpha_beta()`: time = latency + size x factor /
busbw, which is linear in size and so keeps the planner's micro-batch model linear in tokens
(the Ulysses all-to-alls move bytes proportional to a micro-batch's tokens).

Never imports torch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from dcp.costmodel.spec import CostModelError, _from_dict

CollectiveOp = Literal["all_to_all", "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send_recv"]
COLLECTIVES: tuple[str, ...] = ("all_to_all", "all_reduce", "reduce_scatter", "all_gather", "broadcast")
"""The collectives every profile carries a curve of."""
POINT_TO_POINT: tuple[str, ...] = ("send_recv",)
"""Curves a profile may carry besides: ring attention's neighbour exchange (each rank sends a block
to the next while receiving one from the previous), nccl-tests' sendrecv_perf (bus factor 1)."""
KNOWN_OPS: tuple[str, ...] = COLLECTIVES + POINT_TO_POINT


def bus_factor(op: str, ranks: int) -> float:
    """busbw / algbw of `op` on `ranks` ranks (nccl-tests doc/PERFORMANCE.md); 0 for one rank."""
    if op not in KNOWN_OPS:
        raise CostModelError(f"unknown collective {op!r}; expected one of {KNOWN_OPS}")
    if ranks <= 1:
        return 0.0
    if op == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if op in ("broadcast", "send_recv"):
        return 1.0
    return (ranks - 1) / ranks


def group_shape(ranks: int, gpus_per_node: int) -> tuple[int, int]:
    """(GPUs per node, nodes) of an aligned block of `ranks` ranks in nodes of `gpus_per_node`."""
    if ranks <= gpus_per_node:
        return ranks, 1
    return gpus_per_node, math.ceil(ranks / gpus_per_node)


@dataclass(frozen=True, kw_only=True)
class CollectiveCurve:
    """Bus bandwidth of one collective against message size, on one shape of group."""

    op: str
    """all_to_all, all_reduce, reduce_scatter, all_gather, broadcast or send_recv."""
    gpus_per_node: int
    """GPUs of the group in each node."""
    nodes: int = 1
    """Nodes the group spans."""
    points: tuple[tuple[float, float], ...] = ()
    """(message bytes, bus bandwidth bytes/s), sizes increasing; empty for an alpha-beta curve."""
    latency_s: float | None = None
    """Alpha-beta curve only: the small-message time."""
    bus_bw_bytes_per_s: float | None = None
    """Alpha-beta curve only: the large-message bus bandwidth."""
    source: str = ""
    """Where the numbers come from (a measurement, a published run, or an estimate said to be one)."""

    def __post_init__(self) -> None:
        where = f"{self.op} curve ({self.gpus_per_node} GPUs x {self.nodes} nodes)"
        if self.op not in KNOWN_OPS:
            raise CostModelError(f"unknown collective {self.op!r}; expected one of {KNOWN_OPS}")
        if self.gpus_per_node < 1 or self.nodes < 1 or self.ranks < 2:
            raise CostModelError(f"{where}: GPUs per node and nodes must be positive, at least 2 ranks in all")
        points = tuple((float(m), float(b)) for m, b in self.points)
        object.__setattr__(self, "points", points)
        alpha_beta = self.latency_s is not None or self.bus_bw_bytes_per_s is not None
        if bool(points) == alpha_beta:
            raise CostModelError(f"{where}: give either points or latency_s and bus_bw_bytes_per_s, not both")
        if alpha_beta:
            if self.latency_s is None or self.bus_bw_bytes_per_s is None:
                raise CostModelError(f"{where}: an alpha-beta curve needs both latency_s and bus_bw_bytes_per_s")
            if self.latency_s < 0 or not self.bus_bw_bytes_per_s > 0:
                raise CostModelError(f"{where}: latency must be >= 0 and bandwidth positive")
        elif any(not (m > 0 and b > 0) for m, b in points) or any(
                a[0] >= b[0] for a, b in zip(points, points[1:], strict=False)):
            raise CostModelError(f"{where}: points must have positive sizes and bandwidths, sizes increasing")

    @property
    def ranks(self) -> int:
        return self.gpus_per_node * self.nodes

    def bus_bw(self, message_bytes: float) -> float:
        """Bus bandwidth at `message_bytes`: log-size interpolation between points, the last
        point's beyond them; an alpha-beta curve's size / (time - ...) in busbw terms."""
        if not self.points:
            return message_bytes * bus_factor(self.op, self.ranks) / self.time_s(message_bytes)
        sizes = [m for m, _ in self.points]
        if message_bytes >= sizes[-1]:
            return self.points[-1][1]
        if message_bytes <= sizes[0]:
            # Below the smallest point the time stays at that point's (the latency floor).
            return self.points[0][1] * message_bytes / sizes[0]
        i = next(j for j in range(1, len(sizes)) if message_bytes < sizes[j])
        (m0, b0), (m1, b1) = self.points[i - 1], self.points[i]
        w = math.log(message_bytes / m0) / math.log(m1 / m0)
        return b0 + w * (b1 - b0)

    def time_s(self, message_bytes: float, ranks: int | None = None) -> float:
        """Seconds of one call on `message_bytes` among `ranks` ranks (default: the curve's own)."""
        n = self.ranks if ranks is None else ranks
        if n <= 1 or message_bytes <= 0:
            return 0.0
        f = bus_factor(self.op, n)
        if not self.points:
            assert self.latency_s is not None and self.bus_bw_bytes_per_s is not None
            return self.latency_s + message_bytes * f / self.bus_bw_bytes_per_s
        return message_bytes * f / self.bus_bw(message_bytes)

    @functools.cached_property
    def _fit(self) -> tuple[float, float]:
        if not self.points:
            assert self.latency_s is not None and self.bus_bw_bytes_per_s is not None
            return self.latency_s, self.bus_bw_bytes_per_s
        f = bus_factor(self.op, self.ranks)
        rows = [(m * f, m * f / b) for m, b in self.points]  # (bus bytes, seconds)
        return fit_alpha_beta(rows)

    def alpha_beta(self) -> tuple[float, float]:
        """(latency_s, bus_bw_bytes_per_s) of time = latency + size x factor / busbw, least squares
        in relative error over the points (the stored pair of an alpha-beta curve)."""
        return self._fit

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["points"] = [list(p) for p in self.points]
        return {k: v for k, v in d.items() if v is not None and v != []}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CollectiveCurve:
        return _from_dict(cls, d, "collective curve")


def fit_alpha_beta(rows: list[tuple[float, float]]) -> tuple[float, float]:
    """(alpha, beta) of seconds = alpha + bus_bytes / beta over (bus_bytes, seconds) rows, minimizing
    relative error, alpha >= 0 (pure Python: two unknowns need no solver)."""
    w = [1.0 / t for _, t in rows]
    sxx = sum((wi * x) ** 2 for wi, (x, _) in zip(w, rows, strict=True))
    sx1 = sum(wi * wi * x for wi, (x, _) in zip(w, rows, strict=True))
    s11 = sum(wi * wi for wi in w)
    sxy = sum(wi * wi * x * t for wi, (x, t) in zip(w, rows, strict=True))
    s1y = sum(wi * wi * t for wi, (_, t) in zip(w, rows, strict=True))
    det = s11 * sxx - sx1 * sx1
    if det > 0:
        alpha = (sxx * s1y - sx1 * sxy) / det
        slope = (s11 * sxy - sx1 * s1y) / det
        if alpha >= 0 and slope > 0:
            return alpha, 1.0 / slope
    # Latency-free (or a single point): the slope alone through the origin.
    slope = sxy / sxx
    return 0.0, 1.0 / slope


def nearest_curve(curves: tuple[CollectiveCurve, ...], op: str, gpus_per_node: int, nodes: int
                  ) -> CollectiveCurve | None:
    """The curve of `op` for this shape, else the nearest one: the same side of the node boundary
    first (one node or several), then the closest GPUs per node, then the closest node count at or
    below (a curve measured on more nodes than the group spans is the pessimistic choice only for
    all-to-alls), else above. None if the profile has no curve of `op`."""
    mine = [c for c in curves if c.op == op]
    if not mine:
        return None

    def distance(c: CollectiveCurve) -> tuple[int, float, int, int]:
        across = (c.nodes > 1) != (nodes > 1)
        above = int(c.nodes > nodes)
        return (int(across), abs(math.log2(c.gpus_per_node / gpus_per_node)), above, abs(c.nodes - nodes))

    return min(mine, key=distance)
