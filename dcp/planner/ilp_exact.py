"""The exact program for tiny batches: one variable per (sample, aligned group, micro-batch slot)
and per (micro-batch, checkpoint level). No aggregation, so its optimum is the true optimum of
the cost model over every group layout, assignment, micro-batching and checkpointing.

Used where it pays: a handful of samples on a few GPUs (`ilp.EXACT_MAX_*`); the brute-force
tests check it, and through it the aggregated program's bounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import pulp

from dcp.costmodel import CostModel
from dcp.data.workloads import Sample
from dcp.planner.ilp_costs import CostTable, mb_capacity, min_ckpt
from dcp.planner.ilp_solvers import run_solver
from dcp.planner.options import IlpOptions

Layout = list[tuple[int, int, list[list[int]]]]


def aligned_blocks(sizes: Sequence[int], num_gpus: int, gpus_per_node: int) -> list[tuple[int, int]]:
    """Every (first rank, size) a group may occupy: aligned, and inside a node when it fits one."""
    out = []
    for p in sizes:
        for start in range(0, num_gpus - p + 1, p):
            if p <= gpus_per_node and start // gpus_per_node != (start + p - 1) // gpus_per_node:
                continue
            out.append((start, p))
    return out


def ckpt_levels(batch: Sequence[Sample], cm: CostModel, p: int) -> list[int]:
    """Checkpoint levels some micro-batch at p can need: the fewest layers of each subset's tokens
    (the best level for a micro-batch is its fewest, since every cost grows with r)."""
    tokens = [s.tokens for s in batch]
    levels = set()
    for k in range(1, len(tokens) + 1):
        for combo in combinations(tokens, k):
            r = min_ckpt(cm, sum(combo), p)
            if r is not None:
                levels.add(r)
    return sorted(levels)


def solve_exact(batch: Sequence[Sample], cm: CostModel, table: CostTable, options: IlpOptions,
                upper: float, time_left_s: float) -> tuple[Layout | None, float, str] | None:
    """Minimize the slowest group's busy time exactly. Returns (layout of sample ids or None when
    the solver found nothing better than `upper`, proven lower bound on busy time, status), or
    None when the solver failed."""
    n, sizes = len(batch), table.sizes
    slots = n if options.max_microbatches is None else min(n, options.max_microbatches)
    blocks = aligned_blocks(sizes, cm.cluster.num_gpus, cm.cluster.gpus_per_node)
    prob = pulp.LpProblem("dcp_ilp_exact", pulp.LpMinimize)
    busy = pulp.LpVariable("B", 0, upper * (1 + 1e-6))
    prob += busy
    use = {b: pulp.LpVariable(f"u_{b}", cat=pulp.LpBinary) for b in range(len(blocks))}
    x: dict[tuple[int, int, int], pulp.LpVariable] = {}
    on: dict[tuple[int, int], pulp.LpVariable] = {}
    for b, (_, p) in enumerate(blocks):
        j = sizes.index(p)
        levels = ckpt_levels(batch, cm, p)
        mb_times = []
        for m in range(slots):
            on[b, m] = pulp.LpVariable(f"o_{b}_{m}", cat=pulp.LpBinary)
            # (X2) a micro-batch slot runs only in a used group, slots filled in order
            prob += on[b, m] <= use[b] if m == 0 else on[b, m] <= on[b, m - 1], f"X2_{b}_{m}"
            for i in range(n):
                if table.ckpt[i, j] >= 0:
                    x[i, b, m] = pulp.LpVariable(f"x_{i}_{b}_{m}", cat=pulp.LpBinary)
                    # (X3) a sample joins only a running micro-batch
                    prob += x[i, b, m] <= on[b, m], f"X3_{i}_{b}_{m}"
            members = [i for i in range(n) if (i, b, m) in x]
            q = {r: pulp.LpVariable(f"q_{b}_{m}_{r}", cat=pulp.LpBinary) for r in levels}
            # (X4) a running micro-batch has exactly one checkpoint level
            prob += pulp.lpSum(q.values()) == on[b, m], f"X4_{b}_{m}"
            # (X5) memory: sum_i T_i x[i,b,m] <= sum_r max_tokens(p, r) q[b,m,r]
            prob += (pulp.lpSum(int(table.tokens[i]) * x[i, b, m] for i in members)
                     <= pulp.lpSum(mb_capacity(cm, p, r) * q[r] for r in levels)), f"X5_{b}_{m}"
            tau = pulp.LpVariable(f"tau_{b}_{m}", 0)
            for r in levels:
                lin = table.linear(cm, p, r)
                work = {i: lin.per_token * int(table.tokens[i]) + lin.per_pair * float(table.pairs[i]) for i in members}
                big = lin.fixed + sum(work.values())
                # (X6) time at level r: tau >= fixed(p,r) + sum_i marginal_i(p,r) x_i - M (1 - q_r)
                prob += (tau >= lin.fixed * q[r] + pulp.lpSum(work[i] * x[i, b, m] for i in members)
                         - big * (1 - q[r])), f"X6_{b}_{m}_{r}"
            mb_times.append(tau)
        # (X7) the busy time is at least every group's sum of micro-batch times
        prob += busy >= pulp.lpSum(mb_times), f"X7_{b}"
    for i in range(n):
        # (X1) every sample runs exactly once
        prob += pulp.lpSum(v for (k, _, _), v in x.items() if k == i) == 1, f"X1_{i}"
    for rank in range(cm.cluster.num_gpus):
        # (X8) a rank belongs to at most one group
        prob += pulp.lpSum(use[b] for b, (s, p) in enumerate(blocks) if s <= rank < s + p) <= 1, f"X8_{rank}"
    res = run_solver(prob, options.solver, max(time_left_s, 0.05), 1e-9, None)
    if res.values is None:
        if res.status == "infeasible" or "infeasible" in res.status:
            return None, upper, res.status  # nothing beats the warm start: it is optimal
        return None
    layout: Layout = []
    for b, (start, p) in enumerate(blocks):
        if res.values[use[b]] < 0.5:
            continue
        mbs = [[batch[i].id for i in range(n) if (i, b, m) in x and res.values[x[i, b, m]] > 0.5]
               for m in range(slots)]
        mbs = [mb for mb in mbs if mb]
        if mbs:
            layout.append((start, p, mbs))
    return layout, min(res.bound if res.bound is not None else 0.0, upper), res.status
