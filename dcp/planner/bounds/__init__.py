"""Lower bounds on a global batch's step time: every bound of the planner in one place.

Plan shapes: a single layout (each rank in one group for the whole step), a multi-phase plan (a rank
goes on to another group when its part of a phase ends, `Plan.phases`) and, under ZeRO-3, lockstep
slots (every micro-batch a slot that gathers every layer). A bound that holds for multi-phase plans
holds for single layouts too. Proofs: docs/design.md, Why each bound holds.

| bound | bounds | single layout | multi-phase | ZeRO-3 slots |
|---|---|---|---|---|
| `work.makespan_floor` (max(total / machines, longest), no job split) | busy | yes | yes | yes |
| `work._makespan_bound` (work(M) > N M, `work._Work`) | busy | yes | yes | yes |
| `group.group_bound` with `fixed_floor_s` (longest sample's group) | busy | yes | yes | yes |
| `group.group_bound` without it | busy | yes | no: the group dissolves | yes |
| `group.group_bound` with `chain` (that group and the reductions) | step | yes | yes | no chain |
| `work._exposure_bound` (each rank hides the chain after its last) | step | yes | yes | no chain |
| `release._released`, `release._Spread` (when reductions can start) | step | yes | yes | no chain |
| `schedule.least_link_s` of `release._fewest_slots` (the fewest slots' collectives; their contention) | step | yes | yes | yes (only there) |
| `capacity_busy` (GPU-seconds over N, longest sample), `sample_floors` | busy | yes | yes | yes |
| `lower_bound`: the work, group (floored), chain and link bounds | step | yes | yes | yes |
| `multi_phase_bound` / `_busy`: `lower_bound`, `capacity_bound` | step / busy | yes | yes | yes |
| `single_layout_bound`: `lower_bound` with the unfloored group bound | step | yes | no | yes |
| `step_floor`: the least step above a proven busy bound (the MIP's dual) | step | yes | yes | yes |
| `one_size_busy` (longest sample, marginal work over N / p groups) | busy | one size p | no | yes |
| `baseline_busy` (a baseline's least work over its groups, longest sample) | busy | that baseline's | no | that baseline's |
| `ilp.columns.column_bound` (configuration LP infeasible at a level) | busy | yes | no | yes |
| `split_busy` (per side `makespan_floor` of `sample_floors`, sides added) | busy | no | two sides in turn | no phases |

`column_bound` runs the configuration program's master and pricing, so it stays beside that
program; the MIP's dual bound and the rank-pattern bound (`benchmarks/rank_patterns.py`, offline)
too. tests/test_bounds.py, test_sync_bound.py and test_phases.py check the bounds against
brute-force optima of tiny batches.
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
from dcp.planner.bounds.group import group_bound, longest_group
from dcp.planner.bounds.release import _fewest_slots, _least_step, _released, _Spread
from dcp.planner.bounds.work import (
    _coarse,
    _exposure_bound,
    _makespan_bound,
    _Work,
    makespan_floor,
    size_levels,
)
from dcp.planner.feasibility import allowed_sp_sizes
from dcp.planner.options import GreedyOptions, PackedOptions, StrategyOptions
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
    """The busy time no plan can beat plus the least synchronization any schedule adds, in
    seconds: at least the longest sample's best time alone, every makespan M at which the batch's
    work does not fit N GPUs (`work._makespan_bound`), the longest sample's group (floored,
    `group.group_bound`), at stages 0-2 the reductions the last backward passes cannot hide
    (`release`, `work._exposure_bound`), under ZeRO-3 the fewest slots' collectives. Holds for
    every plan the executor can run, multi-phase included (proof: docs/design.md, Why each bound
    holds). `sp_sizes` None: every allowed size; `arrays`: (tokens, pairs), if in hand."""
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
        # The group bound and the spread release evaluate every sample at many busy times: on at
        # most knobs.BOUND_COARSE classes, rounded down (`round_down`: a bound can only fall).
        coarse = work if len(work.tokens) <= knobs.BOUND_COARSE else _Work(*_coarse(work), cm, sizes)
        # Token shares, then from there each size's weighting of fixed costs (`_Work.weigh`).
        pooled = _makespan_bound(work, cm.cluster.num_gpus)
        if coarse.weigh(pooled):
            pooled = _makespan_bound(coarse, cm.cluster.num_gpus, pooled)
        group = longest_group(coarse, cm, sizes) if len(coarse.tokens) >= 2 else None  # read by all three below
        makespan = group_bound(coarse, cm, sizes, pooled, coarse.fixed_floor, group)
        released = _released(cm, sizes, tokens, pairs)
        spread = _Spread(cm, sizes, coarse.tokens, coarse.pairs, coarse.weight) if released is not None else None
        slots = _fewest_slots(float(tokens.sum()), cm, sizes)
        link = least_link_s(cm, slots)
        single = group_bound(coarse, cm, sizes, makespan, group=group)
        lower = max(_least_step(cm, makespan, sizes, released, spread, slots), link)
        chain = reduction_chain_s(cm)
        if chain is not None:  # stages 0-2: the longest sample's group against the reduction chain
            lower = group_bound(coarse, cm, sizes, lower, coarse.fixed_floor, group, (least_exposed_s(cm), float(chain[-1])))
            lower = _exposure_bound(coarse, cm, sizes, lower, chain)
        floor_work, solo = sample_floors(d_tokens, d_pairs, cm, sizes)
        capacity = makespan_floor(float(floor_work @ weight), cm.cluster.num_gpus, float(solo.max()))
        memo[key] = _Floors(lower, max(_least_step(cm, single, sizes, released, spread, slots), link, lower),
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
    """`lower_bound` raised by the longest sample's group without the fixed floor
    (`group.group_bound`): single-layout plans only, where that group keeps its size for the
    whole step; a multi-phase plan dissolves it once its sample is done."""
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
    """max(total least GPU-seconds / N, the longest sample's best time alone), in seconds: a
    bound on every plan's busy time, each micro-batch's fixed cost spread over the most tokens
    that fit memory (proof: docs/design.md, Why each bound holds). Weaker than `lower_bound`'s
    makespan when fixed costs are heavy (ZeRO-3); the floor the ILP's search is tuned on."""
    return _bounds(batch, cm, sp_sizes, arrays).capacity


def sample_floors(tokens: np.ndarray, pairs: np.ndarray, cm: CostModel,
                  sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per sample (indexed like `tokens`): the fewest GPU-seconds any micro-batch holding it
    spends on it, and its best time alone, over the `sizes` where it fits (inf where it fits
    none). `capacity_bound`'s terms sample by sample, so that a subset's bound is a sum and a max
    over it (the phase search prices thousands of splits so)."""
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


def baseline_busy(options: StrategyOptions, cm: CostModel, sizes: Sequence[int], arrays: BatchArrays, pricer: Pricer,
                  p: int, budget: int) -> float:
    """A lower bound on the busy time of a baseline's plan, whatever it packs, at the static SP
    size p and packing's token `budget` it chooses: each micro-batch costs at least fixed +
    per_token T + per_pair A at the fewest layers its samples allow (all K for bucket and
    dcp-greedy-inter; for packing, those of a bin more than half full, `_packed_work`), so its
    groups carry at least their samples' marginal costs, over N / p groups (static) or N GPUs
    (mixed, in GPU-seconds); and no group is shorter than its longest sample."""
    k, n = cm.model.num_layers, cm.cluster.num_gpus
    if isinstance(options, GreedyOptions):
        if options.pyramid:
            return 0.0  # dcp-greedy itself: always run, never bounded away
        work, longest = np.full(len(arrays.tokens), np.inf), np.full(len(arrays.tokens), np.inf)
        for q in sizes:
            solo = pricer.times(q, arrays.tokens, arrays.pairs, k)
            lin = cm.linear_time(q, k)
            marginal = q * (lin.per_token * arrays.tokens + lin.per_pair * arrays.pairs)
            work = np.minimum(work, np.where(np.isfinite(solo), marginal, np.inf))
            longest = np.minimum(longest, solo)
        return makespan_floor(float(work.sum()), n, float(longest.max()))
    if isinstance(options, PackedOptions):
        return makespan_floor(_packed_work(p, budget, cm, arrays, pricer), n // p,
                              float(pricer.times(p, arrays.tokens, arrays.pairs).max()))
    solo = pricer.times(p, arrays.tokens, arrays.pairs, k)
    lin = cm.linear_time(p, k)
    marginal = lin.per_token * arrays.tokens + lin.per_pair * arrays.pairs
    return makespan_floor(float(marginal.sum()), n // p, float(solo.max()))


def _packed_work(p: int, budget: int, cm: CostModel, arrays: BatchArrays, pricer: Pricer) -> float:
    """Group-seconds packing's micro-batches take at least. First fit leaves at most one bin at
    most half full (a later bin's items would have fit it), so every other micro-batch holds
    more than half the token budget and checkpoints at least the layers that takes; the one bin
    holds at most half the budget, at most the batch's densest pairs per token."""
    k = cm.model.num_layers
    tokens, pairs = float(arrays.tokens.sum()), float(arrays.pairs.sum())
    half = min(int(pricer.layers(p, np.array([budget // 2 + 1.0]))[0]), k)
    full, least = cm.linear_time(p, half), cm.linear_time(p, 0)
    low_tokens = min(tokens, budget / 2)
    low_pairs = min(pairs, float((arrays.pairs / arrays.tokens).max()) * low_tokens)
    bins = max(1, math.ceil(tokens / budget))
    return ((bins - 1) * full.fixed + least.fixed + full.per_token * (tokens - low_tokens)
            + least.per_token * low_tokens + full.per_pair * (pairs - low_pairs) + least.per_pair * low_pairs)


def split_busy(batch: Sequence[Sample], cm: CostModel, sizes: Sequence[int], order: np.ndarray) -> np.ndarray:
    """For every split k = 1..n-1 of the batch in `order` (its first k samples in phase 1, the
    rest in phase 2), a lower bound on the busy time of any plan that runs the phases one after
    the other: each side's `makespan_floor` of its `sample_floors`, added."""
    tokens, pairs = sample_arrays([batch[i] for i in order.tolist()])
    work, solo = sample_floors(tokens, pairs, cm, sizes)
    n = cm.cluster.num_gpus
    head = makespan_floor(np.cumsum(work)[:-1], n, np.maximum.accumulate(solo)[:-1])
    return head + makespan_floor(np.cumsum(work[::-1])[::-1][1:], n, np.maximum.accumulate(solo[::-1])[::-1][1:])


def one_size_busy(arrays: BatchArrays, cm: CostModel, p: int, pricer: Pricer) -> float:
    """A bound on the busy time of a plan whose groups all have SP size p (the fill's): the
    larger of its longest sample's time alone at p (inf where one does not fit) and the samples'
    marginal time without checkpointing spread over the N // p groups."""
    line = cm.linear_time(p, 0)
    work = line.per_token * float(arrays.tokens.sum()) + line.per_pair * float(arrays.pairs.sum())
    return makespan_floor(work, cm.cluster.num_gpus // p, float(pricer.times(p, arrays.tokens, arrays.pairs).max()))


def multi_phase_bound(batch: Sequence[Sample], cm: CostModel, sp_sizes: Sequence[int] | None = None,
                      arrays: tuple[np.ndarray, np.ndarray] | None = None) -> float:
    """A lower bound on the step time of every plan the executor can run, any number of phases:
    max(`lower_bound`, `capacity_bound`); what the planner reports as a plan's bound. Both
    arguments hold when ranks change groups between micro-batches; the ILP's dual bound and the
    configuration program's proofs do not (a plan's notes say when they are higher).
    tests/test_phases.py checks it against the brute-force optimum of tiny batches."""
    return max(lower_bound(batch, cm, sp_sizes, arrays), capacity_bound(batch, cm, sp_sizes, arrays))


def multi_phase_busy(batch: Sequence[Sample], cm: CostModel, sp_sizes: Sequence[int] | None = None,
                     arrays: tuple[np.ndarray, np.ndarray] | None = None) -> float:
    """The busy time no plan the executor can run beats (multi-phase plans included): the larger
    of `lower_bound`'s makespan and `capacity_busy`; `multi_phase_bound` is the step above it."""
    return max(_bounds(batch, cm, sp_sizes, arrays).makespan, capacity_busy(batch, cm, sp_sizes, arrays))
