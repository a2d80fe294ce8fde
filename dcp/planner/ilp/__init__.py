"""The ILP planner: per global batch, a mixed-integer program picks the SP group sizes, each
sample's class and (through the canonical micro-batching) each micro-batch's checkpointed layers,
minimizing the step time under the memory limit. Its phases share `IlpOptions.time_limit_s`
(`budget`; only the final assembly is kept back):

1. setup (`search.Search`): the cost table (`costs`) and the bounds (`bounds`);
2. warm start (`warm`): dcp-greedy, a heuristic, every baseline no bound rules out, the fill, local
   search and best fit, each priced exactly (`incumbent`): the plan is never worse;
3. the program: the exact one for tiny batches (`exact`); else the aggregated program over length
   classes (`model`, `cuts`, `classes`) spread over groups (`pack`) beside the configuration
   programs (`columns`, `patterns`), then neighbourhood (`lns`) and local search;
4. finish: the incumbent assembled and validated, its gap to the best proven bound, and a status
   that says where the time limit cut a step (`dcp.planner.status`): without such a cut, the same
   plan on any machine. On solver failure the warm start comes back with a warning.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import dcp.planner.knobs as knobs
from dcp.costmodel import CostModel
from dcp.planner.bounds import step_floor
from dcp.planner.common import assemble_indices
from dcp.planner.feasibility import allowed_sp_sizes, check_feasible
from dcp.planner.ilp.budget import Budget
from dcp.planner.ilp.costs import CostTable
from dcp.planner.ilp.search import Search
from dcp.planner.options import IlpOptions
from dcp.planner.plan import InfeasibleError, Plan
from dcp.planner.pricing import BatchArrays, Pricer
from dcp.planner.sample import Sample
from dcp.planner.status import CUT_SHORT, NOT_RUN

SOURCE = "best plan from: "
"""How a plan's first note starts: the search step its plan came from follows."""
SECONDS = "seconds: "
"""How its last note starts: the seconds each phase of the solve took follow."""


@dataclass
class Beaten:
    """What `solve_ilp_against` returns when its plan cannot beat the step it was given: the
    program's status and notes as the plan would have had them, and no bound."""

    solver_status: str
    notes: list[str]
    lower_bound_s: float = 0.0


def solve_ilp(batch: Sequence[Sample], cm: CostModel, options: IlpOptions, started: float | None = None,
              arrays: BatchArrays | None = None, *, warn: bool = True) -> Plan:
    """Plan one global batch (module docstring), the limit counted from `started` (perf_counter;
    default now: `dcp.planner.solve` passes its start, so checking the inputs counts too).
    `arrays`: `BatchArrays.of(batch)` if in hand. A solver failure is in the plan's notes, and
    with `warn` a warning too (the phase search's parts are not the user's plan)."""
    plan = solve_ilp_against(batch, cm, options, started, arrays, warn=warn)
    assert isinstance(plan, Plan)
    return plan


def solve_ilp_against(batch: Sequence[Sample], cm: CostModel, options: IlpOptions, started: float | None = None,
                      arrays: BatchArrays | None = None, *, warn: bool = True,
                      beat_s: float | None = None, costs: tuple[Pricer, CostTable] | None = None) -> Plan | Beaten:
    """`solve_ilp` against a plan in hand that runs `beat_s` seconds: when no step the incumbent
    can have is faster, its plan is not assembled (a pass over every sample) and `Beaten` comes
    back. `costs`, when given, are `costs.batch_costs` already built for the backfill."""
    budget = Budget.start(options.time_limit_s, len(batch), started)
    sizes = allowed_sp_sizes(cm, options.sp_sizes)
    arrays = arrays if arrays is not None else BatchArrays.of(batch)
    check_feasible(batch, cm, sizes, arrays.tokens)
    search = Search(batch, cm, sizes, options, budget, arrays, costs)
    search.warm_start()
    if search.incumbent.best is None:
        raise InfeasibleError(f"ilp: no plan found with at most {options.max_microbatches} micro-batches per group")
    warm_source = search.incumbent.source
    search.align_slots(knobs.ALIGN_SHARE)
    if len(batch) <= knobs.EXACT_MAX_SAMPLES and cm.cluster.num_gpus <= knobs.EXACT_MAX_GPUS:
        search.exact_program()
    else:
        search.aggregated_program()
    search.align_slots()
    if search.failed is not None:
        msg = f"ilp: {options.solver} failed ({search.failed}); returning the warm start ({warm_source})"
        if warn:
            warnings.warn(msg, stacklevel=3)
        search.notes.append(msg)
    best, fastest = search.incumbent.best, search.incumbent.fastest_step
    if beat_s is not None and best is not None:
        least = min(best.busy_s + search.sync, fastest[0] if fastest is not None else float("inf"))
        if least >= beat_s:
            return Beaten(f"{options.solver}: {_status(search)}",
                          [f"{SOURCE}{best.source}", *_notes(search), _seconds(budget)])
    return finish(search)


def finish(search: Search) -> Plan:
    """The incumbent as a validated plan, with its bound, gap, status, notes and solve time."""
    budget, best = search.budget, search.incumbent.best
    assert best is not None
    t0 = time.perf_counter()
    status = _status(search)
    notes = [f"{SOURCE}{best.source}", *_notes(search)]
    fastest = search.incumbent.fastest_step  # the fastest scheduled step, which may not be the least busy
    if fastest is not None and fastest[1] is not best:
        best = fastest[1]
        notes[0] = f"{SOURCE}{best.source} (fastest scheduled step)"
    bound_s = max(step_floor(search.batch, search.cm, search.proven, search.sizes, (search.arrays.tokens, search.arrays.pairs)),
                  search.makespan_bound_s)
    plan = assemble_indices("ilp", search.batch, search.cm, best.layout, best.priced.ckpt(), arrays=search.arrays,
                            solver_status=f"{search.options.solver}: {status}", lower_bound_s=0.0,
                            pricer=search.pricer, notes=notes, validate=False)
    # The plan's step is its schedule's (assemble prices it): the bound and gap are against that.
    plan.lower_bound_s = min(bound_s, plan.step_time_s)
    plan.gap = max(0.0, (plan.step_time_s - plan.lower_bound_s) / plan.step_time_s) if plan.step_time_s > 0 else 0.0
    plan.validate()
    budget.record("finish", t0)
    plan.notes.append(_seconds(budget))
    plan.solve_time_s = budget.elapsed()
    return plan


def _seconds(budget: Budget) -> str:
    """The note of the seconds each phase took."""
    return SECONDS + ", ".join(f"{k} {v:.3f}" for k, v in budget.spent_s.items())


def _notes(search: Search) -> list[str]:
    """The steps the time limit skipped or cut short, then the search's own notes."""
    budget = search.budget
    return ([f"{what} skipped: {CUT_SHORT}" for what in budget.cut]
            + [f"{what} cut short: {CUT_SHORT}" for what in budget.stopped] + search.notes)


def _status(search: Search) -> str:
    """The program's outcome, and whether (and where) the time limit cut the search: without
    `CUT_SHORT` no step stopped at a deadline, so the plan is the same on any machine."""
    budget = search.budget
    parts = [f"{len(what)} step{'s' * (len(what) > 1)} {how}"
             for what, how in ((budget.cut, "skipped"), (budget.stopped, "cut short")) if what]
    limited = bool(parts) or search.cut_short
    detail = f" ({', '.join(parts)})" if parts else ""
    if search.program_ran:
        status = search.status
        if limited and CUT_SHORT not in status:
            status += f", {CUT_SHORT}"
        return status + detail
    if limited:
        return f"{NOT_RUN} ({CUT_SHORT}{', ' + ', '.join(parts) if parts else ''})"
    return f"{NOT_RUN} (the warm start meets the bound)"
