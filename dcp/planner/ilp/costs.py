"""Per-sample cost tables for the ILP planner, and the canonical micro-batching of one group. Per
sample i and allowed SP size p (from `CostModel.linear_time` and `max_tokens`):

    ckpt[i, p]  r, the fewest checkpointed layers with which i fits alone at p (-1: never)
    solo[i, p]  its time alone (exact with rings, whose linear form is a lower bound)
    load[i, p]  a lower bound on what i adds to its group's busy time (`cost_table`)
    add[i, p]   the additive estimate: solo time if i needs checkpointing (it runs alone), else
                its marginal cost plus its token share of one micro-batch's fixed cost
    marg[i, p]  per_token(p, r) T_i + per_pair(p, r) A_i: what i adds to any micro-batch

A group runs canonically: a sample that needs checkpointing at p alone at its fewest layers, the
others packed longest first into micro-batches of max_tokens(p, 0) tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

import dcp.planner.knobs as knobs
from dcp.costmodel import CostModel, LinearCost
from dcp.costmodel.ring import RingCoefficients
from dcp.planner.pricing import BatchArrays, Pricer


@dataclass
class CostTable:
    """Costs of every sample at every allowed SP size (columns follow `sizes`)."""

    sizes: list[int]
    tokens: np.ndarray
    pairs: np.ndarray
    ckpt: np.ndarray
    solo: np.ndarray
    load: np.ndarray
    add: np.ndarray
    fixed0: np.ndarray
    """fixed(p, 0): the cost of one micro-batch that checkpoints nothing."""
    cap0: np.ndarray
    """max_tokens(p, 0): tokens a micro-batch may hold without checkpointing."""
    marg: np.ndarray
    rings: dict[int, list[tuple[LinearCost, RingCoefficients]]] = field(default_factory=dict)
    """Per size index whose every layout has a ring: each layout's linear time without
    checkpointing and its ring terms (`exposure`)."""
    num_layers: int = 0
    line0_token: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Per size: the per-token and per-pair coefficients of `marg` without checkpointing."""
    line0_pair: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def gpu_seconds(self, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        """`add` of `rows` times each column's SP size: a sample's GPU-seconds at that size."""
        return self.add[rows] * np.asarray(self.sizes, dtype=np.float64)[None, :]

    def estimate_terms(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What `pack`'s group estimate adds per sample and size: the tokens and the pairs of a
        sample that needs no checkpointing (it shares micro-batches), and its time besides them
        (its marginal cost; a checkpointing sample's solo time). Computed once per table."""
        if not hasattr(self, "_terms"):
            short = self.ckpt == 0
            short_tok = np.where(short, self.tokens[:, None], 0).astype(np.float64)
            short_pairs = np.where(short, self.pairs[:, None], 0).astype(np.float64)
            marg = np.where(short, self.add - self.fixed0[None, :] * self.tokens[:, None]
                            / np.maximum(self.cap0, 1)[None, :], self.solo)
            self._terms = (short_tok, short_pairs, marg)
        return self._terms

    def exposure(self, tokens: np.ndarray, pairs: np.ndarray, j: np.ndarray | int,
                 microbatches: np.ndarray | int = 1) -> np.ndarray:
        """What a group at size index j, whose non-checkpointing samples hold these tokens and
        pairs in this many micro-batches, runs at least beyond the estimate's linear part
        (elementwise; 0 at sizes with a ring-free layout): per micro-batch K (c - 1) max(0,
        latency + transfer T - step compute) forward and backward, at least its value at the
        totals (subadditive), the least over layouts, so the estimate stays below the exact time."""
        tokens, pairs, j, microbatches = np.broadcast_arrays(tokens, pairs, j, microbatches)
        out = np.zeros(tokens.shape)
        ring = self._ring_sizes[j] & (tokens > 0)
        if not ring.any():
            return out
        t, a, jj, n = tokens[ring], pairs[ring], j[ring], microbatches[ring]
        least = np.full(t.shape, np.inf)
        for size, layouts in self.rings.items():
            at = jj == size
            if not at.any():
                continue
            for line, terms in layouts:
                fwd, bwd = terms.exposed(t, a)
                own = line.fixed * n + line.per_token * t + line.per_pair * a + self.num_layers * (fwd + bwd)
                least = np.where(at, np.minimum(least, own), least)
        common = self.fixed0[jj] * n + self.line0_token[jj] * t + self.line0_pair[jj] * a
        out[ring] = np.maximum(least - common, 0.0)
        return out

    @property
    def _ring_sizes(self) -> np.ndarray:
        """Per size index: whether every layout of the size has a ring (`rings`)."""
        if not hasattr(self, "_ring_mask"):
            self._ring_mask = np.array([j in self.rings for j in range(len(self.sizes))])
        return self._ring_mask


def cost_table(arrays: BatchArrays, cm: CostModel, sizes: Sequence[int], pricer: Pricer | None = None) -> CostTable:
    """Build the table; infeasible (sample, size) cells hold r = -1 and infinite costs. load: a
    micro-batch at (p, r') holding i (r' >= r) costs at least the sum over its samples of
    marginal(p, r') + fixed(p, r') T_j / cap(p, r'); either r' = r, or the marginal alone at
    level r+1 is a lower bound (all coefficients grow with r)."""
    pricer = pricer or Pricer(cm, sizes)
    n, m, k = len(arrays.tokens), len(sizes), cm.model.num_layers
    tokens, pairs = arrays.tokens, arrays.pairs
    table = CostTable(list(sizes), tokens.astype(np.int64), pairs, np.full((n, m), -1, dtype=np.int64),
                      np.full((n, m), np.inf), np.full((n, m), np.inf), np.full((n, m), np.inf),
                      np.zeros(m), np.zeros(m), np.full((n, m), np.inf), num_layers=k,
                      line0_token=np.zeros(m), line0_pair=np.zeros(m))
    for j, p in enumerate(sizes):
        lin = [cm.linear_time(p, r) for r in range(k + 1)]
        fixed = np.array([c.fixed for c in lin])
        per_token = np.array([c.per_token for c in lin])
        per_pair = np.array([c.per_pair for c in lin])
        caps = np.maximum([pricer.capacity(p, r) for r in range(k + 1)], 1.0)
        table.fixed0[j], table.cap0[j] = fixed[0], pricer.capacity(p, 0)
        r = pricer.layers(p, tokens)
        fits = r <= k
        rr = np.minimum(r, k)
        marginal = per_token[rr] * tokens + per_pair[rr] * pairs
        # Alone, exactly: for a size with rings the linear form is a lower bound (it hides every
        # ring transfer), the exact time adds what the attention does not hide (CostModel.time_s).
        solo = pricer.times(p, tokens, pairs) if len(cm.layouts(p)) > 1 or cm.layouts(p)[0].ring > 1 \
            else fixed[rr] + marginal
        share = marginal + fixed[rr] * tokens / caps[rr]
        nxt = np.minimum(rr + 1, k)
        next_marginal = per_token[nxt] * tokens + per_pair[nxt] * pairs
        load = np.where(rr < k, np.minimum(share, next_marginal), share)
        table.ckpt[:, j] = np.where(fits, rr, -1)
        table.solo[:, j] = np.where(fits, solo, np.inf)
        table.add[:, j] = np.where(fits, np.where(rr == 0, share, solo), np.inf)
        table.load[:, j] = np.where(fits, load, np.inf)
        table.marg[:, j] = np.where(fits, marginal, np.inf)
        table.line0_token[j], table.line0_pair[j] = per_token[0], per_pair[0]
        layouts = cm.layouts(p)
        if all(o.ring > 1 for o in layouts):
            table.rings[j] = [(cm.layout_linear_time(o, 0), cm.ring_terms(o)) for o in layouts]
    return table


def batch_costs(arrays: BatchArrays, cm: CostModel, sizes: Sequence[int]) -> tuple[Pricer, CostTable]:
    """The pricer of `sizes` and the batch's cost table on it, which the ILP's search and the
    backfill both read (`dcp.planner.phases` builds them once for both)."""
    pricer = Pricer(cm, sizes)
    return pricer, cost_table(arrays, cm, sizes, pricer)


def form_microbatches(ids: Sequence[int] | np.ndarray, j: int, table: CostTable, cm: CostModel,
                      max_microbatches: int | None = None) -> list[list[int]] | None:
    """Canonical micro-batches of one group at size index j: checkpointing samples alone, the
    rest packed longest first into max_tokens(p, 0) (`pack_tokens`). With `max_microbatches`, the
    two smallest merge (checkpointing more) until it holds; None if it cannot."""
    ids = np.asarray(ids, dtype=np.int64)
    ckpt, tokens = table.ckpt[ids, j], table.tokens[ids]
    long_ids = ids[ckpt > 0][np.lexsort((ids[ckpt > 0], -tokens[ckpt > 0]))]
    short = ids[ckpt == 0]
    bins = pack_tokens(table.tokens[short].astype(np.float64), short, float(table.cap0[j]))
    mbs = [[int(i)] for i in long_ids] + bins
    if max_microbatches is None or len(mbs) <= max_microbatches:
        return mbs
    p, k = table.sizes[j], cm.model.num_layers
    full_cap = cm.max_tokens(p, k)
    while len(mbs) > max_microbatches:
        mbs.sort(key=lambda mb: (sum(int(table.tokens[i]) for i in mb), mb[0]))
        merged = mbs[0] + mbs[1]
        if sum(int(table.tokens[i]) for i in merged) > full_cap:
            return None
        mbs = [merged] + mbs[2:]
    return mbs


def pack_tokens(tokens: np.ndarray, ids: np.ndarray, capacity: float) -> list[list[int]]:
    """Bins of at most `capacity` tokens (the `ids` of each), longest first (ties by id): samples
    above capacity / `knobs.FIRST_FIT_PARTS` first fit one at a time, then the rest fill the bins
    in order, each the longest run that fits (losing at most one small sample's tokens)."""
    if not len(ids):
        return []
    order = np.lexsort((ids, -tokens))
    t, ids = tokens[order], ids[order]
    big = int(np.searchsorted(-t, -capacity / knobs.FIRST_FIT_PARTS, side="left"))
    room_arr = np.zeros(big)
    owner = np.empty(big, dtype=np.int64)
    used = lo = 0
    for i in range(big):
        b = lo + int((room_arr[lo:used] >= t[i]).argmax()) if used > lo else used
        if b < used and room_arr[b] >= t[i]:
            room_arr[b] -= t[i]
        else:
            b, used = used, used + 1
            room_arr[b] = capacity - t[i]
        owner[i] = b
        while lo < used and room_arr[lo] < t[big - 1]:  # too full for any sample still to come
            lo += 1
    room: list[float] = room_arr[:used].tolist()
    bins: list[list[int]] = [[] for _ in range(used)]
    for i, b in enumerate(owner.tolist()):
        bins[b].append(int(ids[i]))
    rest = big
    csum = np.concatenate([[0.0], np.cumsum(t[big:])])
    b = 0
    while rest < len(t):
        if b >= len(room):
            room.append(capacity)
            bins.append([])
        # the longest run of the remaining samples (in order) that fits bin b's room
        end = int(np.searchsorted(csum, csum[rest - big] + room[b] * (1 + 1e-12), side="right")) - 1 + big
        if end == rest and not bins[b]:
            end = rest + 1  # a sample longer than an empty bin's room still gets a bin
        if end > rest:
            bins[b].extend(int(i) for i in ids[rest:end])
            room[b] -= float(csum[end - big] - csum[rest - big])
            rest = end
        b += 1
    return bins
