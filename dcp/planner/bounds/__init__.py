"""Lower bounds on a global batch's step time: every bound of the planner in one place.

A plan has one of three shapes: a single layout (each rank in one group for the whole step), a
multi-phase plan (a rank goes on to another group when its part of a phase ends, `Plan.phases`),
and, under ZeRO-3, lockstep slots (every micro-batch a slot that gathers every layer). Which
bound holds for which (a bound that holds for multi-phase plans holds for single layouts too):

| bound | what it bounds | single layout | multi-phase | ZeRO-3 slots |
|---|---|---|---|---|
| `work._makespan_bound` (work(M) > N M, `work._Work`) | busy time | yes | yes | yes |
| `group.group_bound` with `fixed_floor_s` (the longest sample's group) | busy time | yes | yes | yes |
| `group.group_bound` without it | busy time | yes | no: the group dissolves | yes |
| `group.group_bound` with `chain` (that group and the reductions) | step | yes | yes | no chain |
| `work._exposure_bound` (every rank hides the chain after its last micro-batch) | step | yes | yes | no chain |
| `release._released`, `release._Spread` (when a reduction can start) | step | yes | yes | no chain |
| `release._link_bound` (the fewest slots' collectives) | step | yes | yes | yes (only there) |
| `capacity_busy` (fewest GPU-seconds over N, longest sample), `sample_floors` | busy time | yes | yes | yes |
| `lower_bound`: the work, group (floored), chain and link bounds | step | yes | yes | yes |
| `multi_phase_bound` / `multi_phase_busy`: `lower_bound` and `capacity_bound` | step / busy | yes | yes | yes |
| `single_layout_bound`: `lower_bound`'s with the group bound without the floor | step | yes | no | yes |
| `step_floor`: the least step above a proven busy bound (the MIP's dual bound) | step | yes | yes | yes |
| `one_size_busy` (the longest sample, the marginal work over N / p groups) | busy time | groups of one size p | no | yes |

Outside this package, bounds of one program or one plan family, each beside what it bounds: the
MIP's dual bound and the configuration program's (`ilp.columns.column_bound`; single layouts
only), a baseline's own busy time (`ilp.warm.baseline_bound`: that baseline's plans only), the
phase split's (`phases.split_estimates`: plans that run the two sides one after the other, from
`sample_floors`) and the rank-pattern bound (`benchmarks/rank_patterns.py`: offline, not in the
solve path). tests/test_bounds.py, test_sync_bound.py and test_phases.py check them against
brute-force optima of tiny batches.

The work bounds are sums over samples of a per-sample cost, so identical samples are counted
once with a weight, and tens of thousands of samples cost a few array operations.
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
from dcp.costmodel.schedule import least_exposed_s, least_step_s, reduction_chain_s
from dcp.planner.bounds.group import group_bound, longest_group
from dcp.planner.bounds.release import _least_step, _link_bound, _released, _Spread
from dcp.planner.bounds.work import _coarse, _exposure_bound, _makespan_bound, _Work, size_levels
from dcp.planner.feasibility import allowed_sp_sizes
from dcp.planner.pricing import BatchArrays, Pricer, exact_times
from dcp.planner.sample import Sample

_MEMO: weakref.WeakKeyDictionary[CostModel, dict[tuple, _Floors]] = weakref.WeakKeyDictionary()
"""Recent bounds per cost model: every baseline plan of a batch reports the same bound."""


def sample_arrays(batch: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray]:
    """Tokens and attention pairs of the batch's samples (float64)."""
    arrays = BatchArrays.of(batch)
    return arrays.tokens, arrays.pairs


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
            lower = group_bound(coarse, cm, sizes, lower, coarse.fixed_floor, group, (least_exposed_s(cm), float(chain[-1])))
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


def single_layout_bound(batch: Sequence[Sample], cm: CostModel, sp_sizes: Sequence[int] | None = None,
                        arrays: tuple[np.ndarray, np.ndarray] | None = None) -> float:
    """`lower_bound` raised by charging the longest sample's group (`group.group_bound`):
    valid for single-layout plans only, where that group keeps its size for the whole step. A
    multi-phase plan dissolves it once its sample is done, so this bound does not hold there."""
    return _bounds(batch, cm, sp_sizes, arrays).single_layout


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


def one_size_busy(arrays: BatchArrays, cm: CostModel, p: int, pricer: Pricer) -> float:
    """A bound on the busy time of a plan whose groups all have SP size p (the fill's): its
    longest sample's time alone at p (inf where one does not fit; every micro-batch holding it
    runs at least that) and the samples' marginal time without checkpointing (each group runs at
    least its samples' sum) spread over the N // p groups, the larger."""
    line = cm.linear_time(p, 0)
    work = line.per_token * float(arrays.tokens.sum()) + line.per_pair * float(arrays.pairs.sum())
    return max(float(pricer.times(p, arrays.tokens, arrays.pairs).max()), work / (cm.cluster.num_gpus // p))


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
