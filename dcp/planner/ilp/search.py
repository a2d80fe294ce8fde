"""One ILP solve's state and program phases: cost table, incumbent, proven bound, the exact program
for tiny batches and the aggregated one with its configuration rounds. Work budgets are counts, so
the same inputs give the same plan unless the time limit cuts a phase (the status says so).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from itertools import takewhile

import numpy as np

import dcp.planner.knobs as knobs
from dcp.costmodel import CostModel
from dcp.planner.bounds import capacity_busy, single_layout_bound
from dcp.planner.ilp.budget import Budget, machine_probe_s
from dcp.planner.ilp.columns import Columns, column_bound, column_plan, shapes_of
from dcp.planner.ilp.costs import CostTable, batch_costs
from dcp.planner.ilp.heuristic import class_counts
from dcp.planner.ilp.incumbent import Incumbent
from dcp.planner.ilp.lns import lns
from dcp.planner.ilp.model import solve_classes
from dcp.planner.ilp.pack import Groups, estimate, improve, spread
from dcp.planner.ilp.patterns import solve_patterns
from dcp.planner.ilp.solvers import stopped_on_time
from dcp.planner.ilp.warm import warm_start
from dcp.planner.levels import climb, narrow
from dcp.planner.options import IlpOptions
from dcp.planner.pricing import BatchArrays, Pricer
from dcp.planner.sample import Sample


class Search:
    """The batch, its cost table and bounds, the incumbent; the program phases as methods."""

    def __init__(self, batch: Sequence[Sample], cm: CostModel, sizes: list[int], options: IlpOptions,
                 budget: Budget, arrays: BatchArrays | None = None,
                 costs: tuple[Pricer, CostTable] | None = None) -> None:
        t0 = time.perf_counter()
        self.batch, self.cm, self.sizes, self.options, self.budget = list(batch), cm, sizes, options, budget
        self.arrays = arrays if arrays is not None else BatchArrays.of(batch)
        if len(batch) >= knobs.PROBE_FROM:  # a small batch's reserve is too small to tune (`Budget.slowdown`)
            budget.probe_s = machine_probe_s()
        self.pricer, self.table = costs if costs is not None else batch_costs(self.arrays, cm, sizes)
        self.sync = cm.grad_sync_s()
        bound_arrays = (self.arrays.tokens, self.arrays.pairs)
        # The search runs on the capacity bound, which its load coefficients share (the makespan
        # bound flattened the program's objective: docs/tuning-log.md); plans report the larger.
        self.proven = capacity_busy(batch, cm, sizes, bound_arrays)
        self.makespan_bound_s = single_layout_bound(batch, cm, sizes, bound_arrays)
        self.incumbent = Incumbent(cm, self.table, self.arrays, self.pricer, options.max_microbatches, budget)
        self.notes: list[str] = []
        self.status, self.failed, self.cut_short, self.program_ran = "warm start", None, False, False
        budget.record("setup", t0)

    def warm_start(self) -> None:
        """The incumbent from the baselines and quick heuristics (`warm`)."""
        t0 = time.perf_counter()
        warm_start(self.incumbent, self.budget, self.batch, self.cm, self.sizes, self.arrays, self.pricer,
                   self.table, self.proven, self.notes)
        self.budget.record("warm start", t0)

    def align_slots(self, share: float | None = None) -> None:
        """ZeRO-3: the best candidates' slots lined up, until `share` of the time left (None: the
        search deadline)."""
        if self.cm.training.zero_stage < 3 or self.cm.cluster.num_gpus == 1:
            return
        t0 = time.perf_counter()
        at = self.budget.until(share) if share is not None else self.budget.search_deadline
        if at - t0 < knobs.PROGRAM_MIN_S:
            self.budget.skip("slot alignment")
        else:
            self.incumbent.align_slots(self.budget.deadline_for("slot alignment", at))
        self.budget.record("slots", t0)

    # -- the exact program (tiny batches) ------------------------------------------------------
    def exact_program(self) -> None:
        """Tiny batches: the exact program, proven optimal within the time limit."""
        from dcp.planner.ilp.exact import solve_exact

        if self.budget.search_deadline - time.perf_counter() < knobs.PROGRAM_MIN_S:
            self.budget.skip("the exact program")
            return
        t0 = time.perf_counter()
        self.program_ran = True
        try:
            res = solve_exact(self.batch, self.cm, self.table, self.options, self.incumbent.busy_s, self.budget.left())
        except Exception as e:  # the solver must never take the planner down
            res, self.failed = None, f"{type(e).__name__}: {e}"
        self.budget.record("program", t0)
        if res is None:
            self.failed = self.failed or "no solution"
            return
        layout, bound, self.status = res
        self.proven = max(self.proven, bound)
        if layout is not None:
            position = {s.id: k for k, s in enumerate(self.batch)}
            self.incumbent.offer_layout([(start, p, [[position[i] for i in mb] for mb in mbs])
                                         for start, p, mbs in layout], "exact program")

    # -- the aggregated program ----------------------------------------------------------------
    def aggregated_program(self) -> None:
        """The class program spread over groups beside the configuration program's packing, the
        better one (by estimate) searched and priced; later rounds start from the better
        incumbent with tighter cuts, then configuration rounds while they improve."""
        t0 = time.perf_counter()
        self.column_program()
        rounds = max(1, int(knobs.ROUNDS_PER_S * self.options.time_limit_s))
        for round_ in range(rounds):
            if self.gap() <= self.options.mip_rel_gap:
                break
            if self.budget.search_deadline - time.perf_counter() < knobs.PROGRAM_MIN_S:
                self.budget.skip("the class program" if round_ == 0 else f"class program rounds {round_ + 1}-{rounds}")
                break
            self.program_ran = True
            try:
                sol = solve_classes(self.table, self.cm.cluster.num_gpus, self.incumbent.busy_s, self.proven,
                                    self.incumbent.groups, self.options.solver, self.budget.until(knobs.CLASS_SHARE),
                                    self.options.mip_rel_gap)
                error = None if sol is not None else "no solution"
            except Exception as e:  # the solver must never take the planner down
                sol, error = None, f"{type(e).__name__}: {e}"
            if sol is None:
                if round_ == 0:  # a later round's trouble leaves the first round's answer standing
                    self.failed = error
                break
            self.status = sol.status
            if stopped_on_time(sol.status):  # at its share of the time (knobs.CLASS_SHARE) or the deadline
                self.cut_short = True
                self.budget.stop("the class program")
            self.proven = max(self.proven, sol.bound)
            found = [(self.improve(g), "aggregated program") for g in self.spreads(sol.counts, sol.classes)]
            upper = min([self.incumbent.busy_s] + [estimate(g, self.table) for g, _ in found])
            found += [(g, "configuration program") for g in [self.configurations(upper)] if g]
            if not found or not self.search(found):
                break
        for round_ in range(knobs.PATTERN_ROUNDS):
            if self.gap() <= self.options.mip_rel_gap:
                break
            if self.budget.search_deadline - time.perf_counter() < knobs.PROGRAM_MIN_S:
                self.budget.skip("configuration program rounds" if round_ == 0 else
                                 f"configuration program rounds {round_ + 1}-{knobs.PATTERN_ROUNDS}")
                break
            groups = self.configurations(self.incumbent.busy_s)
            if groups is None or not self.search([(groups, "configuration program")]):
                break
        self.budget.record("program", t0)

    def column_program(self) -> None:
        """Few shapes (`columns`): the column bound, then integer plans just above it."""
        shapes = shapes_of(self.table)
        if shapes is None or self.gap() <= self.options.mip_rel_gap:
            return
        if self.budget.search_deadline - time.perf_counter() < knobs.PROGRAM_MIN_S:
            self.budget.skip("the column program")
            return
        self.program_ran, self.status = True, "column program"
        deadline = self.budget.deadline_for("the column program", self.budget.until(knobs.COLUMN_SHARE))
        now = time.perf_counter()
        bounding = self.budget.deadline_for("the column bound", now + knobs.COLUMN_BOUND_SHARE * max(deadline.at - now, 0.0))
        n = self.cm.cluster.num_gpus

        def planned(theta: float, start: Columns) -> bool:
            """Whether the column program gives a plan at theta (then searched and offered)."""
            groups = column_plan(self.table, shapes, n, theta, deadline, start)
            if groups is not None:
                self.search([(self.improve(groups), "column program")])
            return groups is not None

        try:
            bound, feasible, start = column_bound(self.table, shapes, n, self.proven, self.incumbent.busy_s, bounding)
            self.proven = max(self.proven, bound)
            # Levels from the bound or, if the bisection stopped short, just below the lowest
            # feasible level; the highest without a plan and the lowest with one below the incumbent.
            base = max(self.proven, feasible / knobs.COLUMN_LEVELS[0])
            lo, hi = climb(lambda theta: planned(theta, start),
                           takewhile(lambda theta: theta < self.incumbent.busy_s, (base * v for v in knobs.COLUMN_LEVELS)),
                           lambda: self.spent(lambda: math.inf, lambda: None))
            # Between them, bisection while the time lasts: the levels are coarse steps.
            if hi is not None:
                narrow(lambda theta: planned(theta, start), base if lo is None else lo, hi, steps=knobs.COLUMN_SPLITS,
                       rtol=knobs.COLUMN_SPLIT_RTOL, stop=lambda: self.spent(deadline.left, deadline.record))
        except Exception as e:  # the solver must never take the planner down
            self.notes.append(f"column program failed ({type(e).__name__}: {e})")

    def spent(self, left: Callable[[], float], record: Callable[[], object]) -> bool:
        """Whether a level search stops: the gap closed, or `left()` too short (then `record()`)."""
        if self.gap() <= self.options.mip_rel_gap:
            return True
        short = left() < knobs.PROGRAM_MIN_S
        if short:
            record()
        return short

    def configurations(self, upper: float) -> Groups | None:
        """The configuration program (`patterns`) at levels `knobs.PATTERN_STEP` of the way from
        the proven bound to `upper`: infeasible raises the bound (then a higher level); feasible
        gives groups that pack the large samples, locally searched. None when it finds none."""
        found: list[Groups | None] = []

        def holds(theta: float) -> bool:
            """Whether the program leaves theta unproven (`found` then holds its groups or None)."""
            cap = min(self.budget.search_deadline, time.perf_counter() + knobs.PATTERN_SOLVE_SHARE * self.options.time_limit_s)
            try:
                res = solve_patterns(self.table, self.cm.cluster.num_gpus, self.incumbent.busy_s, theta,
                                     self.budget.deadline_for("the configuration program", cap))
            except Exception as e:  # the solver must never take the planner down
                self.notes.append(f"configuration program failed ({type(e).__name__}: {e})")
                res = None
            if res is not None and stopped_on_time(res.status):
                self.cut_short = True
            if res is None or not res.infeasible:
                found.append(None if res is None else res.groups)
                return True
            self.proven = max(self.proven, theta * (1 - 1e-9))  # no plan runs within theta
            return False

        # Each level from the bound as it stands: every infeasible level raises it.
        climb(holds, (self.proven + knobs.PATTERN_STEP * (upper - self.proven) for _ in range(knobs.PATTERN_TRIES)),
              lambda: self.spent(lambda: self.budget.search_deadline - time.perf_counter(),
                                 lambda: self.budget.skip("configuration program levels")))
        return None if not found or found[0] is None else self.improve(found[0])

    def spreads(self, counts: dict[int, int], classes: dict[int, list[int]]) -> list[Groups]:
        """The program's classes over groups, by its counts and by counts from the classes' exact
        loads (its lower-bound coefficients can leave a class short), the better by estimate."""
        out = []
        for c in (counts, self._recount(counts, classes)):
            groups = _spread(c, classes, self.table) if c is not None else None
            if groups is not None:
                out.append(groups)
        return [min(out, key=lambda g: estimate(g, self.table))] if out else []

    def _recount(self, counts: dict[int, int], classes: dict[int, list[int]]) -> dict[int, int] | None:
        loads = {j: float(self.table.add[ids, j].sum()) for j, ids in classes.items() if ids and counts.get(j, 0) > 0}
        if not loads or any(ids and counts.get(j, 0) == 0 for j, ids in classes.items()):
            return None
        items = {j: self.table.add[classes[j], j] for j in loads}
        return class_counts(loads, self.table.sizes, self.cm.cluster.num_gpus, items)

    def improve(self, groups: Groups) -> Groups:
        return improve(groups, self.table, self.budget.deadline_for("local search"), knobs.IMPROVE_STEPS,
                       self.cm.cluster.num_gpus)

    def search(self, found: list[tuple[Groups, str]]) -> bool:
        """Neighbourhood search, then local search, on the best candidate; True if it wins."""
        groups, source = min(found, key=lambda f: estimate(f[0], self.table))
        target = (self.proven + self.sync) / (1 - self.options.mip_rel_gap) - self.sync
        groups = lns(groups, self.table, self.options.solver, self.budget.deadline_for("neighbourhood search"),
                     knobs.LNS_ROUNDS, target)
        groups = self.improve(groups)
        return self.incumbent.offer_groups(groups, source)

    def gap(self) -> float:
        """The incumbent's gap to the proven bound (the search's, not the reported one)."""
        step = self.incumbent.busy_s + self.sync
        return max(0.0, (step - self.proven - self.sync) / step) if step > 0 else 0.0


def _spread(counts: dict[int, int], classes: dict[int, list[int]], table: CostTable) -> Groups | None:
    """Each class's samples over its groups (`pack.spread`); samples left in a class without
    groups go to the smallest populated size where they fit (None if none)."""
    populated = sorted(j for j, c in counts.items() if c > 0)
    members = {j: list(classes.get(j, [])) for j in populated}
    for j, ids in sorted(classes.items()):
        if j in members or not ids:
            continue
        ok = table.ckpt[np.asarray(ids)][:, populated] >= 0
        if not ok.any(axis=1).all():
            return None
        first = np.argmax(ok, axis=1)
        for i, k in zip(ids, first, strict=True):
            members[populated[int(k)]].append(i)
    groups: Groups = []
    for j in populated:
        groups += [(j, b) for b in spread(members[j], counts[j], j, table)]
    return groups

