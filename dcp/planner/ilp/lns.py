"""Large-neighbourhood search: re-solve exactly, as a small MILP, the assignment of every sample of
the slowest group and a few others with slack, keeping their sizes, to find the rearrangements
single moves and swaps miss. Each neighbourhood is an unrelated-machines makespan problem:

    min Z   s.t.  sum_g c[t, g] = |t|                 (L1) every sample of type t placed
                  sum_t a[t, g] c[t, g] <= Z          (L2) every group within Z

a[t, g] the additive estimate of a type-t sample at group g's size, c integer (identical samples
share one count), warm-started from the current assignment.
"""

from __future__ import annotations

import numpy as np
import pulp

import dcp.planner.knobs as knobs
from dcp.planner.ilp.budget import Deadline
from dcp.planner.ilp.costs import CostTable
from dcp.planner.ilp.pack import Groups, _Loads
from dcp.planner.ilp.solvers import new_var, run_solver, stopped_on_time

_HIGHS_OPTIONS: dict[str, float | int] = {
    "mip_max_improving_sols": knobs.LNS_SOLUTIONS,
    # Sub-MIP heuristics cost more than they find on these small, warm-started problems.
    "mip_heuristic_run_rins": False, "mip_heuristic_run_rens": False,
    # HiGHS's MIP presolve (strengthenInequalities) can run without checking the time limit or
    # the interrupt callback: a 32-GPU wikipedia batch spent over 20 minutes there (docs/tuning-log.md).
    "presolve": "off",
}


def _neighbourhood(loads: np.ndarray, gj: np.ndarray, sizes: np.ndarray, c: int, variant: int) -> list[int]:
    """The slowest group c, the least-loaded group of every other size, then the least-loaded
    groups overall, starting `variant` places down the list; at most `knobs.LNS_MAX_ITEMS` samples."""
    order = [int(g) for g in np.lexsort((np.arange(len(loads)), loads)) if g != c]
    chosen, items = [c], int(sizes[c])

    def take(g: int) -> None:
        nonlocal items
        if len(chosen) < knobs.LNS_NEIGHBOURS and items + sizes[g] <= knobs.LNS_MAX_ITEMS and g not in chosen:
            chosen.append(g)
            items += int(sizes[g])

    for j in sorted(set(gj.tolist())):
        g = next((g for g in order if gj[g] == j and g not in chosen), None)
        if g is not None:
            take(g)
    rest = [g for g in order if g not in chosen]
    start = min(variant, max(len(rest) - 1, 0))
    for g in rest[start:] + rest[:start]:
        take(g)
    return chosen


def _solve(groups: Groups, hood: list[int], table: CostTable, solver: str,
           deadline: Deadline) -> dict[int, int] | None:
    """New group (index into `groups`) for every sample of the neighbourhood, or None."""
    types: dict[tuple[int, float], list[int]] = {}
    for g in hood:
        for i in groups[g][1]:
            types.setdefault((int(table.tokens[i]), float(table.pairs[i])), []).append(i)
    keys = sorted(types)
    prob = pulp.LpProblem("dcp_ilp_lns", pulp.LpMinimize)
    z = new_var(prob, "Z", 0)
    prob += z
    c: dict[tuple[int, int], pulp.LpVariable] = {}
    for t, key in enumerate(keys):
        i0, n = types[key][0], len(types[key])
        for g in hood:
            if table.ckpt[i0, groups[g][0]] >= 0:
                c[t, g] = new_var(prob, f"c_{t}_{g}", 0, n, pulp.LpInteger if n > 1 else pulp.LpBinary)
        # (L1) every sample of type t placed
        prob += pulp.lpSum(c[t, g] for g in hood if (t, g) in c) == n, f"L1_{t}"
    for g in hood:
        j = groups[g][0]
        terms = [(c[t, g], float(table.add[types[key][0], j])) for t, key in enumerate(keys) if (t, g) in c]
        # (L2) every group within Z
        prob += pulp.LpAffineExpression(terms) <= z, f"L2_{g}"
    start: dict[pulp.LpVariable, float] = {v: 0.0 for v in c.values()}
    where = {i: g for g in hood for i in groups[g][1]}
    for t, key in enumerate(keys):
        for i in types[key]:
            start[c[t, where[i]]] += 1.0
    start[z] = max(sum(float(table.add[i, groups[g][0]]) for i in groups[g][1]) for g in hood)
    res = run_solver(prob, solver, deadline.left(), knobs.LNS_GAP, start, max_nodes=knobs.LNS_NODES,
                     highs_options=_HIGHS_OPTIONS)
    if stopped_on_time(res.status):
        deadline.record()
    if res.values is None:
        return None
    out: dict[int, int] = {}
    for t, key in enumerate(keys):
        members = list(types[key])
        for g in hood:
            if (t, g) in c:
                k = int(round(res.values[c[t, g]]))
                out.update({i: g for i in members[:k]})
                members = members[k:]
        if members:
            return None  # rounding lost a sample: keep the current assignment
    return out


def lns(groups: Groups, table: CostTable, solver: str, deadline: float | Deadline, rounds: int,
        target: float = 0.0) -> Groups:
    """Up to `rounds` neighbourhood solves, each kept when it lowers the slowest group; stops
    once that group's estimate is at most `target`, or at `deadline` (which records it)."""
    groups = [(j, list(ids)) for j, ids in groups]
    deadline = Deadline.of(deadline)
    variant = failures = 0
    for _ in range(rounds):
        if failures >= 2 or len(groups) < 2:
            break
        if deadline.left() < knobs.LNS_MIN_S:  # a solve needs its model built first: it would end late
            deadline.record()
            break
        st = _Loads(groups, table)
        loads = st.loads()
        c = int(np.argmax(loads))
        if loads[c] <= target:
            break
        counts = np.bincount(st.where, minlength=len(groups))
        if counts[c] > knobs.LNS_MAX_ITEMS:
            break  # many small samples: moves and swaps balance them well
        hood = _neighbourhood(loads, st.gj, counts, c, variant)
        moved = _solve(groups, hood, table, solver, deadline)
        if moved is None:
            break
        trial = [(j, [i for i in ids if i not in moved]) for j, ids in groups]
        for i in sorted(moved):
            trial[moved[i]][1].append(i)
        new = _Loads(trial, table).loads()
        if new[hood].max() < loads[c] * (1 - 1e-9):
            groups, variant, failures = trial, 0, 0
        else:
            variant, failures = variant + knobs.LNS_NEIGHBOURS - 1, failures + 1  # try other partners
    return groups
