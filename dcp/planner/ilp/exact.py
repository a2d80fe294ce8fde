"""The exact program for tiny batches (`knobs.EXACT_MAX_SAMPLES` samples, `knobs.EXACT_MAX_GPUS`
GPUs): a variable per (sample, group slot, micro-batch slot) and per (micro-batch, checkpoint
level), no aggregation, so its optimum is the cost model's over every layout, assignment,
micro-batching and checkpointing; the brute-force tests check it. At sizes with rings the costs are
the linear lower bound, so there its optimum is a proven bound and the plan, priced exactly, may sit
above it (the gap says by how much).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import pulp

import dcp.planner.knobs as knobs
from dcp.costmodel import CostModel
from dcp.planner.ilp.costs import CostTable
from dcp.planner.ilp.pack import place
from dcp.planner.ilp.solvers import new_var, run_solver
from dcp.planner.options import IlpOptions
from dcp.planner.sample import Sample

Layout = list[tuple[int, int, list[list[int]]]]


def group_slots(sizes: Sequence[int], num_gpus: int) -> list[tuple[int, int]]:
    """(SP size, index) of every group a plan could have: N / p slots of each size p (any
    multiset of sizes summing to at most N has an aligned placement, `pack.place`)."""
    return [(p, k) for p in sizes for k in range(num_gpus // p)]


def ckpt_levels(batch: Sequence[Sample], cm: CostModel, p: int) -> list[int]:
    """Each subset's fewest checkpointed layers at p: the levels a micro-batch there can need."""
    tokens = [s.tokens for s in batch]
    levels = set()
    for k in range(1, len(tokens) + 1):
        for combo in combinations(tokens, k):
            r = cm.min_ckpt_layers(sum(combo), p)
            if r is not None:
                levels.add(r)
    return sorted(levels)


def solve_exact(batch: Sequence[Sample], cm: CostModel, table: CostTable, options: IlpOptions,
                upper: float, time_left_s: float) -> tuple[Layout | None, float, str] | None:
    """Minimize the slowest group's busy time exactly: (layout of sample ids, or None when
    nothing beats `upper`; proven busy bound; status), or None when the solver failed."""
    n, sizes = len(batch), table.sizes
    mb_slots = n if options.max_microbatches is None else min(n, options.max_microbatches)
    slots = group_slots(sizes, cm.cluster.num_gpus)
    prob = pulp.LpProblem("dcp_ilp_exact", pulp.LpMinimize)
    busy = new_var(prob, "B", 0, upper * (1 + 1e-6))
    prob += busy
    use = {b: new_var(prob, f"u_{b}", cat=pulp.LpBinary) for b in range(len(slots))}
    x: dict[tuple[int, int, int], pulp.LpVariable] = {}
    for b, (p, k) in enumerate(slots):
        j = sizes.index(p)
        if k > 0:
            prob += use[b] <= use[b - 1], f"X0_{b}"  # (X0) slots of one size used in order (symmetry)
        levels = ckpt_levels(batch, cm, p)
        mb_times = []
        prev = use[b]
        for m in range(mb_slots):
            on = new_var(prob, f"o_{b}_{m}", cat=pulp.LpBinary)
            # (X2) a micro-batch slot runs only in a used group; slots filled in order
            prob += on <= prev, f"X2_{b}_{m}"
            prev = on
            # Symmetry: the groups of one size, and the micro-batches of a group, are ordered by
            # their lowest sample index, so micro-batch m of group slot k holds samples >= k + m.
            members = [i for i in range(k + m, n) if table.ckpt[i, j] >= 0]
            q = {r: new_var(prob, f"q_{b}_{m}_{r}", cat=pulp.LpBinary) for r in levels}
            # (X4) a running micro-batch has exactly one checkpoint level
            prob += pulp.lpSum(q.values()) == on, f"X4_{b}_{m}"
            time_terms = [(q[r], cm.linear_time(p, r).fixed) for r in levels]
            at_level: dict[int, dict[int, pulp.LpVariable]] = {}
            for i in members:
                x[i, b, m] = new_var(prob, f"x_{i}_{b}_{m}", cat=pulp.LpBinary)
                v = at_level[i] = {r: new_var(prob, f"v_{i}_{b}_{m}_{r}", 0, 1) for r in levels}
                # (X3) v[i,r] = x[i] and q[r]: sample i runs at level r; sum_r v[i,r] = x[i], v <= q
                prob += pulp.lpSum(v.values()) == x[i, b, m], f"X3_{i}_{b}_{m}"
                for r in levels:
                    prob += v[r] <= q[r], f"X3q_{i}_{b}_{m}_{r}"
                    lin = cm.linear_time(p, r)
                    time_terms.append((v[r], lin.per_token * int(table.tokens[i]) + lin.per_pair * float(table.pairs[i])))
            for r in levels:
                # (X5) memory at level r: sum_i T_i v[i,r] <= max_tokens(p, r) q[r]
                prob += (pulp.lpSum(int(table.tokens[i]) * at_level[i][r] for i in members)
                         <= cm.max_tokens(p, r) * q[r]), f"X5_{b}_{m}_{r}"
            # (X6) micro-batch time: sum_r fixed(p,r) q[r] + sum_{i,r} marginal_i(p,r) v[i,r]
            mb_times.append(pulp.LpAffineExpression(time_terms))
        # (X7) the busy time is at least every group's sum of micro-batch times
        prob += busy >= pulp.lpSum(mb_times), f"X7_{b}"
    for i in range(n):
        # (X1) every sample runs exactly once
        prob += pulp.lpSum(v for (k, _, _), v in x.items() if k == i) == 1, f"X1_{i}"
    # (X8) the groups fit the cluster: sum_b p_b u_b <= N
    prob += pulp.lpSum(p * use[b] for b, (p, _) in enumerate(slots)) <= cm.cluster.num_gpus, "X8"
    res = run_solver(prob, options.solver, max(time_left_s, 0.05), 1e-9, None, max_nodes=knobs.EXACT_MAX_NODES)
    if res.values is None:
        if "infeasible" in res.status:
            return None, upper, res.status  # nothing beats the warm start: it is optimal
        return None
    groups: list[tuple[int, list[list[int]]]] = []
    for b, (p, _) in enumerate(slots):
        mbs = [[batch[i].id for i in range(n) if (i, b, m) in x and res.values[x[i, b, m]] > 0.5]
               for m in range(mb_slots)]
        mbs = [mb for mb in mbs if mb]
        if res.values[use[b]] > 0.5 and mbs:
            groups.append((p, mbs))
    return place(groups, cm.cluster), min(res.bound if res.bound is not None else 0.0, upper), res.status
