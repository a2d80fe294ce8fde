"""Exact micro-batch prices for whole arrays at once: at SP size p and r checkpointed layers a
micro-batch of T tokens and A pairs runs `CostModel.linear_time(p, r)(T, A)` (plus a ring's exposed
transfers) and fits when T <= `max_tokens(p, r)`. `Pricer` holds these per size, so strategies price
thousands of micro-batches in a few numpy operations (checked by tests/test_pricing.py).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dcp.costmodel import CostModel, SPLayout
from dcp.planner.plan import Group
from dcp.planner.sample import Sample

Layout = list[tuple[int, int, list[list[int]]]]
"""Groups as (first rank, SP size, micro-batches as lists of batch indices)."""


def group_layout(g: Group) -> SPLayout:
    """The cost model's layout of a plan's group (Ulysses degree x ring degree)."""
    return SPLayout(g.ulysses, g.ring)


@dataclass(frozen=True)
class BatchArrays:
    """A batch's samples as arrays, indexed like the batch."""

    ids: np.ndarray
    tokens: np.ndarray
    pairs: np.ndarray

    @classmethod
    def of(cls, batch: Sequence[Sample]) -> BatchArrays:
        n = len(batch)
        return cls(np.fromiter((s.id for s in batch), dtype=np.int64, count=n),
                   np.fromiter((s.tokens for s in batch), dtype=np.float64, count=n),
                   np.fromiter((s.attn_pairs for s in batch), dtype=np.float64, count=n))


class _Level:
    """One SP size's levels r = 0..K and K + 1 ("fits nowhere": infinite time), per layout."""

    def __init__(self, cm: CostModel, p: int) -> None:
        k = cm.model.num_layers
        self.layouts = cm.layouts(p)
        self.capacity = np.array([cm.max_tokens(p, r) for r in range(k + 1)], dtype=np.float64)
        # Activation bytes per token held on one GPU, per layout; level K + 1 repeats K's.
        per_gpu = [[cm.activation_bytes_per_token(p, r, o) * p for r in range(k + 1)] for o in self.layouts]
        self.bytes_per_shard_token = [np.array(b + b[-1:]) for b in per_gpu]
        self.rings = [o.ring for o in self.layouts]
        forms = [[cm.layout_linear_time(o, r) for r in range(k + 1)] for o in self.layouts]
        self.fixed = [np.array([c.fixed for c in f] + [math.inf]) for f in forms]
        self.per_token = [np.array([c.per_token for c in f] + [0.0]) for f in forms]
        self.per_pair = [np.array([c.per_pair for c in f] + [0.0]) for f in forms]
        self.terms = [cm.ring_terms(o) for o in self.layouts]
        self.num_layers = k

    def times(self, i: int, tokens: np.ndarray, pairs: np.ndarray, r: np.ndarray) -> np.ndarray:
        """Exact times in layout i at levels r: linear form plus ring exposure (as `time_s`)."""
        t = self.fixed[i][r] + self.per_token[i][r] * tokens + self.per_pair[i][r] * pairs
        ring = self.terms[i]
        if ring.steps > 1:
            k = self.num_layers
            fwd, bwd = ring.exposed(tokens, pairs)
            t = t + np.where(r <= k, (k + np.minimum(r, k)) * fwd + k * bwd, 0.0)
        return t


_LEVEL_MEMO: weakref.WeakKeyDictionary[CostModel, dict[int, _Level]] = weakref.WeakKeyDictionary()
"""Each cost model's `_Level` per SP size, shared by every solve's pricers and bounds."""


def _level(cm: CostModel, p: int) -> _Level:
    """`_Level(cm, p)`, built once per cost model and size."""
    memo = _LEVEL_MEMO.setdefault(cm, {})
    if p not in memo:
        memo[p] = _Level(cm, p)
    return memo[p]


class Pricer:
    """Fewest layers and exact times of micro-batches at each allowed SP size, vectorized."""

    def __init__(self, cm: CostModel, sizes: Sequence[int]) -> None:
        self.num_layers = cm.model.num_layers
        self.static_bytes = cm.static_bytes
        self.sizes = list(sizes)
        self._levels = {p: _level(cm, p) for p in self.sizes}

    def layers(self, p: int, tokens: np.ndarray) -> np.ndarray:
        """Fewest checkpointed layers at which each micro-batch fits at p; K + 1 where none does."""
        return np.searchsorted(self._levels[p].capacity, tokens, side="left")

    def capacity(self, p: int, r: int) -> float:
        """max_tokens(p, r)."""
        return float(self._levels[p].capacity[r])

    def layouts(self, p: int) -> tuple[SPLayout, ...]:
        """The layouts of p (`CostModel.layouts`), in the order `layout_times` uses."""
        return self._levels[p].layouts

    def layout_times(self, p: int, tokens: np.ndarray, pairs: np.ndarray,
                     ckpt: np.ndarray | int | None = None) -> np.ndarray:
        """[layouts, micro-batches]: `times` in each layout of p."""
        lv = self._levels[p]
        r = self.levels(p, tokens, ckpt)
        return np.array([np.where(tokens > 0, lv.times(i, tokens, pairs, r), 0.0) for i in range(len(lv.layouts))])

    def times(self, p: int, tokens: np.ndarray, pairs: np.ndarray, ckpt: np.ndarray | int | None = None) -> np.ndarray:
        """Times (s) at p with the fewest layers that fit (or `ckpt`), in each one's fastest layout;
        inf where it does not fit, 0 for an empty micro-batch."""
        return self.layout_times(p, tokens, pairs, ckpt).min(axis=0)

    def memory_bytes(self, p: int, tokens: np.ndarray, ckpt: np.ndarray, layout: SPLayout | None = None) -> np.ndarray:
        """`CostModel.memory_bytes` elementwise; without `layout`, the most over p's layouts."""
        lv, t = self._levels[p], np.asarray(tokens, dtype=np.float64)
        which = range(len(lv.layouts)) if layout is None else [lv.layouts.index(layout)]
        held = [lv.bytes_per_shard_token[i][ckpt] * _shard(t, p, lv.rings[i]) for i in which]
        return self.static_bytes + (held[0] if len(held) == 1 else np.maximum.reduce(held))

    def levels(self, p: int, tokens: np.ndarray, ckpt: np.ndarray | int | None = None) -> np.ndarray:
        """The checkpointed layers `times` prices each micro-batch with (K + 1: does not fit)."""
        fewest = self.layers(p, tokens)
        return fewest if ckpt is None else np.where(fewest <= ckpt, ckpt, self.num_layers + 1)


def exact_times(cm: CostModel, p: int, tokens: np.ndarray, pairs: np.ndarray, ckpt: np.ndarray) -> np.ndarray:
    """`CostModel.time_s(T, A, p, r)` elementwise at levels r (<= K), in the fastest layout."""
    lv = _level(cm, p)
    return np.min([lv.times(i, tokens, pairs, ckpt) for i in range(len(lv.layouts))], axis=0)


def _shard(tokens: np.ndarray, p: int, ring: int) -> np.ndarray:
    """Tokens each GPU holds (`shard_tokens`, vectorized)."""
    if ring > 1:
        return 2 * np.ceil(tokens / (2 * p) - 1e-9)
    return np.ceil(tokens / p - 1e-9)


@dataclass
class PricedLayout:
    """A layout's exact prices: busy s per group; per micro-batch (flat, empty ones included)
    tokens, checkpointed layers (K + 1: does not fit) and time (s)."""

    busy_s: np.ndarray
    tokens: np.ndarray
    levels: np.ndarray
    times_s: np.ndarray
    counts: list[int]
    """Micro-batches per group."""
    layouts: list[SPLayout]
    """Each group's layout: the fastest for its micro-batches (ties: larger Ulysses degree)."""
    pairs: np.ndarray | None = None
    """Attention pairs per micro-batch (what the step's schedule prices besides tokens)."""

    @property
    def makespan_s(self) -> float:
        return float(self.busy_s.max()) if len(self.busy_s) else 0.0

    def ckpt(self) -> list[list[int]]:
        """Checkpointed layers of each micro-batch, a list per group (as `assemble` takes)."""
        out, k = [], 0
        levels = self.levels.tolist()
        for c in self.counts:
            out.append(levels[k:k + c])
            k += c
        return out


def price_layout(layout: Layout, arrays: BatchArrays, pricer: Pricer,
                 ckpt: Sequence[Sequence[int]] | None = None) -> PricedLayout:
    """Exact busy time (s) of every group of `layout`, micro-batches at their fewest layers or at
    `ckpt`; inf for a group with a micro-batch that does not fit."""
    counts = [len(mbs) for _, _, mbs in layout]
    lengths = [len(mb) for _, _, mbs in layout for mb in mbs]
    n_mb = len(lengths)
    idx = np.fromiter((i for _, _, mbs in layout for mb in mbs for i in mb), dtype=np.int64)
    # Each micro-batch summed alone: one running sum's differences round short ones' pairs away.
    sizes_mb = np.asarray(lengths, dtype=np.int64)
    starts = (np.cumsum(sizes_mb) - sizes_mb)[sizes_mb > 0]
    tokens, pairs = np.zeros(n_mb), np.zeros(n_mb)
    if len(starts):
        tokens[sizes_mb > 0] = np.add.reduceat(arrays.tokens[idx], starts)
        pairs[sizes_mb > 0] = np.add.reduceat(arrays.pairs[idx], starts)
    size_arr = np.repeat([p for _, p, _ in layout], counts)
    given = np.fromiter((r for rs in ckpt for r in rs), dtype=np.int64, count=n_mb) if ckpt is not None else None
    times, levels = np.zeros(n_mb), np.zeros(n_mb, dtype=np.int64)
    owner = np.repeat(np.arange(len(layout)), counts)
    chosen: list[SPLayout | None] = [None] * len(layout)
    for p in set(size_arr.tolist()):
        on = size_arr == p
        r = None if given is None else given[on]
        per_layout = pricer.layout_times(p, tokens[on], pairs[on], r)
        levels[on] = pricer.levels(p, tokens[on], r)
        groups = np.unique(owner[on])
        # Each group runs in the layout fastest for all its micro-batches (sum over the group).
        sums = np.array([np.bincount(owner[on], weights=t, minlength=len(layout))[groups] for t in per_layout])
        # Backwards, argmin's first minimum is the largest Ulysses degree among equals.
        best = len(per_layout) - 1 - np.argmin(sums[::-1], axis=0)
        pick = np.zeros(len(layout), dtype=np.int64)
        pick[groups] = best
        times[on] = per_layout[pick[owner[on]], np.arange(int(on.sum()))]
        for gi in groups.tolist():
            chosen[gi] = pricer.layouts(p)[int(pick[gi])]
    busy = np.bincount(owner, weights=times, minlength=len(layout)) if n_mb else np.zeros(len(layout))
    return PricedLayout(busy, tokens, levels, times, counts,
                        [o if o is not None else pricer.layouts(p)[0] for o, (_, p, _) in zip(chosen, layout, strict=True)],
                        pairs)
