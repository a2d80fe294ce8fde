"""ZeRO-3's lockstep slots: slot j is every group's j-th micro-batch and each layer's gather syncs
the world, so a step lasts about the sum over slots of each one's slowest micro-batch. `align`
re-cuts each group's samples into S micro-batches, evenly, then against the slots' lengths, so a
group with little work fills slots a long sample holds open elsewhere (docs/design.md).
"""

from __future__ import annotations

import math
import time

import numpy as np

import dcp.planner.knobs as knobs
from dcp.planner.pricing import BatchArrays, Layout, Pricer


class _Groups:
    """A layout's groups with their samples longest first, padded into one matrix per pass."""

    def __init__(self, layout: Layout, arrays: BatchArrays, pricer: Pricer, ckpt: int | None) -> None:
        self.starts = [s for s, _, _ in layout]
        self.sizes = np.array([p for _, p, _ in layout])
        self.pricer, self.ckpt = pricer, ckpt
        self.tokens, self.pairs = arrays.tokens, arrays.pairs
        members = [np.fromiter((i for mb in mbs for i in mb), dtype=np.int64) for _, _, mbs in layout]
        width = max((len(m) for m in members), default=0)
        self.order = np.full((len(layout), width), -1, dtype=np.int64)
        self.solo = np.zeros((len(layout), width))
        """Each sample's time alone, in `order`."""
        for g, (m, p) in enumerate(zip(members, self.sizes.tolist(), strict=True)):
            solo = self.times(p, self.tokens[m], self.pairs[m])
            ranked = np.lexsort((m, -solo))
            self.order[g, :len(m)], self.solo[g, :len(m)] = m[ranked], solo[ranked]
        self.by_size = {p: np.flatnonzero(self.sizes == p) for p in np.unique(self.sizes).tolist()}
        self.group_tokens = np.array([float(self.tokens[m].sum()) for m in members])
        k = pricer.num_layers if ckpt is None else ckpt
        self.capacity = {p: pricer.capacity(p, k) for p in self.by_size}
        """Tokens a micro-batch holds at most at each size."""

    def times(self, p: int, tokens: np.ndarray, pairs: np.ndarray) -> np.ndarray:
        return self.pricer.times(p, tokens, pairs, self.ckpt)

    def slots_needed(self, layers: int) -> int:
        """Micro-batches the fullest group needs at least, at `layers` (or the fixed level)."""
        k = layers if self.ckpt is None else self.ckpt
        need = [math.ceil(t / self.pricer.capacity(int(p), k) - 1e-9)
                for t, p in zip(self.group_tokens.tolist(), self.sizes.tolist(), strict=True)]
        return max([1, *need])

    def deal(self, slots: int, room: np.ndarray | None, deadline: float) -> tuple[np.ndarray, np.ndarray] | None:
        """Each sample's micro-batch and the times [group, slot], each sample where it lengthens
        least or has most room under `room`; None if one fits nowhere or time is up."""
        groups, width = self.order.shape
        tok, pair, time_s = np.zeros((groups, slots)), np.zeros((groups, slots)), np.zeros((groups, slots))
        where = np.full(len(self.tokens), -1, dtype=np.int64)
        room = np.zeros(slots) if room is None else room
        big = self.solo >= knobs.SLOT_BIG * self.solo.sum(axis=1, keepdims=True) / slots
        singles = min(int(big.sum(axis=1).max()), knobs.SLOT_ONE_BY_ONE * slots)
        k, rounds = 0, 0
        while k < width:
            if time.perf_counter() > deadline:
                return None
            if k < singles:
                ranks = 1
            else:
                rounds += 1
                ranks = max(1, -(-(width - k) // max(1, knobs.SLOT_ROUNDS - rounds + 1)))
            for p, rows in self.by_size.items():
                ids = self.order[rows, k:k + ranks]
                live = ids[:, 0] >= 0
                if not live.any():
                    continue
                rows, ids = rows[live], ids[live]
                if ranks == 1 and not self._place_one(p, rows, ids[:, 0], tok, pair, time_s, where, room):
                    return None
                if ranks > 1 and not self._place_round(p, rows, ids, tok, pair, time_s, where, room):
                    return None
            k += ranks
        return where, time_s

    def _place_one(self, p: int, rows: np.ndarray, ids: np.ndarray, tok: np.ndarray, pair: np.ndarray,
                   time_s: np.ndarray, where: np.ndarray, room: np.ndarray) -> bool:
        t, a = self.tokens[ids], self.pairs[ids]
        new = self.times(p, (tok[rows] + t[:, None]).ravel(), (pair[rows] + a[:, None]).ravel()).reshape(len(rows), -1)
        pick = np.argmin(new - room[None, :], axis=1)
        chosen = new[np.arange(len(rows)), pick]
        if not np.isfinite(chosen).all():
            return False
        tok[rows, pick] += t
        pair[rows, pick] += a
        time_s[rows, pick] = chosen
        where[ids] = pick
        return True

    def _place_round(self, p: int, rows: np.ndarray, ids: np.ndarray, tok: np.ndarray, pair: np.ndarray,
                     time_s: np.ndarray, where: np.ndarray, room: np.ndarray) -> bool:
        """A round's samples per group, longest first, to its micro-batches in order of room; a
        group where one overflows places each half of its round apart."""
        slots, cols = tok.shape[1], ids.shape[1]
        held = ids >= 0
        largest = self.tokens[np.where(held[:, 0], ids[:, 0], 0)]
        spare = self.capacity[p] - tok[rows] >= -(-cols // slots) * largest[:, None]
        ranked = np.argsort(time_s[rows] - room[None, :] + np.where(spare, 0.0, np.inf), axis=1, kind="stable")
        cycle = np.maximum(spare.sum(axis=1), 1)
        pick = np.take_along_axis(ranked, np.arange(cols)[None, :] % cycle[:, None], axis=1)
        r_of = np.broadcast_to(rows[:, None], ids.shape)[held]
        b_of, i_of = pick[held], ids[held]
        t_new, a_new = tok.copy(), pair.copy()
        np.add.at(t_new, (r_of, b_of), self.tokens[i_of])
        np.add.at(a_new, (r_of, b_of), self.pairs[i_of])
        new = self.times(p, t_new[rows].ravel(), a_new[rows].ravel()).reshape(len(rows), -1)
        fits = np.isfinite(new).all(axis=1)
        ok = rows[fits]
        tok[ok], pair[ok], time_s[ok] = t_new[ok], a_new[ok], new[fits]
        done = held & fits[:, None]
        where[ids[done]] = pick[done]
        if fits.all():
            return True
        rows, ids = rows[~fits], ids[~fits]  # where one overflowed: each half of the round apart
        if cols == 1:
            return self._place_one(p, rows, ids[:, 0], tok, pair, time_s, where, room)
        for part in (ids[:, :cols // 2], ids[:, cols // 2:]):
            live = part[:, 0] >= 0
            if live.any() and not self._place_round(p, rows[live], part[live], tok, pair, time_s, where, room):
                return False
        return True

    def layout(self, where: np.ndarray, time_s: np.ndarray) -> Layout:
        """The groups' micro-batches from `deal`'s answer, longest first, empty ones dropped."""
        out: Layout = []
        for g, (start, p) in enumerate(zip(self.starts, self.sizes.tolist(), strict=True)):
            ids = self.order[g][self.order[g] >= 0]
            bins = where[ids]
            mbs = [ids[bins == b].tolist() for b in np.argsort(-time_s[g], kind="stable").tolist()]
            out.append((start, p, [mb for mb in mbs if mb]))
        return out


def slots_estimate(time_s: np.ndarray, link_s: float) -> tuple[float, np.ndarray]:
    """sum_j max(tau_j, link_s) and the slots' lengths tau_j (the j-th longest micro-batch of any
    group, `time_s` [group, slot]): ZeRO-3's step from micro-batch times, lockstep slots each
    lasting their slowest micro-batch and at least a slot's collectives (dcp-greedy's merges and
    re-cuts, `align`)."""
    tau = (-np.sort(-time_s, axis=1)).max(axis=0) if time_s.size else np.zeros(0)
    return float(np.maximum(tau, link_s).sum()), tau


def align(layout: Layout, arrays: BatchArrays, pricer: Pricer, link_s: float, ckpt: int | None = None,
          deadline: float = math.inf, most: int | None = None) -> tuple[Layout, float] | None:
    """`layout` re-cut into lined-up slots at the best count tried, and its estimate (s); None if
    none fits in time. `ckpt`: every micro-batch's layers (else fewest); `most`: per group."""
    if not layout:
        return None
    groups = _Groups(layout, arrays, pricer, ckpt)
    fewest = groups.slots_needed(pricer.num_layers)
    own = max(len(mbs) for _, _, mbs in layout)
    top = max(min(groups.slots_needed(0), fewest * knobs.SLOT_SPAN), own)
    counts, s = [], float(fewest)
    while round(s) <= top:
        counts.append(round(s))
        s *= knobs.SLOT_GROWTH
    counts = sorted({c for c in [*counts, own] if most is None or c <= most})
    best: tuple[float, np.ndarray, np.ndarray] | None = None
    worse = 0
    for slots in counts:
        if time.perf_counter() > deadline or worse >= knobs.SLOT_WORSE:
            break
        found = groups.deal(slots, None, deadline)
        if found is None:
            continue
        est, tau = slots_estimate(found[1], link_s)
        mine = (est, *found)
        uneven = est > found[1].sum(axis=1).max() * (1 + 1e-9)  # else each slot already ends together
        promising = best is None or est < best[0] * (1 + knobs.SLOT_RESHAPE_WITHIN)
        for _ in range(knobs.SLOT_RESHAPES if uneven and promising else 0):
            again = groups.deal(slots, tau, deadline)
            if again is None:
                break
            est2, tau = slots_estimate(again[1], link_s)
            if est2 >= mine[0] * (1 - 1e-3):
                if est2 < mine[0]:
                    mine = (est2, *again)
                break
            mine = (est2, *again)
        worse = 0 if best is None or mine[0] < best[0] * (1 - knobs.SLOT_GAIN) else worse + 1
        if best is None or mine[0] < best[0]:
            best = mine
    if best is None:
        return None
    return groups.layout(best[1], best[2]), best[0]
