"""A lower bound that charges the longest sample's group: the pooled work bound (`bounds`) lets
the GPUs of the group that runs the longest sample spend their idle time at the price of a single
GPU, which they cannot.

The longest sample i runs in a group of some size p. That group is busy for at least i's time
alone, so within a makespan M it has at most p (M - lin_p(i)) GPU-seconds for other samples,
each of which costs it at least p times its marginal cost at p (its share of the micro-batch it
joins; lin is the linear form, a lower bound on the exact time with rings, and every
coefficient grows with the checkpointed layers). The other N - p GPUs offer (N - p) M. Each
other sample costs at least its cheapest GPU-seconds within M outside the group (`bounds._Work`)
and at least its marginal cost at p inside; whether any split of them fits both is a fractional
knapsack, so M is below every plan's busy time when no size p where i runs within M admits one.
Feasibility only grows with M, so bisection finds the bound.

It matters where one sample needs a large group: wikipedia's 56K-token sample among 512 on 256
GPUs takes a 64- or 128-GPU group, and the bound on the busy time rises by 8%. (The in-group
marginals are the linear form's, which hides a ring's transfers: with rings the bound stays
below what such a group really absorbs.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dcp.costmodel import CostModel
from dcp.planner.pricing import exact_times

_STEPS = 24
"""Bisection steps at most (or down to a relative width of `_RTOL`)."""
_RTOL = 1e-4
_FEAS_RTOL = 1e-9
"""Rounding room in the knapsack's comparison (a plan that fits exactly must fit here too)."""


class _GroupOf:
    """The longest sample's costs per size, and every sample's marginal GPU-seconds there."""

    def __init__(self, cm: CostModel, sizes: Sequence[int], tokens: np.ndarray, pairs: np.ndarray,
                 longest: int, memory_cap: dict[int, np.ndarray], coef: dict[int, tuple[np.ndarray, ...]]) -> None:
        k = cm.model.num_layers
        self.sizes: list[int] = []
        self.solo: list[float] = []
        self.linear: list[float] = []
        self.marginal: list[np.ndarray] = []
        t0, a0 = tokens[longest], pairs[longest]
        for p in sizes:
            fixed, per_token, per_pair = coef[p]
            r0 = int(np.searchsorted(memory_cap[p], t0, side="left"))
            if r0 > k:
                continue  # the longest sample does not fit at p
            lin = fixed[r0:] + per_token[r0:] * t0 + per_pair[r0:] * a0
            r = np.searchsorted(memory_cap[p], tokens, side="left")
            marg = np.full(len(tokens), math.inf)
            for level in range(k + 1):  # the least marginal at any level a sample fits
                cost = p * (per_token[level] * tokens + per_pair[level] * pairs)
                marg = np.where(r <= level, np.minimum(marg, cost), marg)
            self.sizes.append(p)
            self.solo.append(float(exact_times(cm, p, np.array([t0]), np.array([a0]), np.array([r0]))[0]))
            self.linear.append(float(lin.min()))
            self.marginal.append(marg)


def group_bound(work: object, cm: CostModel, sizes: Sequence[int], lo: float) -> float:
    """The largest M (at least `lo`, a proven bound on the busy time) proven below every plan's
    busy time by the longest sample's group (see the module docstring). `work` is the pooled
    bound's `bounds._Work` on the batch's distinct samples."""
    tokens, pairs, weight = work.tokens, work.pairs, work.weight
    if len(tokens) < 2 or not math.isfinite(lo) or lo <= 0:
        return lo
    n = cm.cluster.num_gpus
    longest = int(np.argmax(work.solo_best))
    group = _GroupOf(cm, sizes, tokens, pairs, longest, work.memory_caps, work.coefs)
    rest = weight.copy()
    rest[longest] -= 1  # the longest sample itself; its twins stay with the others

    def feasible(m: float) -> bool:
        cost = work.costs(m)  # cheapest GPU-seconds of each sample within m, outside the group
        for k, p in enumerate(group.sizes):
            if group.solo[k] > m:
                continue
            outside = (n - p) * m
            total = float(np.dot(np.where(rest > 0, cost, 0.0), rest))
            if total <= outside:
                return True
            room = p * (m - group.linear[k])
            if room <= 0 or not math.isfinite(total):
                continue
            marg = group.marginal[k]
            ok = (rest > 0) & np.isfinite(marg) & (marg > 0)
            ratio = np.where(ok, cost / np.where(ok, marg, 1.0), 0.0)
            order = np.argsort(-ratio[ok], kind="stable")
            c, mg, w = cost[ok][order], marg[ok][order], rest[ok][order]
            used = np.cumsum(mg * w)
            full = int(np.searchsorted(used, room, side="right"))  # items that fit whole
            saved = float(np.dot(c[:full], w[:full]))
            if full < len(c):
                left = room - (float(used[full - 1]) if full else 0.0)
                saved += c[full] * left / mg[full]
            if total - saved <= outside + _FEAS_RTOL * total:
                return True
        return False

    if feasible(lo):
        return lo
    hi = 2 * lo
    for _ in range(_STEPS):
        if feasible(hi):
            break
        lo, hi = hi, 2 * hi
    else:
        return lo
    for _ in range(_STEPS):
        if hi - lo <= _RTOL * hi:
            break
        mid = (lo + hi) / 2
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    return lo
