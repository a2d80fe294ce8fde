"""The aggregated mixed-integer program: how many groups of each SP size, which samples in which
size class, minimizing the slowest group's busy time B (the step time less the gradient sync).

Symmetric groups are aggregated: a class of n_p identical groups of size p is one capacity
n_p * B, not n_p slots. Samples are grouped into
- exact types: identical samples (same tokens and attention pairs) that are large (their best
  solo time is at least `SMALL` of the incumbent U), with an integer count c[t, p] per class;
- fluid buckets: small samples with (nearly) proportional costs across sizes, with a fraction
  y[b, p] of the bucket per class. Coefficients use the smallest ratio in the bucket, so the
  program stays a relaxation; the bound only loses the ratio spread, at most `RATIO_TOL`.

The program (g: `CostTable.load`, t: solo time, U: incumbent busy time, L: proven bound):

    min B,  L <= B <= U
    (E1) sum_p c[t,p] = |t|;  sum_p y[b,p] = 1                       every sample in one class
    (E2) sum_p p n_p <= N,  n_p = sum_k 2^k beta[p,k]                groups fit the cluster
    (E3) load_p = sum_t g[t,p] c[t,p] + sum_b G[b,p] y[b,p] <= n_p B  class capacity, with
         n_p B = sum_k 2^k v[p,k], v[p,k] <= B, v[p,k] <= U beta[p,k] (exact since B <= U)
    (E4) sum_p p load_p <= N B                                        GPU-seconds
    (E5) t[t,p] (c[t,p] > 0) <= B                                     a sample alone fits in B
    (C*) bin-packing cuts at levels theta in (L, U], off when B >= theta (`_level_cuts`)

Every coefficient is a lower bound on what a sample adds to its group, every cut holds for any
plan with busy time at most U, so the solver's dual bound, capped at U, is a proven lower bound
on B (a plan with B > U is no better than the incumbent).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import pulp

from dcp.planner.ilp.costs import CostTable
from dcp.planner.ilp.pack import Groups
from dcp.planner.ilp.solvers import SolveResult, new_var, run_solver

SMALL = 0.03
"""A sample whose fastest solo time is below this fraction of U is treated as fluid."""
RATIO_TOL = 0.005
"""Fluid bucket: each size's load ratio (to the bucket's reference size) varies by at most this."""
MAX_EXACT = 48
"""Exact types at most (the program's integer columns): the longest samples; the rest are fluid."""
MAX_BUCKETS = 96
"""Fluid buckets at most: past it the ratio tolerance doubles."""
LEVELS = 8
"""Busy-time levels between the lower bound and the incumbent at which bin-packing cuts apply."""
COUNT_MAX_K = 64
"""Counting cuts (CN) for items down to theta / (this + 1)."""


@dataclass
class Item:
    """A program item: an exact type (identical large samples) or a fluid bucket of small ones."""

    members: np.ndarray
    """Batch indices (table rows) of the samples it stands for."""
    options: list[int]
    exact: bool
    coef: dict[int, float]
    """Load per unit: per sample for exact types, per whole bucket for fluid ones."""


@dataclass
class ClassSolution:
    """The program's answer: groups per size index and the samples of each class."""

    counts: dict[int, int]
    classes: dict[int, list[int]]
    bound: float
    status: str


def program_items(table: CostTable, upper: float) -> list[Item]:
    """Exact types and fluid buckets; a sample's classes are the sizes where it runs alone
    within U (no plan better than the incumbent puts it elsewhere). The program's size does not
    grow with the batch: at most `MAX_EXACT` exact types (the largest; the other large samples
    join the fluid ones), and buckets of samples whose load ratios across sizes agree to within
    `RATIO_TOL`, the tolerance doubled until at most `MAX_BUCKETS` remain."""
    n = len(table.tokens)
    opts = (table.ckpt >= 0) & (table.solo <= upper * (1 + 1e-9))
    best_solo = table.solo.min(axis=1)
    large = np.flatnonzero(best_solo >= SMALL * upper)
    exact_ids = _exact_types(table, large, best_solo)
    items: list[Item] = []
    for ids in exact_ids:
        o = np.flatnonzero(opts[ids[0]]).tolist()
        items.append(Item(ids, o, True, {j: float(table.load[ids[0], j]) for j in o}))
    fluid = np.setdiff1d(np.arange(n), np.concatenate(exact_ids) if exact_ids else np.zeros(0, dtype=np.int64))
    if not len(fluid):
        return items
    mask = (opts[fluid] * (1 << np.arange(opts.shape[1]))).sum(axis=1)
    ref = np.argmax(opts[fluid], axis=1)  # the smallest size where each sample may go
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(opts[fluid], table.load[fluid] / table.load[fluid, ref][:, None], 1.0)
    tol = RATIO_TOL
    while True:
        cells = np.floor(np.log(ratio) / np.log1p(tol)).astype(np.int64)
        keys = np.column_stack([mask, cells])
        _, bucket = _unique_rows(keys)
        if bucket.max() + 1 <= MAX_BUCKETS:
            break
        tol *= 2
    order = np.lexsort((fluid, bucket))
    starts = np.flatnonzero(np.concatenate([[True], bucket[order][1:] != bucket[order][:-1]]))
    for lo, hi in zip(starts, np.append(starts[1:], len(order)), strict=True):
        members = fluid[order[lo:hi]]
        o = np.flatnonzero(opts[members[0]]).tolist()
        low = ratio[order[lo:hi]].min(axis=0)
        total = float(table.load[members, o[0]].sum())
        # Coefficients use the smallest ratio in the bucket: the program stays a relaxation.
        items.append(Item(members, o, False, {j: total * float(low[j]) for j in o}))
    return items


def _exact_types(table: CostTable, large: np.ndarray, best_solo: np.ndarray) -> list[np.ndarray]:
    """Identical large samples grouped (same tokens and pairs), at most `MAX_EXACT` groups: the
    ones with the longest solo times."""
    if not len(large):
        return []
    keys = np.column_stack([table.tokens[large], table.pairs[large]])
    _, inverse = _unique_rows(keys)
    order = np.lexsort((large, inverse))
    starts = np.flatnonzero(np.concatenate([[True], inverse[order][1:] != inverse[order][:-1]]))
    groups = [large[order[lo:hi]] for lo, hi in zip(starts, np.append(starts[1:], len(order)), strict=True)]
    if len(groups) > MAX_EXACT:
        groups = sorted(groups, key=lambda g: (-best_solo[g[0]], int(g[0])))[:MAX_EXACT]
    return sorted(groups, key=lambda g: (int(table.tokens[g[0]]), float(table.pairs[g[0]])))


def _unique_rows(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First index of each distinct row and the row number of every row (rows in sorted order)."""
    order = np.lexsort(keys.T[::-1])
    sk = keys[order]
    new = np.concatenate([[True], (sk[1:] != sk[:-1]).any(axis=1)])
    rank = np.cumsum(new) - 1
    inverse = np.empty(len(keys), dtype=np.int64)
    inverse[order] = rank
    return order[new], inverse


def solve_classes(table: CostTable, num_gpus: int, upper: float, lower: float, start: Groups | None,
                  solver: str, deadline: float, gap: float) -> ClassSolution | None:
    """Solve the program; None when the solver gives no solution. `upper` (U) is the incumbent's
    busy time, `lower` a proven bound on B; `start` the incumbent's groups (warm start); the
    solver stops at `deadline` (time.perf_counter()) at the latest."""
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
        # (E3) class capacity: load_p <= n_p * B = sum_k 2^k v[p,k]  (n_p = sum_k 2^k beta[p,k])
        prob += load[j] <= pulp.lpSum((1 << k) * cap_v[j, k] for k in bits), f"E3_{j}"
    # (E2) groups cover at most N GPUs: sum_p p * n_p <= N (aligned_layout places them)
    prob += pulp.lpSum(p * n_groups[j] for j, p in enumerate(sizes)) <= num_gpus, "E2"
    # (E4) GPU-seconds: sum_p p * load_p <= N * B (each class's load fits n_p * B)
    prob += pulp.lpSum(p * load[j] for j, p in enumerate(sizes)) <= num_gpus * busy, "E4"
    delta: dict[tuple[int, int], pulp.LpVariable] = {}
    for t, it in enumerate(items):
        if not it.exact:
            continue
        i0 = it.members[0]
        for j in it.options:
            solo = float(table.solo[i0, j])
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
    zeta = _level_cuts(prob, items, x, n_groups, busy, lower, upper, m)
    init = _warm_start(items, table, start, upper, x, beta, cap_v, delta, busy, zeta) if start else None
    res: SolveResult = run_solver(prob, solver, deadline - time.perf_counter(), gap, init)
    if res.values is None:
        return None
    return _extract(items, table, res, x, beta, upper)


def _level_cuts(prob: pulp.LpProblem, items: list[Item], x: dict, n_groups: dict, busy: pulp.LpVariable,
                lower: float, upper: float, m: int) -> dict[int, pulp.LpVariable]:
    """Bin-packing cuts that hold whenever B < theta, for a geometric grid of levels theta in
    (L, U]. zeta[l] = 1 (allowed only if B >= theta_l) switches level l's cuts off. For each class
    p with n_p groups of capacity theta and exact item sizes g (Martello-Toth L2 / Fekete-Schepers
    dual feasible functions):
      (Ck) sum (ceil((k+1) g / theta) - 1) <= k n_p, k = 1..4 (k = 1: one item > theta/2 per group)
      (C5) theta #{g > theta - a} + sum{a <= g <= theta - a} g <= theta n_p, for a in `_alphas`
      (CN) #{g > theta / (k + 1)} <= k n_p, for the k smaller items give (`_count_rows`)
    """
    zeta: dict[int, pulp.LpVariable] = {}
    exact = [t for t, it in enumerate(items) if it.exact]
    if lower <= 0 or not exact:
        return zeta
    g = np.array([[items[t].coef.get(j, 0.0) for j in range(m)] for t in exact])
    mult = np.array([len(items[t].members) for t in exact], dtype=np.float64)
    for lv in range(LEVELS):
        theta = lower * (upper / lower) ** ((lv + 1) / LEVELS)
        z = None
        for j in range(m):
            sized = np.flatnonzero(g[:, j] > theta / 5)
            rows = []
            if len(sized):
                gs = g[sized, j]
                rows = [(f"C{k}", np.ceil((k + 1) * gs / theta - 1e-12) - 1, float(k), sized) for k in (1, 2, 3, 4)]
                for n, a in enumerate(_alphas(gs, theta)):
                    rows.append((f"C5{n}", np.where(gs > theta - a, theta, np.where(gs >= a, gs, 0.0)), theta, sized))
            rows += _count_rows(g[:, j], mult, theta)
            if not rows:
                continue
            if z is None:
                z = zeta[lv] = new_var(prob, f"zeta_{lv}", cat=pulp.LpBinary)
                # (C0) level l's cuts may be switched off only if B >= theta_l
                prob += busy >= theta * z, f"C0_{lv}"
            for name, coef, per_group, rows_of in rows:
                on = np.flatnonzero(coef > 0)
                if not len(on):
                    continue
                big_m = float((coef[on] * mult[rows_of[on]]).sum())
                lhs = pulp.LpAffineExpression([(x[exact[rows_of[i]], j], float(coef[i])) for i in on])
                prob += lhs <= per_group * n_groups[j] + big_m * z, f"{name}_{lv}_{j}"
        if z is not None and lv - 1 in zeta:
            prob += zeta[lv - 1] >= z, f"C0m_{lv}"  # monotone: B >= theta_l implies B >= theta_(l-1)
    return zeta


def _count_rows(g: np.ndarray, mult: np.ndarray, theta: float) -> list[tuple[str, np.ndarray, float, np.ndarray]]:
    """(CN) a group within theta holds at most k items larger than theta / (k + 1): for each k
    that some exact type's size gives (k = floor(theta / g), up to `COUNT_MAX_K`), the number of
    items at least that large is at most k n_p. Written only where it can bind: when more such
    items exist than k (with one group they would not fit)."""
    rows = []
    on = np.flatnonzero((g > theta / (COUNT_MAX_K + 1)) & (g <= theta / 5))  # (C1)-(C4) cover the larger
    if not len(on):
        return rows
    ks = np.floor(theta / g[on] * (1 - 1e-12)).astype(np.int64)
    for k in np.unique(ks):
        members = on[ks <= k]
        if mult[members].sum() > k:
            rows.append((f"CN{k}", np.ones(len(members)), float(k), members))
    return rows


def _alphas(sizes: np.ndarray, theta: float, most: int = 4) -> list[float]:
    """Parameters a in (0, theta/2] of the Martello-Toth cut: theta/3, theta/4, and theta - g for
    up to `most` distinct sizes g > theta/2 (then every item >= g counts a whole group, and the
    items that cannot join it count their size)."""
    big = np.unique(sizes[(sizes > theta / 2) & (sizes < theta)])
    if len(big) > most:
        big = big[np.linspace(0, len(big) - 1, most).round().astype(int)]
    return [theta / 3, theta / 4] + [float(theta - g) * (1 + 1e-9) for g in big]


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


def split_fluid(it: Item, table: CostTable, share: dict[int, float]) -> tuple[list[tuple[int, list[int]]], list[int]]:
    """A fluid bucket's samples over its classes, `share[j]` the fraction of the bucket's load
    at class j: largest samples to the largest sizes, each class up to its share (a sample goes
    while the class's load before it plus half its own stays within the share). Returns the
    (class, samples) taken and the samples rounding left over."""
    ref = it.options[0]
    members = it.members[np.lexsort((it.members, -table.tokens[it.members]))]
    load = table.load[members, ref]
    total = float(load.sum())
    mid = np.cumsum(load) - load / 2  # where each sample's middle falls, from the front
    done = np.concatenate([[0.0], np.cumsum(load)])
    out: list[tuple[int, list[int]]] = []
    start = 0
    for j in sorted(share, reverse=True):
        end = max(start, int(np.searchsorted(mid, done[start] + share[j] * total, side="right")))
        out.append((j, members[start:end].tolist()))
        start = end
    return out, members[start:].tolist()


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
