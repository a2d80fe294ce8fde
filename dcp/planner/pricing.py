"""Exact micro-batch prices for whole arrays at once, from the cost model's linear queries.

At fixed (SP size p, checkpointed layers r) a micro-batch of T tokens and A attention pairs runs
`CostModel.linear_time(p, r)(T, A)` and fits when T <= `CostModel.max_tokens(p, r)` (a multiple
of p: each GPU holds ceil(T/p) tokens, the executor pads). Its best level is the fewest layers
that fit (every cost coefficient grows with r), and its memory is `CostModel.memory_bytes`:
static bytes plus the per-GPU activation bytes of ceil(T/p) tokens. `Pricer` holds those numbers
per allowed size, so strategies price thousands of candidate micro-batches in a few numpy
operations (tests/test_pricing.py checks them against the cost model's scalar queries);
`price_layout` prices a whole layout the way `common.assemble` does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dcp.costmodel import CostModel
from dcp.planner.sample import Sample

Layout = list[tuple[int, int, list[list[int]]]]
"""Groups as (first rank, SP size, micro-batches as lists of batch indices)."""


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
    """One SP size's levels r = 0..K, plus r = K + 1 standing for "fits nowhere" (infinite time)."""

    def __init__(self, cm: CostModel, p: int) -> None:
        k = cm.model.num_layers
        self.capacity = np.array([cm.max_tokens(p, r) for r in range(k + 1)], dtype=np.float64)
        # Activation bytes per token held on one GPU (CostModel.memory_bytes multiplies them by
        # the shard's ceil(T/p) tokens); level K + 1 repeats K's, for shapes only.
        per_gpu = [cm.activation_bytes_per_token(1, r) for r in range(k + 1)]
        self.bytes_per_shard_token = np.array(per_gpu + per_gpu[-1:])
        lin = [cm.linear_time(p, r) for r in range(k + 1)]
        self.fixed = np.array([c.fixed for c in lin] + [math.inf])
        self.per_token = np.array([c.per_token for c in lin] + [0.0])
        self.per_pair = np.array([c.per_pair for c in lin] + [0.0])


class Pricer:
    """Fewest layers and exact times of micro-batches at each allowed SP size, vectorized."""

    def __init__(self, cm: CostModel, sizes: Sequence[int]) -> None:
        self.num_layers = cm.model.num_layers
        self.static_bytes = cm.static_bytes
        self.sizes = list(sizes)
        self._levels = {p: _Level(cm, p) for p in self.sizes}

    def layers(self, p: int, tokens: np.ndarray) -> np.ndarray:
        """Fewest checkpointed layers at which each micro-batch fits at p; K + 1 where none does."""
        return np.searchsorted(self._levels[p].capacity, tokens, side="left")

    def capacity(self, p: int, r: int) -> float:
        """max_tokens(p, r)."""
        return float(self._levels[p].capacity[r])

    def times(self, p: int, tokens: np.ndarray, pairs: np.ndarray, ckpt: np.ndarray | int | None = None) -> np.ndarray:
        """Times at p with the fewest layers that fit (or `ckpt` layers, inf where those do not
        fit); inf where nothing fits, 0 for an empty micro-batch."""
        lv = self._levels[p]
        fewest = self.layers(p, tokens)
        r = fewest if ckpt is None else np.where(fewest <= ckpt, ckpt, self.num_layers + 1)
        t = lv.fixed[r] + lv.per_token[r] * tokens + lv.per_pair[r] * pairs
        return np.where(tokens > 0, t, 0.0)

    def memory_bytes(self, p: int, tokens: np.ndarray, ckpt: np.ndarray) -> np.ndarray:
        """`CostModel.memory_bytes(T, p, r)` elementwise: static bytes plus the activation bytes
        of the ceil(T/p) tokens each GPU holds (`dcp.costmodel.model.shard_tokens`, the same rounding)."""
        shard = np.ceil(np.asarray(tokens, dtype=np.float64) / p - 1e-9)
        return self.static_bytes + self._levels[p].bytes_per_shard_token[ckpt] * shard

    def levels(self, p: int, tokens: np.ndarray, ckpt: np.ndarray | int | None = None) -> np.ndarray:
        """The checkpointed layers `times` prices each micro-batch with (K + 1: does not fit)."""
        fewest = self.layers(p, tokens)
        return fewest if ckpt is None else np.where(fewest <= ckpt, ckpt, self.num_layers + 1)


@dataclass
class PricedLayout:
    """A layout's exact prices: busy seconds per group, and per micro-batch (flat, group after
    group, empty ones included) its tokens, checkpointed layers (K + 1: does not fit) and time."""

    busy_s: np.ndarray
    tokens: np.ndarray
    levels: np.ndarray
    times_s: np.ndarray
    counts: list[int]
    """Micro-batches per group."""
    pairs: np.ndarray | None = None
    """Attention pairs per micro-batch (what the step's schedule prices besides tokens)."""

    @property
    def makespan_s(self) -> float:
        return float(self.busy_s.max()) if len(self.busy_s) else 0.0

    def ckpt(self) -> list[list[int]]:
        """Checkpointed layers of each micro-batch, one list per group (as `assemble` takes them)."""
        out, k = [], 0
        levels = self.levels.tolist()
        for c in self.counts:
            out.append(levels[k:k + c])
            k += c
        return out


def price_layout(layout: Layout, arrays: BatchArrays, pricer: Pricer,
                 ckpt: Sequence[Sequence[int]] | None = None) -> PricedLayout:
    """Exact busy time of every group of `layout` (micro-batches of batch indices), each
    micro-batch at its fewest layers or at `ckpt`; inf for a group with a micro-batch that does
    not fit."""
    counts = [len(mbs) for _, _, mbs in layout]
    lengths = [len(mb) for _, _, mbs in layout for mb in mbs]
    n_mb = len(lengths)
    idx = np.fromiter((i for _, _, mbs in layout for mb in mbs for i in mb), dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    csum_t = np.concatenate([[0.0], np.cumsum(arrays.tokens[idx])])
    csum_a = np.concatenate([[0.0], np.cumsum(arrays.pairs[idx])])
    tokens = csum_t[bounds[1:]] - csum_t[bounds[:-1]]
    pairs = csum_a[bounds[1:]] - csum_a[bounds[:-1]]
    size_arr = np.repeat([p for _, p, _ in layout], counts)
    given = np.fromiter((r for rs in ckpt for r in rs), dtype=np.int64, count=n_mb) if ckpt is not None else None
    times, levels = np.zeros(n_mb), np.zeros(n_mb, dtype=np.int64)
    for p in set(size_arr.tolist()):
        on = size_arr == p
        r = None if given is None else given[on]
        times[on] = pricer.times(p, tokens[on], pairs[on], r)
        levels[on] = pricer.levels(p, tokens[on], r)
    owner = np.repeat(np.arange(len(layout)), counts)
    busy = np.bincount(owner, weights=times, minlength=len(layout)) if n_mb else np.zeros(len(layout))
    return PricedLayout(busy, tokens, levels, times, counts, pairs)
