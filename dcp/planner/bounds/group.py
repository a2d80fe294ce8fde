"""A lower bound that charges the longest sample's group, whose idle time the pooled work bound
(`work`) lets it spend at a single GPU's price. Within a makespan M that group, of size p, has at
most p (M - lin_p(i)) GPU-seconds for the others, each at least its marginal cost at p; the other
N - p GPUs offer (N - p) M, each sample at its cheapest. M is below every plan's busy time when
no size admits such a split (a fractional knapsack); bisection finds the bound. It matters where
one sample needs a large group (docs/tuning-log.md; proofs: docs/design.md)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice

import numpy as np

import dcp.planner.knobs as knobs
from dcp.costmodel import CostModel
from dcp.planner.levels import climb, geometric, narrow
from dcp.planner.pricing import exact_times

_RTOL = 1e-4
_FEAS_RTOL = 1e-9
"""Rounding room in the knapsack's comparison (a plan that fits exactly must fit here too)."""


class _GroupOf:
    """The longest sample's costs per size and every sample's marginal GPU-seconds there, in two
    lower-bound forms: linear, and linear plus a ring's transfers as if never hidden."""

    def __init__(self, cm: CostModel, sizes: Sequence[int], tokens: np.ndarray, pairs: np.ndarray,
                 longest: int, memory_cap: dict[int, np.ndarray], coef: dict[int, tuple[np.ndarray, ...]]) -> None:
        k = cm.model.num_layers
        self.sizes: list[int] = []
        self.solo: list[float] = []
        self.forms: list[list[tuple[float, np.ndarray]]] = []
        """Per size: (the longest sample's time, every sample's marginal GPU-seconds) per form."""
        self.top: list[float] = []
        t0, a0 = tokens[longest], pairs[longest]
        for p in sizes:
            r0 = int(np.searchsorted(memory_cap[p], t0, side="left"))
            if r0 > k:
                continue  # the longest sample does not fit at p
            r = np.searchsorted(memory_cap[p], tokens, side="left")
            fixed, per_token, per_pair = coef[p]
            forms = [_form(fixed, per_token, per_pair, 0.0, 0.0, 0.0, r0, r, t0, a0, tokens, pairs, p, k)]
            ringed = [o for o in cm.layouts(p) if o.ring > 1]
            if ringed:
                per_layout = []
                for o in cm.layouts(p):
                    lin = [cm.layout_linear_time(o, level) for level in range(k + 1)]
                    e0, e_tok, e_pair = _exposure(cm.ring_terms(o), k) if o.ring > 1 else (0.0, 0.0, 0.0)
                    per_layout.append(_form(np.array([c.fixed for c in lin]), np.array([c.per_token for c in lin]),
                                            np.array([c.per_pair for c in lin]), e0, e_tok, e_pair,
                                            r0, r, t0, a0, tokens, pairs, p, k))
                # Each micro-batch in its fastest layout: the least of each term is a lower bound.
                forms.append((min(f[0] for f in per_layout), np.minimum.reduce([f[1] for f in per_layout])))
            self.sizes.append(p)
            self.solo.append(float(exact_times(cm, p, np.array([t0]), np.array([a0]), np.array([r0]))[0]))
            self.forms.append(forms)
            # What its micro-batch runs outside the backward of layers K-2..0 (K forwards, the
            # head, the top layer's backward), at the least over the layouts: `group_bound`'s `chain`.
            self.top.append(min(k * lt.forward_s + cm.head_s(t0, p) + lt.backward_s
                                for lt in (cm.layer_times(t0, a0, p, o) for o in cm.layouts(p))))


def _exposure(ring: object, k: int) -> tuple[float, float, float]:
    """(intercept, per token, per pair) of K (c - 1) ((y_f - x_f) + (y_b - x_b)): at most what
    the exact time adds to the linear form."""
    scale = k * (ring.steps - 1)
    return (scale * 2 * ring.step_latency_s,
            scale * (ring.fwd_transfer_token_s - ring.fwd_step_token_s + ring.bwd_transfer_token_s
                     - ring.bwd_step_token_s),
            -scale * (ring.fwd_step_pair_s + ring.bwd_step_pair_s))


def _form(fixed: np.ndarray, per_token: np.ndarray, per_pair: np.ndarray, e0: float, e_tok: float, e_pair: float,
          r0: int, r: np.ndarray, t0: float, a0: float, tokens: np.ndarray, pairs: np.ndarray, p: int,
          k: int) -> tuple[float, np.ndarray]:
    """The longest sample's least time at its levels (r0..K) and every sample's least marginal
    GPU-seconds where it fits (inf where none), under one linear form plus the exposure terms."""
    alone = float((fixed[r0:] + per_token[r0:] * t0 + per_pair[r0:] * a0).min()) + e0 + e_tok * t0 + e_pair * a0
    marg = np.full(len(tokens), math.inf)
    for level in range(k + 1):
        cost = per_token[level] * tokens + per_pair[level] * pairs
        marg = np.where(r <= level, np.minimum(marg, cost), marg)
    return alone, p * (marg + e_tok * tokens + e_pair * pairs)


def _saved(cost: np.ndarray, marg: np.ndarray, rest: np.ndarray, room: float) -> float:
    """The most cheapest-cost GPU-seconds that samples worth `marg` each in the group can take
    off the others within `room` (a fractional knapsack; samples at marg <= 0 come free)."""
    use = (rest > 0) & np.isfinite(marg) & np.isfinite(cost)
    free = use & (marg <= 0)
    saved = float(np.dot(cost[free], rest[free]))
    room -= float(np.dot(marg[free], rest[free]))
    take = use & ~free
    if room <= 0 or not take.any():
        return saved
    c, mg, w = cost[take], marg[take], rest[take]
    order = np.argsort(-(c / mg), kind="stable")
    c, mg, w = c[order], mg[order], w[order]
    used = np.cumsum(mg * w)
    full = int(np.searchsorted(used, room, side="right"))  # samples that fit whole
    saved += float(np.dot(c[:full], w[:full]))
    if full < len(c):
        left = room - (float(used[full - 1]) if full else 0.0)
        saved += c[full] * left / mg[full]
    return saved


def _room_or_saved(cost: np.ndarray, marg: np.ndarray, rest: np.ndarray, room: float) -> float:
    """What the group's ranks take off the others in `room` GPU-seconds when they may also run
    micro-batches of their own: a GPU-second per GPU-second, plus the knapsack of the gains of
    samples that join the longest sample's micro-batch for less than their cost (no fixed part)."""
    gain = np.where(np.isfinite(marg) & np.isfinite(cost), cost - marg, 0.0)
    return room + _saved(np.maximum(gain, 0.0), np.where(gain > 0, marg, np.inf), rest, room)


@dataclass(frozen=True)
class _Own:
    """What the group's ranks take off the others in micro-batches of their own, with `own_s`
    seconds for them in a plan of busy time M: at most `rate` = 1 + a + F / (M - own_s) cost per
    second past the least fixed part F (`floor`), or None where the argument's conditions fail
    (the plain count then; proof: docs/design.md, Why each bound holds)."""

    share: float
    """a: the most any level's fixed cost is of its full micro-batch's token time."""
    fixed_max: float
    full_s: float
    """The least token time of a full micro-batch (per_token cap) over the levels."""
    floor: float
    """F, the least fixed part of any micro-batch."""

    @classmethod
    def of(cls, work: object, floor: float) -> _Own:
        levels = [(f, t * c) for p, (fixed, per_token, _) in work.coefs.items()
                  for f, t, c in zip(fixed.tolist(), per_token.tolist(), work.memory_caps[p].tolist(), strict=True)
                  if c > 0 and t > 0]
        if not levels:
            return cls(math.inf, math.inf, 0.0, floor)
        return cls(max(f / full for f, full in levels), max(f for f, _ in levels), min(full for _, full in levels),
                   floor)

    def rate(self, m: float, own_s: float) -> float | None:
        """Cost taken per second past the floor with `own_s` seconds in a plan of busy time `m`
        (0 where no micro-batch fits), or None where the plain count must be used."""
        spare = own_s - self.floor
        if spare <= 0:
            return 0.0
        if own_s >= m - own_s or spare > (m - self.fixed_max) / 2 or spare > self.full_s / 2:
            return None
        rate = 1.0 + self.share + self.floor / (m - own_s)
        return rate if rate * spare <= own_s else None

    def capped(self, plain: float, cost: np.ndarray, marg: np.ndarray, rest: np.ndarray, p: int, m: float,
               joins_s: float, own_s: float) -> float:
        """`plain` (the plain count of what the group's p ranks take) capped where `rate` holds,
        with joins within `joins_s` and own micro-batches within `own_s` seconds per rank:
        max(KS(p (joins_s - F)) + p rate (own_s - F), KS(p joins_s)), KS the knapsack `_saved`."""
        rate = self.rate(m, own_s)
        if rate is None:
            return plain
        return min(plain, max(_saved(cost, marg, rest, p * max(joins_s - self.floor, 0.0))
                              + p * rate * (own_s - self.floor), _saved(cost, marg, rest, p * joins_s)))


def group_bound(work: object, cm: CostModel, sizes: Sequence[int], lo: float,
                fixed_floor_s: float | None = None, group: LongestGroup | None = None,
                chain: tuple[float, float] | None = None) -> float:
    """The largest M (at least `lo`, a proven busy bound) proven below every single-layout plan's
    busy time by the longest sample's group; `work` is the pooled bound's `work._Work`, `group`
    what `longest_group` built. With `fixed_floor_s` (the least time of any micro-batch) it holds
    for every plan, multi-phase included; with `chain` = (`least_exposed_s`, chain seconds after
    layer K-1) too it bounds the step instead (`lo` a proven step bound) by the group and the
    gradient reductions. Proofs: docs/design.md, Why each bound holds."""
    if len(work.tokens) < 2 or not math.isfinite(lo) or lo <= 0:
        return lo
    n = cm.cluster.num_gpus
    group, rest = group if group is not None else longest_group(work, cm, sizes)
    own = _Own.of(work, fixed_floor_s) if fixed_floor_s is not None else None

    def feasible(value: float) -> bool:
        m = value if chain is None else value - chain[0]
        cost = work.costs(m)  # cheapest GPU-seconds of each sample within m, outside the group
        total = float(np.dot(np.where(rest > 0, cost, 0.0), rest))
        if not math.isfinite(total):
            return False
        for k, p in enumerate(group.sizes):
            solo = group.solo[k]
            if solo > m:
                continue
            outside = (n - p) * m + _FEAS_RTOL * total
            forms = group.forms[k]
            if chain is not None:  # the step: the group's ranks have `room` for their own
                room = m - solo if value > solo + chain[1] else min(m - solo, value - chain[1] - group.top[k])
                if room < 0:
                    continue  # no rank of the group can end X in time
                taken = (_taken(own, cost, marg, rest, p, m, m - alone, room) for alone, marg in forms)
            elif own is not None and m - max(a for a, _ in forms) >= own.floor:  # room for their own
                taken = (own.capped(_room_or_saved(cost, marg, rest, p * (m - alone)), cost, marg, rest, p, m,
                                    m - alone, m - alone) for alone, marg in forms)
            else:
                taken = (_saved(cost, marg, rest, p * (m - alone)) for alone, marg in forms)
            # Every form bounds the group's time: the split must fit each of them.
            if all(total - t <= outside for t in taken):
                return True
        return False

    return _raised(feasible, lo)


def _taken(own: _Own, cost: np.ndarray, marg: np.ndarray, rest: np.ndarray, p: int, m: float, joins_s: float,
           own_s: float) -> float:
    """What the group's p ranks take off the others with joins within `joins_s` and, where
    `own_s` reaches the least fixed part, own micro-batches for `own_s` seconds per rank: the
    less of the joins' knapsack plus p `own_s` and `_room_or_saved`, capped by `_Own.capped`."""
    if own_s < own.floor:
        return _saved(cost, marg, rest, p * joins_s)
    plain = min(_room_or_saved(cost, marg, rest, p * joins_s), p * own_s + _saved(cost, marg, rest, p * joins_s))
    return own.capped(plain, cost, marg, rest, p, m, joins_s, own_s)


def _raised(feasible: Callable[[float], bool], lo: float) -> float:
    """The largest value found, from `lo` up, at which `feasible` fails (`lo` if it holds there):
    doubling, then bisection. Feasibility only grows with the value."""
    failed, held = climb(feasible, islice(geometric(lo, 2.0), knobs.GROUP_BOUND_STEPS + 1))
    if failed is None or held is None:
        return lo if failed is None else failed
    return narrow(feasible, failed, held, steps=knobs.GROUP_BOUND_STEPS, rtol=_RTOL)[0]


LongestGroup = tuple[_GroupOf, np.ndarray]
"""The longest sample's costs per size and every distinct sample's count besides it (`longest_group`)."""


def longest_group(work: object, cm: CostModel, sizes: Sequence[int]) -> LongestGroup:
    """The longest sample's costs per size (`_GroupOf`) and every distinct sample's count besides
    it (its twins stay with the others): what `group_bound` reads, built once per batch."""
    longest = int(np.argmax(work.solo_best))
    group = _GroupOf(cm, sizes, work.tokens, work.pairs, longest, work.memory_caps, work.coefs)
    rest = work.weight.copy()
    rest[longest] -= 1
    return group, rest
