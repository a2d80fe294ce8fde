"""Backfill plans for 2+ samples per GPU (docs/design.md, "Multi-phase plans"): instead of running
short samples in a long one's group at its large SP size, the cores (samples that need SP > 1 or
exceed a target T at SP 1) run first at their cheapest size within T, and the fillers after at SP 1
on each rank as it frees (or inside a core group where cheaper), keeping a long last micro-batch to
hide the reductions. The least busy target (`knobs.BACKFILL_LEVELS`, `BACKFILL_ONWARD`) wins.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

import dcp.planner.knobs as knobs
from dcp.costmodel import CostModel
from dcp.costmodel.schedule import reduction_chain_s
from dcp.planner.common import assemble_indices, chain
from dcp.planner.ilp.budget import Deadline, final_pricing_s
from dcp.planner.ilp.costs import CostTable, batch_costs, form_microbatches
from dcp.planner.levels import narrow
from dcp.planner.lpt import lpt
from dcp.planner.plan import Plan
from dcp.planner.pricing import BatchArrays, Layout, Pricer, price_layout
from dcp.planner.sample import Sample
from dcp.planner.sync import longest_last


@dataclass
class Candidate:
    """One target's plan before assembly: each phase's groups and the busy time (s)."""

    first: Layout
    second: Layout
    busy_s: float
    fills_first: bool
    """Whether some core group runs after its ranks' fillers."""

    def within(self, max_microbatches: int | None) -> bool:
        """Whether every group runs at most `max_microbatches` micro-batches (None: any number)."""
        return max_microbatches is None or max(len(mbs) for _, _, mbs in self.first + self.second) <= max_microbatches


def backfill_plan(batch: Sequence[Sample], cm: CostModel, sizes: Sequence[int], busy_floor_s: float,
                  arrays: BatchArrays | None = None, max_microbatches: int | None = None,
                  costs: tuple[Pricer, CostTable] | None = None, time_limit_s: float = math.inf,
                  solve_started: float | None = None, cut: Deadline | None = None) -> Plan | None:
    """The best backfill plan over the targets times `busy_floor_s` (a busy-time lower bound, s),
    priced and validated; None when too few samples per GPU (`knobs.BACKFILL_MIN_PER_GPU`, or
    `BACKFILL_FEW_PER_GPU` with assembly over `BACKFILL_FEW_COST_SHARE` of the limit), without SP 1,
    at ZeRO-3, or if no target fits `max_microbatches`. `costs`: (pricer, cost table) or None; the
    limit, from `solve_started` (perf_counter), bounds later targets, and `cut` records it."""
    n = cm.cluster.num_gpus
    if len(batch) < knobs.BACKFILL_MIN_PER_GPU * n or not sizes or sizes[0] != 1 or cm.training.zero_stage == 3:
        return None
    if len(batch) < knobs.BACKFILL_FEW_PER_GPU * n and final_pricing_s(len(batch), len(batch), n, 1.0) > knobs.BACKFILL_FEW_COST_SHARE * time_limit_s:
        return None
    arrays = arrays if arrays is not None else BatchArrays.of(batch)
    pricer, table = costs if costs is not None else batch_costs(arrays, cm, sizes)
    reductions = reduction_chain_s(cm)
    hide = _hiding_tokens(cm, table, reductions)
    best: Candidate | None = None
    started = time.perf_counter()
    solve_started = started if solve_started is None else solve_started
    assembly_s = final_pricing_s(len(batch))  # the chosen candidate's, after the last target
    levels = list(knobs.BACKFILL_LEVELS)
    best_level: float | None = None  # the target `best` came from
    for k in range(len(knobs.BACKFILL_LEVELS) + len(knobs.BACKFILL_ONWARD[0])):
        if k == len(knobs.BACKFILL_LEVELS):  # the rest on the side of the faster of the first two
            if len(batch) < knobs.BACKFILL_FEW_PER_GPU * n:
                break
            levels += knobs.BACKFILL_ONWARD[best_level == knobs.BACKFILL_LEVELS[1]]
        level = levels[k]
        if best is not None and best.busy_s <= busy_floor_s * (1 + knobs.BACKFILL_CLOSE_ENOUGH):
            break
        now = time.perf_counter()
        if (k >= 1 and now + (now - started) / k + assembly_s > solve_started + knobs.BACKFILL_FIRST_END_SHARE * time_limit_s) \
                or (k >= 2 and (now - started) * (k + 1) / k > knobs.BACKFILL_LEVELS_SHARE * time_limit_s):
            if cut is not None:
                cut.record()
            break
        # Fillers before the short core groups, then inside them where the first put some before.
        for fill_first in (True, False) if len(batch) <= knobs.BACKFILL_BOTH_UP_TO else (False,):
            cand = _candidate(table, cm, arrays, pricer, busy_floor_s * level, hide, reductions, fill_first)
            if cand is not None and cand.within(max_microbatches):
                if best is None or cand.busy_s < best.busy_s:
                    best, best_level = cand, level
            if cand is None or not cand.fills_first:
                break
    return None if best is None else assemble_candidate(batch, cm, arrays, pricer, best)


def _hiding_tokens(cm: CostModel, table: CostTable, reductions: np.ndarray | None) -> float:
    """SP-1 micro-batch tokens whose layer backward hides a layer's reduction; 0 without a chain."""
    k = cm.model.num_layers
    if reductions is None or k < 2:
        return 0.0
    per_layer = float(np.max(np.diff(reductions)))
    cap = float(table.cap0[0])
    short = table.tokens[table.ckpt[:, 0] == 0]
    pairs_per_token = float(np.mean(table.pairs[table.ckpt[:, 0] == 0] / np.maximum(short, 1))) if len(short) else 1.0
    if cm.layer_times(cap, cap * pairs_per_token, 1).backward_s < per_layer:
        return cap
    return narrow(lambda t: cm.layer_times(t, t * pairs_per_token, 1).backward_s >= per_layer, 0.0, cap, steps=30)[1]


def _candidate(table: CostTable, cm: CostModel, arrays: BatchArrays, pricer: Pricer, target_s: float,
               hide: float, reductions: np.ndarray | None, fill_first: bool = True) -> Candidate | None:
    """The plan for one target (module docstring); None if its cores need more GPUs than exist."""
    n, sizes = cm.cluster.num_gpus, table.sizes
    size_arr = np.asarray(sizes)
    fits_one = (table.ckpt[:, 0] == 0) & (table.solo[:, 0] <= target_s)
    cores = np.flatnonzero(~fits_one)
    # Each core at the size of fewest GPU-seconds among those where it runs within the target.
    within = table.solo[cores] <= target_s
    gpu_s = np.where(within, table.solo[cores] * size_arr, np.inf)
    choice = np.where(within.any(axis=1), np.argmin(gpu_s, axis=1), np.argmin(table.solo[cores], axis=1))
    groups = pack_per_size(cores, choice, table.solo, target_s, sizes, n)
    if groups is None:
        return None
    layout: Layout = [(start, sizes[j], form_microbatches(ids, j, table, cm)) for start, j, ids in groups]
    ready = price_layout(layout, arrays, pricer).busy_s if groups else np.zeros(0)
    fillers = np.flatnonzero(fits_one)
    fillers = fillers[np.lexsort((fillers, -table.solo[fillers, 0]))]
    marg, fixed, cap = table.marg[:, 0], float(table.fixed0[0]), float(table.cap0[0])
    work = float(sum(r * sizes[j] for r, (_, j, _) in zip(ready.tolist(), groups, strict=True)))
    level = max(target_s, (work + float(marg[fillers].sum()) + fixed * float(table.tokens[fillers].sum()) / cap) / n)
    short_s = fixed + float(np.median(marg[fillers]) / max(float(np.median(table.tokens[fillers])), 1.0)) * hide \
        if len(fillers) else 0.0
    # Fillers inside a core group where its room holds more of them than at SP 1 on its ranks.
    taken = np.zeros(len(fillers), dtype=bool)  # by position in `fillers`
    costs: dict[int, tuple[np.ndarray, float, float]] = {}
    slot_ready = np.zeros(n)
    in_slots = np.ones(n, dtype=bool)
    before = np.zeros(n, dtype=bool)  # ranks whose fillers run before their core group
    changed: list[int] = []
    for g, ((start, j, ids), r) in enumerate(zip(groups, ready.tolist(), strict=True)):
        p = sizes[j]
        room = level - r
        slot_ready[start:start + p] = r
        if p == 1:
            continue
        if j not in costs:  # the fillers' costs at size j, their markup over SP 1, the cheapest's
            cost_j = table.add[fillers, j]
            costs[j] = (cost_j, float(cost_j.sum()) * p / max(float(table.add[fillers, 0].sum()), 1e-300),
                        float(cost_j.min()) if len(cost_j) else math.inf)
        cost, markup, cheapest = costs[j]
        # SP-1 work a rank's room holds either way: room - fixed at SP 1, room / markup inside.
        inside = room / markup > room - fixed
        if room >= short_s and not inside:
            continue
        if fill_first and not inside:
            before[start:start + p] = True
            continue
        in_slots[start:start + p] = False
        for _ in range(knobs.BACKFILL_PASSES):  # the longest run of free fillers that fits, then again
            if room < cheapest:  # none fits
                break
            fit = np.flatnonzero((cost <= room) & ~taken)
            if not len(fit):
                break
            run = fit[:_fitting_prefix(cost, fit, room)]
            if not changed or changed[-1] != g:
                changed.append(g)
            ids += fillers[run].tolist()
            taken[run] = True
            room -= float(cost[run].sum())
    rest = fillers[~taken]
    slots = np.flatnonzero(in_slots)
    if len(rest) and not len(slots):  # every rank in a core group too full to take them
        return None
    fills, ends, size = _lpt(rest, slot_ready[slots], table.tokens, marg, fixed, cap)
    first = before[slots]  # their fillers end before the core: no short last micro-batch there
    ends = _unexposed(fills, ends, np.where(first, np.inf, size), table.tokens, marg, fixed, cap, hide, reductions)
    ends = _rebalance(fills, ends, table.tokens, marg, cap, hide)
    core_busy = ready.copy()
    if changed:  # re-form and re-price only the groups that took fillers
        for g in changed:
            start, j, ids = groups[g]
            layout[g] = (start, sizes[j], form_microbatches(ids, j, table, cm))
        core_busy[changed] = price_layout([layout[g] for g in changed], arrays, pricer).busy_s
    core_ends = float(core_busy.max()) if len(core_busy) else 0.0
    # Phase 1: the cores, but where the fillers go first; phase 2: the rest.
    late = {g for g, (start, _, _) in enumerate(groups) if before[start]}
    ones = [(int(slots[k]), 1, mbs) for k, mbs in enumerate(fills) if mbs]
    return Candidate([c for g, c in enumerate(layout) if g not in late] + [o for o in ones if before[o[0]]],
                      [c for g, c in enumerate(layout) if g in late] + [o for o in ones if not before[o[0]]],
                      max(float(ends.max()) if len(ends) else 0.0, core_ends), bool(late))


def _fitting_prefix(cost: np.ndarray, fit: np.ndarray, room: float) -> int:
    """How many of `fit`, in order, fit `room` together (growing prefixes: a room holds few)."""
    size = 64
    while True:
        head = np.cumsum(cost[fit[:size]])
        count = int(np.searchsorted(head, room, side="right"))
        if count < len(head) or size >= len(fit):
            return count
        size *= 8


def least_groups_gpus(cost: np.ndarray, choice: np.ndarray, target_s: float, sizes: Sequence[int]) -> int:
    """A lower bound on the GPUs `pack_per_size` needs (per size, by count and by summed cost)."""
    gpus = 0
    for j in np.unique(choice).tolist():
        c = cost[choice == j]
        alone = int(np.count_nonzero(c > target_s))
        rest = c[c <= target_s]
        by_sum = math.ceil(float(rest.sum()) / target_s * (1 - 1e-12)) if target_s > 0 else len(rest)
        gpus += sizes[j] * (alone + max(by_sum, int(np.count_nonzero(rest > target_s / 2))))
    return gpus


def pack_per_size(ids: np.ndarray, choice: np.ndarray, cost: np.ndarray, target_s: float,
                  sizes: Sequence[int], num_gpus: int) -> list[tuple[int, int, list[int]]] | None:
    """Samples `ids` at size indices `choice`, per size in the fewest groups of `cost` within
    `target_s` (worst fit, longest first), largest first; None when they need over `num_gpus`."""
    if least_groups_gpus(cost[ids, choice], choice, target_s, sizes) > num_gpus:
        return None
    groups: list[tuple[int, int, list[int]]] = []
    rank = 0
    for j in sorted(set(choice.tolist()), key=lambda j: -sizes[j]):
        mine = ids[choice == j]
        mine = mine[np.lexsort((mine, -cost[mine, j]))]
        rooms: list[tuple[float, int]] = []  # (minus the room left, group)
        members: list[list[int]] = []
        for i, t in zip(mine.tolist(), cost[mine, j].tolist(), strict=True):
            if rooms and -rooms[0][0] >= t:
                room, g = heapq.heappop(rooms)
                members[g].append(i)
                heapq.heappush(rooms, (room + t, g))
            else:
                members.append([i])
                heapq.heappush(rooms, (t - target_s, len(members) - 1))
        for m in members:
            groups.append((rank, j, m))
            rank += sizes[j]
    return groups if rank <= num_gpus else None


def _lpt(fillers: np.ndarray, ready: np.ndarray, tokens: np.ndarray, marg: np.ndarray, fixed: float,
         cap: float) -> tuple[list[list[list[int]]], np.ndarray, np.ndarray]:
    """Fillers onto slots free from `ready` (`lpt.lpt`), then into micro-batches of at most `cap`
    tokens: each slot's micro-batches, exact end (s) and tokens."""
    m_slots = len(ready)
    fills: list[list[list[int]]] = [[] for _ in range(m_slots)]
    if not m_slots or not len(fillers):
        return fills, ready.astype(np.float64), np.zeros(m_slots)
    place = lpt(marg[fillers] + fixed * tokens[fillers] / cap, m_slots, ready.astype(np.float64),
                knobs.BACKFILL_WATER_FROM, (tokens[fillers].astype(np.float64), marg[fillers], fixed, cap))
    limit = cap * (1 + 1e-12)
    open_t = [0.0] * m_slots  # tokens of each slot's open micro-batch (0: none open)
    for i, s, x in zip(fillers.tolist(), place.tolist(), tokens[fillers].tolist(), strict=True):
        if open_t[s] > 0 and open_t[s] + x <= limit:
            fills[s][-1].append(i)
            open_t[s] += x
        else:
            fills[s].append([i])
            open_t[s] = x
    ends = ready + np.bincount(place, weights=marg[fillers], minlength=m_slots) \
        + fixed * np.array([len(f) for f in fills])
    return fills, ends, np.bincount(place, weights=tokens[fillers], minlength=m_slots)


def _unexposed(fills: list[list[list[int]]], ends: np.ndarray, size: np.ndarray, tokens: np.ndarray, marg: np.ndarray,
               fixed: float, cap: float, hide: float, reductions: np.ndarray | None) -> np.ndarray:
    """Short backfills near the end (under `hide` tokens) moved to hiding slots; the new ends."""
    if reductions is None or not hide:
        return ends
    window = float(reductions[-1])
    last = float(ends.max()) if len(ends) else 0.0
    bad = [s for s in range(len(fills)) if fills[s] and size[s] < hide and ends[s] > last - window]
    # Only slots that run a backfill of their own take fillers.
    good = [(float(ends[s]), s) for s in range(len(fills)) if fills[s] and size[s] >= hide]
    if not bad or not good:
        return ends
    heapq.heapify(good)
    held = {s: float(tokens[fills[s][-1]].sum()) for _, s in good}
    for s in bad:
        moved = [i for mb in fills[s] for i in mb]
        # Left there, it ends the step about the whole chain after it (less what any plan adds).
        limit = max(last, float(ends[s]) + window - float(reductions[0]))
        trial, placed, ok = list(good), [], True
        opened: dict[int, float] = {}
        for i in moved:
            end, g = heapq.heappop(trial)
            room = opened.get(g, held[g])
            fresh = room + tokens[i] > cap
            end += float(marg[i]) + (fixed if fresh else 0.0)
            if end > limit:
                ok = False
                break
            opened[g] = float(tokens[i]) if fresh else room + float(tokens[i])
            placed.append((g, i, fresh, end))
            heapq.heappush(trial, (end, g))
        if not ok:
            continue
        for g, i, fresh, end in placed:
            if fresh:
                fills[g].append([i])
            else:
                fills[g][-1].append(i)
            ends[g] = end
        held.update(opened)
        ends[s] -= sum(float(marg[i]) for i in moved) + fixed * len(fills[s])
        fills[s] = []
        good = trial
    return ends


def _rebalance(fills: list[list[list[int]]], ends: np.ndarray, tokens: np.ndarray, marg: np.ndarray,
               cap: float, hide: float) -> np.ndarray:
    """Fillers moved from the last-ending slot to the first-ending one with room while both end
    sooner, keeping `hide` tokens, `knobs.BACKFILL_REBALANCE_MOVES` per slot; the new ends."""
    live = [s for s in range(len(fills)) if fills[s]]
    if len(live) < 2:
        return ends
    at = np.array(live)
    held = np.array([float(tokens[fills[s][-1]].sum()) for s in live])
    e = ends[at].copy()
    for _ in range(knobs.BACKFILL_REBALANCE_MOVES * len(live)):
        hi = int(np.argmax(e))
        last = fills[live[hi]][-1]
        if len(last) < 2:
            break
        small = float(tokens[last].min())
        lo = int(np.argmin(np.where(held + small <= cap, e, np.inf)))  # the first to end that has room
        diff = float(e[hi] - e[lo])
        costs = marg[last]
        ok = (costs < diff) & (held[lo] + tokens[last] <= cap)
        if held[hi] >= hide:
            ok &= held[hi] - tokens[last] >= hide
        if lo == hi or not ok.any():
            break
        k = int(np.argmin(np.where(ok, np.abs(costs - diff / 2), np.inf)))
        i = last.pop(k)
        fills[live[lo]][-1].append(i)
        held[hi] -= float(tokens[i])
        held[lo] += float(tokens[i])
        e[hi] -= float(marg[i])
        e[lo] += float(marg[i])
    ends[at] = e
    return ends


def assemble_candidate(batch: Sequence[Sample], cm: CostModel, arrays: BatchArrays, pricer: Pricer,
              cand: Candidate) -> Plan:
    """The candidate as a validated, priced plan of one or two phases, longest micro-batch last."""
    parts = [assemble_indices("ilp", batch, cm, part, arrays=arrays, pricer=pricer, solver_status="backfill",
                              lower_bound_s=0.0, validate=False, step=False)
             for part in (cand.first, cand.second) if part]
    for part in parts:
        for g in part.groups:
            g.microbatches = longest_last(g.microbatches)
    return chain("ilp", batch, parts, cm, copy=False)
