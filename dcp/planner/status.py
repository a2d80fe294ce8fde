"""The words a plan's `solver_status` uses to say what the ILP's time limit did, and how the
tables (`dcp plan`, `dcp compare`, `dcp show`) read them back."""

from __future__ import annotations

from dcp.planner.plan import Plan

CUT_SHORT = "time limit reached"
"""The time limit stopped the program (or skipped a phase) before it finished."""
NOT_RUN = "program not run"
"""The program did not run: the warm start met the bound, or the time limit left it no time."""


def program_outcome(plan: Plan) -> str:
    """One word or two for a table: "-" for a heuristic's plan; for the ILP's, "complete",
    "cut short" (the limit stopped or skipped part of the search), "not needed" (the warm start
    met the bound) or "not run" (the limit left the program no time)."""
    status = plan.solver_status
    if plan.strategy != "ilp" or status == "heuristic":
        return "-"
    if NOT_RUN in status:
        return "not run" if CUT_SHORT in status else "not needed"
    return "cut short" if CUT_SHORT in status else "complete"
