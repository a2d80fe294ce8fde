"""How one solve divides its time limit among the stages of `phases.solve_phased`, each window timed
from the start of `solve`: floor & setup (checks, bounds, cost table, the warm start's baselines:
never cut), the single layout (the ILP), the nested column plans and the phase search (until the
search deadline), and the report (the margin after it). `TimeBudget.divide` computes them from the
shares in `knobs`; `--explain-budget` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass

import dcp.planner.knobs as knobs


@dataclass(frozen=True)
class Stage:
    """One stage's window, in seconds from the start of the solve."""

    name: str
    start_s: float
    end_s: float

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class TimeBudget:
    """The windows of one solve's stages; they tile [0, limit_s] in order."""

    limit_s: float
    stages: tuple[Stage, ...]
    search_deadline_s: float
    """When the nested columns and phase search stop (from the start): the report's margin after."""

    @classmethod
    def divide(cls, limit_s: float, final_pricing_s: float, *, search: bool = False, reaching: bool = False,
               nested_columns: bool = False) -> TimeBudget:
        """The windows for a solve of `limit_s` whose plan takes about `final_pricing_s` to
        assemble, with a phase search (`search`; `reaching`, a split's bound meets the batch's:
        `knobs.REACHING_SHARE`, not `knobs.PHASE_SHARE`) and nested column plans or not; a search
        under `knobs.MIN_SEARCH_S` gets no window (it would only cut the single layout)."""
        margin_s = min(knobs.REPORT_MARGIN_PRICINGS * final_pricing_s, limit_s / 4)
        search_s = (knobs.REACHING_SHARE if reaching else knobs.PHASE_SHARE) * limit_s if search else 0.0
        search_s = search_s if search_s >= knobs.MIN_SEARCH_S else 0.0
        kept_s = search_s + margin_s if search_s else min(final_pricing_s, knobs.REPORT_S, limit_s / 4)
        single_s = limit_s - kept_s
        if nested_columns:
            single_s = min(single_s, (1 - knobs.NESTED_COLUMNS_SHARE) * limit_s)
        deadline_s = limit_s - margin_s
        middle = {(True, True): "nested columns, then the phase search", (True, False): "nested columns",
                  (False, True): "phase search"}.get((nested_columns, search_s > 0))
        stages = [Stage("floor & setup (not cut)", 0.0, 0.0), Stage("single layout", 0.0, single_s)]
        if middle is not None:
            stages.append(Stage(middle, single_s, deadline_s))
        stages.append(Stage("report", stages[-1].end_s, limit_s))
        return cls(limit_s, tuple(stages), deadline_s)

    @classmethod
    def nested_columns_fit(cls, limit_s: float) -> bool:
        """Whether a limit leaves the nested column plans enough time (`knobs.NESTED_COLUMNS_MIN_S`)."""
        return knobs.NESTED_COLUMNS_SHARE * limit_s >= knobs.NESTED_COLUMNS_MIN_S

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    @property
    def single_s(self) -> float:
        """The single layout's limit, counted from the start of the solve."""
        return self.stage("single layout").end_s

    def explain(self) -> str:
        """The windows as a table: stage, from, to, seconds, share of the limit."""
        rows = [f"  {s.name:<40}{s.start_s:>8.3f}{s.end_s:>8.3f}{s.seconds:>8.3f}{s.seconds / self.limit_s:>8.1%}"
                for s in self.stages]
        return "\n".join([f"  {'stage':<40}{'from s':>8}{'to s':>8}{'s':>8}{'share':>8}", *rows])


def explain_budget(limit_s: float, samples: int) -> str:
    """How a limit of `limit_s` is divided for `samples` samples, in every case the search can
    meet (whether a phase search or nested column plans run depends on the batch)."""
    from dcp.planner.ilp.budget import final_pricing_s

    pricing_s = final_pricing_s(samples)
    cases = [("no phase search", {}), ("a sample needs a large group", {"search": True}),
             ("a split's bound meets the batch's", {"search": True, "reaching": True})]
    if TimeBudget.nested_columns_fit(limit_s):
        cases.append(("few shapes, few samples a GPU", {"nested_columns": True}))
    parts = [f"time limit {limit_s:g} s, {samples:,} samples (final assembly about {pricing_s:.3f} s):"]
    for title, flags in cases:
        parts += [f"{title}:", TimeBudget.divide(limit_s, pricing_s, **flags).explain()]
    return "\n".join(parts)
