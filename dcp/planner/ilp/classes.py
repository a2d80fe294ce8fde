"""Length classes, the aggregated program's rows, and their samples handed back out:

- exact types: length bands of large samples (least marginal time at least `knobs.CLASS_FLUID_SHARE`
  of the incumbent's busy time U, or if none is, `knobs.CHEAPEST_LARGE` of it at their cheapest
  size), at most `knobs.CLASS_MAX_EXACT`;
- fluid buckets: the rest, load ratios across sizes within `knobs.CLASS_RATIO_TOL` (doubled until at
  most `knobs.CLASS_MAX_BUCKETS`), at their summed load times the least ratio in the bucket (a
  relaxation), split by fractions (`split_fluid` hands them back out).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

import numpy as np

import dcp.planner.knobs as knobs
from dcp.planner.ilp.costs import CostTable
from dcp.planner.levels import climb, geometric


@dataclass
class Item:
    """A program item: an exact type (identical large samples) or a fluid bucket of small ones."""

    members: np.ndarray
    """Batch indices (table rows) of the samples it stands for."""
    options: list[int]
    exact: bool
    coef: dict[int, float]
    """Load per unit: per sample for exact types, per whole bucket for fluid ones (the least
    over the members, so the program stays a relaxation)."""
    solo: dict[int, float]
    """The least solo time of a member at each option (exact types; empty for fluid ones)."""
    marg: dict[int, float]
    """Like `coef`, for `CostTable.marg`: what the item adds to micro-batches beyond fixed costs."""


def program_items(table: CostTable, upper: float) -> list[Item]:
    """Exact types and fluid buckets (module docstring); a sample's classes are the sizes where
    it runs alone within `upper` (no plan better than the incumbent puts it elsewhere)."""
    n = len(table.tokens)
    opts = (table.ckpt >= 0) & (table.solo <= upper * (1 + 1e-9))
    # Large by its least marginal time: with heavy fixed costs every solo time would be large.
    best_marg = table.marg.min(axis=1)
    large = np.flatnonzero(best_marg >= knobs.CLASS_FLUID_SHARE * upper)
    if not len(large):
        # Without exact types the program has no integrality: at their cheapest size then
        # (docs/tuning-log.md, `CHEAPEST_LARGE`).
        gpu_s = np.where(opts, table.load * np.asarray(table.sizes, dtype=np.float64)[None, :], np.inf)
        best_marg = table.marg[np.arange(n), np.argmin(gpu_s, axis=1)]
        large = np.flatnonzero(best_marg >= knobs.CHEAPEST_LARGE * upper)
    exact_ids = _bands(table, large, opts, best_marg)
    items: list[Item] = []
    for ids in exact_ids:
        o = np.flatnonzero(opts[ids[0]]).tolist()
        items.append(Item(ids, o, True, {j: float(table.load[ids, j].min()) for j in o},
                          {j: float(table.solo[ids, j].min()) for j in o},
                          {j: float(table.marg[ids, j].min()) for j in o}))
    fluid_mask = np.ones(n, dtype=bool)
    for ids in exact_ids:
        fluid_mask[ids] = False
    fluid = np.flatnonzero(fluid_mask)
    if not len(fluid):
        return items
    mask = (opts[fluid] * (1 << np.arange(opts.shape[1]))).sum(axis=1)
    ref = np.argmax(opts[fluid], axis=1)  # the smallest size where each sample may go
    ref_load = table.load[fluid, ref]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(opts[fluid], table.load[fluid] / ref_load[:, None], 1.0)
        log_ratio = np.log(ratio)
    bucket = np.zeros(0, dtype=np.int64)

    def few(tol: float) -> bool:
        """Whether the buckets at `tol` are few enough (then `bucket` holds them)."""
        nonlocal bucket
        _, bucket = _unique_rows(np.column_stack([mask, np.floor(log_ratio / np.log1p(tol)).astype(np.int64)]))
        return bucket.max() + 1 <= knobs.CLASS_MAX_BUCKETS

    climb(few, geometric(knobs.CLASS_RATIO_TOL, 2.0))  # ends: the cells merge as tol grows
    order = np.lexsort((fluid, bucket))
    starts = np.flatnonzero(np.concatenate([[True], bucket[order][1:] != bucket[order][:-1]]))
    # Per bucket: the least ratio and marginal cost per unit of reference load at every size
    # (minima in one pass; sums bucket by bucket, as their rounding depends on the order).
    low = np.minimum.reduceat(ratio[order], starts, axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        marg_low = np.minimum.reduceat(table.marg[fluid[order]] / ref_load[order][:, None], starts, axis=0)
    sorted_load = ref_load[order]
    ends = np.append(starts[1:], len(order))
    for b, (lo, hi) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        o = np.flatnonzero(opts[fluid[order[lo]]]).tolist()
        total = float(sorted_load[lo:hi].sum())
        # Coefficients use the smallest ratio in the bucket: the program stays a relaxation.
        items.append(Item(fluid[order[lo:hi]], o, False, {j: total * float(low[b, j]) for j in o}, {},
                          {j: total * float(marg_low[b, j]) for j in o}))
    return items


def _bands(table: CostTable, large: np.ndarray, opts: np.ndarray, best_size: np.ndarray) -> list[np.ndarray]:
    """The large samples in length bands, each band's members in ascending tokens: the same sizes
    open, token counts and pairs each within a factor 1 + `knobs.CLASS_BAND_TOL` (grown by half
    until at most `knobs.CLASS_MAX_EXACT` remain; the longest bands are kept, the rest go fluid).
    Pairs too, as videos of equal tokens but other frame counts differ several-fold in pairs."""
    if not len(large):
        return []
    mask = (opts[large] * (1 << np.arange(opts.shape[1]))).sum(axis=1)
    log_t = np.log(table.tokens[large].astype(np.float64))
    log_a = np.log(np.maximum(table.pairs[large], 1.0))
    band = np.zeros(0, dtype=np.int64)

    def few(tol: float) -> bool:
        """Whether the bands at `tol` are few enough (`band` holds the last tried)."""
        nonlocal band
        _, band = _unique_rows(np.column_stack([mask, np.floor(log_t / np.log1p(tol)).astype(np.int64),
                                                np.floor(log_a / np.log1p(tol)).astype(np.int64)]))
        return band.max() + 1 <= knobs.CLASS_MAX_EXACT

    climb(few, islice(geometric(knobs.CLASS_BAND_TOL, 1.5), 24))
    order = np.lexsort((large, table.pairs[large], table.tokens[large], band))
    starts = np.flatnonzero(np.concatenate([[True], band[order][1:] != band[order][:-1]]))
    groups = [large[order[lo:hi]] for lo, hi in zip(starts, np.append(starts[1:], len(order)), strict=True)]
    if len(groups) > knobs.CLASS_MAX_EXACT:
        groups = sorted(groups, key=lambda g: (-best_size[g[-1]], int(g[0])))[:knobs.CLASS_MAX_EXACT]
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


def split_fluid(it: Item, table: CostTable, share: dict[int, float]) -> tuple[list[tuple[int, list[int]]], list[int]]:
    """A fluid bucket's samples over its classes, `share[j]` the fraction of its load at class j:
    largest samples to the largest sizes, each class while the load before a sample plus half its
    own stays within its share. Returns (class, samples) and the samples left."""
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
