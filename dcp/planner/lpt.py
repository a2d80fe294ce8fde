"""Longest processing time first, a round of jobs at a time.

LPT (`baselines.lpt_assign`: dcp-greedy's classes, bucket's and packing's groups) gives each job,
in order, to the group that holds least, ties by the lower group. A heap step per job is a
Python step per job (docs/tuning-log.md, `LPT_SHORT_ROUND`).
`least_loaded` takes the same decisions a round at a time: with the groups sorted by load (then
index), the next r jobs go to the r least-loaded groups in that order, one each, as long as every
group the round has given a job ends above the next group's load (strictly: a tie could pop in
another order, so the round stops short of it). Every load is the same sum, in the same order,
as the heap's, so the assignment is identical to the last bit. Where rounds come out short (few
groups, or loads further apart than the jobs are long) heap steps are cheaper, and it takes them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence

import numpy as np

import dcp.planner.knobs as knobs


def least_loaded(times: np.ndarray, groups: int) -> np.ndarray:
    """The group of every job, jobs taken in the order of `times`, each to the group with the
    least load so far (ties by the lower index); all `groups` start empty."""
    times = np.asarray(times, dtype=np.float64)
    owner = np.empty(len(times), dtype=np.int64)
    loads = np.zeros(groups)
    if groups < knobs.LPT_SHORT_ROUND:
        _heap_steps(times, 0, len(times), loads, owner)
        return owner
    at = 0
    while at < len(times):
        order = np.lexsort((np.arange(groups), loads))
        low = loads[order]
        r = min(groups, len(times) - at)
        ends = low[:r] + times[at:at + r]
        # The round's pop k finds order[k] only if every group given a job before ends above it.
        beaten = np.minimum.accumulate(ends[:-1]) > low[1:r]
        r = 1 + (int(np.argmin(beaten)) if not beaten.all() else len(beaten))
        if r < knobs.LPT_SHORT_ROUND:
            at = _heap_steps(times, at, min(len(times), at + groups), loads, owner)
            continue
        owner[at:at + r] = order[:r]
        loads[order[:r]] = ends[:r]
        at += r
    return owner


def balanced_s(classes: Iterable[tuple[float, int, float]]) -> float:
    """The step classes of jobs spread over their own groups reach at best: per class (its jobs'
    summed time, its groups, its longest job) the larger of its mean load per group and its
    longest job, the largest over the classes. dcp-greedy's and the heuristic's estimate."""
    return max(max(total / n, longest) for total, n, longest in classes)


def hand_out(groups: dict[int, int], sizes: Sequence[int], left: int, key: Callable[[int], tuple],
             most: dict[int, int] | None = None) -> None:
    """GPUs `left` over, a group at a time, to the class of `groups` (groups per size index) of
    the largest `key` whose size still fits (and that has fewer than `most` groups), in place."""
    while fits := [j for j in groups if sizes[j] <= left and (most is None or groups[j] < most[j])]:
        j = max(fits, key=key)
        groups[j] += 1
        left -= sizes[j]


def by_group(owner: np.ndarray, groups: int) -> list[np.ndarray]:
    """Each group's indices (ascending) from the group of every index, 0 to `groups` - 1."""
    order = np.argsort(owner, kind="stable")
    cuts = np.searchsorted(owner[order], np.arange(groups + 1)).tolist()
    return [order[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def _heap_steps(times: np.ndarray, at: int, stop: int, loads: np.ndarray, owner: np.ndarray) -> int:
    """`least_loaded`'s jobs `at` to `stop` one heap step each, `loads` and `owner` updated in
    place; returns `stop`."""
    heap = [(v, g) for g, v in enumerate(loads.tolist())]
    heapq.heapify(heap)
    for k, t in enumerate(times[at:stop].tolist(), start=at):
        v, g = heapq.heappop(heap)
        heapq.heappush(heap, (v + t, g))
        owner[k] = g
    for v, g in heap:
        loads[g] = v
    return stop


def water_fill(loads: np.ndarray, costs: np.ndarray) -> np.ndarray:
    """The group of each job of `costs` (in order) on groups holding `loads`: the level L at which
    the groups' room below it holds every job, and each group a run of them, in order, filling
    its room to within one job (a job goes where its middle falls). LPT's rest when the jobs are
    short against the groups: one numpy pass instead of a heap step each."""
    by_load = np.lexsort((np.arange(len(loads)), loads))
    low = loads[by_load]
    level = (float(costs.sum()) + np.cumsum(low)) / np.arange(1, len(low) + 1)  # k groups under it
    k = int(np.argmax(level <= np.append(low[1:], np.inf)))
    room = np.maximum(level[k] - low, 0.0)
    mid = np.cumsum(costs) - costs / 2
    return by_load[np.minimum(np.searchsorted(np.cumsum(room), mid, side="right"), len(low) - 1)]
