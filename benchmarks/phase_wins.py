"""How often and by how much multi-phase plans win, for benchmarks/planner.py.

Each batch is planned twice with the same options: as usual (up to `max_phases` phases; the
phase search keeps part of the time limit) and with `max_phases=1` (the single-layout ILP with the
whole limit). A win is a plan of 2+ phases faster than that single layout; a loss is a plan slower
than it (the time the phase search kept back, or time-limit noise on a loaded machine).
"""

from __future__ import annotations

import copy
import dataclasses
import re
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from dcp.planner.bounds import single_layout_bound

_RTOL = 1e-9
_SINGLE_NOTE = re.compile(r"bound ([0-9.]+) s for single-layout plans only")


def phase_columns(plan: Any, batch: Sequence[Any], cm: Any, options: Any, solve: Callable) -> dict[str, Any]:
    """The row's multi-phase columns: the plan's phase count, the single-layout plan's step time
    (planned with `options` and `max_phases=1`), its own bound (valid for single-layout plans
    only) and gap to it, the ratio of the two plans' steps, and the search's note."""
    # A copy of the cost model: the planned solve memoized this batch's bound on `cm`, which
    # would give the second solve a head start of a few tens of ms (noise at small limits).
    single = solve(batch, copy.deepcopy(cm), dataclasses.replace(options, max_phases=1))[0]
    bound = min(single_bound_s(single, batch, cm), single.step_time_s)
    return {"num_phases": plan.num_phases, "single_layout_step_s": single.step_time_s,
            "single_layout_bound_s": bound, "single_layout_gap": 1 - bound / single.step_time_s,
            "phase_speedup": single.step_time_s / plan.step_time_s,
            "phase_note": next((n for n in plan.notes if n.startswith("phases")), "")}


def single_bound_s(single: Any, batch: Sequence[Any], cm: Any) -> float:
    """A single-layout plan's own bound: `bounds.single_layout_bound`, or the solver's proven one
    where its note names a higher one (3 decimals, taken rounded down); `plan.lower_bound_s` is
    the bound of every plan, multi-phase included."""
    found = [float(m.group(1)) - 5e-4 for n in single.notes if (m := _SINGLE_NOTE.match(n))]
    return max([single.lower_bound_s, single_layout_bound(batch, cm), *found])


def phase_summary(cases: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per workload, over every batch of its cells: batches, wins (2+ phases, faster than the
    single layout), losses (slower than it), the mean and largest speedup of the wins (single
    layout's step / the plan's), the worst ratio of the losses."""
    out: dict[str, dict[str, Any]] = {}
    for case in cases:
        rows = [r for r in case["steps"] if "phase_speedup" in r]
        acc = out.setdefault(case["summary"]["workload"], {"batches": 0, "won": [], "lost": []})
        acc["batches"] += len(rows)
        acc["won"] += [r["phase_speedup"] for r in rows if r["num_phases"] > 1 and r["phase_speedup"] > 1 + _RTOL]
        acc["lost"] += [r["phase_speedup"] for r in rows if r["phase_speedup"] < 1 - _RTOL]
    return {w: {"batches": a["batches"], "won": len(a["won"]), "lost": len(a["lost"]),
                "won_speedup_mean": statistics.mean(a["won"]) if a["won"] else None,
                "won_speedup_max": max(a["won"], default=None),
                "lost_ratio_worst": min(a["lost"], default=None)} for w, a in out.items()}


def phase_lines(summary: dict[str, dict[str, Any]]) -> list[str]:
    """The summary in words, a line per workload."""
    lines = ["multi-phase plans against the single-layout ILP (same time limit):"]
    for w, s in summary.items():
        won = (f", {100 * (s['won_speedup_mean'] - 1):.1f}% faster on average, at most "
               f"{100 * (s['won_speedup_max'] - 1):.1f}%" if s["won"] else "")
        lost = f"; slower on {s['lost']} (worst {100 * (1 / s['lost_ratio_worst'] - 1):.1f}%)" if s["lost"] else "; never slower"
        lines.append(f"  {w}: won {s['won']} of {s['batches']} batches{won}{lost}")
    return lines
