"""Every tuning knob of the planner, grouped by the stage that reads it, each with what it trades.

The code reads them as `knobs.NAME` when it runs, so a test (or a what-if study) sets one here,
`monkeypatch.setattr(knobs, "NAME", value)`, and every stage sees it. The runs that chose each
value are in docs/tuning-log.md, one entry per knob with the command that measured it.
"""

from __future__ import annotations

# -- dividing the time limit among the stages (`dcp.planner.timebudget`) ---------------------
PHASE_SHARE = 0.1
"""Limit kept back for the phase search when some sample needs a large group: more finds splits, less leaves the single layout more."""
REACHING_SHARE = 0.5
"""Kept back instead when a split's bound meets the batch's: those batches are where phases win, so they get half."""
MIN_SEARCH_S = 0.2
"""No time is kept back for the search below this: a shorter search plans splits badly and only cuts the single layout."""
REPORT_MARGIN_PRICINGS = 3
"""Final pricings (`budget.final_pricing_s`) kept back after a phase search, for chaining a split's phases and reporting."""
REPORT_S = 0.02
"""Kept back at most for the report when no split is searched: more is safer against overrun, less is program time."""
NESTED_COLUMNS_SHARE = 0.7
"""Share of the limit the nested column plans may take after the single layout: theirs against the single layout's time."""
NESTED_COLUMNS_MIN_S = 0.7
"""Nested column plans run only when their share is at least this long: shorter finds no level in time."""
