"""Run a PuLP program on HiGHS (highspy, in-process, default) or CBC (bundled with PuLP), with a
warm start, a time limit and a relative gap, and report the solver's proven dual bound."""

from __future__ import annotations

import functools
import os
import re
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

import pulp

import dcp.planner.knobs as knobs


class SolverUnavailableError(RuntimeError):
    """The requested MILP solver is not installed."""


@dataclass
class SolveResult:
    """What the solver proved and found."""

    values: dict[pulp.LpVariable, float] | None
    """Incumbent variable values; None when there is none."""
    bound: float | None
    """Proven lower bound on the objective (minimization); None when unknown."""
    status: str


def stopped_on_time(status: str) -> bool:
    """Whether a `SolveResult.status` says the time limit stopped the solver (HiGHS: "time limit
    reached", also from `_interrupt_at`; CBC: "stopped on time")."""
    return "time limit" in status or "stopped on time" in status


def new_var(prob: pulp.LpProblem, name: str, low: float | None = None, up: float | None = None,
            cat: str = pulp.LpContinuous) -> pulp.LpVariable:
    """A variable owned by `prob` (PuLP >= 3.3's add_variable; LpVariable on older PuLP)."""
    if hasattr(prob, "add_variable"):
        return prob.add_variable(name, low, up, cat)
    return pulp.LpVariable(name, low, up, cat)


@functools.cache
def _silence_highs_banner() -> None:
    """Build the process's first Highs object with fd 1 on /dev/null: HiGHS prints a banner to
    stdout then, which would corrupt machine-readable output (`dcp plan --format json`). Once per
    process; what another thread writes in that instant is lost too."""
    import highspy

    sys.stdout.flush()
    saved, devnull = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def _highs_class() -> type:
    if not pulp.HiGHS().available():
        raise SolverUnavailableError("HiGHS is not available: `pip install highspy` (or use solver='cbc')")
    _silence_highs_banner()

    class WarmHighs(pulp.HiGHS):  # type: ignore[misc, valid-type]
        """pulp's in-process HiGHS, plus a MIP start from the variables' initial values."""

        def __init__(self, start: dict[pulp.LpVariable, float] | None, deadline: float | None = None,
                     **kw: object) -> None:
            super().__init__(**kw)
            self.start, self.deadline = start, deadline

        def callSolver(self, lp: pulp.LpProblem) -> None:  # noqa: N802 (pulp's name)
            model = lp.solverModel
            if self.start:
                import numpy as np

                idx = np.array([v.index for v in self.start], dtype=np.int32)
                val = np.array(list(self.start.values()), dtype=np.float64)
                model.setSolution(len(idx), idx, val)
            if self.deadline is not None:
                _interrupt_at(model, self.deadline)
            model.run()

        def findSolutionValues(self, lp: pulp.LpProblem) -> tuple[int, int]:  # noqa: N802 (pulp's name)
            """pulp's mapping misses some HiGHS statuses (node or solution limits): read the values
            directly; `run_solver` reads status and bound from the model itself."""
            try:
                return super().findSolutionValues(lp)
            except KeyError:
                values = list(lp.solverModel.getSolution().col_value)
                for var in lp.variables():
                    var.varValue = values[var.index] if var.index < len(values) else None
                found = lp.solverModel.getInfo().primal_solution_status == 2
                return pulp.LpStatusNotSolved, (pulp.LpSolutionIntegerFeasible if found
                                                else pulp.LpSolutionNoSolutionFound)

    return WarmHighs


def _interrupt_at(model: object, deadline: float) -> None:
    """Stop HiGHS at `deadline` (perf_counter) by its interrupt callbacks: it checks its time
    limit between nodes only, and one node has run three times past it (without callbacks, only
    the time limit stops it)."""
    import highspy

    cb = getattr(highspy, "cb", None)
    if cb is None or not hasattr(model, "setCallback"):
        return

    def interrupt(kind: int, message: str, data_out: object, data_in: object, user: object) -> None:
        if time.perf_counter() > deadline:
            data_in.user_interrupt = True

    model.setCallback(interrupt, None)
    for kind in (cb.HighsCallbackType.kCallbackMipInterrupt, cb.HighsCallbackType.kCallbackSimplexInterrupt):
        model.startCallback(kind)


def run_solver(prob: pulp.LpProblem, solver: str, time_limit_s: float, gap: float,
               start: dict[pulp.LpVariable, float] | None, max_nodes: int = knobs.SOLVER_MAX_NODES,
               highs_options: dict[str, float | int] | None = None) -> SolveResult:
    """Solve `prob` within `time_limit_s` (wall clock): solver trouble is in the status; only an
    unknown or missing solver raises."""
    limit = max(time_limit_s, 0.01)
    if solver == "highs":
        cls = _highs_class()
        s = cls(start, time.perf_counter() + limit, msg=False, timeLimit=limit, gapRel=gap, threads=1,
                mip_feasibility_tolerance=1e-7, mip_max_nodes=max_nodes, **(highs_options or {}))
        try:
            prob.solve(s)
        except pulp.PulpSolverError as e:
            return SolveResult(None, None, f"error: {e}")
        model = prob.solverModel
        info = model.getInfo()
        status = model.modelStatusToString(model.getModelStatus()).lower()
        if status == "interrupted by user":  # only `_interrupt_at` interrupts: the deadline
            status = "time limit reached"
        has_sol = info.primal_solution_status == 2  # kSolutionStatusFeasible
        bound = info.mip_dual_bound if status != "infeasible" else None
        values = {v: float(v.varValue) for v in prob.variables()} if has_sol else None
        return SolveResult(values, bound if bound is not None and bound > -1e30 else None, status)
    if solver != "cbc":  # `options.SOLVERS` names the two (the options sit above this back end)
        raise ValueError(f"unknown MILP solver {solver!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # PuLP 3.3 prefers COIN_CMD + pulp[cbc]
        cbc = pulp.PULP_CBC_CMD()
    if not cbc.available():
        raise SolverUnavailableError("CBC is not available: it ships with PuLP; reinstall pulp")
    if start:
        for v, value in start.items():
            v.setInitialValue(value)
    fd, log = tempfile.mkstemp(suffix=".log", prefix="dcp_cbc_")
    os.close(fd)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            s = pulp.PULP_CBC_CMD(msg=False, timeLimit=limit, gapRel=gap, threads=1, warmStart=bool(start),
                                  logPath=log, maxNodes=max_nodes)
        try:
            prob.solve(s)
        except pulp.PulpSolverError as e:
            return SolveResult(None, None, f"error: {e}")
        with open(log) as f:
            text = f.read()
    finally:
        os.unlink(log)
    has_sol = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    values = {v: float(v.varValue) for v in prob.variables()} if has_sol and all(
        v.varValue is not None for v in prob.variables()) else None
    return SolveResult(values, _cbc_bound(text, values is not None, prob, gap), _cbc_status(text))


def _cbc_status(text: str) -> str:
    m = re.search(r"Result - (.*)", text)
    return m.group(1).strip().lower() if m else "unknown"


def _cbc_bound(text: str, solved: bool, prob: pulp.LpProblem, gap: float) -> float | None:
    """CBC's 'Lower bound:' if it stopped early; at optimality, the objective times (1 - gap)."""
    m = re.search(r"Lower bound:\s*([-+0-9.eE]+)", text)
    if m:
        return float(m.group(1))
    if solved and "Optimal solution found" in text:
        obj = pulp.value(prob.objective)
        return float(obj) * (1 - gap) if obj is not None else None
    return None
