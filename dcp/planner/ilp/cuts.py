"""Bin-packing cuts for the aggregated program (`model`), valid for every plan whose busy time is
below a level theta and switched off by a binary when B >= theta."""

from __future__ import annotations

import numpy as np
import pulp

import dcp.planner.knobs as knobs
from dcp.planner.ilp.classes import Item
from dcp.planner.ilp.solvers import new_var


def level_cuts(prob: pulp.LpProblem, items: list[Item], x: dict, n_groups: dict, busy: pulp.LpVariable,
                lower: float, upper: float, m: int) -> dict[int, pulp.LpVariable]:
    """Cuts that hold whenever B < theta, for a geometric grid of levels theta in (L, U]: binary
    zeta[l] = 1 (only if B >= theta_l) switches level l's off. Per class p with n_p groups of
    capacity theta and exact item sizes g (Martello-Toth L2 / Fekete-Schepers dual feasible
    functions, and a count):
        (Ck) sum (ceil((k+1) g / theta) - 1) <= k n_p, k = 1..4 (k = 1: one > theta/2 a group)
        (C5) theta #{g > theta - a} + sum{a <= g <= theta - a} g <= theta n_p, for a in `_alphas`
        (CN) #{g > theta / (k + 1)} <= k n_p, for the k smaller items give (`_count_rows`)"""
    zeta: dict[int, pulp.LpVariable] = {}
    exact = [t for t, it in enumerate(items) if it.exact]
    if lower <= 0 or not exact:
        return zeta
    g = np.array([[items[t].coef.get(j, 0.0) for j in range(m)] for t in exact])
    mult = np.array([len(items[t].members) for t in exact], dtype=np.float64)
    for lv in range(knobs.CUT_LEVELS):
        theta = lower * (upper / lower) ** ((lv + 1) / knobs.CUT_LEVELS)
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
            groups_terms = list(n_groups[j].items())
            for name, coef, per_group, rows_of in rows:
                on = np.flatnonzero(coef > 0)
                if not len(on):
                    continue
                big_m = float((coef[on] * mult[rows_of[on]]).sum())
                # lhs <= per_group * n_p + big_m * z, written as one row (PuLP's operators copy
                # the expression at every step: a third of the class program's build time)
                terms = [(x[exact[rows_of[i]], j], float(coef[i])) for i in on]
                terms += [(beta, -per_group * w) for beta, w in groups_terms] + [(z, -big_m)]
                prob.addConstraint(pulp.LpConstraint(pulp.LpAffineExpression(terms), pulp.LpConstraintLE,
                                                     f"{name}_{lv}_{j}", 0.0))
        if z is not None and lv - 1 in zeta:
            prob += zeta[lv - 1] >= z, f"C0m_{lv}"  # monotone: B >= theta_l implies B >= theta_(l-1)
    return zeta


def _count_rows(g: np.ndarray, mult: np.ndarray, theta: float) -> list[tuple[str, np.ndarray, float, np.ndarray]]:
    """(CN): a group within theta holds at most k items larger than theta / (k + 1), for each k
    some exact type gives (floor(theta / g), up to `knobs.COUNT_MAX_K`), where over k such exist."""
    rows = []
    on = np.flatnonzero((g > theta / (knobs.COUNT_MAX_K + 1)) & (g <= theta / 5))  # (C1)-(C4) cover the larger
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
    up to `most` distinct sizes g > theta/2."""
    big = np.unique(sizes[(sizes > theta / 2) & (sizes < theta)])
    if len(big) > most:
        big = big[np.linspace(0, len(big) - 1, most).round().astype(int)]
    return [theta / 3, theta / 4] + [float(theta - g) * (1 + 1e-9) for g in big]
