"""Run a PuLP program on HiGHS (highspy, in-process, default) or CBC (bundled with PuLP), with a
warm start, a time limit and a relative gap, and report the solver's proven dual bound."""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass

import pulp

SOLVERS = ("highs", "cbc")


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


def _highs_class() -> type:
    if not pulp.HiGHS().available():
        raise SolverUnavailableError("HiGHS is not available: `pip install highspy` (or use solver='cbc')")

    class WarmHighs(pulp.HiGHS):  # type: ignore[misc, valid-type]
        """pulp's in-process HiGHS, plus a MIP start from the variables' initial values."""

        def __init__(self, start: dict[pulp.LpVariable, float] | None, **kw: object) -> None:
            super().__init__(**kw)
            self.start = start

        def callSolver(self, lp: pulp.LpProblem) -> None:  # noqa: N802 (pulp's name)
            if self.start:
                import numpy as np

                idx = np.array([v.index for v in self.start], dtype=np.int32)
                val = np.array(list(self.start.values()), dtype=np.float64)
                lp.solverModel.setSolution(len(idx), idx, val)
            lp.solverModel.run()

    return WarmHighs


def run_solver(prob: pulp.LpProblem, solver: str, time_limit_s: float, gap: float,
               start: dict[pulp.LpVariable, float] | None) -> SolveResult:
    """Solve `prob` within `time_limit_s` (wall clock); never raises on solver trouble (the
    status says what happened), only on an unknown or missing solver."""
    if solver not in SOLVERS:
        raise ValueError(f"unknown MILP solver {solver!r}; expected one of {SOLVERS}")
    limit = max(time_limit_s, 0.01)
    if solver == "highs":
        cls = _highs_class()
        s = cls(start, msg=False, timeLimit=limit, gapRel=gap, threads=1, mip_feasibility_tolerance=1e-7)
        try:
            prob.solve(s)
        except pulp.PulpSolverError as e:
            return SolveResult(None, None, f"error: {e}")
        model = prob.solverModel
        info = model.getInfo()
        status = model.modelStatusToString(model.getModelStatus()).lower()
        has_sol = info.primal_solution_status == 2  # kSolutionStatusFeasible
        bound = info.mip_dual_bound if status != "infeasible" else None
        values = {v: float(v.varValue) for v in prob.variables()} if has_sol else None
        return SolveResult(values, bound if bound is not None and bound > -1e30 else None, status)
    cbc = pulp.PULP_CBC_CMD()
    if not cbc.available():
        raise SolverUnavailableError("CBC is not available: it ships with PuLP; reinstall pulp")
    if start:
        for v, value in start.items():
            v.setInitialValue(value)
    fd, log = tempfile.mkstemp(suffix=".log", prefix="dcp_cbc_")
    os.close(fd)
    try:
        s = pulp.PULP_CBC_CMD(msg=False, timeLimit=limit, gapRel=gap, threads=1, warmStart=bool(start),
                              logPath=log)
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
    """CBC prints 'Lower bound:' when it stops early; at proven optimality (within gapRel) the
    bound is the objective times (1 - gapRel)."""
    m = re.search(r"Lower bound:\s*([-+0-9.eE]+)", text)
    if m:
        return float(m.group(1))
    if solved and "Optimal solution found" in text:
        obj = pulp.value(prob.objective)
        return float(obj) * (1 - gap) if obj is not None else None
    return None
