"""Longest processing time first, a round of jobs at a time: the planner's one LPT, for the
baselines (`baselines.lpt_assign`), the ILP's spread (`pack.lpt_fast`) and the backfill
(`backfill._lpt`). `least_loaded` takes LPT's decisions a round at a time (the next r jobs to the r
least-loaded groups while each ends strictly above the next group's load), summing each load as a
heap would, so the assignment is identical to the last bit at a numpy step per round; short rounds
take heap steps (docs/tuning-log.md, `LPT_SHORT_ROUND`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import numpy as np

import dcp.planner.knobs as knobs


def lpt(times: np.ndarray, groups: int, loads: np.ndarray | None = None, water_from: int = 0,
        batches: tuple[np.ndarray, np.ndarray, float, float] | None = None) -> np.ndarray:
    """The group of every job (`times` longest first), LPT onto `groups` holding `loads` (default
    empty; updated in place): one by one the first `knobs.LPT_HEAD` per group and every job above
    `knobs.LPT_SHARE` of the mean level per group, the shorter rest by `water_fill` (within one job
    of LPT's balance, one numpy pass) where more than `water_from` per group are left.

    Whole jobs (the baselines', the ILP's) add their time to their group: the head is LPT proper
    (`least_loaded`). With `batches` (each job's tokens and marginal time, a micro-batch's fixed
    time and token capacity: the backfill's) a job opens a micro-batch, paying its fixed time,
    when the group's open one cannot hold it, so `times` are estimates: the head goes in
    `_rounds`, which see that, and water fills only a long tail (docs/tuning-log.md,
    `BACKFILL_WATER_FROM`)."""
    times = np.asarray(times, dtype=np.float64)
    loads = np.zeros(groups) if loads is None else loads
    owner = np.empty(len(times), dtype=np.int64)
    if batches is None:  # the level (loads and jobs left) stays put: the first short job, at once
        big = int((times > knobs.LPT_SHARE * (float(loads.sum()) + float(times.sum())) / groups).sum())
        head = max(knobs.LPT_HEAD * groups, big)
        head = len(times) if len(times) - head <= water_from * groups else head
        owner[:head] = least_loaded(times[:head], groups, loads)
    else:
        head = _rounds(times, loads, *batches, owner, water_from)
    if head < len(times):
        owner[head:] = water_fill(loads, times[head:])
        loads += np.bincount(owner[head:], weights=times[head:], minlength=groups)
    return owner


def _rounds(times: np.ndarray, loads: np.ndarray, tokens: np.ndarray, marg: np.ndarray, fixed: float, cap: float,
            owner: np.ndarray, water_from: int) -> int:
    """`lpt`'s head with micro-batches: each round gives its next m jobs to the m groups that end
    first below the water level, the longest to the first, a group whose open micro-batch the job
    would overflow counting `fixed` later; micro-batches fill in arrival order up to `cap`
    tokens. Fills `owner` until a round would start at a job `lpt` water fills (checked every
    round: exact times replace the estimates) and returns where it stopped."""
    groups = len(loads)
    held = np.zeros(groups)  # tokens of each group's open micro-batch (0: none)
    left = float(times.sum())
    at = 0
    while at < len(times):
        if len(times) - at > water_from * groups \
                and times[at] <= knobs.LPT_SHARE * (float(loads.sum()) + left) / groups:
            break
        key = loads + np.where((held > 0) & (held + tokens[at] <= cap), 0.0, fixed)
        water = min((float(loads.sum()) + left) / groups, float(key.min()) + float(times[at]))
        m = max(1, min(int((key < water).sum()), len(times) - at))
        pick = np.argpartition(key, m - 1)[:m] if m < groups else np.arange(groups)
        pick = pick[np.argsort(key[pick], kind="stable")]
        t = tokens[at:at + m]
        new = (held[pick] == 0) | (held[pick] + t > cap)
        loads[pick] += marg[at:at + m] + np.where(new, fixed, 0.0)
        held[pick] = np.where(new, t, held[pick] + t)
        owner[at:at + m] = pick
        left -= float(times[at:at + m].sum())
        at += m
    return at


def least_loaded(times: np.ndarray, groups: int, loads: np.ndarray | None = None) -> np.ndarray:
    """Each job's group, in the order of `times`, each to the least-loaded group (ties: lower
    index), from `loads` (default empty; updated in place, summed as a heap sums them)."""
    times = np.asarray(times, dtype=np.float64)
    owner = np.empty(len(times), dtype=np.int64)
    loads = np.zeros(groups) if loads is None else loads
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


def hand_out(groups: dict[int, int], sizes: Sequence[int], left: int, key: Callable[[int], tuple],
             most: dict[int, int] | None = None) -> None:
    """GPUs `left` over, a group at a time, to the class of `groups` (groups per size index) of
    largest `key` whose size still fits (and has fewer than `most` groups), in place."""
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
    """`least_loaded`'s jobs `at` to `stop`, a heap step each, in place; returns `stop`."""
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
    """The group of each job of `costs` (in order) on groups holding `loads`: the level at which
    the groups' room below it holds every job, each group taking a run of them that fills its
    room to within one job (a job goes where its middle falls)."""
    by_load = np.lexsort((np.arange(len(loads)), loads))
    low = loads[by_load]
    level = (float(costs.sum()) + np.cumsum(low)) / np.arange(1, len(low) + 1)  # k groups under it
    k = int(np.argmax(level <= np.append(low[1:], np.inf)))
    room = np.maximum(level[k] - low, 0.0)
    mid = np.cumsum(costs) - costs / 2
    return by_load[np.minimum(np.searchsorted(np.cumsum(room), mid, side="right"), len(low) - 1)]
