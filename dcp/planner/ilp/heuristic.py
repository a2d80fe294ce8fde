"""Quick solutions from the cost table alone: group counts per SP size for class loads
(`class_counts`), and the warm start's heuristic (each sample's size, classes spread)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

import dcp.planner.knobs as knobs
from dcp.planner.bounds import makespan_floor
from dcp.planner.ilp.budget import Deadline
from dcp.planner.ilp.costs import CostTable
from dcp.planner.ilp.pack import Groups, estimate, spread
from dcp.planner.levels import narrow
from dcp.planner.lpt import hand_out


def class_counts(loads: dict[int, float], sizes: Sequence[int], num_gpus: int,
                 items: dict[int, np.ndarray] | None = None) -> dict[int, int]:
    """Groups per class (keyed by size index) for class loads (group-seconds): the least
    per-group time T with sum_p p n_p(T) <= N, n_p(T) = ceil(load_p / T), but given `items`
    (sizes) at least a group per item above T / 2 plus one per two in (T / 3, T / 2] (lumpy items
    do not pack like sand); left-over GPUs go a group at a time to the most load per group."""
    used = sorted(j for j, v in loads.items() if v > 0)

    def counts_at(t: float) -> dict[int, int]:
        out = {}
        for j in used:
            n = max(1, math.ceil(loads[j] / t - 1e-12))
            if items is not None and j in items:
                big = int((items[j] > t / 2).sum())
                mid = int(((items[j] > t / 3) & (items[j] <= t / 2)).sum())
                n = max(n, big + math.ceil(mid / 2))
            out[j] = n
        return out

    def gpus(c: dict[int, int]) -> int:
        return sum(sizes[j] * c[j] for j in c)

    lo, hi = 1e-12, max(loads[j] for j in used) + 1e-12
    if items is not None:
        hi = max(hi, max((float(v.max()) for v in items.values() if len(v)), default=0.0) * 2 + 1e-12)
    if gpus(counts_at(hi)) > num_gpus:  # even one group per class does not fit: as few as possible
        return {j: 1 for j in used}
    hi = narrow(lambda t: gpus(counts_at(t)) <= num_gpus, lo, hi, steps=60)[1]
    counts = counts_at(hi)
    hand_out(counts, sizes, num_gpus - gpus(counts), lambda j: (loads[j] / counts[j], -j))
    return counts


def heuristic(table: CostTable, num_gpus: int, target: float, deadline: float | Deadline = math.inf,
              targets: Sequence[float] = knobs.HEURISTIC_TARGETS) -> Groups:
    """A quick solution, the best by estimate over `targets` (times `target`; skips recorded):
    each sample to the size of least GPU-seconds where it runs alone within the target (else its
    fastest), classes merged upward until they fit (`class_counts`), then spread."""
    best: Groups | None = None
    best_est = math.inf
    deadline = Deadline.of(deadline)
    for scale in targets:
        if best is not None and deadline.passed():
            break
        groups = _heuristic_at(table, num_gpus, target * scale)
        est = estimate(groups, table)
        if est < best_est:
            best, best_est = groups, est
    assert best is not None
    return best


def _heuristic_at(table: CostTable, num_gpus: int, target: float) -> Groups:
    sizes = np.array(table.sizes)
    gpu_time = table.add * sizes[None, :]
    ok = table.solo <= target
    cheapest = np.argmin(np.where(ok, gpu_time, np.inf), axis=1)
    choice = np.where(ok.any(axis=1), cheapest, np.argmin(table.solo, axis=1))
    used = sorted(set(choice.tolist()))
    # A sample that fits at size p fits at every larger size (memory per GPU shrinks with p).
    while sum(table.sizes[j] for j in used) > num_gpus:
        choice[choice == used[0]] = used[1]
        used = used[1:]
    counts = _fold_small_classes(table, choice, num_gpus)
    used = sorted(counts)
    groups: Groups = []
    for j in used:
        ids = np.flatnonzero(choice == j).tolist()
        groups += [(j, b) for b in spread(ids, counts[j], j, table)]
    return groups


def _fold_small_classes(table: CostTable, choice: np.ndarray, num_gpus: int) -> dict[int, int]:
    """Group counts for the classes in `choice` (changed in place): while the least-loaded class
    holds one group that would idle most of the step, its samples move to the next larger size in
    use (they fit: memory per GPU only shrinks), as long as that shortens the step estimate; else
    a few long samples at several sizes can hold most GPUs while the short ones queue."""

    def counts_of(ch: np.ndarray) -> tuple[dict[int, int], float]:
        used = sorted(set(ch.tolist()))
        loads = {j: float(table.add[ch == j, j].sum()) for j in used}
        counts = class_counts(loads, table.sizes, num_gpus, {j: table.add[ch == j, j] for j in used})
        return counts, max(makespan_floor(loads[j], counts[j], float(table.add[ch == j, j].max())) for j in used)

    counts, step = counts_of(choice)
    for _ in range(len(table.sizes)):
        used = sorted(counts)
        loads = {j: float(table.add[choice == j, j].sum()) for j in used}
        small = [j for j in used[:-1] if counts[j] == 1 and loads[j] < step / 2]
        if not small:
            break
        j = min(small, key=lambda q: (loads[q], q))
        trial = choice.copy()
        trial[trial == j] = min(q for q in used if q > j)
        trial_counts, trial_step = counts_of(trial)
        if trial_step >= step:
            break
        choice[:], counts, step = trial, trial_counts, trial_step
    return counts
