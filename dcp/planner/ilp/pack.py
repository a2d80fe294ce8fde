"""From SP classes to concrete groups: longest-processing-time packing, a local search that
moves and swaps samples between groups to shorten the slowest one, and plan assembly.

A solution here is a list of groups `(j, sample indices)`, j indexing `CostTable.sizes`.
Group time is estimated as (sum over checkpointing samples of their solo time) + (sum over
the others of their marginal time) + fixed(p, 0) * ceil(their tokens / max_tokens(p, 0)):
the canonical micro-batching of `costs` with perfect packing. The plan is priced exactly
by `assemble` afterwards.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from typing import TypeVar

import numpy as np

from dcp.costmodel import Cluster, CostModel
from dcp.planner.baselines import lpt_assign
from dcp.planner.common import aligned_layout, assemble
from dcp.planner.ilp.costs import CostTable, form_microbatches
from dcp.planner.plan import Plan
from dcp.planner.sample import Sample

Groups = list[tuple[int, list[int]]]
T = TypeVar("T")
_TOL = 1e-9
_SWAP_TOP = 24
"""Swaps try this many of the slowest group's largest samples."""


class _Loads:
    """Vectorized group-time estimates: per group, the sum of solo/marginal times and the tokens
    of samples that need no checkpointing (they share micro-batches)."""

    def __init__(self, groups: Groups, table: CostTable) -> None:
        self.t = table
        short = table.ckpt == 0
        self.short_tok = np.where(short, table.tokens[:, None], 0).astype(np.float64)
        self.marg = np.where(short, table.add - table.fixed0[None, :] * table.tokens[:, None]
                             / np.maximum(table.cap0, 1)[None, :], table.solo)
        self.gj = np.array([j for j, _ in groups], dtype=np.int64)
        self.where = np.full(len(table.tokens), -1, dtype=np.int64)
        self.base = np.zeros(len(groups))
        self.tok = np.zeros(len(groups))
        for g, (j, ids) in enumerate(groups):
            self.where[ids] = g
            self.base[g] = self.marg[ids, j].sum()
            self.tok[g] = self.short_tok[ids, j].sum()

    def est(self, base: np.ndarray, tok: np.ndarray, gj: np.ndarray | int) -> np.ndarray:
        """base + fixed(p, 0) * ceil(tokens / max_tokens(p, 0)), elementwise (broadcasting)."""
        cap = np.maximum(self.t.cap0[gj], 1)
        return base + self.t.fixed0[gj] * np.ceil(tok / cap - 1e-12)

    def loads(self) -> np.ndarray:
        return self.est(self.base, self.tok, self.gj)

    def move(self, s: int, h: int) -> None:
        g = self.where[s]
        self.base[g] -= self.marg[s, self.gj[g]]
        self.tok[g] -= self.short_tok[s, self.gj[g]]
        self.base[h] += self.marg[s, self.gj[h]]
        self.tok[h] += self.short_tok[s, self.gj[h]]
        self.where[s] = h


def improve(groups: Groups, table: CostTable, deadline: float, max_iter: int = 2000) -> Groups:
    """Local search: repeatedly apply the move or swap involving the slowest group that most
    lowers the larger of the two touched groups' times, while that stays below the slowest
    group's time. Swaps consider the slowest group's `_SWAP_TOP` largest samples against every
    other sample. Deterministic (ties go to the lowest index); `deadline` is a safety net."""
    if len(groups) < 2:
        return groups
    st = _Loads(groups, table)
    for it in range(max_iter):
        if it % 8 == 0 and time.perf_counter() > deadline:
            break
        loads = st.loads()
        c = int(np.argmax(loads))
        lc, jc = loads[c], st.gj[c]
        members = np.flatnonzero(st.where == c)
        base_c = st.base[c] - st.marg[members, jc]
        tok_c = st.tok[c] - st.short_tok[members, jc]
        new_c = st.est(base_c, tok_c, jc)
        # moves: member s to group h
        new_h = st.est(st.base[None, :] + st.marg[members][:, st.gj],
                       st.tok[None, :] + st.short_tok[members][:, st.gj], st.gj[None, :])
        new_h[:, c] = math.inf
        val = np.maximum(new_h, new_c[:, None])
        k = int(np.argmin(val))
        best_val, best = lc * (1 - _TOL) - _TOL, None
        if val.flat[k] < best_val:
            best_val, best = float(val.flat[k]), (int(members[k // val.shape[1]]), k % val.shape[1], -1)
        # swaps: one of the largest members s with any sample u of another group
        others = np.flatnonzero(st.where != c)
        if len(others):
            top = np.argsort(-st.marg[members, jc], kind="stable")[:_SWAP_TOP]
            s_idx, og = members[top], st.where[others]
            oj = st.gj[og]
            nc = st.est(base_c[top][:, None] + st.marg[others, jc][None, :],
                        tok_c[top][:, None] + st.short_tok[others, jc][None, :], jc)
            nh = st.est(st.base[og][None, :] - st.marg[others, oj][None, :] + st.marg[s_idx[:, None], oj[None, :]],
                        st.tok[og][None, :] - st.short_tok[others, oj][None, :]
                        + st.short_tok[s_idx[:, None], oj[None, :]], oj[None, :])
            val = np.maximum(nc, nh)
            k = int(np.argmin(val))
            if val.flat[k] < best_val:
                r, q = divmod(k, val.shape[1])
                best_val, best = float(val.flat[k]), (int(s_idx[r]), int(og[q]), int(others[q]))
        if best is None:
            break
        s, h, u = best
        if u >= 0:
            st.move(u, c)
        st.move(s, h)
    out: Groups = [(int(st.gj[g]), []) for g in range(len(groups))]
    for i in range(len(table.tokens)):
        out[st.where[i]][1].append(i)
    return out


def lpt(ids: Sequence[int], n_groups: int, j: int, table: CostTable) -> list[list[int]]:
    """`lpt_assign` of the samples by their additive estimates at size index j (ties by index)."""
    if n_groups == 0:
        return []
    order = sorted(ids)
    return [[order[k] for k in b] for b in lpt_assign([float(table.add[i, j]) for i in order], n_groups)]


def multifit(ids: Sequence[int], n_groups: int, j: int, table: CostTable, rounds: int = 20) -> list[list[int]]:
    """MULTIFIT (Coffman, Garey, Johnson 1978): bisect on a capacity for which first-fit-decreasing
    packs every sample into `n_groups` groups; LPT's packing when it is better."""
    best = lpt(ids, n_groups, j, table)
    if n_groups <= 1 or len(ids) <= n_groups:
        return best
    size = {i: float(table.add[i, j]) for i in ids}
    order = sorted(ids, key=lambda i: (-size[i], i))
    hi = max(sum(size[i] for i in b) for b in best)
    lo = max(sum(size.values()) / n_groups, size[order[0]])
    for _ in range(rounds):
        if hi - lo <= 1e-4 * hi:
            break
        cap = (lo + hi) / 2
        bins: list[list[int]] = [[] for _ in range(n_groups)]
        room = [cap] * n_groups
        for i in order:
            k = next((k for k in range(n_groups) if size[i] <= room[k] + 1e-12), None)
            if k is None:
                lo = cap
                break
            bins[k].append(i)
            room[k] -= size[i]
        else:
            hi, best = cap, bins
    return best


def estimate(groups: Groups, table: CostTable) -> float:
    """Estimated slowest-group time of a solution."""
    return float(_Loads(groups, table).loads().max()) if groups else 0.0


def groups_of_plan(plan: Plan, table: CostTable, index: dict[int, int]) -> Groups | None:
    """A plan's groups in table indices; None if it uses an SP size outside the table."""
    out: Groups = []
    for g in plan.groups:
        if g.sp not in table.sizes:
            return None
        ids = [index[i] for mb in g.microbatches for i in mb.samples]
        if not np.all(table.ckpt[ids, table.sizes.index(g.sp)] >= 0):
            return None
        out.append((table.sizes.index(g.sp), ids))
    return out


def place(groups: Sequence[tuple[int, T]], cluster: Cluster) -> list[tuple[int, int, T]]:
    """(first rank, SP size, payload) for groups given as (SP size, payload): `aligned_layout`'s
    blocks, largest sizes first (groups of one size keep their order)."""
    ordered = sorted(groups, key=lambda g: -g[0])
    starts = aligned_layout(Counter(p for p, _ in ordered), cluster.num_gpus, cluster.gpus_per_node)
    return [(start, p, payload) for (start, p), (_, payload) in zip(starts, ordered, strict=True)]


def to_plan(groups: Groups, batch: Sequence[Sample], cm: CostModel, table: CostTable,
            max_microbatches: int | None, **kw: object) -> Plan | None:
    """Aligned ranks, canonical micro-batches, exact prices (assemble validates). None when a
    group cannot meet the micro-batch cap."""
    layout = []
    for start, p, (j, ids) in place([(table.sizes[j], (j, ids)) for j, ids in groups if ids], cm.cluster):
        mbs = form_microbatches(ids, j, table, cm, max_microbatches)
        if mbs is None:
            return None
        layout.append((start, p, [[batch[i].id for i in mb] for mb in mbs]))
    return assemble("ilp", batch, cm, layout, **kw)  # type: ignore[arg-type]


def class_counts(loads: dict[int, float], sizes: Sequence[int], num_gpus: int) -> dict[int, int]:
    """Groups per class (keyed by size index) for class loads (group-seconds): the smallest
    per-group time T with sum_p p * ceil(load_p / T) <= N (bisection), at least one group per
    used class; left-over GPUs go one group at a time to the class with the most load per group."""
    used = sorted(j for j, v in loads.items() if v > 0)

    def counts_at(t: float) -> dict[int, int]:
        return {j: max(1, math.ceil(loads[j] / t - 1e-12)) for j in used}

    def gpus(c: dict[int, int]) -> int:
        return sum(sizes[j] * c[j] for j in c)

    lo, hi = 1e-12, max(loads[j] for j in used) + 1e-12
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if gpus(counts_at(mid)) <= num_gpus else (mid, hi)
    counts = counts_at(hi)
    left = num_gpus - gpus(counts)
    while True:
        fit = [j for j in used if sizes[j] <= left]
        if not fit:
            break
        j = max(fit, key=lambda j: (loads[j] / counts[j], -j))
        counts[j] += 1
        left -= sizes[j]
    return counts


def heuristic(table: CostTable, num_gpus: int, target: float) -> Groups:
    """A quick solution: each sample to the SP size with the least GPU-seconds among those where
    it runs alone within `target` (else its fastest), classes merged upward until they fit the
    cluster, GPUs shared by `class_counts`, samples spread by LPT."""
    sizes = np.array(table.sizes)
    gpu_time = table.add * sizes[None, :]
    ok = table.solo <= target
    cheapest = np.argmin(np.where(ok, gpu_time, np.inf), axis=1)
    choice = np.where(ok.any(axis=1), cheapest, np.argmin(table.solo, axis=1))
    used = sorted(set(choice.tolist()))
    # A sample that fits at size p fits at every larger size (memory per GPU shrinks with p).
    while sum(table.sizes[j] for j in used) > num_gpus:
        choice[choice == used[0]] = used[1]
        used = used[1:]
    loads = {j: float(table.add[choice == j, j].sum()) for j in used}
    counts = class_counts(loads, table.sizes, num_gpus)
    groups: Groups = []
    for j in used:
        ids = np.flatnonzero(choice == j).tolist()
        groups += [(j, b) for b in multifit(ids, counts[j], j, table)]
    return groups
