"""Per-sample cost tables for the ILP planner, and the canonical micro-batching of one group.

For every sample i and allowed SP size p the table holds (DESIGN.md, "The cost model"):

    r[i, p]     fewest checkpointed layers with which sample i fits alone at p (-1: never)
    solo[i, p]  t_ip = fixed(p, r) + per_token(p, r) T_i + per_pair(p, r) A_i, its time alone
    load[i, p]  g_ip, a lower bound on what sample i adds to its group's busy time, whatever it
                shares a micro-batch with (see `_load_lower_bound`)
    add[i, p]   a_ip, the additive estimate the local search uses: solo time for a sample that
                needs checkpointing (it runs alone), else its marginal cost plus its token
                share of one micro-batch's fixed cost

A group runs its samples canonically: a sample that needs checkpointing at p runs alone with
its fewest layers; the others are packed first-fit-decreasing into micro-batches of at most
max_tokens(p, 0) tokens, so they need no checkpointing at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dcp.costmodel import CostModel
from dcp.planner.sample import Sample


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


def _load_lower_bound(cm: CostModel, p: int, r: int, t: int, a: int) -> float:
    """g_ip: a micro-batch at (p, r') holding sample i (so r' >= r) costs at least
    sum over its samples of [marginal(p, r') + fixed(p, r') * T_j / cap(p, r')], because its
    tokens are at most cap(p, r'). Either r' = r, or r' > r and the marginal alone at r + 1
    is already a lower bound (all coefficients grow with r)."""
    lin = cm.linear_time(p, r)
    marginal = lin.per_token * t + lin.per_pair * a
    share = marginal + lin.fixed * t / max(cm.max_tokens(p, r), 1)
    if r < cm.model.num_layers:
        nxt = cm.linear_time(p, r + 1)
        share = min(share, nxt.per_token * t + nxt.per_pair * a)
    return share


def cost_table(batch: Sequence[Sample], cm: CostModel, sizes: Sequence[int]) -> CostTable:
    """Build the table; infeasible (sample, size) cells hold r = -1 and infinite costs."""
    n, m = len(batch), len(sizes)
    tokens = np.array([s.tokens for s in batch], dtype=np.int64)
    pairs = np.array([s.attn_pairs for s in batch], dtype=np.float64)
    table = CostTable(list(sizes), tokens, pairs, np.full((n, m), -1, dtype=np.int64),
                      np.full((n, m), np.inf), np.full((n, m), np.inf), np.full((n, m), np.inf),
                      np.zeros(m), np.zeros(m))
    for j, p in enumerate(sizes):
        lin0 = cm.linear_time(p, 0)
        cap0 = cm.max_tokens(p, 0)
        table.fixed0[j], table.cap0[j] = lin0.fixed, cap0
        short = tokens <= cap0
        # Samples that fit without checkpointing: vectorized (the common case).
        marg = lin0.per_token * tokens + lin0.per_pair * pairs
        table.ckpt[short, j] = 0
        table.solo[short, j] = (lin0.fixed + marg)[short]
        table.add[short, j] = (marg + lin0.fixed * tokens / max(cap0, 1))[short]
        nxt = cm.linear_time(p, 1)  # ModelSpec has at least one layer
        g0 = np.minimum(marg + lin0.fixed * tokens / max(cap0, 1), nxt.per_token * tokens + nxt.per_pair * pairs)
        table.load[short, j] = g0[short]
        for i in np.flatnonzero(~short):
            t, a = int(tokens[i]), int(batch[i].attn_pairs)
            r = cm.min_ckpt_layers(t, p)
            if r is None:
                continue
            lin = cm.linear_time(p, r)
            table.ckpt[i, j] = r
            table.solo[i, j] = lin(t, a)
            table.add[i, j] = lin(t, a)
            table.load[i, j] = _load_lower_bound(cm, p, r, t, a)
    return table


def form_microbatches(ids: Sequence[int], j: int, table: CostTable, cm: CostModel,
                      max_microbatches: int | None = None) -> list[list[int]] | None:
    """Canonical micro-batches of one group at size index j: checkpointing samples alone,
    the rest first-fit-decreasing into capacity max_tokens(p, 0). With a cap on micro-batches,
    the two smallest are merged (checkpointing more) until it holds; None if it cannot."""
    long_ids = sorted((i for i in ids if table.ckpt[i, j] > 0), key=lambda i: (-table.tokens[i], i))
    short_ids = sorted((i for i in ids if table.ckpt[i, j] == 0), key=lambda i: (-table.tokens[i], i))
    cap = int(table.cap0[j])
    bins: list[list[int]] = []
    room: list[int] = []
    for i in short_ids:
        t = int(table.tokens[i])
        for b, left in enumerate(room):
            if t <= left:
                bins[b].append(i)
                room[b] -= t
                break
        else:
            bins.append([i])
            room.append(cap - t)
    mbs = [[i] for i in long_ids] + bins
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
