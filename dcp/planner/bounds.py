"""Lower bounds on a global batch's step time, valid for every plan the cost model can price.

Both bounds are sums over samples of a per-sample cost, so identical samples are counted once
with a weight, and tens of thousands of samples cost a few array operations.
"""

from __future__ import annotations

import hashlib
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

import dcp.planner.knobs as knobs
from dcp.costmodel import CostModel
from dcp.costmodel.schedule import least_exposed_s, least_link_s, least_step_s, reduction_chain_s
from dcp.planner.bound_group import group_bound, longest_group, step_group_bound
from dcp.planner.feasibility import allowed_sp_sizes
from dcp.planner.levels import climb, geometric, narrow
from dcp.planner.pricing import exact_times
from dcp.planner.sample import Sample

_MEMORY_RTOL = 1e-9
"""`Plan.validate` lets a micro-batch exceed the memory limit by this fraction; capacities here do too."""
_RTOL = 1e-5
_MEMO: weakref.WeakKeyDictionary[CostModel, dict[tuple, _Floors]] = weakref.WeakKeyDictionary()
"""Recent bounds per cost model: every baseline plan of a batch reports the same bound."""
_LEVELS: weakref.WeakKeyDictionary[CostModel, dict[tuple[int, bool], SizeLevels]] = weakref.WeakKeyDictionary()
"""Each cost model's `SizeLevels` per (SP size, charged below): a pure function of them, which
every batch's bounds read."""


def sample_arrays(batch: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray]:
    """Tokens and attention pairs of the batch's samples (float64)."""
    n = len(batch)
    return (np.fromiter((s.tokens for s in batch), dtype=np.float64, count=n),
            np.fromiter((s.attn_pairs for s in batch), dtype=np.float64, count=n))


def distinct_samples(tokens: np.ndarray, pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (tokens, pairs) of a batch and how many samples share each."""
    if not len(tokens):
        return tokens, pairs, np.zeros(0)
    order = np.lexsort((pairs, tokens))
    t, a = tokens[order], pairs[order]
    first = np.flatnonzero(np.concatenate([[True], (t[1:] != t[:-1]) | (a[1:] != a[:-1])]))
    return t[first], a[first], np.diff(np.append(first, len(t))).astype(np.float64)


def lower_bound(batch: Sequence[Sample], cm: CostModel, sp_sizes: Sequence[int] | None = None,
                arrays: tuple[np.ndarray, np.ndarray] | None = None) -> float:
    """The busy time no plan can beat, plus the gradient sync: at least the longest sample's best
    time alone, and at least every makespan M at which the batch's work does not fit N GPUs.

    Why the work argument holds: a micro-batch at SP size p with r checkpointed layers, T tokens
    and A pairs costs p * (fixed(p, r) + per_token(p, r) T + per_pair(p, r) A) GPU-seconds, the
    sum over its samples of p * ((fixed / T + per_token) t_i + per_pair a_i). T is at most what
    fits memory at (p, r) and, in a plan whose slowest group runs M, at most
    (M - fixed - per_pair a_i) / per_token for each sample i it holds; so i carries at least its
    share at that capacity (or, at the sizes `_Work.weigh` picks, its weight of `_weigh`, which
    also sum to at most 1 over a micro-batch), at a level (p, r) where it fits and runs alone
    within M. The cheapest
    such level per sample, summed, is work(M) <= N * M for a plan of busy time M; work only falls
    as M grows, so every M with work(M) > N * M is below the optimum (at M = inf it is the plain
    GPU-seconds bound). The synchronization added is the least any plan's schedule adds to a
    busy time of at least M (`schedule.least_step_s`: at least `CostModel.grad_sync_s`, and the
    whole chain of gradient reductions the last backward passes cannot hide, with `_released`
    from the longest samples); under ZeRO-3 the bound is also at least the fewest slots' collectives
    (`_link_bound`), since every slot gathers every layer.

    It holds for every plan the executor can run, multi-phase plans included (see
    `multi_phase_bound`). `arrays` (tokens, pairs), when given, saves reading them from the
    samples again.
    """
    return _bounds(batch, cm, sp_sizes, arrays).lower


def _bounds(batch: Sequence[Sample], cm: CostModel, sp_sizes: Sequence[int] | None,
            arrays: tuple[np.ndarray, np.ndarray] | None) -> _Floors:
    """The batch's bounds, memoized per cost model and batch."""
    sizes = tuple(allowed_sp_sizes(cm, sp_sizes))
    tokens, pairs = arrays if arrays is not None else sample_arrays(batch)
    digest = hashlib.blake2b(tokens.tobytes() + pairs.tobytes(), digest_size=16).digest()
    key = (sizes, len(tokens), digest)  # all of a sample that the bound reads
    memo = _MEMO.setdefault(cm, {})
    if key not in memo:
        if len(memo) >= knobs.BOUND_MEMO_SIZE:
            del memo[next(iter(memo))]
        d_tokens, d_pairs, weight = distinct_samples(tokens, pairs)  # each distinct sample once, weighted
        work = _Work(d_tokens, d_pairs, weight, cm, sizes)
        # The longest sample's group and the spread release on at most knobs.BOUND_COARSE classes of samples,
        # each rounded down (`round_down`: a bound can only fall): they evaluate every sample at
        # many busy times (docs/tuning-log.md, `BOUND_COARSE`).
        coarse = work if len(work.tokens) <= knobs.BOUND_COARSE else _Work(*_coarse(work), cm, sizes)
        # The pooled bound with token shares, then, from it up, with each size's fixed costs
        # weighed as `_Work.weigh` chooses there, on the coarse classes (docs/tuning-log.md).
        pooled = _makespan_bound(work, cm.cluster.num_gpus)
        if coarse.weigh(pooled):
            pooled = _makespan_bound(coarse, cm.cluster.num_gpus, pooled)
        group = longest_group(coarse, cm, sizes) if len(coarse.tokens) >= 2 else None  # read by all three below
        makespan = group_bound(coarse, cm, sizes, pooled, coarse.fixed_floor, group)
        released = _released(cm, sizes, tokens, pairs)
        spread = _Spread(cm, sizes, coarse.tokens, coarse.pairs, coarse.weight) if released is not None else None
        link = _link_bound(float(tokens.sum()), cm, sizes)
        single = group_bound(coarse, cm, sizes, makespan, group=group)
        lower = max(_least_step(cm, makespan, sizes, released, spread), link)
        chain = reduction_chain_s(cm)
        if chain is not None:  # stages 0-2: the longest sample's group against the reduction chain
            lower = step_group_bound(coarse, cm, sizes, lower, coarse.fixed_floor, least_exposed_s(cm),
                                     float(chain[-1]), group)
            lower = _exposure_bound(coarse, cm, sizes, lower, chain)
        floor_work, solo = sample_floors(d_tokens, d_pairs, cm, sizes)
        capacity = max(float(floor_work @ weight) / cm.cluster.num_gpus, float(solo.max()))
        memo[key] = _Floors(lower, max(_least_step(cm, single, sizes, released, spread), link, lower),
                            None if spread is None else np.maximum(released, spread.at(math.inf)), makespan,
                            capacity)
    return memo[key]


@dataclass(frozen=True)
class _Floors:
    lower: float
    """`lower_bound`."""
    single_layout: float
    """`single_layout_bound`."""
    released: np.ndarray | None
    """Per layer, a time before which no plan issues its reduction: `_released` and the spread
    release of any busy time (`_Spread.at(inf)`)."""
    makespan: float
    """The makespan bound on every plan's busy time (`_makespan_bound`)."""
    capacity: float
    """`capacity_busy`, which a solve reads three times."""


def _released(cm: CostModel, sizes: Sequence[int], tokens: np.ndarray, pairs: np.ndarray) -> np.ndarray | None:
    """Stages 0-2, per layer u: a time before which no plan issues layer u's gradient reduction
    (None at stage 3, on one GPU, or for an empty batch), from the batch's `knobs.BOUND_RELEASE_SAMPLES`
    longest samples: the most, over them, of the least over the layouts where the sample fits
    of its time alone outside layers u-1..0's backward: K forwards, the head and K - u
    backwards (`schedule.least_step_s` adds the reductions after).

    Why it holds: the group holding sample i issues layer u's reduction no sooner than its busy
    time minus its last micro-batch's backward (and recompute) of layers u-1..0. If i's
    micro-batch is that last one, this is at least the forwards, the head and the backwards of
    layers K-1..u of that micro-batch, and each only grows when samples join it: compute,
    all-to-alls and the head grow with tokens and pairs, and a ring's exposed transfers shrink
    by at most the step compute the joining sample adds, (c - 1) / c of its attention and the
    c - 1 extra calls' per-token cost, which the forward and backward compute count in full.
    So i alone in the micro-batch's layout is below it. If it is not the last, the group runs
    i's micro-batch before the last, so issues no sooner than that micro-batch's whole time;
    and in a multi-phase plan, the ranks' last groups start after i's group ends."""
    if cm.training.zero_stage >= 3 or cm.cluster.num_gpus == 1 or not len(tokens) or not cm.model.num_layers:
        return None
    k = cm.model.num_layers
    u = np.arange(k, dtype=np.float64)
    memory = cm.cluster.memory_bytes * (1 + _MEMORY_RTOL)
    out = np.zeros(k)
    for i in np.argsort(-tokens, kind="stable")[:knobs.BOUND_RELEASE_SAMPLES]:
        t, a = float(tokens[i]), float(pairs[i])
        least = np.full(k, math.inf)
        for p in sizes:
            if t > cm.priceable_tokens(p):
                continue
            for layout in cm.layouts(p):
                if cm.memory_bytes(t, p, k, layout) > memory:  # not even with every layer checkpointed
                    continue
                lt = cm.layer_times(t, a, p, layout)
                least = np.minimum(least, k * lt.forward_s + cm.head_s(t, p) + (k - u) * lt.backward_s)
        out = np.maximum(out, np.where(np.isfinite(least), least, 0.0))
    return out


class _Spread:
    """Stages 0-2, per layer u and busy time M: a time before which not every rank has issued
    layer u's gradient reduction in a plan whose busy time is at most M, from the whole batch's
    work: the average over the N ranks of what each must run before it issues u, plus one
    micro-batch's fixed part (`at`).

    Why it holds: rank c issues u when its last micro-batch has run K forwards, the head and
    the backwards of layers K-1..u, after all its earlier micro-batches (`schedule`), so its
    release is at least the sum of its micro-batches' times less the last one's backward and
    recompute of layers u-1..0. That leaves, of every micro-batch, at least its forwards, head
    and K - u backwards (compute, all-to-alls and the ring's extra steps: the linear form of
    `CostModel.layer_linear`, unhidden transfers and recomputes dropped), whose per-token and
    per-pair parts are sums over its samples. Summed over the ranks, a micro-batch of p ranks
    counts p times: so the releases sum to at least the batch's samples' parts, each at the
    fewest GPU-seconds over the layouts where it fits memory and, alone, runs within M (its
    layout's linear time without checkpointing is below its micro-batch's), and the last rank's
    release is at least their average over N, plus the fixed part of its own last micro-batch
    (the average over ranks that run micro-batches is at least that over N). A rank may change
    groups between micro-batches without changing this: it holds for multi-phase plans too."""

    def __init__(self, cm: CostModel, sizes: Sequence[int], tokens: np.ndarray, pairs: np.ndarray,
                 weight: np.ndarray) -> None:
        k = self.k = cm.model.num_layers
        self.us = sorted({max(k - 2 ** j, 0) for j in range(knobs.BOUND_SPREAD_LAYERS)} | {k - 1}, reverse=True)
        u = np.array(self.us, dtype=np.float64)[:, None]
        self.weight, self.gpus = weight, cm.cluster.num_gpus
        self.fixed = np.full(len(self.us), math.inf)
        self.parts, self.solo = [], []  # per layout: (us, samples) parts where it fits; its samples' solo times
        memory = cm.cluster.memory_bytes * (1 + _MEMORY_RTOL)
        for p in sizes:
            for layout in cm.layouts(p):
                f, b, _ = cm.layer_linear(layout)
                self.fixed = np.minimum(self.fixed, k * f.fixed + cm.fit.microbatch_fixed_s + (k - u[:, 0]) * b.fixed)
                per_token = p * (k * f.per_token + (k - u) * b.per_token) + cm.fit.head_per_token_s
                per_pair = p * (k * f.per_pair + (k - u) * b.per_pair)
                fits = tokens <= cm.max_tokens(p, k, memory, layout)  # with every layer checkpointed
                self.parts.append(np.where(fits, per_token * tokens + per_pair * pairs, math.inf))
                line = cm.layout_linear_time(layout, 0)
                self.solo.append(line.fixed + line.per_token * tokens + line.per_pair * pairs)

    def at(self, busy_s: float) -> np.ndarray:
        """Per layer, the release bound of plans of busy time at most `busy_s` (inf: any)."""
        least = np.full(self.parts[0].shape, math.inf)
        for part, solo in zip(self.parts, self.solo, strict=True):
            least = np.minimum(least, part if not math.isfinite(busy_s) else np.where(solo <= busy_s, part, math.inf))
        spread = np.where(np.isfinite(least), least, 0.0) @ self.weight / self.gpus + self.fixed
        out = np.zeros(self.k)
        for v, value in zip(self.us, spread, strict=True):  # us descending: each fills down to the next
            out[:v + 1] = value
        return out


def _least_step(cm: CostModel, busy_s: float, sizes: Sequence[int], released: np.ndarray | None,
                spread: _Spread | None) -> float:
    """The least step of any plan of busy time at least `busy_s`: `schedule.least_step_s` with
    `released` and, on each interval [M_i, M_i+1) of busy times, the spread release of plans of
    busy time at most M_i+1 (it only falls as M grows, and the step only grows with the busy
    time and the releases), the least over the intervals."""
    if spread is None or not math.isfinite(busy_s):  # spread is None exactly where released is
        return least_step_s(cm, busy_s, sizes, released)
    grid = [busy_s * (1 + knobs.BOUND_GRID_STEP * i) for i in range(knobs.BOUND_GRID)] + [math.inf]
    return min(least_step_s(cm, lo, sizes, np.maximum(released, spread.at(hi)))
               for lo, hi in zip(grid[:-1], grid[1:], strict=True))


def single_layout_bound(batch: Sequence[Sample], cm: CostModel, sp_sizes: Sequence[int] | None = None,
                        arrays: tuple[np.ndarray, np.ndarray] | None = None) -> float:
    """`lower_bound` raised by charging the longest sample's group (`bound_group.group_bound`):
    valid for single-layout plans only, where that group keeps its size for the whole step. A
    multi-phase plan dissolves it once its sample is done, so this bound does not hold there."""
    return _bounds(batch, cm, sp_sizes, arrays).single_layout


def _link_bound(total_tokens: float, cm: CostModel, sizes: Sequence[int]) -> float:
    """ZeRO-3 (lockstep slots): the link is busy at least the fewest slots' collectives. A slot
    runs at most one micro-batch per group, each of at most max_tokens(p, K) tokens, and the
    groups' p sum to at most N, so a slot holds at most N * max_p max_tokens(p, K) / p tokens."""
    if cm.training.zero_stage < 3:
        return 0.0
    k = cm.model.num_layers
    per_gpu = max(cm.max_tokens(p, k) / p for p in sizes)
    if per_gpu <= 0:
        return 0.0
    slots = math.ceil(total_tokens / (cm.cluster.num_gpus * per_gpu) - 1e-9)
    return least_link_s(cm, max(slots, 1))


def step_floor(batch: Sequence[Sample], cm: CostModel, busy_s: float, sp_sizes: Sequence[int] | None = None,
               arrays: tuple[np.ndarray, np.ndarray] | None = None) -> float:
    """The least step of any plan of this batch whose busy time is at least `busy_s` (a proven
    busy bound: the ILP's dual bound, say), `schedule.least_step_s` with `_released`."""
    sizes = allowed_sp_sizes(cm, sp_sizes)
    return least_step_s(cm, busy_s, sizes, _bounds(batch, cm, sizes, arrays).released)


def capacity_bound(batch: Sequence[Sample], cm: CostModel, sp_sizes: Sequence[int] | None = None,
                   arrays: tuple[np.ndarray, np.ndarray] | None = None) -> float:
    """`capacity_busy` + the least the step adds to it (`schedule.least_step_s`)."""
    return step_floor(batch, cm, capacity_busy(batch, cm, sp_sizes, arrays), sp_sizes, arrays)


def capacity_busy(batch: Sequence[Sample], cm: CostModel, sp_sizes: Sequence[int] | None = None,
                  arrays: tuple[np.ndarray, np.ndarray] | None = None) -> float:
    """max(total minimal GPU-seconds / N, the longest sample's best time alone): a bound on every
    plan's busy time, each micro-batch's fixed cost spread over the most tokens that fit memory;
    weaker than `lower_bound`'s makespan when fixed costs are heavy (ZeRO-3), and the floor the
    ILP's search is tuned on.

    Why it holds: a micro-batch holding a sample has at least its tokens, so needs at least the
    sample's own fewest checkpointed layers r_i(p), and every cost coefficient grows with r; its
    time is at least the sample's solo time, and the GPU-seconds it adds are at least p times its
    marginal cost at r_i(p), plus its tokens' share p * fixed(p, 0) / max_tokens(p, K) of the
    micro-batch's fixed cost (it holds at most max_tokens(p, K) tokens).
    """
    return _bounds(batch, cm, sp_sizes, arrays).capacity


class SizeLevels:
    """One SP size's coefficients at r = 0..K and the tokens that fit memory (and the profile's
    priceable range) at each, with the validator's tolerance. `fixed`, `per_token` and
    `per_pair` are the micro-batch's time; the `charge_` ones what the work bound charges, the
    same, or with `below` the time less the backward below the top layer
    (`CostModel.linear_less_below`: `_exposure_bound`)."""

    def __init__(self, cm: CostModel, p: int, below: bool = False) -> None:
        k = cm.model.num_layers
        room = cm.cluster.memory_bytes * (1 + _MEMORY_RTOL) - cm.static_bytes
        lin = [cm.linear_time(p, r) for r in range(k + 1)]
        self.fixed = np.array([c.fixed for c in lin])
        self.per_token = np.array([c.per_token for c in lin])
        self.per_pair = np.array([c.per_pair for c in lin])
        charged = [cm.linear_less_below(p, r) for r in range(k + 1)] if below else lin
        self.charge_fixed = np.array([c.fixed for c in charged])
        self.charge_per_token = np.array([c.per_token for c in charged])
        self.charge_per_pair = np.array([c.per_pair for c in charged])
        # Each GPU holds ceil(T/p) tokens (CostModel.memory_bytes: the executor pads), so a
        # micro-batch fits when ceil(T/p) <= room / bytes per token on one GPU: T <= p * floor(..)
        # (CostModel.max_tokens, which also pads for rings and takes the least over layouts).
        memory = cm.cluster.memory_bytes * (1 + _MEMORY_RTOL)
        self.memory_cap = np.array([float(cm.max_tokens(p, r, memory)) if room > 0 else 0.0 for r in range(k + 1)])
        with np.errstate(divide="ignore", invalid="ignore"):
            self.memory_share = np.where(self.charge_fixed > 0, self.charge_fixed / self.memory_cap, 0.0)
        self.candidates = self._candidates()

    def _candidates(self) -> list[list[int]]:
        """For a sample whose fewest layers at p are r0: the levels r >= r0 its cheapest cost can
        be at, for every makespan M. Level r2 > r1 never beats r1 when both fit, if the per-token
        price it adds is at least the memory share it saves (per_token(r2) - per_token(r1) >=
        fixed(r1) / cap(r1) - fixed(r2) / cap(r2), in the charged prices): every other term, the
        time share and solo time included, is no smaller at r2, as fixed, per_token and per_pair
        (the time's and the charged) grow with r. When they do not grow with r every level stays a
        candidate."""
        k = len(self.fixed) - 1
        grows = all((np.diff(c) >= 0).all() for c in (self.fixed, self.per_token, self.per_pair, self.charge_fixed,
                                                       self.charge_per_token, self.charge_per_pair))
        out = []
        for r0 in range(k + 1):
            if not grows:
                out.append(list(range(r0, k + 1)))
                continue
            with np.errstate(invalid="ignore"):  # inf - inf: neither level holds a token
                saved = self.memory_share[r0] - self.memory_share[r0 + 1:]
            added = self.charge_per_token[r0 + 1:] - self.charge_per_token[r0]
            out.append([r0] + [r0 + 1 + int(i) for i in np.flatnonzero(added < saved)])
        return out


def size_levels(cm: CostModel, p: int, below: bool = False) -> SizeLevels:
    """`SizeLevels(cm, p, below)`, built once per cost model."""
    cached = _LEVELS.setdefault(cm, {})
    if (p, below) not in cached:
        cached[p, below] = SizeLevels(cm, p, below)
    return cached[p, below]


def _makespan_bound(work: _Work, n: int, start: float = 0.0, extra: float = 0.0) -> float:
    """The largest M proven below every plan's busy time: max(longest sample, work(inf) / N,
    `start`, a proven bound), raised while work(M) + `extra` > N * M by regula falsi (Illinois)
    on that decreasing function; one evaluation more when it does not hold at the start."""

    def excess(m: float) -> float:
        return work(m) + extra - n * m

    lo = max(work.longest, (work(math.inf) + extra) / n, start)
    f_lo = excess(lo) if 0 < lo < math.inf else 0.0
    if not f_lo > 0:
        return lo
    seen = {lo: f_lo}

    def fits(m: float) -> bool:
        seen[m] = excess(m)
        return not seen[m] > 0

    # work(M) falls towards work(inf) <= n * lo - extra, so some doubling fits.
    failed, hi = climb(fits, geometric(2 * lo, 2.0))
    lo = lo if failed is None else failed
    return narrow(excess, lo, hi, steps=knobs.BOUND_MAX_STEPS, rtol=_RTOL, values=(seen[lo], seen[hi]))[0]


def _exposure_bound(coarse: _Work, cm: CostModel, sizes: Sequence[int], start_s: float, chain: np.ndarray) -> float:
    """Stages 0-2: a bound on the step S from every rank's need to hide the reduction chain
    after its own last micro-batch: `start_s` (a proven step bound), raised where it holds.

    Why it holds: rank c ends its last micro-batch at e_c and issues layer K-1's reduction at
    e_c - below_c, below_c being that micro-batch's backward and recompute of layers K-2..0,
    and the step ends no sooner than that plus `reduction_chain_s`[K-1] (`schedule.least_step_s`);
    a rank in no group issues at 0. Summed over the N ranks: N S >= sum of (e_c - below_c) +
    N chain[K-1]. A rank runs its micro-batches one after another, so the e_c sum to at least
    every micro-batch's p times its time, and below_c is that of its last one: charging every
    micro-batch p (time - below), which is at least its linear form less the linear backward
    below the top layer (`CostModel.linear_less_below`), undercharges. That is `_Work` with
    those coefficients, each micro-batch within the busy time M <= S - `least_exposed_s`, so
    work'(S - least) + N chain[K-1] <= N (S - least) + N least for every plan, and any S where it
    fails is below all of them (`_makespan_bound` on M = S - least, from `start_s` - least).
    Multi-phase plans too: a rank's group may change between micro-batches, and its last
    micro-batch issues its reductions.

    Where the chain is long against the step (`knobs.BOUND_CAPPED_CHAIN_SHARE`) each micro-batch's charge
    is capped by the release instead: every micro-batch a rank runs ends by e_c, and e_c less the
    last one's backward below is at most R = S - chain[K-1], so the charge of each (its time, or
    its time less that backward for the last) is at most R. That is `_Work`'s argument again in
    charged seconds (`capped`: the token shares, the time shares at the cap R, and each size's
    weighting), on the same sum: work''(R) <= N R, and S = R + chain[K-1] (docs/tuning-log.md).

    The charge is at most `ratio` (the largest of charged over time coefficients) times the
    work bound's cost, at every level, and the work bound fits N M at M = `start_s` - least
    (above its own root): where that ratio of it plus the chain fits too, it cannot raise the
    bound and is not computed (a screen only: returning `start_s` is always valid)."""
    n, least = cm.cluster.num_gpus, least_exposed_s(cm)
    extra = n * (float(chain[-1]) - least)
    ratio = 0.0
    for p in sizes:
        lv = size_levels(cm, p, below=True)
        for t, c in ((lv.fixed, lv.charge_fixed), (lv.per_token, lv.charge_per_token),
                     (lv.per_pair, lv.charge_per_pair)):
            ratio = max(ratio, float(np.max(np.divide(c, t, out=np.zeros_like(c), where=t > 0))))
    if ratio * n * (start_s - least) + extra <= n * (start_s - least):
        return start_s
    tokens, pairs, weight = coarse.tokens, coarse.pairs, coarse.weight
    if len(tokens) > knobs.BOUND_EXPOSURE_CLASSES:
        tokens, pairs, weight = round_down(tokens, pairs, weight, knobs.BOUND_EXPOSURE_CLASSES)
    work = _Work(tokens, pairs, weight, cm, sizes, below=True, longest=coarse.longest)
    raised = max(start_s, _makespan_bound(work, n, start_s - least, extra) + least)
    last = float(chain[-1])
    if last <= knobs.BOUND_CAPPED_CHAIN_SHARE * raised:
        return raised
    # Each micro-batch's charge is also at most S - chain (the release, below): on that cap, in
    # charged seconds throughout, with each size's fixed costs weighed as `_Work.weigh` picks.
    capped = _Work(tokens, pairs, weight, cm, sizes, below=True, longest=0.0, capped=True)
    release = _makespan_bound(capped, n, raised - last)
    if capped.weigh(release):
        release = _makespan_bound(capped, n, release)
    return max(raised, release + last)


def _front(tokens: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """The indices of the samples that no other has at least as many tokens and pairs as, with
    more of one (equal ones all kept): the maximal ones, whatever order the costs take."""
    order = np.lexsort((-pairs, -tokens))  # most tokens first, then most pairs
    t, a = tokens[order], pairs[order]
    first = np.concatenate([[True], t[1:] != t[:-1]])  # each token count's most pairs come first
    group = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    above = np.concatenate([[-math.inf], np.maximum.accumulate(a)[starts[1:] - 1]])  # most pairs with more tokens
    return order[(a == a[starts][group]) & (a > above[group])]


def _coarse(work: _Work) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`work`'s samples in at most `knobs.BOUND_COARSE` classes: the `knobs.BOUND_COARSE_EXACT` longest as they are
    (the group bound charges the longest), the rest rounded down (`round_down`)."""
    order = np.argsort(work.tokens, kind="stable")
    rest, top = order[:-knobs.BOUND_COARSE_EXACT], order[-knobs.BOUND_COARSE_EXACT:]
    t, a, w = round_down(work.tokens[rest], work.pairs[rest], work.weight[rest], knobs.BOUND_COARSE - knobs.BOUND_COARSE_EXACT)
    return (np.concatenate([t, work.tokens[top]]), np.concatenate([a, work.pairs[top]]),
            np.concatenate([w, work.weight[top]]))


def round_down(tokens: np.ndarray, pairs: np.ndarray, weight: np.ndarray,
               most: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """At most about `most` classes of samples on a geometric grid of token counts, each standing
    for its members with the least tokens and the least pairs among them: every cost in the
    bound grows with both, so the bound can only fall."""
    spread = math.log(float(tokens.max()) / float(tokens.min())) if len(tokens) else 0.0
    step = max(spread / most, 1e-6)
    key = np.floor(np.log(tokens) / step).astype(np.int64)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    starts = np.searchsorted(inverse[order], np.arange(len(first)))
    return (np.minimum.reduceat(tokens[order], starts), np.minimum.reduceat(pairs[order], starts),
            np.add.reduceat(weight[order], starts))


class _Work:
    """work(M): GPU-seconds the batch needs if no group runs longer than M (see `lower_bound`),
    over every level (p, r) that can be a sample's cheapest (`SizeLevels.candidates`); inf when some
    sample fits no micro-batch within M. Also `longest`, the largest over samples of their least
    solo time at a level where they fit.

    For sample i at level l: cost = p (per_token t_i + per_pair a_i) + p t_i fixed / cap, where
    fixed / cap = max(fixed / memory_cap, fixed per_token / (M - fixed - per_pair a_i)), and the
    level is open to i when t_i fits memory_cap and its solo time at l is at most M. Arrays are
    (level slots) x (distinct samples), weighted by how many samples each row stands for;
    everything but M is computed once. With `capped` (and `below`) M caps each micro-batch's
    charge instead of its time: the solo and fixed times, the time share and the weightings are
    the charged ones (`_exposure_bound`)."""

    def __init__(self, tokens: np.ndarray, pairs: np.ndarray, weight: np.ndarray, cm: CostModel,
                 sizes: Sequence[int], below: bool = False, longest: float | None = None,
                 capped: bool = False) -> None:
        k = cm.model.num_layers
        levels = {p: size_levels(cm, p, below) for p in sizes}
        cands = {p: lv.candidates for p, lv in levels.items()}
        slots = sum(max(len(c) for c in cands[p]) for p in sizes)
        if slots * len(tokens) > knobs.BOUND_MAX_CELLS:
            tokens, pairs, weight = round_down(tokens, pairs, weight, max(1, knobs.BOUND_MAX_CELLS // slots))
        self.tokens, self.pairs, self.weight = tokens, pairs, weight
        self.memory_caps = {p: lv.memory_cap for p, lv in levels.items()}
        self.coefs = {p: (lv.fixed, lv.per_token, lv.per_pair) for p, lv in levels.items()}
        rows: list[tuple[int, np.ndarray, np.ndarray]] = []  # (p, level per sample, open by memory)
        for p in sizes:
            lv = levels[p]
            r0 = np.searchsorted(lv.memory_cap, tokens, side="left")  # K + 1: fits nowhere at p
            table = np.full((k + 2, max(len(c) for c in cands[p])), k + 1)
            for r, c in enumerate(cands[p]):
                table[r, :len(c)] = c
            for s in range(table.shape[1]):
                r = table[r0, s]
                rows.append((p, np.minimum(r, k), r <= k))
        gpus = np.array([p for p, _, _ in rows], dtype=np.float64)[:, None]
        fixed = np.stack([levels[p].fixed[r] for p, r, _ in rows])
        per_token = np.stack([levels[p].per_token[r] for p, r, _ in rows])
        per_pair = np.stack([levels[p].per_pair[r] for p, r, _ in rows])
        memory_share = np.stack([levels[p].memory_share[r] for p, r, _ in rows])
        charge = [fixed, per_token, per_pair]
        if below:
            charge = [np.stack([levels[p].charge_fixed[r] for p, r, _ in rows]),
                      np.stack([levels[p].charge_per_token[r] for p, r, _ in rows]),
                      np.stack([levels[p].charge_per_pair[r] for p, r, _ in rows])]
        fits = np.stack([ok for _, _, ok in rows])
        t, a = tokens[None, :], pairs[None, :]
        self.busy = fixed + per_pair * a  # what a micro-batch holding i runs besides its tokens
        self.solo = self.busy + per_token * t
        self.marginal = np.where(fits, gpus * (charge[1] * t + charge[2] * a), np.inf)
        self.gpu_tokens = gpus * t
        # Alone at its cheapest level where it fits: no plan runs shorter than any sample's best.
        # That is its fewest layers (every cost grows with r), priced exactly: with a ring the
        # exact time adds the transfers its attention does not hide, and adding samples to a
        # micro-batch only lengthens every ring step (CostModel.time_s).
        # `longest`, when given (a proven bound on the busy time), stands in for it. Only the
        # samples no other has as many tokens and pairs as (`_front`) are priced: that time
        # only grows with both, so the largest is among them (the others keep 0).
        solo = np.zeros(len(tokens))
        if longest is None and len(tokens):
            front = _front(tokens, pairs)
            least = np.full(len(front), math.inf)
            for p in sizes:
                r0 = np.searchsorted(levels[p].memory_cap, tokens[front], side="left")
                alone = exact_times(cm, p, tokens[front], pairs[front], np.minimum(r0, k))
                least = np.minimum(least, np.where(r0 <= k, alone, math.inf))
            solo[front] = least
        self.solo_best = solo
        """Per sample, its least time alone where it fits, on the (tokens, pairs) front; 0 off it
        (everywhere when `longest` is given)."""
        self.longest = longest if longest is not None else float(solo.max()) if len(solo) else 0.0
        self.memory_share = memory_share
        self.time_share = charge[0] * per_token  # over M - busy: fixed seconds per token when time caps it
        # For `weigh`: each row's size (rows of one size share a weighting) and its samples' fixed time.
        self.row_sizes = gpus[:, 0].astype(np.int64)
        self.fixed = fixed
        if capped:  # the makespan caps each micro-batch's charge, not its time (`_exposure_bound`)
            self.busy = charge[0] + charge[2] * a
            self.solo = self.busy + charge[1] * t
            self.time_share = charge[0] * charge[1]
            self.fixed = charge[0]
        self.weighting: np.ndarray | None = None
        """Per row, the fixed-cost weighting `weigh` chose (0: the token shares); None: all 0."""
        # The least time any micro-batch takes: the least fixed part at any allowed size and level.
        self.fixed_floor = max(0.0, min(float(lv.fixed.min()) for lv in levels.values())) if levels else 0.0

    def __call__(self, makespan: float) -> float:
        return float(self.costs(makespan) @ self.weight)

    def costs(self, makespan: float) -> np.ndarray:
        """Each distinct sample's least GPU-seconds in a plan of busy time `makespan`."""
        if not math.isfinite(makespan):
            cost = self.marginal + self.gpu_tokens * self.memory_share
        else:
            cost = self._charged(makespan)
        return cost.min(axis=0)

    def _charged(self, makespan: float) -> np.ndarray:
        """Per row and sample at a finite makespan: the marginal GPU-seconds plus the fixed cost's
        token share, or at the sizes `weigh` set, the weighting `_weigh` names."""
        open_ = self.solo <= makespan
        left = makespan - self.busy  # > 0 wherever open_ and per_token > 0
        timed = np.divide(self.time_share, left, out=np.zeros_like(left), where=left > 0)
        share = np.maximum(self.memory_share, timed)
        cost = np.where(open_, self.marginal + self.gpu_tokens * share, np.inf)
        if self.weighting is not None:
            for k in range(1, len(_WEIGHTINGS) + 1):
                rows = self.weighting == k
                if rows.any():
                    cost[rows] = self._weighed(k, makespan, rows, open_[rows])
        return cost

    def _weighed(self, k: int, makespan: float, rows: np.ndarray | slice, open_: np.ndarray) -> np.ndarray:
        """`rows`' costs at `makespan` with their fixed costs charged by weighting k (`_weigh`)."""
        fixed = self.fixed[rows]
        # Weighting 3 reads each sample's share of its micro-batch's memory, t / cap, which is
        # t * memory_share / fixed (where the fixed time is 0 its weight charges nothing).
        memory_used = None if k != 3 else np.divide(self.tokens * self.memory_share[rows], fixed,
                                                    out=np.zeros_like(fixed), where=fixed > 0)
        w = _weigh(k, self.solo[rows] - fixed, makespan - fixed, memory_used)
        return np.where(open_, self.marginal[rows] + self.row_sizes[rows, None] * fixed * w, np.inf)

    def weigh(self, makespan: float) -> dict[int, int]:
        """Charges each size's fixed costs by the weighting (`_weigh`; 0: the token shares) under
        which the work at `makespan` is largest, the other sizes' weightings as they stand, size
        after size, over the sizes again while one changes (at most `knobs.BOUND_WEIGH_PASSES` passes): a
        choice is taken only where it raises the work, so it never falls below the token shares'.
        Returns the sizes that took one (and which).

        Why any choice holds: a micro-batch B at level (p, r) in a plan of busy time at most M
        costs p (fixed + its samples' marginal times) GPU-seconds, so charging each of its samples
        its marginal GPU-seconds plus w_i p fixed undercharges it whenever the weights of B's
        samples sum to at most 1. The token shares do (`lower_bound`), and so does each
        weighting; each size may take its own, as a micro-batch is at one size. The choice only
        sets which valid bound is computed (each stays valid at every M, and falls as M grows)."""
        self.weighting = None
        cost = self._charged(makespan)
        rows = cost.shape[0]
        if rows < 2 or not math.isfinite(makespan):
            return {}
        open_ = np.isfinite(cost)
        sizes, row_size = np.unique(self.row_sizes, return_inverse=True)
        # Each weighting's costs on every row (0: the token shares).
        alts = [cost] + [self._weighed(k, makespan, slice(None), open_) for k in range(1, len(_WEIGHTINGS) + 1)]
        choice = np.zeros(len(sizes), dtype=np.int64)
        now = cost.copy()
        for _ in range(knobs.BOUND_WEIGH_PASSES):  # each size's best weighting, the others' as they stand
            changed = False
            for q in range(len(sizes)):
                mine = row_size == q
                others = now[~mine].min(axis=0) if not mine.all() else np.full(now.shape[1], np.inf)
                works = [float(np.minimum(others, alt[mine].min(axis=0)) @ self.weight) for alt in alts]
                k = int(np.argmax(works))
                if works[k] > works[choice[q]] * (1 + 1e-12):
                    choice[q], changed = k, True
                    now[mine] = alts[k][mine]
            if not changed:
                break
        if choice.any():
            self.weighting = choice[row_size]
        return {int(p): int(k) for p, k in zip(sizes, choice, strict=True) if k}


_WEIGHTINGS = ("time share", "over half the time", "over half the memory")
"""The fixed-cost weightings `_weigh` computes, numbered from 1 (0: the token shares)."""


def _weigh(k: int, var_s: np.ndarray, room_s: np.ndarray, memory_used: np.ndarray | None) -> np.ndarray:
    """Weighting k of `_WEIGHTINGS`: fixed-cost weights per (row, sample) whose sum over any
    micro-batch's samples is at most 1 in a plan of busy time M (`_Work.weigh`). A micro-batch
    runs its fixed time and its samples' marginal times within M, so their marginal time as a
    share x of `room_s` (M less the fixed time) sums to at most 1 over it; so does their share y
    of the memory; and so does any dual-feasible function of either (u(x) summed stays at most 1
    wherever x does). 1: x itself, which counts a long sample's attention in full (the token
    shares count only its tokens); 2: 1 where x > 1/2, else 0; 3: 1 where y > 1/2, else 0 (no
    two such samples share a micro-batch: a long sample alone in a large group pays all of it);
    `memory_used` (y) is read by 3 only."""
    if k == 3:
        assert memory_used is not None
        return np.where(memory_used > 0.5, 1.0, 0.0)
    x = np.minimum(np.divide(var_s, room_s, out=np.ones_like(var_s), where=room_s > 0), 1.0)
    return x if k == 1 else np.where(x > 0.5, 1.0, 0.0)


def sample_floors(tokens: np.ndarray, pairs: np.ndarray, cm: CostModel,
                  sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per sample (arrays indexed like `tokens`): the fewest GPU-seconds any micro-batch holding
    it spends on it, and its best time alone, over the allowed sizes where it fits (inf where it
    fits none). The terms of `capacity_bound`, sample by sample, so that the bound of any subset
    of a batch is a sum and a max over it (the phase search prices thousands of splits so)."""
    k = cm.model.num_layers
    work, solo = np.full(len(tokens), math.inf), np.full(len(tokens), math.inf)
    for p in sizes:
        levels = size_levels(cm, p)
        r = np.searchsorted(levels.memory_cap, tokens, side="left")
        fits = r <= k
        r = np.minimum(r, k)
        marginal = p * (levels.per_token[r] * tokens + levels.per_pair[r] * pairs)
        capacity = cm.max_tokens(p, k)
        share = p * levels.fixed[0] / capacity * tokens if capacity > 0 else np.zeros_like(tokens)
        work = np.where(fits, np.minimum(work, marginal + share), work)
        solo = np.where(fits, np.minimum(solo, exact_times(cm, p, tokens, pairs, r)), solo)  # see _Work.longest
    return work, solo


def multi_phase_bound(batch: Sequence[Sample], cm: CostModel, sp_sizes: Sequence[int] | None = None,
                      arrays: tuple[np.ndarray, np.ndarray] | None = None) -> float:
    """A lower bound on the step time of every plan the executor can run, with any number of
    phases: max(`lower_bound`, `capacity_bound`). What the planner reports as a plan's bound.

    Why both hold for a multi-phase plan of busy time M (the last rank's end): their arguments
    use only that every micro-batch runs on one group of p ranks for its whole time, within
    [0, M] (so its time is at most M, and its GPU-seconds p * time), that a rank runs one
    micro-batch at a time (so all of them together take at most N * M GPU-seconds), that each
    micro-batch fits memory, and that the step ends with one gradient sync; a rank may change
    groups between micro-batches without changing any of that. What they do not cover are the
    single-layout arguments of the ILP: its program's dual bound and the configuration program's
    infeasibility proofs assume one group per rank for the whole step (a plan says so in its
    notes when they are higher). tests/test_phases.py checks it against the brute-force optimum
    over every multi-phase plan of tiny batches."""
    return max(lower_bound(batch, cm, sp_sizes, arrays), capacity_bound(batch, cm, sp_sizes, arrays))


def multi_phase_busy(batch: Sequence[Sample], cm: CostModel, sp_sizes: Sequence[int] | None = None,
                     arrays: tuple[np.ndarray, np.ndarray] | None = None) -> float:
    """The busy time no plan the executor can run beats (multi-phase plans included): the larger
    of `lower_bound`'s makespan and `capacity_busy`; `multi_phase_bound` is the step above it."""
    return max(_bounds(batch, cm, sp_sizes, arrays).makespan, capacity_busy(batch, cm, sp_sizes, arrays))
