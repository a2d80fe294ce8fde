"""Lower bounds on a global batch's step time, valid for every plan the cost model can price."""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence

import numpy as np

from dcp.costmodel import CostModel
from dcp.costmodel.schedule import least_link_s
from dcp.data.workloads import Sample

_MEMORY_RTOL = 1e-9
"""`Plan.validate` lets a micro-batch exceed the memory limit by this fraction; capacities here do too."""
_RTOL = 1e-6
_MAX_STEPS = 60
"""Root finding on work(M) = N * M: stop at this relative width, or after this many steps."""
_MEMO: weakref.WeakKeyDictionary[CostModel, dict[tuple, float]] = weakref.WeakKeyDictionary()
"""Recent bounds per cost model: every baseline plan of a batch reports the same bound (the ILP's
warm start builds nine), and one costs tens of milliseconds at 2048 samples."""
_MEMO_SIZE = 16


def lower_bound(batch: Sequence[Sample], cm: CostModel, sp_sizes: Sequence[int] | None = None) -> float:
    """The busy time no plan can beat, plus the gradient sync: at least the longest sample's best
    time alone, and at least every makespan M at which the batch's work does not fit N GPUs.

    Why the work argument holds: a micro-batch at SP size p with r checkpointed layers, T tokens
    and A pairs costs p * (fixed(p, r) + per_token(p, r) T + per_pair(p, r) A) GPU-seconds, the
    sum over its samples of p * ((fixed / T + per_token) t_i + per_pair a_i). T is at most what
    fits memory at (p, r) and, in a plan whose slowest group runs M, at most
    (M - fixed - per_pair a_i) / per_token for each sample i it holds; so i carries at least its
    share at that capacity, at a level (p, r) where it fits and runs alone within M. The cheapest
    such level per sample, summed, is work(M) <= N * M for a plan of busy time M; work only falls
    as M grows, so every M with work(M) > N * M is below the optimum (at M = inf it is the plain
    GPU-seconds bound). The gradient sync added is the least any plan's schedule adds
    (`CostModel.grad_sync_s`); under ZeRO-3 the bound is also at least the fewest slots' collectives
    (`_link_bound`), since every slot gathers every layer.
    """
    from dcp.planner.common import allowed_sp_sizes  # common imports this module

    sizes = tuple(allowed_sp_sizes(cm, sp_sizes))
    key = (sizes, tuple((s.tokens, s.attn_pairs) for s in batch))  # all of a sample that _Work reads
    memo = _MEMO.setdefault(cm, {})
    if key not in memo:
        if len(memo) >= _MEMO_SIZE:
            del memo[next(iter(memo))]
        memo[key] = max(_makespan_bound(_Work(batch, cm, sizes), cm.cluster.num_gpus) + cm.grad_sync_s(),
                        _link_bound(batch, cm, sizes))
    return memo[key]


def _link_bound(batch: Sequence[Sample], cm: CostModel, sizes: Sequence[int]) -> float:
    """ZeRO-3 (lockstep slots): the link is busy at least the fewest slots' collectives. A slot
    runs at most one micro-batch per group, each of at most max_tokens(p, K) tokens, and the
    groups' p sum to at most N, so a slot holds at most N * max_p max_tokens(p, K) / p tokens."""
    if cm.training.zero_stage < 3:
        return 0.0
    k = cm.model.num_layers
    per_gpu = max(cm.max_tokens(p, k) / p for p in sizes)
    if per_gpu <= 0:
        return 0.0
    slots = math.ceil(sum(s.tokens for s in batch) / (cm.cluster.num_gpus * per_gpu) - 1e-9)
    return least_link_s(cm, max(slots, 1))


def capacity_bound(batch: Sequence[Sample], cm: CostModel, sp_sizes: Sequence[int] | None = None) -> float:
    """max(total minimal GPU-seconds / N, the longest sample's best time alone) + gradient sync,
    each micro-batch's fixed cost spread over the most tokens that fit memory: weaker than
    `lower_bound` when fixed costs are heavy (ZeRO-3), and the floor the ILP's search is tuned on.

    Why it holds: a micro-batch holding a sample has at least its tokens, so needs at least the
    sample's own fewest checkpointed layers r_i(p), and every cost coefficient grows with r; its
    time is at least the sample's solo time, and the GPU-seconds it adds are at least p times its
    marginal cost at r_i(p), plus its tokens' share p * fixed(p, 0) / max_tokens(p, K) of the
    micro-batch's fixed cost (it holds at most max_tokens(p, K) tokens).
    """
    from dcp.planner.common import allowed_sp_sizes  # common imports this module

    sizes = allowed_sp_sizes(cm, sp_sizes)
    k = cm.model.num_layers
    capacity = {p: cm.max_tokens(p, k) for p in sizes}
    fixed_per_token = {p: p * cm.linear_time(p, 0).fixed / capacity[p] for p in sizes if capacity[p] > 0}
    work = 0.0
    longest = 0.0
    for s in batch:
        best_work, best_time = math.inf, math.inf
        for p in sizes:
            r = cm.min_ckpt_layers(s.tokens, p)
            if r is None:
                continue
            lin = cm.linear_time(p, r)
            marginal = p * (lin.per_token * s.tokens + lin.per_pair * s.attn_pairs)
            best_work = min(best_work, marginal + fixed_per_token[p] * s.tokens)
            best_time = min(best_time, lin(s.tokens, s.attn_pairs))
        work += best_work
        longest = max(longest, best_time)
    return max(work / cm.cluster.num_gpus, longest) + cm.grad_sync_s()


def _makespan_bound(work: _Work, n: int) -> float:
    """The largest M proven below every plan's busy time: max(longest sample, work(inf) / N),
    raised while work(M) > N * M by regula falsi (Illinois) on that decreasing function; one
    evaluation more when it does not hold at the start."""
    lo = max(work.longest, work(math.inf) / n)
    f_lo = work(lo) - n * lo if 0 < lo < math.inf else 0.0
    if not f_lo > 0:
        return lo
    hi = 2 * lo
    f_hi = work(hi) - n * hi
    while f_hi > 0:  # work(hi) falls towards work(inf) <= n * lo, so this ends
        lo, f_lo, hi = hi, f_hi, 2 * hi
        f_hi = work(hi) - n * hi
    side = 0
    for _ in range(_MAX_STEPS):
        if hi - lo <= _RTOL * hi:
            break
        mid = (lo * f_hi - hi * f_lo) / (f_hi - f_lo)
        if not math.isfinite(mid):
            mid = (lo + hi) / 2
        mid = min(max(mid, lo + 0.01 * (hi - lo)), hi - 0.01 * (hi - lo))  # stay strictly inside
        f_mid = work(mid) - n * mid
        if f_mid > 0:
            lo, f_lo = mid, f_mid
            f_hi, side = (f_hi / 2, 1) if side == 1 else (f_hi, 1)  # Illinois: halve the stale end
        else:
            hi, f_hi = mid, f_mid
            f_lo, side = (f_lo / 2, -1) if side == -1 else (f_lo, -1)
    return lo


class _Work:
    """work(M): GPU-seconds the batch needs if no group runs longer than M (see `lower_bound`),
    over every level (p, r) at once; inf when some sample fits no micro-batch within M. Also
    `longest`, the largest over samples of their least solo time at a level where they fit.

    For sample i at level l: cost = p (per_token t_i + per_pair a_i) + p t_i fixed / cap, where
    fixed / cap = max(fixed / memory_cap, fixed per_token / (M - fixed - per_pair a_i)), and the
    level is open to i when t_i fits memory_cap and its solo time at l is at most M. Everything
    but M is computed once."""

    def __init__(self, batch: Sequence[Sample], cm: CostModel, sizes: Sequence[int]) -> None:
        k = cm.model.num_layers
        room = cm.cluster.memory_bytes * (1 + _MEMORY_RTOL) - cm.static_bytes
        levels = [(p, r) for p in sizes for r in range(k + 1)]
        lin = [cm.linear_time(p, r) for p, r in levels]
        gpus = np.array([p for p, _ in levels], dtype=np.float64)[:, None]
        fixed = np.array([c.fixed for c in lin])[:, None]
        per_token = np.array([c.per_token for c in lin])[:, None]
        per_pair = np.array([c.per_pair for c in lin])[:, None]
        memory_cap = np.array([min(room / cm.activation_bytes_per_token(p, r), cm.priceable_tokens(p))
                               if room > 0 else 0.0 for p, r in levels])[:, None]
        tokens = np.array([s.tokens for s in batch], dtype=np.float64)[None, :]
        pairs = np.array([s.attn_pairs for s in batch], dtype=np.float64)[None, :]
        # Arrays are levels x samples.
        self.busy = fixed + per_pair * pairs  # what a micro-batch holding i runs besides its tokens
        self.solo = self.busy + per_token * tokens
        self.marginal = gpus * (per_token * tokens + per_pair * pairs)
        self.marginal[np.broadcast_to(tokens > memory_cap, self.marginal.shape)] = np.inf
        self.gpu_tokens = gpus * tokens
        # Alone at its cheapest level where it fits: no plan runs shorter than any sample's best.
        self.longest = float(np.where(np.isfinite(self.marginal), self.solo, np.inf).min(axis=0).max())
        with np.errstate(divide="ignore", invalid="ignore"):
            self.memory_share = np.where(fixed > 0, fixed / memory_cap, 0.0)  # fixed seconds per token, full
        self.time_share = fixed * per_token  # over M - busy: fixed seconds per token when time caps it

    def __call__(self, makespan: float) -> float:
        if not math.isfinite(makespan):
            cost = self.marginal + self.gpu_tokens * self.memory_share
        else:
            open_ = self.solo <= makespan
            left = makespan - self.busy  # > 0 wherever open_ and per_token > 0
            timed = np.divide(self.time_share, left, out=np.zeros_like(left), where=left > 0)
            share = np.maximum(self.memory_share, timed)
            cost = np.where(open_, self.marginal + self.gpu_tokens * share, np.inf)
        return float(cost.min(axis=0).sum())
