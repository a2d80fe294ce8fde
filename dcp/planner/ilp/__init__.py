"""The ILP planner: per global batch, a PuLP mixed-integer program picks the SP group sizes, the
class of every sample and (through the canonical micro-batching) each micro-batch's checkpointed
layers, minimizing the step time under the memory limit.

Pipeline, all inside `IlpOptions.time_limit_s`:
1. warm start: the best of the baseline plans (dcp-greedy, bucket, packed, re-priced with the
   fewest checkpointed layers), of few large micro-batches balanced on exact prices where
   fixed costs are heavy (ZeRO-3, `fill`) and of a quick heuristic, each improved by local
   search (`pack`); it is the program's MIP start and incumbent;
2. tiny batches (a few samples, a few GPUs): the exact program over every group, micro-batch
   and checkpoint level (`exact`), proven optimal;
3. otherwise the aggregated program (`model`: count variables per SP size, not per group),
   its classes spread over groups (MULTIFIT), and beside it the configuration program
   (`patterns`: the large samples packed exactly as patterns, at a level between the bound
   and the incumbent; infeasible raises the bound to that level); the better candidate gets
   moves and swaps (`pack`) and small exact re-solves of the slowest group's neighbourhood
   (`lns`), priced exactly by `assemble`; configuration rounds repeat while they improve.
The better of the program's plan and the warm start is returned (never worse than dcp-greedy),
with the gap to the best proven bound: max(`lower_bound`, the solver's dual bound + gradient
sync); the search itself runs on `capacity_bound`, see `_Run`. On solver failure the warm
start is returned with a warning. No randomness, and work budgets are counts (nodes, rounds,
steps), so the same inputs give the same plan unless the wall-clock limit cuts a phase short,
which the status then reports.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence

from dcp.costmodel import CostModel
from dcp.planner.bounds import capacity_bound, lower_bound
from dcp.planner.common import assemble
from dcp.planner.feasibility import allowed_sp_sizes, check_feasible
from dcp.planner.ilp.costs import CostTable, cost_table
from dcp.planner.ilp.fill import fill_plans
from dcp.planner.ilp.lns import lns
from dcp.planner.ilp.model import solve_classes
from dcp.planner.ilp.pack import (
    Groups,
    estimate,
    groups_of_plan,
    heuristic,
    improve,
    multifit,
    to_plan,
)
from dcp.planner.ilp.patterns import solve_patterns
from dcp.planner.options import BucketOptions, GreedyOptions, IlpOptions, PackedOptions
from dcp.planner.plan import InfeasibleError, Plan
from dcp.planner.sample import Sample

EXACT_MAX_SAMPLES = 6
"""Batches up to this many samples (on up to `EXACT_MAX_GPUS`) get the exact program."""
EXACT_MAX_GPUS = 8
_ROUNDS_PER_S = 1.0
"""Program solves per second of time limit (at least one): a second solve starts from the
first's plan with tighter cuts. Work budgets are counts, not clock readings, so the same inputs
and options give the same plan unless the wall-clock limit cuts a phase short (then the status
says `time limit reached`)."""
_LNS_ROUNDS = 6
"""Neighbourhood re-solves after each program solve."""
_SEARCH_ITERS = 300
"""Local-search steps after each warm start and after each program solve."""
_PATTERN_ROUNDS = 2
"""Configuration-program rounds after the class program's, while each improves the incumbent."""
_PATTERN_STEP = 0.25
"""The configuration program's level: this fraction of the way from the proven bound to the
incumbent (a plan found at theta usually prices a little above it)."""
_PATTERN_SOLVE_S = 0.2
"""A configuration-program solve stops after this fraction of the time limit (its root node
can be slow right at the feasibility boundary); the status then says `time limit reached`."""
_PATTERN_TRIES = 3
"""Levels tried per round while the program proves them infeasible."""
_MIN_SOLVE_S = 0.03
"""A program round starts only with this much time left besides the reserve."""


def baseline_plans(batch: Sequence[Sample], cm: CostModel, sizes: Sequence[int],
                   notes: list[str] | None = None) -> list[Plan]:
    """The baseline strategies' plans for this batch (those that exist and succeed); why one
    failed goes to `notes` (a baseline that cannot plan a batch is not the ILP's problem)."""
    from dcp.planner.baselines import smallest_fitting_sp, solve_bucket, solve_packed
    from dcp.planner.greedy import solve_greedy

    solvers = {GreedyOptions: solve_greedy, BucketOptions: solve_bucket, PackedOptions: solve_packed}
    plans = []
    candidates = [GreedyOptions(sp_sizes=tuple(sizes)), BucketOptions(sp_sizes=tuple(sizes)),
                  PackedOptions(sp_sizes=tuple(sizes))]
    # Packing at every static SP size that fits the batch: the ILP must never lose to the best
    # static configuration a user could pick (with ZeRO-3's per-micro-batch parameter gathers,
    # few large micro-batches at a larger SP size can beat everything the greedy finds).
    smallest = smallest_fitting_sp(max(s.tokens for s in batch), cm, sizes)
    candidates += [PackedOptions(sp_sizes=tuple(sizes), static_sp=p) for p in sizes if p > smallest]
    for opts in candidates:
        try:
            plans.append(solvers[type(opts)](batch, cm, opts))
        except ImportError:
            continue  # that strategy's module is not there
        except Exception as e:  # a baseline's failure must not stop the ILP planner
            if notes is not None:
                notes.append(f"baseline {opts.name} failed ({type(e).__name__}: {e}); not a warm start")
    return plans


def _busy(plan: Plan) -> float:
    return plan.step_time_s - plan.grad_sync_s


class _Best:
    """The incumbent: best plan so far, as groups of table indices too."""

    def __init__(self) -> None:
        self.plan: Plan | None = None
        self.groups: Groups | None = None
        self.source = ""

    def offer(self, plan: Plan | None, groups: Groups | None, source: str) -> bool:
        if plan is None or (self.plan is not None and plan.step_time_s >= self.plan.step_time_s * (1 - 1e-12)):
            return False
        self.plan, self.groups, self.source = plan, groups, source
        return True


def solve_ilp(batch: Sequence[Sample], cm: CostModel, options: IlpOptions) -> Plan:
    """Plan one global batch with the ILP planner (see the module docstring)."""
    started = time.perf_counter()
    deadline = started + options.time_limit_s
    sizes = allowed_sp_sizes(cm, options.sp_sizes)
    check_feasible(batch, cm, sizes)
    run = _Run(list(batch), cm, sizes, options, deadline)
    run.warm_start()
    warm_source, warm_s = run.best.source, time.perf_counter() - started
    if len(run.batch) <= EXACT_MAX_SAMPLES and cm.cluster.num_gpus <= EXACT_MAX_GPUS:
        run.exact_program()
    else:
        run.aggregated_program()
    if run.failed is not None:
        msg = f"ilp: {options.solver} failed ({run.failed}); returning the warm start ({warm_source})"
        warnings.warn(msg, stacklevel=3)
        run.notes.append(msg)
    run.notes.append(f"best plan from: {run.best.source}")
    run.notes.append(f"seconds: warm start {warm_s:.3f}, program and search {time.perf_counter() - started - warm_s:.3f}")
    plan = run.best.plan
    assert plan is not None
    # Every phase stops at deadline - reserve at the latest; finishing that late means one did.
    truncated = run.cut_short or run.left() < _reserve(len(run.batch)) + 0.005
    status = run.status + (", time limit reached" if truncated and "time limit" not in run.status else "")
    # The makespan bound after the search, which it would not guide (see `_Run`) but would cost time.
    bound_s = max(run.proven + run.sync, lower_bound(run.batch, cm, sizes))
    return _finish(plan, bound_s, started, f"{options.solver}: {status}", run.notes)


class _Run:
    """One solve's state: the batch, its cost table, the incumbent and the proven bound."""

    def __init__(self, batch: list[Sample], cm: CostModel, sizes: list[int], options: IlpOptions,
                 deadline: float) -> None:
        self.batch, self.cm, self.sizes, self.options, self.deadline = batch, cm, sizes, options, deadline
        self.table = cost_table(batch, cm, sizes)
        self.sync = cm.grad_sync_s()
        # Proven bounds on the busy time. The search (class program's floor B >= L, cut and
        # configuration levels, early stop) runs on the capacity bound, the one its load
        # coefficients share: as the floor, the makespan bound flattens the program's objective
        # above its relaxation (any assignment meeting it is "optimal") and the spread plans got
        # worse (opensora:balanced, 64 GPUs: +0.2%). The plan reports `lower_bound` if larger.
        self.proven = capacity_bound(batch, cm, sizes) - self.sync
        self.best = _Best()
        self.notes: list[str] = []
        self.status, self.failed, self.cut_short = "warm start", None, False

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def price(self, groups: Groups) -> Plan | None:
        return to_plan(groups, self.batch, self.cm, self.table, self.options.max_microbatches,
                       lower_bound_s=self.proven + self.sync)

    def warm_start(self) -> None:
        """Baselines (re-priced with the fewest checkpointed layers), few large micro-batches where
        fixed costs are heavy (`fill`), the heuristic, local search."""
        cap, index = self.options.max_microbatches, {s.id: k for k, s in enumerate(self.batch)}
        for plan in baseline_plans(self.batch, self.cm, self.sizes, self.notes):
            groups = groups_of_plan(plan, self.table, index)
            if groups is None or (cap is not None and any(len(g.microbatches) > cap for g in plan.groups)):
                continue
            layout = [(g.ranks[0], g.sp, [mb.samples for mb in g.microbatches]) for g in plan.groups]
            repriced = assemble("ilp", self.batch, self.cm, layout, lower_bound_s=self.proven + self.sync)
            self.best.offer(repriced, groups, plan.strategy)
        for plan in fill_plans(self.batch, self.cm, self.sizes, self.proven + self.sync, self.deadline):
            if cap is None or all(len(g.microbatches) <= cap for g in plan.groups):
                self.best.offer(plan, groups_of_plan(plan, self.table, index), "fill")
        first = heuristic(self.table, self.cm.cluster.num_gpus, self.proven)
        for name, groups in [("heuristic", first), ("incumbent", self.best.groups)]:
            if groups is not None:
                groups = improve(groups, self.table, self.deadline, _SEARCH_ITERS)
                self.best.offer(self.price(groups), groups,
                                f"{self.best.source}+search" if name == "incumbent" else name)
        if self.best.plan is None:
            raise InfeasibleError(f"ilp: no plan found with at most {cap} micro-batches per group")

    def exact_program(self) -> None:
        """Tiny batches: the exact program, proven optimal within the time limit."""
        from dcp.planner.ilp.exact import solve_exact

        try:
            res = solve_exact(self.batch, self.cm, self.table, self.options, _busy(self.best.plan), self.left())
        except Exception as e:  # the solver must never take the planner down
            res, self.failed = None, f"{type(e).__name__}: {e}"
        if res is None:
            self.failed = self.failed or "no solution"
            return
        layout, bound, self.status = res
        self.proven = max(self.proven, bound)
        if layout is not None:
            plan = assemble("ilp", self.batch, self.cm, layout, lower_bound_s=self.proven + self.sync)
            self.best.offer(plan, None, "exact program")

    def aggregated_program(self) -> None:
        """The class program, its answer spread over groups; the configuration program's packing
        beside it; the better one (by estimate) searched and priced. A later round starts from
        the better incumbent with tighter cuts; configuration rounds follow while they improve."""
        reserve = _reserve(len(self.batch))
        for round_ in range(max(1, int(_ROUNDS_PER_S * self.options.time_limit_s))):
            if self.gap() <= self.options.mip_rel_gap or self.left() < reserve + _MIN_SOLVE_S:
                break
            try:
                sol = solve_classes(self.table, self.cm.cluster.num_gpus, _busy(self.best.plan), self.proven,
                                    self.best.groups, self.options.solver, self.deadline - reserve,
                                    self.options.mip_rel_gap)
                error = None if sol is not None else "no solution"
            except Exception as e:  # the solver must never take the planner down
                sol, error = None, f"{type(e).__name__}: {e}"
            if sol is None:
                if round_ == 0:  # a later round's trouble leaves the first round's answer standing
                    self.failed = error
                return
            self.status = sol.status
            self.proven = max(self.proven, sol.bound)
            spread = _spread(sol.counts, sol.classes, self.table)
            found = [] if spread is None else [(self.improve(spread), "aggregated program")]
            upper = min([_busy(self.best.plan)] + [estimate(g, self.table) for g, _ in found])
            found += [(g, "configuration program") for g in [self.configurations(upper)] if g]
            if not found or not self.search(found):
                break
        for _ in range(_PATTERN_ROUNDS):
            if self.gap() <= self.options.mip_rel_gap or self.left() < reserve + _MIN_SOLVE_S:
                break
            groups = self.configurations(_busy(self.best.plan))
            if groups is None or not self.search([(groups, "configuration program")]):
                break

    def configurations(self, upper: float) -> Groups | None:
        """The configuration program (`patterns`) at a level theta `_PATTERN_STEP` of the way
        from the proven bound to `upper` (the best busy time in hand): infeasible proves busy time
        > theta (then a higher level); feasible gives groups packing the large samples as the
        class program's counting cuts cannot, locally searched. None when it finds none."""
        reserve = _reserve(len(self.batch))
        for _ in range(_PATTERN_TRIES):
            if self.gap() <= self.options.mip_rel_gap or self.left() < reserve + _MIN_SOLVE_S:
                return None
            theta = self.proven + _PATTERN_STEP * (upper - self.proven)
            cap = min(self.deadline - reserve, time.perf_counter() + _PATTERN_SOLVE_S * self.options.time_limit_s)
            try:
                res = solve_patterns(self.table, self.cm.cluster.num_gpus, _busy(self.best.plan), theta,
                                     self.options.solver, cap)
            except Exception as e:  # the solver must never take the planner down
                self.notes.append(f"configuration program failed ({type(e).__name__}: {e})")
                return None
            if res is not None and "time limit" in res.status:
                self.cut_short = True
            if res is None or not res.infeasible:
                return None if res is None or res.groups is None else self.improve(res.groups)
            self.proven = max(self.proven, theta * (1 - 1e-9))  # no plan runs within theta
        return None

    def improve(self, groups: Groups) -> Groups:
        return improve(groups, self.table, self.deadline - _reserve(len(self.batch)), _SEARCH_ITERS)

    def search(self, found: list[tuple[Groups, str]]) -> bool:
        """Neighbourhood search on the best candidate (by estimate), then local search; True if
        it is the new incumbent."""
        reserve = _reserve(len(self.batch))
        groups, source = min(found, key=lambda f: estimate(f[0], self.table))
        target = (self.proven + self.sync) / (1 - self.options.mip_rel_gap) - self.sync
        groups = lns(groups, self.table, self.options.solver, self.deadline - reserve, _LNS_ROUNDS, target)
        groups = improve(groups, self.table, self.deadline - reserve, _SEARCH_ITERS)
        return self.best.offer(self.price(groups), groups, source)

    def gap(self) -> float:
        assert self.best.plan is not None
        return _gap(self.best.plan, self.proven + self.sync)


def _reserve(n: int) -> float:
    """Seconds kept back for pricing (and validating) the final plan after the search stops."""
    return 0.02 + 5e-5 * n


def _gap(plan: Plan, bound_s: float) -> float:
    return max(0.0, (plan.step_time_s - bound_s) / plan.step_time_s) if plan.step_time_s > 0 else 0.0


def _spread(counts: dict[int, int], classes: dict[int, list[int]], table: CostTable) -> Groups | None:
    """Each class's samples over its groups by LPT; samples the rounding left in a class without
    groups go to the smallest populated size where they fit (None if there is none)."""
    populated = sorted(j for j, c in counts.items() if c > 0)
    members = {j: list(classes.get(j, [])) for j in populated}
    for j, ids in sorted(classes.items()):
        if j in members:
            continue
        for i in ids:
            k = next((k for k in populated if table.ckpt[i, k] >= 0), None)
            if k is None:
                return None
            members[k].append(i)
    groups: Groups = []
    for j in populated:
        groups += [(j, b) for b in multifit(members[j], counts[j], j, table)]
    return groups


def _finish(plan: Plan, bound_s: float, started: float, status: str, notes: list[str]) -> Plan:
    """Stamp the final plan with its bound, gap, status and total solve time; re-validate."""
    plan.lower_bound_s = min(max(plan.lower_bound_s, bound_s), plan.step_time_s)
    plan.gap = _gap(plan, plan.lower_bound_s)
    plan.solver_status = status
    plan.strategy = "ilp"
    plan.notes = list(notes)
    plan.solve_time_s = time.perf_counter() - started
    return plan.validate()
