"""dcp-greedy: the DCP paper's runtime (NUS, "Training Variable Long Sequences With Data-centric
Parallel"; NUS-HPC-AI-Lab/VideoSys), priced by the cost model instead of profiled (docs/design.md):
per length bucket a profiled (SP, batch size), GPUs per SP class by work, balanced accumulation,
stragglers promoted, ZeRO-3 slots merged and lined up. pyramid=True (DCP-intra) checkpoints only
what a micro-batch must, False all; milliseconds, the ILP's fallback.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

import dcp.planner.knobs as knobs
from dcp.costmodel import CostModel
from dcp.costmodel.schedule import slot_link_s
from dcp.planner.baselines import group_share, lpt_assign, plan_by
from dcp.planner.bounds import makespan_floor
from dcp.planner.common import aligned_layout
from dcp.planner.lpt import by_group, hand_out
from dcp.planner.options import GreedyOptions
from dcp.planner.plan import Plan
from dcp.planner.pricing import BatchArrays, Layout, Pricer, price_layout
from dcp.planner.sample import Sample
from dcp.planner.slots import align, slots_estimate


@dataclass(frozen=True)
class BucketProfile:
    """The (SP size, batch size) the paper's profiler keeps for one length bucket."""

    sp: int
    batch_size: int
    time_s: float
    """Time of one full micro-batch of the bucket's longest sample (s)."""

    @property
    def samples_per_gpu_s(self) -> float:
        return self.batch_size / (self.sp * self.time_s)


def profile_bucket(longest: Sample, count: int, cm: CostModel, sizes: Sequence[int], pyramid: bool,
                   pricer: Pricer | None = None) -> BucketProfile:
    """The paper's profile loop, priced: up to `group_share` copies of the bucket's longest."""
    pricer = pricer or Pricer(cm, sizes)
    k = cm.model.num_layers
    best: BucketProfile | None = None
    for p in sorted(sizes):
        b = np.arange(1, group_share(count, p, cm.cluster.num_gpus) + 1, dtype=np.float64)
        t = pricer.times(p, b * longest.tokens, b * longest.attn_pairs, None if pyramid else k)
        # Memory grows with b: the batch sizes that fit are a prefix (none: try the next SP size).
        fit = int(np.argmin(np.isfinite(t))) if not np.isfinite(t).all() else len(t)
        if fit == 0:
            continue
        rate = b[:fit] / (p * t[:fit])
        j = int(np.argmax(rate))
        prof = BucketProfile(p, j + 1, float(t[j]))
        if best is None or prof.samples_per_gpu_s > best.samples_per_gpu_s * (1 + 1e-12):
            best = prof
    assert best is not None, "check_feasible guarantees the largest SP size fits a lone sample"
    return best


@dataclass
class _MicroBatches:
    """Profiled micro-batches: members (from `starts`), home size index, times at every size."""

    order: np.ndarray
    starts: np.ndarray
    home: np.ndarray
    times: np.ndarray

    def rehomed(self, home: np.ndarray) -> _MicroBatches:
        return _MicroBatches(self.order, self.starts, home, self.times)


def _microbatches(batch: Sequence[Sample], arrays: BatchArrays, cm: CostModel, pricer: Pricer,
                  pyramid: bool, notes: list[str]) -> _MicroBatches:
    sizes, k = pricer.sizes, cm.model.num_layers
    # Power-of-two buckets (`baselines.length_bucket`): frexp's exponent of t - 1 is its bit length.
    bucket = np.frexp(arrays.tokens - 1)[1]
    order, counts, home = [], [], []
    for e in np.unique(bucket):
        idx = np.flatnonzero(bucket == e)
        # The bucket's longest sample: most tokens, then most pairs, then lowest id.
        top = idx[np.lexsort((arrays.ids[idx], -arrays.pairs[idx], -arrays.tokens[idx]))[0]]
        prof = profile_bucket(batch[int(top)], len(idx), cm, sizes, pyramid, pricer)
        notes.append(f"bucket {1 << int(e)}: sp {prof.sp}, batch size {prof.batch_size}")
        order.append(idx[np.lexsort((arrays.ids[idx], -arrays.tokens[idx]))])
        full, rest = divmod(len(idx), prof.batch_size)
        counts += [prof.batch_size] * full + ([rest] if rest else [])
        home += [sizes.index(prof.sp)] * (full + bool(rest))
    flat = np.concatenate(order)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    tokens = np.add.reduceat(arrays.tokens[flat], starts[:-1])
    pairs = np.add.reduceat(arrays.pairs[flat], starts[:-1])
    times = np.stack([pricer.times(p, tokens, pairs, None if pyramid else k) for p in sizes], axis=1)
    return _MicroBatches(flat, starts, np.array(home, dtype=np.int64), times)


def allocate_groups(mbs: _MicroBatches, sizes: Sequence[int], num_gpus: int) -> tuple[np.ndarray, dict[int, int]]:
    """Groups per class (size index -> count) and the classes after small ones joined larger."""
    home = mbs.home.copy()
    rows = np.arange(len(home))
    # Sizes can add up past N (32 and 16 on 32 GPUs): fold the smallest class into the next larger.
    while sum(sizes[j] for j in set(home.tolist())) > num_gpus:
        lo = min(home.tolist())
        home[home == lo] = min(j for j in set(home.tolist()) if j > lo)
    own = mbs.times[rows, home]
    work = {j: sizes[j] * float(own[home == j].sum()) for j in set(home.tolist())}
    total = sum(work.values())
    groups: dict[int, int] = {}
    count: dict[int, int] = {}
    left = num_gpus
    for j in range(len(sizes) - 1, -1, -1):  # a class joining the one below is seen again there
        ids = rows[home == j]
        if not len(ids):
            continue
        p = sizes[j]
        n = round(num_gpus * work[j] / total / p) if total > 0 else 1
        below = [q for q in range(j) if np.isfinite(mbs.times[ids, q]).all()]
        if n == 0 and below:
            q = max(below)  # too little work for a group of its own: the next size down
            home[ids] = q
            work[q] = work.get(q, 0.0) + sizes[q] * float(mbs.times[ids, q].sum())
            continue
        reserve = sum(sizes[q] for q in work if q < j and (home == q).any())  # one group each below
        n = max(1, min(n, (left - reserve) // p, len(ids)))
        groups[j], count[j] = n, len(ids)
        left -= n * p
    # Rounding leaves GPUs over: to the classes whose groups carry the most load per group.
    hand_out(groups, sizes, left, lambda q: (work[q] / (sizes[q] * groups[q]), q), count)
    return home, groups


def _estimate(mbs: _MicroBatches, home: np.ndarray, groups: dict[int, int]) -> float:
    """A schedule's step before balancing (`bounds.makespan_floor` of its classes)."""
    own = mbs.times[np.arange(len(home)), home]
    return max(makespan_floor(float(own[home == j].sum()), n, float(own[home == j].max())) for j, n in groups.items())


class _Schedule:
    """Micro-batches on groups: each class LPT over its own groups, then spilled to balance."""

    def __init__(self, mbs: _MicroBatches, home: np.ndarray, groups: dict[int, int]) -> None:
        self.mbs = mbs
        self.size_of = np.array([j for j in sorted(groups, reverse=True) for _ in range(groups[j])], dtype=np.int64)
        self.where = np.full(len(home), -1, dtype=np.int64)
        first = 0
        for j in sorted(groups, reverse=True):
            ids = np.flatnonzero(home == j)
            for g, jobs in enumerate(lpt_assign(mbs.times[ids, j].tolist(), groups[j])):
                self.where[ids[jobs]] = first + g
            first += groups[j]
        self.loads = np.bincount(self.where, weights=mbs.times[np.arange(len(home)), self.size_of[self.where]],
                                 minlength=len(self.size_of))
        self._balance()

    def step_s(self) -> float:
        return float(self.loads.max())

    def _balance(self) -> None:
        """While it helps: one of the slowest group's micro-batches to where it ends first."""
        times = self.mbs.times
        by_size = np.ascontiguousarray(times.T)  # one size's times of any members, contiguous
        size_of, loads = self.size_of, self.loads
        n_groups = len(size_of)
        first = np.unique(-size_of, return_index=True)[1]
        starts = first.tolist()
        ends = np.append(first[1:], n_groups).tolist()
        block_of = np.repeat(np.arange(len(starts)), np.diff(np.append(first, n_groups)))
        block_size = size_of[first]

        def least_of(b: int) -> int:  # the block's first least-loaded group
            return starts[b] + int(np.argmin(loads[starts[b]:ends[b]]))

        least = np.array([least_of(b) for b in range(len(starts))], dtype=np.int64)
        members = by_group(self.where, n_groups)
        for _ in range(2 * len(self.where) + 64):
            c = int(np.argmax(loads))
            jc, mine, bc = int(size_of[c]), members[c], int(block_of[c])
            heads, sizes = least, block_size
            if least[bc] == c:  # the slowest group is its block's least loaded: the next one there
                f, e = starts[bc], ends[bc]
                if e - f == 1:
                    keep = np.arange(len(starts)) != bc
                    heads, sizes = least[keep], block_size[keep]
                else:
                    others = loads[f:e].copy()
                    others[c - f] = np.inf
                    heads = least.copy()
                    heads[bc] = f + int(np.argmin(others))
            if not len(heads):
                return
            left = loads[c] - by_size[jc, mine]
            val = np.maximum(loads[heads][:, None] + by_size[sizes[:, None], mine], left[None, :])
            best = float(val.min())
            if not best < loads[c] * (1 - 1e-9):
                return
            hit = val == best
            i = int(np.argmax(hit.any(axis=0)))  # the first member with the best value, then its first size
            h = int(heads[int(np.argmax(hit[:, i]))])
            mb = int(mine[i])
            loads[c] -= times[mb, jc]
            loads[h] += times[mb, size_of[h]]
            self.where[mb] = h
            members[c] = np.concatenate((mine[:i], mine[i + 1:]))
            at, there = int(np.searchsorted(members[h], mb)), members[h]
            members[h] = np.concatenate((there[:at], mine[i:i + 1], there[at:]))
            for b in {bc, int(block_of[h])}:
                least[b] = least_of(b)


def _promote(mbs: _MicroBatches, target_s: float) -> np.ndarray:
    """Micro-batches over `target_s` at home moved to the smallest larger size within it."""
    rows = np.arange(len(mbs.home))
    over = mbs.times[rows, mbs.home] > target_s
    ok = (mbs.times <= target_s) & (np.arange(mbs.times.shape[1])[None, :] >= mbs.home[:, None])
    first_ok = np.where(ok.any(axis=1), np.argmax(ok, axis=1), np.argmin(mbs.times, axis=1))
    return np.where(over, np.maximum(first_ok, mbs.home), mbs.home)


def _promote_stragglers(mbs: _MicroBatches, sizes: Sequence[int], num_gpus: int) -> _Schedule:
    """The profile runs attention-bound long samples small, where one can outlast the step: promote
    those over lower target steps, keep the best estimate, then grow the slowest group's longest."""
    home, groups = allocate_groups(mbs, sizes, num_gpus)
    best = _Schedule(mbs, home, groups)
    floor = float(mbs.times.min(axis=1).max())  # no schedule beats its longest micro-batch
    target, chosen = best.step_s(), None
    est_best = _estimate(mbs, home, groups)
    previous = mbs.home
    for _ in range(knobs.GREEDY_MAX_PROMOTIONS):
        target *= 0.8
        if target < floor:
            break
        home = _promote(mbs, target)
        if np.array_equal(home, previous):
            continue  # the same classes as the last target: the same estimate, never better
        previous = home
        trial = mbs.rehomed(home)
        est = _estimate(trial, *allocate_groups(trial, sizes, num_gpus))
        if est < est_best * (1 - 1e-9):
            est_best, chosen = est, trial
    if chosen is not None:
        trial_schedule = _Schedule(chosen, *allocate_groups(chosen, sizes, num_gpus))
        if trial_schedule.step_s() < best.step_s() * (1 - 1e-9):
            mbs, best = chosen, trial_schedule
    for _ in range(knobs.GREEDY_MAX_PROMOTIONS if len(mbs.home) <= knobs.GREEDY_PROMOTE_UP_TO else 0):
        c = int(np.argmax(best.loads))
        members = np.flatnonzero(best.where == c)
        mb = int(members[np.argmax(mbs.times[members, best.size_of[c]])])
        if mbs.home[mb] + 1 >= len(sizes):
            break
        trial_home = mbs.home.copy()
        trial_home[mb] += 1
        trial_mbs = mbs.rehomed(trial_home)
        trial = _Schedule(trial_mbs, *allocate_groups(trial_mbs, sizes, num_gpus))
        if trial.step_s() >= best.step_s() * (1 - 1e-9):
            break
        mbs, best = trial_mbs, trial
    return best


def greedy_layout(batch: Sequence[Sample], cm: CostModel, options: GreedyOptions, sizes: Sequence[int],
                  arrays: BatchArrays, pricer: Pricer) -> tuple[Layout, list[list[int]], list[str]]:
    """The greedy's groups, each micro-batch's checkpointed layers, and one note per bucket."""
    notes: list[str] = []
    mbs = _microbatches(batch, arrays, cm, pricer, options.pyramid, notes)
    schedule = _promote_stragglers(mbs, sizes, cm.cluster.num_gpus)
    mbs = schedule.mbs
    counts: dict[int, int] = {}
    for j in schedule.size_of:
        counts[sizes[j]] = counts.get(sizes[j], 0) + 1
    layout: Layout = []
    ckpt: list[list[int]] = []
    k = cm.model.num_layers
    tokens = np.add.reduceat(arrays.tokens[mbs.order], mbs.starts[:-1])
    order, starts = mbs.order.tolist(), mbs.starts.tolist()
    # Each group's micro-batches longest first (ties by number), groups numbered as _Schedule does.
    by_group = np.lexsort((np.arange(len(schedule.where)),
                           -mbs.times[np.arange(len(schedule.where)), schedule.size_of[schedule.where]],
                           schedule.where))
    cuts = np.searchsorted(schedule.where[by_group], np.arange(len(schedule.size_of) + 1)).tolist()
    pairs = np.add.reduceat(arrays.pairs[mbs.order], mbs.starts[:-1])
    slot_s = slot_link_s(cm)  # 0 below ZeRO-3
    # aligned_layout places groups largest first, as _Schedule numbers them.
    for g, (start, p) in enumerate(aligned_layout(counts, cm.cluster.num_gpus)):
        jobs = by_group[cuts[g]:cuts[g + 1]].tolist()
        parts = [order[starts[m]:starts[m + 1]] for m in jobs]
        if slot_s > 0:
            parts = _fewer_slots(parts, tokens[jobs], pairs[jobs], p, pricer, None if options.pyramid else k,
                                 slot_s)
        layout.append((start, p, parts))
    if slot_s > 0:
        layout = _aligned(layout, arrays, pricer, slot_s, None if options.pyramid else k)
    for _, p, parts in layout:
        part_tokens = np.array([arrays.tokens[part].sum() for part in parts])
        ckpt.append(pricer.levels(p, part_tokens, None if options.pyramid else k).tolist())
    return layout, ckpt, notes


def _aligned(layout: Layout, arrays: BatchArrays, pricer: Pricer, slot_s: float, ckpt: int | None) -> Layout:
    """ZeRO-3: the layout's slots lined up (`slots.align`) where that estimates a faster step."""
    aligned = align(layout, arrays, pricer, slot_s, ckpt)
    if aligned is None:
        return layout
    priced = price_layout(layout, arrays, pricer, [[ckpt] * len(mbs) for _, _, mbs in layout] if ckpt is not None else None)
    own = np.zeros((len(layout), max(priced.counts)))
    for g, (at, count) in enumerate(zip(np.cumsum(priced.counts) - priced.counts, priced.counts, strict=True)):
        own[g, :count] = priced.times_s[at:at + count]
    return aligned[0] if aligned[1] < slots_estimate(own, slot_s)[0] else layout


def _fewer_slots(parts: list[list[int]], tokens: np.ndarray, pairs: np.ndarray, p: int, pricer: Pricer,
                 ckpt: int | None, slot_s: float) -> list[list[int]]:
    """ZeRO-3: a group's two shortest micro-batches merged while faster; longest first."""
    times = pricer.times(p, tokens, pairs, ckpt).tolist()
    heap = [(t, i) for i, t in enumerate(times)]
    heapq.heapify(heap)
    members = dict(enumerate(parts))
    held = {i: (float(tokens[i]), float(pairs[i])) for i in range(len(parts))}
    while len(heap) >= 2:
        (ta, a), (tb, b) = heapq.heappop(heap), heapq.heappop(heap)
        t_sum, a_sum = held[a][0] + held[b][0], held[a][1] + held[b][1]
        together = float(pricer.times(p, np.array([t_sum]), np.array([a_sum]), ckpt)[0])
        if not together < slots_estimate(np.array([[ta, tb]]), slot_s)[0]:  # inf where it does not fit
            heap += [(ta, a), (tb, b)]
            break
        new = len(held)
        members[new], held[new] = members.pop(a) + members.pop(b), (t_sum, a_sum)
        heapq.heappush(heap, (together, new))
    return [members[i] for _, i in sorted(heap, key=lambda e: (-e[0], e[1]))]


def solve_greedy(batch: Sequence[Sample], cm: CostModel, options: GreedyOptions | None = None) -> Plan:
    """Plan one global batch the way DCP's runtime does (see the module docstring)."""
    options = options or GreedyOptions()
    return plan_by("dcp-greedy" if options.pyramid else "dcp-greedy-inter", batch, cm, options.sp_sizes,
                   lambda sizes, arrays: greedy_layout(batch, cm, options, sizes, arrays, Pricer(cm, sizes)))
