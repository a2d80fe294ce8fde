"""Nested two-phase plans for batches of under `knobs.BACKFILL_MIN_PER_GPU` samples per GPU, too few
for a backfill (docs/design.md, "Multi-phase plans"): per target T (`knobs.NESTED_LEVELS` times the
busy bound), each sample at its cheapest size within T; those at the largest such size first in as
few groups as fit T, the rest after, each where it costs the fewest GPU-seconds within T.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

import dcp.planner.knobs as knobs
from dcp.costmodel import CostModel
from dcp.planner.backfill import Candidate, assemble_candidate, pack_per_size
from dcp.planner.ilp.budget import Deadline
from dcp.planner.ilp.costs import CostTable, batch_costs, form_microbatches
from dcp.planner.plan import Plan
from dcp.planner.pricing import BatchArrays, Pricer, price_layout
from dcp.planner.sample import Sample


def nested_plan(batch: Sequence[Sample], cm: CostModel, sizes: Sequence[int], busy_floor_s: float,
                arrays: BatchArrays | None = None, max_microbatches: int | None = None,
                costs: tuple[Pricer, CostTable] | None = None, time_limit_s: float = math.inf,
                cut: Deadline | None = None) -> Plan | None:
    """The fastest nested plan over the targets times `busy_floor_s` (a busy-time lower bound, s),
    validated; None at the backfill's samples per GPU, one size, ZeRO-3, or if no target fits
    `max_microbatches`. `costs`: (pricer, cost table) or None; `time_limit_s` bounds the targets."""
    n = cm.cluster.num_gpus
    if len(batch) >= knobs.BACKFILL_MIN_PER_GPU * n or len(sizes) < 2 or cm.training.zero_stage == 3:
        return None
    arrays = arrays if arrays is not None else BatchArrays.of(batch)
    pricer, table = costs if costs is not None else batch_costs(arrays, cm, sizes)
    best: Plan | None = None
    started = time.perf_counter()
    for k, level in enumerate(knobs.NESTED_LEVELS):
        now = time.perf_counter()
        if k >= 1 and (now - started) * (k + 1) / k > knobs.NESTED_LEVELS_SHARE * time_limit_s:
            if cut is not None:
                cut.record()
            break
        cand = nested_candidate(table, cm, arrays, pricer, busy_floor_s * level)
        if cand is None or not cand.within(max_microbatches):
            continue
        plan = assemble_candidate(batch, cm, arrays, pricer, cand)
        if best is None or plan.step_time_s < best.step_time_s:
            best = plan
    return best


def nested_candidate(table: CostTable, cm: CostModel, arrays: BatchArrays, pricer: Pricer, target_s: float,
                     q1: int | None = None) -> Candidate | None:
    """The plan for `target_s`, phase 1 the samples at sizes of at least `q1` (default: the largest
    chosen); None when phase 1 needs more GPUs than there are or no sample runs above SP 1."""
    n, sizes = cm.cluster.num_gpus, table.sizes
    size_arr = np.asarray(sizes)
    add, solo = table.add, table.solo
    within = solo <= target_s
    choice = np.where(within.any(axis=1), np.argmin(np.where(within, add * size_arr, np.inf), axis=1),
                      np.argmin(solo, axis=1))
    q1 = int(size_arr[choice].max()) if q1 is None else q1
    if q1 <= 1:
        return None
    ids = np.arange(len(table.tokens))
    head = ids[size_arr[choice] >= q1]
    first = pack_per_size(head, choice[head], add, target_s, sizes, n)
    if first is None:
        return None
    ready = np.zeros(n)  # head is not empty (q1 is some sample's size): phase 1 has groups
    busy = price_layout([(s, sizes[j], form_microbatches(m, j, table, cm)) for s, j, m in first], arrays,
                        pricer).busy_s
    for (s, j, _), e in zip(first, busy.tolist(), strict=True):
        ready[s:s + sizes[j]] = e
    rest = ids[size_arr[choice] < q1]
    rest = rest[np.lexsort((-add[rest, choice[rest]], -size_arr[choice[rest]]))]
    phase2 = _Phase2(n, sizes, ready, first)
    for i in rest.tolist():
        phase2.place(i, add[i], solo[i], target_s)
    lay1 = [(s, sizes[j], form_microbatches(m, j, table, cm)) for s, j, m in first]
    lay2 = [(s, sizes[j], form_microbatches(m, j, table, cm)) for s, j, m in phase2.groups()]
    return Candidate(lay1, lay2, phase2.end(), False)


class _Phase2:
    """Phase 2's groups as samples are placed, each choice among all options at once."""

    def __init__(self, n: int, sizes: Sequence[int], ready: np.ndarray,
                 first: list[tuple[int, int, list[int]]]) -> None:
        self.sizes = list(sizes)
        self.size_arr = np.asarray(sizes, dtype=np.int64)
        self.ready = ready  # per rank: when its phase-1 group ends
        self.owner = np.full(n, -1, dtype=np.int64)  # per rank: the phase-2 group holding it
        self.first = [m for _, _, m in first]  # phase 1's samples, group by group (extended here)
        self.f_start = np.array([s for s, _, _ in first], dtype=np.int64)
        self.f_j = np.array([j for _, j, _ in first], dtype=np.int64)
        self.f_size = self.size_arr[self.f_j]
        self.f_free = np.ones(len(first), dtype=bool)  # no phase-2 group holds a rank of it
        self.b_start = np.zeros(n, dtype=np.int64)  # phase-2 groups, at most one per rank
        self.b_j = np.zeros(n, dtype=np.int64)
        self.b_end = np.zeros(n)
        self.members: list[list[int]] = []
        self._slots: tuple[np.ndarray, np.ndarray] | None = None

    def groups(self) -> list[tuple[int, int, list[int]]]:
        return [(int(self.b_start[b]), int(self.b_j[b]), m) for b, m in enumerate(self.members)]

    def end(self) -> float:
        m = len(self.members)
        return max(float(self.b_end[:m].max()) if m else 0.0, float(self.ready.max()))

    def slots(self) -> tuple[np.ndarray, np.ndarray]:
        """Per size: when its first block free of phase-2 groups frees (inf: none), and where."""
        if self._slots is None:
            start = np.full(len(self.sizes), np.inf)
            at = np.zeros(len(self.sizes), dtype=np.int64)
            free = self.owner == -1
            for j, q in enumerate(self.sizes):
                s = np.where(free.reshape(-1, q).all(axis=1), self.ready.reshape(-1, q).max(axis=1), np.inf)
                k = int(np.argmin(s))
                start[j], at[j] = s[k], k * q
            self._slots = (start, at)
        return self._slots

    def place(self, i: int, add: np.ndarray, solo: np.ndarray, target_s: float) -> None:
        """Sample i where it costs the fewest GPU-seconds within `target_s` (else ends first): an
        open phase-2 group, a new one on free ranks, or an untouched phase-1 group."""
        m = len(self.members)
        f = np.flatnonzero(self.f_free & np.isfinite(add[self.f_j]))
        bj = self.b_j[:m]
        b = np.flatnonzero(np.isfinite(add[bj]))
        start, at = self.slots()
        new = np.flatnonzero(np.isfinite(solo) & np.isfinite(start))
        end = np.concatenate([self.ready[self.f_start[f]] + add[self.f_j[f]], self.b_end[b] + add[bj[b]],
                              start[new] + solo[new]])
        gpu_s = np.concatenate([add[self.f_j[f]] * self.f_size[f], add[bj[b]] * self.size_arr[bj[b]],
                                add[new] * self.size_arr[new]])
        fresh = np.concatenate([np.ones(len(f), bool), np.zeros(len(b), bool), np.ones(len(new), bool)])
        ok = end <= target_s
        # Within T: fewest GPU-seconds, an open group, the latest end; else the earliest end.
        pick = int(np.lexsort((np.where(ok, -end, end), fresh, np.where(ok, np.round(gpu_s, 9), end), ~ok))[0])
        if pick < len(f):
            g = int(f[pick])
            self.first[g].append(i)
            s, p = int(self.f_start[g]), int(self.f_size[g])
            self.ready[s:s + p] = end[pick]
            self._slots = None
        elif pick < len(f) + len(b):
            g = int(b[pick - len(f)])
            self.members[g].append(i)
            self.b_end[g] = end[pick]
        else:
            j = int(new[pick - len(f) - len(b)])
            s, q = int(at[j]), self.sizes[j]
            self.owner[s:s + q] = m
            self.b_start[m], self.b_j[m], self.b_end[m] = s, j, end[pick]
            self.members.append([i])
            # The phase-1 groups it overlaps take no more samples.
            self.f_free &= (self.f_start + self.f_size <= s) | (self.f_start >= s + q)
            self._slots = None
