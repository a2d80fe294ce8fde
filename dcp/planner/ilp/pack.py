"""From SP classes to concrete groups: longest processing time first, a local search that moves and
swaps samples off the slowest group (`improve`), a re-spread of the small samples over every group
and size (`rebalance`), and the groups' layout. A solution is a list of groups
`(j, sample indices)`, j indexing `CostTable.sizes`, estimated by `group_estimate`: the canonical
micro-batching of `costs` packed perfectly, so never above its exact price.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from collections.abc import Sequence
from typing import TypeVar

import numpy as np

import dcp.planner.knobs as knobs
from dcp.costmodel import Cluster, CostModel
from dcp.planner.bounds import makespan_floor
from dcp.planner.common import aligned_layout
from dcp.planner.ilp.budget import Deadline
from dcp.planner.ilp.costs import CostTable, form_microbatches
from dcp.planner.levels import narrow
from dcp.planner.lpt import by_group, lpt
from dcp.planner.pricing import Layout

Groups = list[tuple[int, list[int]]]
T = TypeVar("T")
_TOL = 1e-9


def group_estimate(table: CostTable, base: np.ndarray | float, tok: np.ndarray | float,
                   pairs: np.ndarray | float, gj: np.ndarray | int,
                   microbatches: np.ndarray | int | None = None, scalar: bool = False) -> np.ndarray:
    """A group's time estimate from its terms (`CostTable.estimate_terms` summed), the planner's
    one estimate of a group of samples (the search's moves, best fit, the nested columns): base +
    fixed(p, 0) * ceil(tokens / max_tokens(p, 0)) (or times `microbatches`, the shared
    micro-batches' count where it is known) + the ring transfers the shared micro-batches leave
    exposed at least (`CostTable.exposure`), elementwise (broadcasting). With `scalar` (Python
    floats in, a float out; gj a ring-free size) the same sum in plain floats: best fit's inner
    loop estimates one group at a time, where a numpy call costs microseconds."""
    if scalar:
        return base + float(table.fixed0[gj]) * math.ceil(tok / max(float(table.cap0[gj]), 1.0) - 1e-12)
    if microbatches is None:
        microbatches = np.ceil(tok / np.maximum(table.cap0[gj], 1) - 1e-12)
    out = base + table.fixed0[gj] * microbatches
    return out + table.exposure(tok, pairs, gj, np.maximum(microbatches, 1)) if table.rings else out


class _Loads:
    """Vectorized group estimates: per group, its samples' summed solo/marginal times and the
    tokens and pairs of those that need no checkpointing (they share micro-batches)."""

    def __init__(self, groups: Groups, table: CostTable) -> None:
        self.t = table
        self.short_tok, self.short_pairs, self.marg = table.estimate_terms()
        self.gj = np.array([j for j, _ in groups], dtype=np.int64)
        self.where = np.full(len(table.tokens), -1, dtype=np.int64)
        for g, (_, ids) in enumerate(groups):
            self.where[ids] = g
        placed = np.flatnonzero(self.where >= 0)
        cols = self.gj[self.where[placed]]
        self.base = np.bincount(self.where[placed], weights=self.marg[placed, cols], minlength=len(groups))
        self.tok = np.bincount(self.where[placed], weights=self.short_tok[placed, cols], minlength=len(groups))
        self.pairs = np.bincount(self.where[placed], weights=self.short_pairs[placed, cols], minlength=len(groups))
        self.count = np.bincount(self.where[placed], minlength=len(groups))
        self._held: list[np.ndarray] | None = None

    def held(self, g: int) -> np.ndarray:
        """Group g's samples, ascending (kept up to date by `move`)."""
        if self._held is None:
            order = np.argsort(self.where, kind="stable")
            cuts = np.searchsorted(self.where[order], np.arange(-1, len(self.gj) + 1))
            self._held = [order[cuts[k + 1]:cuts[k + 2]] for k in range(len(self.gj))]
        return self._held[g]

    def loads(self) -> np.ndarray:
        return group_estimate(self.t, self.base, self.tok, self.pairs, self.gj)

    def move(self, s: int, h: int) -> None:
        g = self.where[s]
        self.base[g] -= self.marg[s, self.gj[g]]
        self.tok[g] -= self.short_tok[s, self.gj[g]]
        self.pairs[g] -= self.short_pairs[s, self.gj[g]]
        self.base[h] += self.marg[s, self.gj[h]]
        self.tok[h] += self.short_tok[s, self.gj[h]]
        self.pairs[h] += self.short_pairs[s, self.gj[h]]
        self.where[s] = h
        self.count[g] -= 1
        self.count[h] += 1
        if self._held is not None:
            self._held[g] = self._held[g][self._held[g] != s]
            at = int(np.searchsorted(self._held[h], s))
            self._held[h] = np.concatenate((self._held[h][:at], [s], self._held[h][at:]))


def improve(groups: Groups, table: CostTable, deadline: float | Deadline, max_iter: int = 2000,
            num_gpus: int | None = None) -> Groups:
    """Local search: apply the move or swap off the slowest group that most lowers the larger of
    the two touched groups' times, while that stays below the slowest group's time (swaps: its
    `knobs.SWAP_TOP` largest samples against others). With `num_gpus`, free GPUs become empty
    groups of the smallest size first (`with_free_groups`); groups left empty are dropped.
    Halfway (in steps and time) the small samples are re-spread (`rebalance`), kept unless that
    raises the slowest group: single moves cannot lower a level hundreds of groups share. When
    nothing helps, the slowest group merges with the least-loaded one of its size (`_merge`),
    else grows or sheds a sample onto GPUs freed from the least-loaded groups (`_grow`).
    Deterministic (ties to the lowest index) unless `deadline` stops it, which it then records."""
    if num_gpus is not None:
        groups = with_free_groups(groups, table, num_gpus)
    if len(groups) < 2:
        return [g for g in groups if g[1]]
    deadline = Deadline.of(deadline)
    # Half the steps and the time, then the small samples re-spread across every group (cheap:
    # it balances what moves off the slowest group one at a time cannot), then the rest.
    half = Deadline(min(deadline.at, time.perf_counter() + deadline.left() / 2))
    groups, left = _search(groups, table, half, max_iter // 2)
    if not deadline.passed():
        balanced = rebalance(groups, table, deadline=deadline)
        if estimate(balanced, table) <= estimate(groups, table):  # the same slowest group may be left, alone
            groups = with_free_groups(balanced, table, num_gpus) if num_gpus is not None else balanced
    groups, _ = _search(groups, table, deadline, max_iter - max_iter // 2 + left)
    return [g for g in groups if g[1]]


def _search(groups: Groups, table: CostTable, deadline: Deadline, max_iter: int) -> tuple[Groups, int]:
    """`improve`'s moves and swaps, at most `max_iter`: the groups (empties kept), steps unused."""
    st = _Loads(groups, table)
    for it in range(max_iter):
        if it % 8 == 0 and deadline.passed():
            return _groups_of(st.where, st.gj), 0
        loads = st.loads()
        c = int(np.argmax(loads))
        lc, jc = loads[c], st.gj[c]
        members = st.held(c)
        base_c = st.base[c] - st.marg[members, jc]
        tok_c = st.tok[c] - st.short_tok[members, jc]
        pairs_c = st.pairs[c] - st.short_pairs[members, jc]
        new_c = group_estimate(st.t, base_c, tok_c, pairs_c, jc)
        # moves: member s to group h
        new_h = group_estimate(st.t, st.base[None, :] + st.marg[members][:, st.gj],
                               st.tok[None, :] + st.short_tok[members][:, st.gj],
                               st.pairs[None, :] + st.short_pairs[members][:, st.gj], st.gj[None, :])
        new_h[:, c] = math.inf
        val = np.maximum(new_h, new_c[:, None])
        k = int(np.argmin(val))
        best_val, best = lc * (1 - _TOL) - _TOL, None
        if val.flat[k] < best_val:
            best_val, best = float(val.flat[k]), (int(members[k // val.shape[1]]), k % val.shape[1], -1)
        # swaps: one of the largest members s with any sample u of the least-loaded groups
        by_load = np.argsort(loads, kind="stable")
        by_load = by_load[st.count[by_load] > 0]  # empty groups have no sample to swap
        # the least-loaded groups overall and of every SP size (a swap can change sizes)
        partners = np.unique(np.concatenate([by_load[:knobs.SWAP_GROUPS]] + [
            by_load[st.gj[by_load] == j][:knobs.SWAP_PER_SIZE] for j in np.unique(st.gj)]))
        others = np.sort(np.concatenate([st.held(int(g)) for g in partners if g != c] + [np.zeros(0, np.int64)]))
        if len(others) > knobs.SWAP_OTHERS:
            others = others[np.linspace(0, len(others) - 1, knobs.SWAP_OTHERS).astype(np.int64)]
        if len(others):
            top = np.argsort(-st.marg[members, jc], kind="stable")[:knobs.SWAP_TOP]
            s_idx, og = members[top], st.where[others]
            oj = st.gj[og]
            nc = group_estimate(st.t, base_c[top][:, None] + st.marg[others, jc][None, :],
                                tok_c[top][:, None] + st.short_tok[others, jc][None, :],
                                pairs_c[top][:, None] + st.short_pairs[others, jc][None, :], jc)
            nh = group_estimate(st.t, st.base[og][None, :] - st.marg[others, oj][None, :] + st.marg[s_idx[:, None], oj[None, :]],
                                st.tok[og][None, :] - st.short_tok[others, oj][None, :]
                                + st.short_tok[s_idx[:, None], oj[None, :]],
                                st.pairs[og][None, :] - st.short_pairs[others, oj][None, :]
                                + st.short_pairs[s_idx[:, None], oj[None, :]], oj[None, :])
            val = np.maximum(nc, nh)
            k = int(np.argmin(val))
            if val.flat[k] < best_val:
                r, q = divmod(k, val.shape[1])
                best_val, best = float(val.flat[k]), (int(s_idx[r]), int(og[q]), int(others[q]))
        if best is None:
            merged = _merge(st, c, loads)
            if merged is None:
                merged = _grow(st, c, loads, deadline)
            if merged is None:
                return _groups_of(st.where, st.gj), 0 if deadline.passed() else max_iter - it
            st = _Loads(merged, table)
            continue
        s, h, u = best
        if u >= 0:
            st.move(u, c)
        st.move(s, h)
    return _groups_of(st.where, st.gj), 0


def rebalance(groups: Groups, table: CostTable, deadline: float | Deadline = math.inf) -> Groups:
    """The small samples (sharing micro-batches, each below `knobs.REBALANCE_SMALL_SHARE` of the
    mean group load) taken out of every group and put back, longest first, each where the group's
    estimate after it is least (ties to the lower index): across classes, at a heap step per
    sample. Ring groups keep theirs (their estimate is not additive); empty groups are dropped;
    at `deadline` the samples not yet placed stay where they were."""
    if len(groups) < 2:
        return [g for g in groups if g[1]]
    st = _Loads(groups, table)
    loads = st.loads()
    p = np.asarray(table.sizes, dtype=np.float64)[st.gj]
    mean = float(p @ loads) / float(p.sum())
    ringless = ~table._ring_sizes[st.gj]
    placed = np.flatnonzero(st.where >= 0)
    g_of = st.where[placed]
    j_of = st.gj[g_of]
    size = table.add[placed, j_of]
    small = ringless[g_of] & (st.short_tok[placed, j_of] > 0) & (size < knobs.REBALANCE_SMALL_SHARE * mean)
    if small.sum() > knobs.REBALANCE_MAX:  # the largest of them: the ones that balance most per heap step
        small &= size >= np.sort(size[small])[-knobs.REBALANCE_MAX]
    fill, g_of, j_of = placed[small], g_of[small], j_of[small]
    if not len(fill):
        return [g for g in groups if g[1]]
    n = len(groups)
    base = (st.base - np.bincount(g_of, weights=st.marg[fill, j_of], minlength=n)).tolist()
    tok = (st.tok - np.bincount(g_of, weights=st.short_tok[fill, j_of], minlength=n)).tolist()

    heaps: dict[int, list[tuple[float, int]]] = {}
    for g in np.flatnonzero(ringless).tolist():
        j = int(st.gj[g])
        heaps.setdefault(j, []).append((group_estimate(table, base[g], tok[g], 0.0, j, scalar=True), g))
    for h in heaps.values():
        heapq.heapify(h)
    sizes = sorted(heaps)
    cols = np.asarray(sizes)
    gpu_s = table.gpu_seconds(fill)[:, cols]
    shares = (table.ckpt[fill][:, cols] == 0)
    marg, short_tok = st.marg[fill][:, cols].tolist(), st.short_tok[fill][:, cols].tolist()
    where = st.where.copy()
    order = np.lexsort((fill, -np.where(shares, gpu_s, np.inf).min(axis=1)))
    deadline = Deadline.of(deadline)
    for step, k in enumerate(order.tolist()):
        if step % 256 == 255 and deadline.passed():
            break
        best, pick, g = math.inf, -1, -1
        for c, j in enumerate(sizes):
            if not shares[k, c]:
                continue
            top = heaps[j][0][1]
            e = group_estimate(table, base[top] + marg[k][c], tok[top] + short_tok[k][c], 0.0, j, scalar=True)
            if e < best or (e == best and top < g):
                best, pick, g = e, c, top
        j = sizes[pick]
        base[g] += marg[k][pick]
        tok[g] += short_tok[k][pick]
        heapq.heapreplace(heaps[j], (best, g))
        where[fill[k]] = g
    return [g for g in _groups_of(where, st.gj) if g[1]]


def _merge(st: _Loads, c: int, loads: np.ndarray) -> Groups | None:
    """The slowest group c and the least-loaded other group of its size as one group of twice the
    size, if that estimates below c (no move can do it when c's time is one large sample's)."""
    table, j = st.t, int(st.gj[c])
    p = table.sizes[j]
    if 2 * p not in table.sizes:
        return None
    same = np.flatnonzero(st.gj == j)
    same = same[same != c]
    if not len(same):
        return None
    h = int(same[np.argmin(loads[same])])  # ties: the lowest index
    j2 = table.sizes.index(2 * p)
    ids = np.sort(np.concatenate([st.held(c), st.held(h)]))
    if not np.all(table.ckpt[ids, j2] >= 0):
        return None
    est = group_estimate(st.t, np.array([st.marg[ids, j2].sum()]), np.array([st.short_tok[ids, j2].sum()]),
                         np.array([st.short_pairs[ids, j2].sum()]), j2)[0]
    if est >= loads[c] * (1 - _TOL):
        return None
    groups = _groups_of(st.where, st.gj)
    return [g for q, g in enumerate(groups) if q not in (c, h)] + [(j2, ids.tolist())]


def _grow(st: _Loads, c: int, loads: np.ndarray, deadline: Deadline) -> Groups | None:
    """The slowest group c at twice its size, or one of its samples alone in a new group, on GPUs
    freed from the least-loaded groups (their samples longest first where they raise an estimate
    least): the first try leaving every group faster than c was; None if none or past `deadline`."""
    table, j = st.t, int(st.gj[c])
    p = table.sizes[j]
    mine = st.held(c)
    tries: list[tuple[int, int]] = []  # (size index of the new group, the sample it takes; -1: all of c)
    if 2 * p in table.sizes and np.all(table.ckpt[mine, table.sizes.index(2 * p)] >= 0):
        tries.append((table.sizes.index(2 * p), -1))
    if len(mine) > 1:
        for s in mine[np.argsort(-st.marg[mine, j], kind="stable")][:knobs.EJECT_TOP].tolist():
            fast = np.flatnonzero(table.solo[s] < loads[c] * (1 - _TOL))
            if len(fast):
                tries.append((int(fast[np.argmin(np.asarray(table.sizes)[fast])]), s))
    for j2, s in tries:
        if deadline.passed():
            return None
        found = _carved(st, c, loads, j2, s, deadline)
        if found is not None:
            return found
    return None


def _carved(st: _Loads, c: int, loads: np.ndarray, j2: int, s: int, deadline: Deadline) -> Groups | None:
    """`_grow`'s one try at size index j2 (s = -1: all of c, else its sample s), freed samples to
    the least-loaded group where they estimate least; None past `deadline`."""
    table = st.t
    size_of = np.asarray(table.sizes)
    sizes = size_of[st.gj]
    need = table.sizes[j2] - (sizes[c] if s < 0 else 0)
    freed: list[int] = []
    for g in np.argsort(loads, kind="stable").tolist():
        if not need:
            break
        if g != c and sizes[g] <= need:
            freed.append(g)
            need -= int(sizes[g])
    if need:
        return None
    # Hopeless when the freed samples' least GPU-seconds exceed what the others have below c.
    orphans = np.concatenate([st.held(g) for g in freed] + [np.zeros(0, np.int64)])
    others = np.ones(len(loads), dtype=bool)
    others[[c, *freed]] = False
    room = float(sizes[others] @ np.maximum(loads[c] - loads[others], 0.0)) + table.sizes[j2] * loads[c]
    least = float((st.marg[orphans] * size_of[None, :]).min(axis=1, initial=np.inf).sum())
    if least >= room:
        return None
    groups = _groups_of(st.where, st.gj)
    mine = st.held(c)
    if s < 0:
        kept, added = [g for q, g in enumerate(groups) if q != c and q not in freed], [(j2, mine.tolist())]
    else:
        kept = [g if q != c else (g[0], [i for i in g[1] if i != s]) for q, g in enumerate(groups) if q not in freed]
        added = [(j2, [s])]
    ns = _Loads(kept + added, table)
    now = ns.loads()
    heaps: dict[int, list[tuple[float, int]]] = {}
    for g, j in enumerate(ns.gj.tolist()):
        if not table._ring_sizes[j]:  # as `rebalance`: a ring's estimate is not additive (and slow)
            heaps.setdefault(j, []).append((float(now[g]), g))
    for h in heaps.values():
        heapq.heapify(h)
    if not heaps and len(orphans):
        return None
    cols = np.array(sorted(heaps), dtype=np.int64)
    for k, o in enumerate(orphans[np.lexsort((orphans, -table.solo[orphans].min(axis=1)))].tolist()):
        if k % 64 == 63 and deadline.passed():
            return None
        tops = np.array([heaps[j][0][1] for j in cols.tolist()], dtype=np.int64)
        new = group_estimate(ns.t, ns.base[tops] + ns.marg[o, cols], ns.tok[tops] + ns.short_tok[o, cols],
                             ns.pairs[tops] + ns.short_pairs[o, cols], cols)
        q = int(np.argmin(new))
        if not np.isfinite(new[q]):
            return None
        h, j = int(tops[q]), int(cols[q])
        ns.base[h] += ns.marg[o, j]
        ns.tok[h] += ns.short_tok[o, j]
        ns.pairs[h] += ns.short_pairs[o, j]
        ns.where[o] = h
        heapq.heapreplace(heaps[j], (float(new[q]), h))
    if ns.loads().max() >= loads[c] * (1 - _TOL):
        return None
    return _groups_of(ns.where, ns.gj)


def with_free_groups(groups: Groups, table: CostTable, num_gpus: int) -> Groups:
    """`groups` plus, on the GPUs none holds, as many empty groups of the smallest SP size as fit
    (sizes are powers of two: any set summing to at most `num_gpus` has an aligned layout)."""
    j = int(np.argmin(table.sizes))
    free = num_gpus - sum(table.sizes[g] for g, _ in groups)
    return list(groups) + [(j, []) for _ in range(max(0, free) // table.sizes[j])]


def _groups_of(where: np.ndarray, gj: np.ndarray) -> Groups:
    """Groups (size index, sample indices ascending) from each sample's group number."""
    return [(int(gj[g]), members.tolist()) for g, members in enumerate(by_group(where, len(gj)))]


def spread(ids: Sequence[int], n_groups: int, j: int, table: CostTable) -> list[list[int]]:
    """One class's samples over `n_groups` groups by their additive estimates at size index j:
    MULTIFIT (Coffman, Garey, Johnson 1978), which packs few samples a group better than LPT, or
    LPT where there are many and MULTIFIT would cost a pass per sample per bisection step."""
    if n_groups == 0:
        return []
    ids = np.asarray(sorted(ids), dtype=np.int64)
    if len(ids) <= min(knobs.MULTIFIT_ITEMS * n_groups, knobs.MULTIFIT_MAX):
        return multifit(ids, n_groups, j, table)
    return lpt_fast(table.add[ids, j], ids, n_groups)


def lpt_fast(sizes: np.ndarray, ids: np.ndarray, n_groups: int) -> list[list[int]]:
    """`lpt.lpt` of `ids` (their `sizes`, longest first, ties by id) on `n_groups` empty groups."""
    order = np.lexsort((ids, -sizes))
    owner = np.empty(len(ids), dtype=np.int64)
    owner[order] = lpt(sizes[order], n_groups)
    return [ids[members].tolist() for members in by_group(owner, n_groups)]


def multifit(ids: np.ndarray, n_groups: int, j: int, table: CostTable, rounds: int = 12) -> list[list[int]]:
    """MULTIFIT (FFD packing, capacity bisected) into `n_groups` groups; LPT's when better."""
    size = table.add[ids, j].astype(np.float64)
    best = lpt_fast(size, ids, n_groups) if len(ids) > n_groups else \
        [[int(i)] for i in ids] + [[] for _ in range(n_groups - len(ids))]
    if n_groups <= 1 or len(ids) <= n_groups:
        return best
    order = np.lexsort((ids, -size))
    by_id = dict(zip(ids.tolist(), size.tolist(), strict=True))
    hi = max(sum(by_id[i] for i in b) for b in best)
    lo = makespan_floor(float(size.sum()), n_groups, float(size.max()))

    def packs(cap: float) -> bool:
        """Whether first-fit-decreasing packs every sample within `cap` (then `best` is its packing)."""
        nonlocal best
        room = np.full(n_groups, cap)
        owner = np.empty(len(ids), dtype=np.int64)
        for k in order:
            g = int(np.argmax(room >= size[k] - 1e-12))
            if room[g] < size[k] - 1e-12:
                return False
            owner[k] = g
            room[g] -= size[k]
        best = [ids[owner == g].tolist() for g in range(n_groups)]
        return True

    narrow(packs, lo, hi, steps=rounds, rtol=1e-4)
    return best


def estimate(groups: Groups, table: CostTable) -> float:
    """Estimated slowest-group time of a solution."""
    return float(_Loads(groups, table).loads().max()) if groups else 0.0


def groups_of_layout(layout: Layout, table: CostTable) -> Groups | None:
    """A layout's groups in table indices; None if a sample cannot run alone at its group's size."""
    out: Groups = []
    for _, p, mbs in layout:
        if p not in table.sizes:
            return None
        ids = [i for mb in mbs for i in mb]
        j = table.sizes.index(p)
        if not np.all(table.ckpt[ids, j] >= 0):
            return None
        out.append((j, ids))
    return out


def place(groups: Sequence[tuple[int, T]], cluster: Cluster) -> list[tuple[int, int, T]]:
    """(first rank, SP size, payload) for groups given as (SP size, payload): `aligned_layout`'s
    blocks, largest sizes first (groups of one size keep their order)."""
    ordered = sorted(groups, key=lambda g: -g[0])
    starts = aligned_layout(Counter(p for p, _ in ordered), cluster.num_gpus)
    return [(start, p, payload) for (start, p), (_, payload) in zip(starts, ordered, strict=True)]


def to_layout(groups: Groups, cm: CostModel, table: CostTable,
              max_microbatches: int | None) -> Layout | None:
    """Aligned ranks and canonical micro-batches of batch indices (priced exactly by
    `pricing.price_layout`); None when a group cannot meet `max_microbatches`."""
    layout: Layout = []
    for start, p, (j, ids) in place([(table.sizes[j], (j, ids)) for j, ids in groups if len(ids)], cm.cluster):
        mbs = form_microbatches(ids, j, table, cm, max_microbatches)
        if mbs is None:
            return None
        layout.append((start, p, mbs))
    return layout
