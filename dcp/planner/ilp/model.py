"""The aggregated mixed-integer program: how many groups of each SP size and which samples in which
size class, minimizing the slowest group's busy time B (the step less the gradient sync). n_p
identical groups are one capacity n_p B, and the rows are length classes (`classes`), so the program
does not grow with the batch.

The program (g: `CostTable.load`, t: solo time, U: incumbent busy time, L: proven bound):

    min B,  L <= B <= U
    (E1) sum_p c[t,p] = |t|;  sum_p y[b,p] = 1                       every sample in one class
    (E2) sum_p p n_p <= N,  n_p = sum_k 2^k beta[p,k]                groups fit the cluster
    (E3) load_p = sum_t g[t,p] c[t,p] + sum_b G[b,p] y[b,p] <= n_p B  class capacity, with
         n_p B = sum_k 2^k v[p,k], v[p,k] <= B, v[p,k] <= U beta[p,k] (exact since B <= U)
    (E4) sum_p p load_p <= N B                                        GPU-seconds
    (E5) t[t,p] (c[t,p] > 0) <= B                                     a sample alone fits in B
    (C*) bin-packing cuts at levels theta in (L, U], off when B >= theta (`cuts.level_cuts`)

Every coefficient is a lower bound on what a sample adds to its group and every cut holds for any
plan of busy time at most U, so the solver's dual bound, capped at U, bounds B.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import pulp

from dcp.planner.ilp.classes import Item, program_items, split_fluid
from dcp.planner.ilp.costs import CostTable
from dcp.planner.ilp.cuts import level_cuts
from dcp.planner.ilp.pack import Groups
from dcp.planner.ilp.solvers import SolveResult, new_var, run_solver


@dataclass
class ClassSolution:
    """The program's answer: groups per size index and the samples of each class."""

    counts: dict[int, int]
    classes: dict[int, list[int]]
    bound: float
    status: str


def solve_classes(table: CostTable, num_gpus: int, upper: float, lower: float, start: Groups | None,
                  solver: str, deadline: float, gap: float) -> ClassSolution | None:
    """Solve the program; None when the solver gives no solution. `upper` (U): the incumbent's
    busy time; `lower`: a proven bound on B; `start`: the incumbent's groups (warm start);
    `deadline`: perf_counter time by which the solver stops."""
    sizes, m = table.sizes, len(table.sizes)
    items = program_items(table, upper)
    prob = pulp.LpProblem("dcp_ilp", pulp.LpMinimize)
    busy = new_var(prob, "B", lower, upper)
    prob += busy
    x: dict[tuple[int, int], pulp.LpVariable] = {}
    for t, it in enumerate(items):
        for j in it.options:
            if it.exact:
                x[t, j] = new_var(prob, f"c_{t}_{j}", 0, len(it.members), pulp.LpInteger)
            else:
                x[t, j] = new_var(prob, f"y_{t}_{j}", 0, 1)
        # (E1) every sample in exactly one class: sum_p c[t,p] = |t|; sum_p y[b,p] = 1
        prob += pulp.lpSum(x[t, j] for j in it.options) == (len(it.members) if it.exact else 1), f"E1_{t}"
    beta: dict[tuple[int, int], pulp.LpVariable] = {}
    cap_v: dict[tuple[int, int], pulp.LpVariable] = {}
    n_groups: dict[int, pulp.LpAffineExpression] = {}
    load: dict[int, pulp.LpAffineExpression] = {}
    marg: dict[int, pulp.LpAffineExpression] = {}
    for j, p in enumerate(sizes):
        bits = range(int(math.log2(num_gpus // p)) + 1)
        for k in bits:
            beta[j, k] = new_var(prob, f"beta_{j}_{k}", cat=pulp.LpBinary)
            cap_v[j, k] = new_var(prob, f"v_{j}_{k}", 0, upper)
            # (E3b) v[p,k] = B * beta[p,k], linearized: v <= B and v <= U beta (B <= U)
            prob += cap_v[j, k] <= busy, f"E3b_{j}_{k}"
            prob += cap_v[j, k] <= upper * beta[j, k], f"E3c_{j}_{k}"
        n_groups[j] = pulp.lpSum((1 << k) * beta[j, k] for k in bits)
        load[j] = pulp.lpSum(it.coef[j] * x[t, j] for t, it in enumerate(items) if j in it.coef)
        capacity = pulp.lpSum((1 << k) * cap_v[j, k] for k in bits)
        # (E3) class capacity: load_p <= n_p * B = sum_k 2^k v[p,k]  (n_p = sum_k 2^k beta[p,k])
        prob += load[j] <= capacity, f"E3_{j}"
        # (E3m) every group runs at least one micro-batch: f_p n_p + sum m[t,p] x[t,p] <= n_p B
        marg[j] = pulp.lpSum(it.marg[j] * x[t, j] for t, it in enumerate(items) if j in it.marg)
        prob += marg[j] + float(table.fixed0[j]) * n_groups[j] <= capacity, f"E3m_{j}"
    # (E2) groups cover at most N GPUs: sum_p p * n_p <= N (aligned_layout places them)
    prob += pulp.lpSum(p * n_groups[j] for j, p in enumerate(sizes)) <= num_gpus, "E2"
    # (E4) GPU-seconds: sum_p p * load_p <= N * B (each class's load fits n_p * B)
    prob += pulp.lpSum(p * load[j] for j, p in enumerate(sizes)) <= num_gpus * busy, "E4"
    # (E4m) the same with (E3m)'s left-hand sides
    prob += pulp.lpSum(p * (marg[j] + float(table.fixed0[j]) * n_groups[j]) for j, p in enumerate(sizes)) \
        <= num_gpus * busy, "E4m"
    delta: dict[tuple[int, int], pulp.LpVariable] = {}
    for t, it in enumerate(items):
        if not it.exact:
            continue
        for j in it.options:
            solo = it.solo[j]
            if solo <= lower:
                continue
            if len(it.members) == 1:
                # (E5) a sample's solo time bounds the busy time: t_ip c[i,p] <= B
                prob += solo * x[t, j] <= busy, f"E5_{t}_{j}"
            else:
                delta[t, j] = new_var(prob, f"d_{t}_{j}", cat=pulp.LpBinary)
                # (E5') c[t,p] > 0 only if delta[t,p]; t_tp delta[t,p] <= B
                prob += x[t, j] <= len(it.members) * delta[t, j], f"E5a_{t}_{j}"
                prob += solo * delta[t, j] <= busy, f"E5b_{t}_{j}"
    zeta = level_cuts(prob, items, x, n_groups, busy, lower, upper, m)
    init = _warm_start(items, table, start, upper, x, beta, cap_v, delta, busy, zeta) if start else None
    res: SolveResult = run_solver(prob, solver, deadline - time.perf_counter(), gap, init)
    if res.values is None:
        return None
    return _extract(items, table, res, x, beta, upper)


def _warm_start(items: list[Item], table: CostTable, start: Groups, upper: float,
                x: dict, beta: dict, cap_v: dict, delta: dict, busy: pulp.LpVariable,
                zeta: dict) -> dict[pulp.LpVariable, float] | None:
    """Variable values of the incumbent; None if it does not map onto the program."""
    cls = np.full(len(table.tokens), -1)
    counts: dict[int, int] = {}
    for j, ids in start:
        if ids:
            cls[ids] = j
            counts[j] = counts.get(j, 0) + 1
    init: dict[pulp.LpVariable, float] = {busy: upper}
    init.update({z: 1.0 for z in zeta.values()})
    for t, it in enumerate(items):
        where = cls[it.members]
        if not np.isin(where, it.options).all():
            return None
        ref = table.load[it.members, it.options[0]]
        for j in it.options:
            inside = where == j
            init[x[t, j]] = float(inside.sum()) if it.exact else float(ref[inside].sum() / ref.sum())
            if (t, j) in delta:
                init[delta[t, j]] = float(inside.any())
    for (j, k), var in beta.items():
        on = (counts.get(j, 0) >> k) & 1
        init[var] = float(on)
        init[cap_v[j, k]] = upper * on
    return init


def _extract(items: list[Item], table: CostTable, res: SolveResult, x: dict, beta: dict,
             upper: float) -> ClassSolution:
    val = res.values
    counts = {j: 0 for j in range(len(table.sizes))}
    for (j, k), var in beta.items():
        counts[j] += (1 << k) * int(round(val[var]))
    classes: dict[int, list[int]] = {j: [] for j in counts}
    for t, it in enumerate(items):
        if it.exact:
            members = it.members.tolist()
            for j in it.options:
                c = int(round(val[x[t, j]]))
                classes[j] += members[:c]
                members = members[c:]
            classes[it.options[-1]] += members
            continue
        shares, rest = split_fluid(it, table, {j: val[x[t, j]] for j in it.options})
        for j, ids in shares:
            classes[j] += ids
        classes[it.options[0]] += rest
    bound = min(res.bound, upper) if res.bound is not None else 0.0
    return ClassSolution(counts, classes, bound, res.status)
