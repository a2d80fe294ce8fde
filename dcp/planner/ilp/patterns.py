"""The configuration program at one busy-time level theta: can every group run within theta? The
aggregated program (`model`) bounds each class's large samples by counting cuts, which miss how a
handful of large videos combine; here they are packed exactly, as patterns: a pattern of size p is a
multiset of large types (load above theta / `knobs.PATTERN_PARTS` there) whose loads sum to at most
theta. Smaller samples stay counts and fractions per class (`classes`):

    find z[p,q] >= 0 integer (groups of size p with pattern q), c[t,p] (integer), y[b,p] in [0, 1]
    (P1) sum_{p,q} a[q,t] z[p,q] + sum_p c[t,p] = |t|;  sum_p y[b,p] = 1      every sample placed
    (P2) sum_t g[t,p] c[t,p] + sum_b G[b,p] y[b,p] <= sum_q (theta - g_q) z[p,q]  room per class
    (P3) sum_{p,q} p z[p,q] <= N                                             groups fit the cluster

with a[q,t] the copies of type t in pattern q and g_q its load. Every plan within theta is a
solution, so infeasible proves busy time > theta; feasible gives a packable class assignment. Every
pattern is a column from the start (an infeasibility proof needs them all), on `colgen`'s master,
solved whole by HiGHS (`colgen.solve_integer`) whatever MILP solver the options name.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass

import numpy as np

import dcp.planner.knobs as knobs
from dcp.planner.colgen import TIME_LIMIT, Master, solve_integer
from dcp.planner.ilp.budget import Deadline
from dcp.planner.ilp.classes import Item, program_items, split_fluid
from dcp.planner.ilp.costs import CostTable
from dcp.planner.ilp.pack import Groups
from dcp.planner.ilp.solvers import stopped_on_time

_HIGHS_OPTIONS: dict[str, float | int | str | bool] = {
    "mip_rel_gap": 0.01, "mip_feasibility_tolerance": 1e-7,
    "presolve": "off", "mip_heuristic_run_rins": False, "mip_heuristic_run_rens": False}
"""A solution within 1% will do (the local search takes it on); presolve and the sub-MIP
heuristics cost more than they find here (docs/design.md, the planner)."""


@dataclass
class PatternResult:
    """`groups` (sample indices per group) when the program is feasible; `infeasible` when it is
    proven infeasible (no plan runs within theta); neither when the solver gave up."""

    groups: Groups | None
    infeasible: bool
    status: str


def _patterns(items: list[Item], big: list[int], j: int, theta: float, most: int) -> list[dict[int, int]] | None:
    """Every multiset of the large items `big` at size index j with load at most theta (the
    empty one included); None when there are more than `most`."""
    order = sorted(big, key=lambda t: (-items[t].coef[j], t))
    out: list[dict[int, int]] = []
    pat: dict[int, int] = {}

    def grow(start: int, used: float) -> bool:
        out.append(dict(pat))
        if len(out) > most:
            return False
        for q in range(start, len(order)):
            t = order[q]
            g = items[t].coef[j]
            if used + g <= theta * (1 + 1e-12) and pat.get(t, 0) < len(items[t].members):
                pat[t] = pat.get(t, 0) + 1
                ok = grow(q, used + g)
                pat[t] -= 1
                if not pat[t]:
                    del pat[t]
                if not ok:
                    return False
        return True

    return out if grow(0, 0.0) else None


def solve_patterns(table: CostTable, num_gpus: int, upper: float, theta: float,
                   deadline: float | Deadline) -> PatternResult | None:
    """The program at level `theta`, its items built at `upper` (the incumbent's busy time); None
    when too large to pose. Exact types go only where they run alone within theta, buckets keep
    every size; `deadline` records it when the time left allows under `knobs.MAX_PATTERNS`."""
    deadline = Deadline.of(deadline)
    sizes = table.sizes
    items = program_items(table, upper)
    usable = {(t, j) for t, it in enumerate(items) for j in it.options
              if not it.exact or it.solo[j] <= theta * (1 + 1e-9)}
    for t, it in enumerate(items):
        if not any((t, j) in usable for j in it.options):
            return PatternResult(None, True, "a sample runs alone longer than theta")
    parts = knobs.PATTERN_PARTS
    # The program's size follows the time left: its root node costs about knobs.ROOT_S_PER_COLUMN each.
    by_time = int(min(max(deadline.left(), 0.0) / knobs.ROOT_S_PER_COLUMN, knobs.MAX_PATTERNS))  # inf: no deadline
    most = max(1, min(knobs.MAX_PATTERNS, by_time))
    while True:
        big = {j: [t for t, it in enumerate(items) if it.exact and (t, j) in usable and it.coef[j] > theta / parts]
               for j in range(len(sizes))}
        pats: dict[int, list[dict[int, int]]] = {}
        left = most
        for j in range(len(sizes)):
            found = _patterns(items, big[j], j, theta, left)
            if found is None:
                break
            pats[j], left = found, left - len(found)
        else:
            break
        if by_time < knobs.MAX_PATTERNS:
            deadline.record()  # fewer large samples than the deterministic budget would allow
        if parts <= 2:
            return None
        parts //= 2
    # A column per pattern and per smaller class's count or fraction; rows P1 (per item), P2 (per
    # size), P3. Columns sorted by name (c, y, z): HiGHS breaks ties by column order.
    rows, room = len(items) + len(sizes) + 1, len(items)
    need = np.array([len(it.members) if it.exact else 1 for it in items], dtype=np.float64)
    program = Master(np.concatenate([need, np.zeros(len(sizes)), [-np.inf]]), sizes,
                     np.concatenate([need, np.full(len(sizes), np.inf), [num_gpus]]))
    columns = [(f"z_{j}_{q}", (j, q), j, pat, theta - load, p, p * load, num_gpus // p)
               for j, p in enumerate(sizes) for q, pat in enumerate(pats[j])
               for load in [sum(items[t].coef[j] * k for t, k in pat.items())]]
    columns += [(f"{'c' if it.exact else 'y'}_{t}_{j}", (t, j), j, {t: 1}, -it.coef[j], 0, sizes[j] * it.coef[j],
                 len(it.members) if it.exact else 1)
                for t, it in enumerate(items) for j in it.options if (t, j) in usable and t not in big[j]]
    z: dict[tuple[int, int], int] = {}
    small: dict[tuple[int, int], int] = {}
    for name, key, j, counts, room_left, gpus, cost, copies in sorted(columns, key=lambda c: c[0]):
        a = np.zeros(rows)
        for t, k in counts.items():
            a[t] = k  # (P1) every sample placed: in a pattern or among its class's smaller samples
        a[room + j] = room_left  # (P2) a class's smaller samples fit the room its patterns leave below theta
        a[-1] = gpus  # (P3) groups cover at most N GPUs
        program.add(j, a, cost, copies)  # cost: GPU-seconds, the least leaves the most room to balance
        (z if name[0] == "z" else small)[key] = len(program.cols) - 1
    z = dict(sorted(z.items()))  # the groups (`_groups`) by size, then pattern
    if knobs.ROOT_S_PER_COLUMN * len(z) > deadline.left():
        deadline.record()
        return PatternResult(None, False, TIME_LIMIT)  # its root node alone would run past it
    whole = [*z.values(), *(c for (t, _), c in small.items() if items[t].exact)]
    seconds = max(deadline.left(), 0.01)
    values, status = solve_integer(program, np.array(whole), seconds, knobs.PATTERN_NODES,
                                   time.perf_counter() + seconds, **_HIGHS_OPTIONS)
    if stopped_on_time(status):
        deadline.record()
    if values is None:
        return PatternResult(None, status == "infeasible", status)
    return PatternResult(_groups(items, table, pats, z, small, values), False, status)


def _groups(items: list[Item], table: CostTable, pats: dict[int, list[dict[int, int]]], z: dict[tuple[int, int], int],
            small: dict[tuple[int, int], int], val: np.ndarray) -> Groups:
    """Groups from a solution: one per pattern copy with its large samples, then each class's
    smaller samples, largest first, to its least-loaded group (additive estimate)."""
    pool = {t: list(it.members) for t, it in enumerate(items)}
    populated = {j for (j, _), var in z.items() if int(round(val[var])) > 0}
    groups: Groups = []
    for (j, q), var in z.items():
        for _ in range(int(round(val[var]))):
            ids: list[int] = []
            for t, k in sorted(pats[j][q].items()):
                ids += pool[t][:k]
                pool[t] = pool[t][k:]
            groups.append((j, ids))
    rest: dict[int, list[int]] = {}
    for t, it in enumerate(items):
        opts = [j for j in it.options if (t, j) in small]
        if it.exact:
            for j in opts:
                k = int(round(val[small[t, j]]))
                rest.setdefault(j, []).extend(pool[t][:k])
                pool[t] = pool[t][k:]
        else:  # fluid buckets hold no large samples, so none went into a pattern
            shares, pool[t] = split_fluid(it, table, {j: val[small[t, j]] for j in opts})
            for j, ids in shares:
                if ids:
                    rest.setdefault(j, []).extend(ids)
        if pool[t]:  # rounding left some: the populated size where they are cheapest to add
            where = [j for j in it.options if j in populated] or it.options
            j = min(where, key=lambda j: (table.sizes[j] * table.add[it.members[0], j], j))
            rest.setdefault(j, []).extend(pool[t])
    for j, ids in sorted(rest.items()):
        mine = [g for g, (jj, _) in enumerate(groups) if jj == j]
        if not mine:
            groups.append((j, []))
            mine = [len(groups) - 1]
        # The least-loaded group (first on a tie), a heap step per sample (docs/tuning-log.md).
        heap = [(float(table.add[groups[g][1], j].sum()), k) for k, g in enumerate(mine)]
        heapq.heapify(heap)
        add = table.add[:, j]
        for i in sorted(ids, key=lambda i: (-add[i], i)):
            load, k = heap[0]
            groups[mine[k]][1].append(i)
            heapq.heapreplace(heap, (load + float(add[i]), k))
    return [(j, ids) for j, ids in groups if ids]
