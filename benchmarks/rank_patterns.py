"""Offline, not in the solve path (benchmarks and tests only): a tighter bound on every plan's busy
time where GPUs run few samples, the rank-pattern program (`benchmarks/planner.py --pattern-bound`).

`bounds.multi_phase_busy` pools the batch's GPU-seconds: a plan of busy time M has N * M of
them. That lets every rank fill its M to the last microsecond. At two videos a GPU it cannot:
a rank that runs a sixteenth of a 432,000-token video at SP 16 (0.74 s) has 0.09 s left, and the
batch holds only so many short videos to fill it with. This bound counts ranks instead.

Every rank runs its micro-batches one after another within M, so the micro-batches it takes
part in form a pattern: a multiset of slices, one per micro-batch, of total time at most M. A
micro-batch B at SP size p has p slices (one per rank of its group, in any phase of any plan),
each covering 1/p of B's samples. With y_C ranks on pattern C, every plan of busy time M gives

    sum_C y_C <= N   and   sum_C y_C * cover_C[s] >= n_s   for every class s of samples,

cover_C[s] summing k_s / p over C's slices (k_s samples of class s in a micro-batch of p GPUs).
If the linear program min sum_C y_C over those rows needs more than N ranks, no plan runs within
M. For any prices pi >= 0 of the rows, every pattern covers at most V(pi) of sum_s pi_s
cover_C[s], so sum_C y_C >= pi . n / V(pi) (Farley's bound): any pi, and any upper bound on
V(pi), proves every M where it exceeds N. Column generation (`_proven`, its master the
planner's `colgen.Master`) finds good prices.

V(pi) is a knapsack of slices into M, each slice one of a micro-batch's knapsack of samples:
 - a slice at level (p, r) (SP size, checkpointed layers) takes at least the micro-batch's linear
   time (`CostModel.linear_time`, a lower bound on every layout's exact time), fixed(p, r) +
   sum_s k_s c_s(p, r), with every sample fitting memory alone (tokens <= max_tokens(p, r));
   the micro-batch's own memory, T <= max_tokens(p, r), is relaxed to a time of at least
   sum_s k_s (c_s + fixed * t_s / max_tokens) (T / max_tokens <= 1), and the smaller of the two
   knapsacks' values taken; a micro-batch holds at most as many samples of a class as the batch;
 - every time is rounded down to a grid (`FINE` steps a unit, `UNITS` units in M), which packs
   at least as much (a sum of floors is at most the floor of the sum); the rank knapsack counts
   a slice as one unit at least, which holds where every micro-batch's fixed time is a unit or
   more, so busy times past `UNITS` of the least fixed time are not searched (llama-7b: 29 s,
   STDiT: 8 s; lognormal's 128K-token samples on 256 GPUs, 18.8 s, are within it);
 - levels above a size's first (the fewest layers its samples fit at) add only costs where
   `bounds.SizeLevels.candidates` says a larger r never lowers a sample's charged price; where it
   does not, every r is priced;
 - samples are rounded down to classes (`bounds.round_down`): a smaller sample never costs more.

It holds for every plan the executor can run, single-layout or multi-phase: nothing above asks
which group a rank is in between micro-batches. Open-Sora, 512 videos on 256 GPUs: 0.7-1.0%
above `multi_phase_busy` on the benchmark's batches, in 2.3-3.6 s (so it is a measurement, not part
of a 1 s solve: `benchmarks/planner.py --pattern-bound` reports the gap to it). Never imports
torch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dcp.costmodel import CostModel
from dcp.planner.bounds import (
    distinct_samples,
    multi_phase_bound,
    multi_phase_busy,
    sample_arrays,
    step_floor,
)
from dcp.planner.bounds.work import round_down, size_levels
from dcp.planner.colgen import Master, knapsack
from dcp.planner.feasibility import allowed_sp_sizes
from dcp.planner.ilp.budget import Deadline
from dcp.planner.sample import Sample

UNITS = 1000
"""Units of M in the rank knapsack (rounding loses under one unit a slice)..."""
FINE = 8
"""...and steps of a unit in each micro-batch's knapsack."""
CLASSES = 64
"""Classes of samples at most (the rest rounded down into them)."""
SPAN = 0.05
"""The busy times searched: from `multi_phase_busy` to this share above it..."""
STEP = 0.0025
"""...upward in steps of this share of the last proven, halved below a busy time not proven...
"""
RESOLUTION = 0.0005
"""...until the interval left is this share of it."""
STRETCH = 5
"""Bisections of the busy times the proving prices also prove."""
ITERATIONS = 80
"""Columns generated at one busy time at most before it counts as not proven."""
SMOOTHING = 0.5
"""Prices are priced as this share of the best Farley prices so far plus the rest of the
master's (Wentges' smoothing: fewer columns before the bound settles)."""


@dataclass(frozen=True)
class _Level:
    """One (SP size, checkpointed layers): its fixed time, each class's time c_s, which classes fit
    memory alone, the memory-relaxed time (c_s + fixed * t_s / max_tokens) and max_tokens."""

    p: int
    fixed: float
    cost: np.ndarray
    fits: np.ndarray
    spread: np.ndarray
    cap: float
    ordered: bool
    """Whether every coefficient of its size grows with r and a larger r never lowers a sample's
    memory-charged price (`SizeLevels.candidates` all single): then a level whose classes that
    run within M all run at a lower level of its size packs nothing that one does not."""
    rate: float
    """The most tokens a second of its classes' time holds (their t_s / c_s): within M - fixed it
    holds at most rate * (M - fixed) tokens, so where that fits memory the relaxed knapsack
    never binds."""


def _levels(cm: CostModel, sizes: Sequence[int], tokens: np.ndarray, pairs: np.ndarray) -> list[_Level]:
    """Per size, the levels the classes first fit memory at (every level from the first where
    a larger r can lower a charged price)."""
    out = []
    k = cm.model.num_layers
    for p in sizes:
        lv = size_levels(cm, p)
        first = np.searchsorted(lv.memory_cap, tokens, side="left")  # K + 1: fits nowhere at p
        starts = sorted({int(r) for r in first if r <= k})
        if not starts:
            continue
        singles = all(c == [r] for r, c in enumerate(lv.candidates))  # they also say the coefficients grow
        for r in starts if singles else range(starts[0], k + 1):
            cost = lv.per_token[r] * tokens + lv.per_pair[r] * pairs
            cap = lv.memory_cap[r]
            fits = tokens <= cap
            rate = float(np.max(tokens[fits] / cost[fits])) if fits.any() and (cost[fits] > 0).all() else math.inf
            out.append(_Level(p, float(lv.fixed[r]), cost, fits,
                              cost + (lv.fixed[r] * tokens / cap if cap > 0 else math.inf), float(cap), singles, rate))
    return out


class _OutOfTime(Exception):
    """The search's deadline passed inside a pricing."""


class _Pricing:
    """The best pattern's value at one busy time M for prices pi, an upper bound on every
    pattern's (see the module's docstring), and the pattern itself (to add as a column)."""

    def __init__(self, levels: list[_Level], counts: np.ndarray, busy_s: float, deadline: float) -> None:
        self.fine, self.capacity, self.counts, self.deadline = busy_s / (UNITS * FINE), UNITS * FINE, counts, deadline
        runs = [lv.fits & (lv.fixed + lv.cost <= busy_s) for lv in levels]
        self.levels = [lv for i, lv in enumerate(levels) if runs[i].any() and not (lv.ordered and any(
            levels[j].p == lv.p and not (runs[i] & ~runs[j]).any() for j in range(i)))]

    def _slices(self, level: _Level, pi: np.ndarray) -> tuple[np.ndarray, Callable[[int], np.ndarray], int] | None:
        """The level's best micro-batch value within each fine capacity (the lesser of the two
        knapsacks, `colgen.knapsack` on times rounded down), the timed knapsack's counts within
        a capacity (less the fixed time), and the fixed time in fine steps."""
        fixed = int(math.floor(level.fixed / self.fine))
        if fixed > self.capacity:
            return None
        values = pi / level.p
        room = self.capacity - fixed
        timed, taken = knapsack(values, level.cost, room * self.fine, self.counts, level.fits, False, room)
        timed = np.concatenate([np.full(fixed, -math.inf), timed])
        if level.rate * (self.capacity * self.fine - level.fixed) <= level.cap:
            return timed, taken, fixed
        relaxed, _ = knapsack(values, level.spread, self.capacity * self.fine, self.counts, level.fits, False,
                              self.capacity)
        return np.minimum(timed, relaxed), taken, fixed

    def __call__(self, pi: np.ndarray, column: bool = True) -> tuple[float, np.ndarray | None, float]:
        """(V(pi), the pattern's cover per class, the pattern's linear time); `_OutOfTime` when
        the deadline passes between two levels' knapsacks (all of them take up to a second at 57
        levels) or two slices read back."""
        ends = np.minimum(np.arange(1, UNITS + 2) * FINE - 1, self.capacity)  # a slice of u units ends before u + 1
        best, which = np.zeros(UNITS + 1), np.full(UNITS + 1, -1)
        for i, level in enumerate(self.levels):
            if time.perf_counter() > self.deadline:
                raise _OutOfTime
            out = self._slices(level, pi)
            if out is None:
                continue
            by_unit = out[0][ends]
            better = by_unit > best
            best, which = np.where(better, by_unit, best), np.where(better, i, which)
        ranks, last = np.zeros(UNITS + 1), np.zeros(UNITS + 1, dtype=np.int64)
        for x in range(1, UNITS + 1):  # the rank knapsack of slices (a slice is at least 1 unit)
            took = ranks[x - np.arange(1, x + 1)] + best[1:x + 1]
            j = int(np.argmax(took))
            if took[j] > ranks[x - 1]:
                ranks[x], last[x] = took[j], j + 1
            else:
                ranks[x] = ranks[x - 1]
        if not column:
            return float(ranks[UNITS]), None, 0.0
        cover, seconds, x = np.zeros(len(pi)), 0.0, UNITS
        while x > 0:
            u = int(last[x])
            if u == 0:
                x -= 1
                continue
            if time.perf_counter() > self.deadline:
                raise _OutOfTime
            level = self.levels[int(which[u])]
            _, taken, fixed = self._slices(level, pi)
            counts = taken(int(ends[u]) - fixed)
            cover += counts / level.p
            seconds += level.fixed + float(counts @ level.cost)
            x -= u
        return float(ranks[UNITS]), cover, seconds


@dataclass
class _Column:
    """A pattern of the program: its cover per class and its slices' linear time (the busy
    times it fits)."""

    cover: np.ndarray
    seconds: float


def _single_class_columns(levels: list[_Level], tokens: np.ndarray, busy_s: float) -> list[_Column]:
    """Per class, the rank that covers most of it alone: at the level where it does, micro-batches
    of as many of its samples as fit memory and the busy time, as many as fit the busy time."""
    out = []
    for s in range(len(tokens)):
        best = _Column(np.zeros(len(tokens)), 0.0)
        for level in levels:
            if not level.fits[s] or level.fixed + level.cost[s] > busy_s:
                continue
            k = min(math.floor((busy_s - level.fixed) / level.cost[s]), math.floor(level.cap / tokens[s]))
            seconds = level.fixed + k * level.cost[s]
            slices = math.floor(busy_s / seconds)
            if slices * k / level.p > best.cover[s]:
                best = _Column(np.eye(len(tokens))[s] * slices * k / level.p, slices * seconds)
        out.append(best)
    return out


def _proven(pricing: _Pricing, counts: np.ndarray, gpus: int, columns: list[_Column],
            deadline: float) -> tuple[bool | None, np.ndarray | None]:
    """Whether the program at this busy time needs more than `gpus` ranks (True: proven by
    Farley's bound, with the prices that prove it; False: its master fits them; None: undecided
    within the deadline or `ITERATIONS`), adding the columns it generates to `columns`."""
    center, best = None, 0.0
    master = Master(counts, [1])  # the planner's column master (`colgen`): one rank a pattern
    for c in columns:
        master.add(0, c.cover)
    for _ in range(ITERATIONS):
        if time.perf_counter() > deadline:
            break
        solved = master.solve(Deadline(deadline))
        if solved is None:
            break
        ranks, pi = solved
        if ranks <= gpus * (1 - 1e-9):
            return False, None
        trial = pi if center is None else SMOOTHING * center + (1 - SMOOTHING) * pi
        try:
            value, cover_c, seconds = pricing(trial)
        except _OutOfTime:
            break
        farley = float(counts @ trial) / value if value > 0 else math.inf
        if farley > gpus * (1 + 1e-9):
            return True, trial
        if farley > best:
            center, best = trial, farley
        if float(cover_c @ pi) <= 1 + 1e-9:  # no column prices above 1 at the master's prices
            if trial is pi:
                return False, None
            center = None  # misprice: the next round prices the master's prices alone
            continue
        columns.append(_Column(cover_c, seconds))
        master.add(0, cover_c)
    return None, None


def _stretch(levels: list[_Level], counts: np.ndarray, gpus: int, prices: np.ndarray, low: float,
             high: float, deadline: float) -> float:
    """The largest busy time in [low, high] that `prices` prove (proven at `low`), by bisection:
    every pattern within M fits every larger M, so Farley's bound only falls as M grows."""
    for _ in range(STRETCH):
        if time.perf_counter() > deadline:
            break
        busy = (low + high) / 2
        try:
            value, _, _ = _Pricing(levels, counts, busy, deadline)(prices, column=False)
        except _OutOfTime:
            break
        if value > 0 and float(counts @ prices) / value > gpus * (1 + 1e-9):
            low = busy
        else:
            high = busy
    return low


def rank_pattern_busy(batch: Sequence[Sample], cm: CostModel, sp_sizes: Sequence[int] | None = None,
                      time_limit_s: float = 5.0) -> float:
    """The largest busy time this program proves below every plan's, at least
    `bounds.multi_phase_busy`, searched upward from it (every column of a busy time fits every
    larger one): a step of `STEP` above the last proven, which the prices that prove it then
    stretch (`_stretch`); where a busy time is not proven, the steps halve below it, down to
    `RESOLUTION`, or until `time_limit_s` (any busy time proven stays proven). Where the first
    step is not proven the search ends there (lognormal's 512 samples on 256 GPUs: 2.4 s a
    step, none proven in 10 s)."""
    if not len(batch):
        raise ValueError("rank_pattern_busy: the batch is empty, there is nothing to bound")
    deadline = time.perf_counter() + time_limit_s
    sizes = allowed_sp_sizes(cm, sp_sizes)
    tokens, pairs = sample_arrays(batch)
    lower = multi_phase_busy(batch, cm, sizes, (tokens, pairs))
    d_tokens, d_pairs, counts = distinct_samples(tokens, pairs)
    if len(d_tokens) > CLASSES:
        d_tokens, d_pairs, counts = round_down(d_tokens, d_pairs, counts, CLASSES)
    levels = _levels(cm, sizes, d_tokens, d_pairs)
    if not levels or not math.isfinite(lower) or lower <= 0:
        return lower
    if min(lv.fixed for lv in levels) < lower * (1 + SPAN) / UNITS:
        return lower  # a slice could be shorter than a unit, which the rank knapsack charges one
    gpus = cm.cluster.num_gpus
    columns = _single_class_columns(levels, d_tokens, lower)  # within every busy time searched: the master starts feasible
    low, high, step = lower, lower * (1 + SPAN), STEP
    while high - low > RESOLUTION * low and time.perf_counter() < deadline:
        busy = min(low * (1 + step), (low + high) / 2)
        kept = [c for c in columns if c.seconds <= busy]
        rest = [c for c in columns if busy < c.seconds <= high]
        proven, prices = _proven(_Pricing(levels, counts, busy, deadline), counts, gpus, kept, deadline)
        columns = kept + rest
        if proven:
            low = _stretch(levels, counts, gpus, prices, busy, high, deadline)
        elif proven is None or low == lower:  # not even the first step: what is left is not worth its time
            break
        else:
            high, step = busy, step / 2
    return low


def rank_pattern_bound(batch: Sequence[Sample], cm: CostModel, sp_sizes: Sequence[int] | None = None,
                       time_limit_s: float = 5.0) -> float:
    """The least step of any plan whose busy time is at least `rank_pattern_busy`
    (`bounds.step_floor`), never below `bounds.multi_phase_bound`."""
    busy = rank_pattern_busy(batch, cm, sp_sizes, time_limit_s)
    return max(step_floor(batch, cm, busy, sp_sizes), multi_phase_bound(batch, cm, sp_sizes))
