"""Best fit by SP size at a busy-time level, each size's leftover room filled from the sizes below:
a warm start for few samples per GPU, where a group's last sample decides how much of its time idles
and the programs' class loads round badly. At level theta each sample's home is the size of least
GPU-seconds where it runs alone within theta; sizes are packed largest first, own samples longest
first into the group each fills best by `pack`'s estimate (else a new group), then the room left
takes samples homed below. The level is bisected between a proven bound and the incumbent's busy
time. Its gain: docs/tuning-log.md.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

import dcp.planner.knobs as knobs
from dcp.planner.ilp.budget import Deadline
from dcp.planner.ilp.costs import CostTable
from dcp.planner.ilp.pack import Groups, group_estimate
from dcp.planner.levels import narrow


def best_fit(table: CostTable, num_gpus: int, lower: float, upper: float,
             deadline: float | Deadline = math.inf) -> list[Groups]:
    """The packings found whose groups fit `num_gpus`, at levels bisected in [lower, upper], the
    least last (the step, not only the busy time, decides the best, so each is worth pricing).
    Empty when even `upper` needs more GPUs or the deadline came first."""
    deadline = Deadline.of(deadline)
    first = _at(table, upper, num_gpus, deadline)
    if first is None:
        return []
    found = [first]

    def fits(theta: float) -> bool:
        groups = _at(table, theta, num_gpus, deadline)
        if groups is not None:
            found.append(groups)
        return groups is not None

    narrow(fits, lower, upper, steps=knobs.BEST_FIT_LEVEL_STEPS, rtol=knobs.BEST_FIT_LEVEL_RTOL, stop=deadline.passed)
    return found


def _at(table: CostTable, theta: float, num_gpus: int, deadline: Deadline) -> Groups | None:
    """Groups whose estimates stay within theta (module docstring); None when they need more than
    `num_gpus`, a sample runs alone within theta at no size, or at the deadline."""
    sizes = table.sizes
    ok = table.solo <= theta
    gpu_s = np.where(ok, table.gpu_seconds(), np.inf)
    home = np.argmin(gpu_s, axis=1)
    if not ok[np.arange(len(home)), home].all():
        return None
    marg = table.estimate_terms()[2]
    placed = np.zeros(len(home), dtype=bool)
    groups: Groups = []
    used = 0
    for j in range(len(sizes) - 1, -1, -1):
        mine = np.flatnonzero((home == j) & ~placed)
        if not len(mine):
            continue
        if deadline.passed():
            return None
        bins = _Bins(table, j, theta)
        most = (num_gpus - used) // sizes[j]  # groups this size may open
        for i in mine[np.argsort(-marg[mine, j], kind="stable")].tolist():
            if not bins.place(i):
                if len(bins.members) == most:
                    return None
                bins.open(i)
        placed[mine] = True
        used += sizes[j] * len(bins.members)
        rest = np.flatnonzero((home < j) & ~placed & ok[:, j])
        if len(rest):
            placed[bins.fill(rest[np.argsort(-marg[rest, j], kind="stable")])] = True
        groups += [(j, members) for members in bins.members]
    return groups


class _Bins:
    """One size's groups at theta: their estimate terms, members and rooms, sorted for best fit."""

    def __init__(self, table: CostTable, j: int, theta: float) -> None:
        self.table, self.j, self.theta = table, j, theta
        self.ring = j in table.rings
        short_tok, short_pairs, marg = table.estimate_terms()
        self.s_tok, self.s_pairs, self.s_marg = short_tok[:, j], short_pairs[:, j], marg[:, j]
        self.s_tok_list: list[float] = self.s_tok.tolist()
        self.s_marg_list: list[float] = self.s_marg.tolist()
        self.base: list[float] = []
        self.tok: list[float] = []
        self.pairs: list[float] = []
        self.members: list[list[int]] = []
        self.rooms: list[tuple[float, int]] = []

    def est(self, base: np.ndarray | float, tok: np.ndarray | float, pairs: np.ndarray | float) -> np.ndarray:
        """`pack`'s group estimate at this size (elementwise)."""
        return group_estimate(self.table, base, tok, pairs, self.j)

    def room(self, g: int, i: int) -> float:
        """Theta less group g's estimate with sample i added (in plain floats at ring-free sizes)."""
        return self.theta - float(group_estimate(self.table, self.base[g] + self.s_marg_list[i], self.tok[g] + self.s_tok_list[i],
                                                 self.pairs[g] + float(self.s_pairs[i]), self.j, scalar=not self.ring))

    def _take(self, g: int, i: int) -> None:
        """Sample i joins group g (its room is the caller's to keep)."""
        self.base[g] += self.s_marg_list[i]
        self.tok[g] += self.s_tok_list[i]
        self.pairs[g] += float(self.s_pairs[i])
        self.members[g].append(i)

    def _add(self, g: int, i: int, room: float) -> None:
        self._take(g, i)
        bisect.insort(self.rooms, (room, g))

    def open(self, i: int) -> None:
        """Sample i in a group of its own."""
        self.base.append(0.0)
        self.tok.append(0.0)
        self.pairs.append(0.0)
        self.members.append([])
        g = len(self.members) - 1
        self._add(g, i, self.room(g, i))

    def place(self, i: int) -> bool:
        """Sample i into the group with the least room that takes it; False if none does."""
        if self.ring:  # few groups, each estimate costly: all of them at once
            if not self.members:
                return False
            new = self.theta - self.est(np.array(self.base) + self.s_marg[i], np.array(self.tok) + self.s_tok[i],
                                        np.array(self.pairs) + self.s_pairs[i])
            fits = np.flatnonzero(new >= 0)
            if not len(fits):
                return False
            g = int(fits[np.argmin(new[fits])])
            self.rooms.remove(next(r for r in self.rooms if r[1] == g))
            self._add(g, i, float(new[g]))
            return True
        m = self.s_marg_list[i]
        k = bisect.bisect_left(self.rooms, (m * (1 - 1e-12), -1))  # the room must hold its marginal time
        while k < len(self.rooms):
            g = self.rooms[k][1]
            room = self.room(g, i)
            if room >= 0:
                self.rooms.pop(k)
                self._add(g, i, room)
                return True
            k += 1  # a micro-batch more, or the ring: the next room
        return False

    def fill(self, candidates: np.ndarray) -> np.ndarray:
        """Candidates (longest first) into the groups' room; those placed."""
        if self.ring:
            return self._fill_runs(candidates)
        taken: list[int] = []
        need = -self.s_marg[candidates]  # ascending
        at = 0
        while at < len(candidates) and self.rooms:
            # the next candidate whose marginal time the largest room holds
            at = max(at, int(np.searchsorted(need, -self.rooms[-1][0] * (1 + 1e-12), side="left")))
            if at >= len(candidates):
                break
            i = int(candidates[at])
            if self.place(i):
                taken.append(i)
            at += 1
        return np.array(taken, dtype=np.int64)

    def _alone(self, g: int, candidates: np.ndarray) -> np.ndarray:
        """Which candidates group g takes one at a time."""
        return self.est(self.base[g] + self.s_marg[candidates], self.tok[g] + self.s_tok[candidates],
                        self.pairs[g] + self.s_pairs[candidates]) <= self.theta

    def _fill_runs(self, candidates: np.ndarray) -> np.ndarray:
        """Ring sizes: each group in turn takes the longest run of the candidates left (in order)
        that fits, from the first that fits it alone, up to `knobs.BEST_FIT_RING_RUNS` times."""
        left = np.ones(len(candidates), dtype=bool)
        for g in range(len(self.members)):
            alone = self._alone(g, candidates)
            for _ in range(knobs.BEST_FIT_RING_RUNS):
                open_ = np.flatnonzero(alone & left)
                if not len(open_):
                    break
                run = np.flatnonzero(left)
                run = run[run >= open_[0]]
                ids = candidates[run]
                within = self.est(self.base[g] + np.cumsum(self.s_marg[ids]), self.tok[g] + np.cumsum(self.s_tok[ids]),
                                  self.pairs[g] + np.cumsum(self.s_pairs[ids])) <= self.theta
                k = len(run) if within.all() else int(np.argmin(within))
                if k == 0:  # the group has filled since it was judged: judge again
                    alone = self._alone(g, candidates)
                    continue
                for i in ids[:k].tolist():
                    self._take(g, i)
                left[run[:k]] = False
        self.rooms = sorted((self.theta - float(self.est(self.base[g], self.tok[g], self.pairs[g])), g)
                            for g in range(len(self.members)))
        return candidates[~left]
