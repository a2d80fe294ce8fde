"""The best plan found so far, exactly priced, and the groups the search continues from. Candidates
are layouts (a baseline's, the exact program's, the fill's) or the search's groups, micro-batched
canonically (`costs`); each is priced exactly before it can win, groups whose estimate cannot win
are not priced, and nothing becomes a `Plan` until `finish`. As the step is not the busy time plus a
constant (ZeRO-3's slots; the reductions the last backward passes hide), the incumbent also keeps
the fastest scheduled step (`fastest_step`), which `finish` prefers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from dcp.costmodel import CostModel
from dcp.costmodel.schedule import least_link_s, slot_link_s
from dcp.planner.ilp.budget import Budget, Deadline
from dcp.planner.ilp.costs import CostTable
from dcp.planner.ilp.pack import Groups, estimate, groups_of_layout, to_layout
from dcp.planner.pricing import BatchArrays, Layout, PricedLayout, Pricer, price_layout
from dcp.planner.slots import align
from dcp.planner.sync import layout_step_s

_TOL = 1e-12


@dataclass
class Candidate:
    """A priced layout, its source, and its groups in table indices (None if they do not map)."""

    source: str
    layout: Layout
    priced: PricedLayout
    groups: Groups | None
    aligned: bool = False
    """Its slots already lined up (`slots.align`): `Incumbent.align_slots` leaves it."""

    @property
    def busy_s(self) -> float:
        return self.priced.makespan_s


class Incumbent:
    """Keeps the fastest candidate offered (ties: the first)."""

    def __init__(self, cm: CostModel, table: CostTable, arrays: BatchArrays, pricer: Pricer,
                 max_microbatches: int | None, budget: Budget) -> None:
        self.cm, self.table, self.arrays, self.pricer = cm, table, arrays, pricer
        self.cap, self.budget = max_microbatches, budget
        self.best: Candidate | None = None
        self.scheduled = cm.cluster.num_gpus > 1
        self.least_sync_s = cm.grad_sync_s()
        self.fastest_step: tuple[float, Candidate] | None = None
        """(scheduled step, candidate) of the fastest step offered."""

    @property
    def busy_s(self) -> float:
        return self.best.busy_s if self.best is not None else float("inf")

    @property
    def winning_busy_s(self) -> float:
        """The busy time a candidate must stay below to win: the least busy candidate's or, when
        higher, the fastest scheduled step less the least synchronization (a busier plan can step
        faster where the hidden reductions or ZeRO-3's slots decide the step)."""
        least_busy = self.busy_s * (1 - _TOL)
        if not self.scheduled or self.fastest_step is None:
            return least_busy
        return max(least_busy, self.fastest_step[0] * (1 - _TOL) - self.least_sync_s)

    @property
    def groups(self) -> Groups | None:
        return self.best.groups if self.best is not None else None

    @property
    def source(self) -> str:
        return self.best.source if self.best is not None else ""

    def offer_layout(self, layout: Layout, source: str, groups: Groups | None = None, aligned: bool = False) -> bool:
        """Price a layout at its fewest layers; True if it is the new incumbent. Under ZeRO-3 its
        pricing time counts for the budget (`Budget.pricing_s`: hundreds of lockstep slots take
        tenths of a second); at stages 0-2 only the search's count (docs/tuning-log.md)."""
        if self.cap is not None and any(len(mbs) > self.cap for _, _, mbs in layout):
            return False
        t0 = time.perf_counter()
        priced = price_layout(layout, self.arrays, self.pricer)
        if not np.isfinite(priced.makespan_s):
            return False
        if self.scheduled:
            self._offer_step(layout, priced, source, groups, aligned)
        if self.cm.training.zero_stage >= 3:
            self.budget.pricing_s = max(self.budget.pricing_s, time.perf_counter() - t0)
        if priced.makespan_s >= self.busy_s * (1 - _TOL):
            return False
        if groups is None:
            groups = groups_of_layout(layout, self.table)
        self.best = Candidate(source, layout, priced, groups, aligned)
        self.budget.plan_size(len(self.arrays.tokens), len(priced.tokens), len(layout))
        return True

    def _offer_step(self, layout: Layout, priced: PricedLayout, source: str, groups: Groups | None,
                    aligned: bool) -> None:
        if self.fastest_step is not None and priced.makespan_s + self.least_sync_s >= self.fastest_step[0]:
            return  # the step is at least the busy time plus the least synchronization
        if self.fastest_step is not None and least_link_s(self.cm, max(len(mbs) for _, _, mbs in layout)) \
                >= self.fastest_step[0]:
            return  # ZeRO-3: at least its slots' collectives (hundreds of slots: tenths of a second to price)
        covered = sum(p for _, p, _ in layout)
        step = layout_step_s(self.cm, layout, priced, covered < self.cm.cluster.num_gpus)
        if self.fastest_step is None or step < self.fastest_step[0] * (1 - _TOL):
            self.fastest_step = (step, Candidate(source, layout, priced, groups, aligned))

    def offer_groups(self, groups: Groups | None, source: str) -> bool:
        """Canonical micro-batches for the search's groups, priced; True if the new incumbent."""
        if groups is None:
            return False
        est = estimate(groups, self.table)  # never above the exact busy time
        if est >= self.winning_busy_s:
            return False
        t0 = time.perf_counter()
        layout = to_layout(groups, self.cm, self.table, self.cap)
        better = layout is not None and self.offer_layout(layout, source, groups)
        self.budget.pricing_s = max(self.budget.pricing_s, time.perf_counter() - t0)
        return better

    def align_slots(self, deadline: Deadline) -> None:
        """ZeRO-3: the fastest-step and the least busy candidates re-cut into slots that line up
        (`slots.align`) and offered: the program and the warm start are blind to the slots."""
        fastest = self.fastest_step[1] if self.fastest_step is not None else None
        done: list[Candidate] = []
        for cand in (fastest, self.best):
            if cand is None or cand.aligned or any(cand is d for d in done):
                continue
            done.append(cand)
            if deadline.passed():
                return
            found = align(cand.layout, self.arrays, self.pricer, slot_link_s(self.cm), None, deadline.at, self.cap)
            if found is not None:
                self.offer_layout(found[0], f"{cand.source}+slots", aligned=True)
        deadline.passed()  # records it when the last alignment ran out of time
