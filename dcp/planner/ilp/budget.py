"""The ILP planner's clock: one deadline for the whole solve, shared out by phase.

`IlpOptions.time_limit_s` covers everything, warm start and baselines included, except the final
pricing and validation of the chosen plan, which is kept back as a reserve measured in samples
(`final_pricing_s`). Each phase asks for its share of what is left (`until`), every loop checks
the clock between steps, and every solver call gets the remaining time as its own limit, so the
limit holds by construction, not by a quiet machine. What a phase had to skip or cut short is
recorded and ends up in the plan's status and notes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

FINAL_PRICING_S = 0.005
"""Fixed part of the reserve for the final assembly."""
PER_SAMPLE_S = 1.5e-6
PER_MICROBATCH_S = 2.5e-6
PER_GROUP_S = 5e-5
"""Assembling and validating a plan, measured in CPU time on the benchmark machine (32,768
samples in 21,307 micro-batches on 32 GPUs: 71 ms; in 19,568 on 1,024 GPUs: 123 ms)..."""
PASS_S_PER_SAMPLE = 5e-8
"""...on which one plain Python pass over a batch's samples (`Budget.sample_pass_s`) takes
about this long per sample: the reserve scales with how much slower the pass ran here and now
(other work on the machine's cores slows both alike), and never below `MIN_SLOWDOWN`."""
MIN_SLOWDOWN = 1.5
MAX_SLOWDOWN = 6.0


def final_pricing_s(samples: int, microbatches: int = 0, groups: int = 0, slowdown: float = 2.0) -> float:
    """Seconds kept back for assembling and validating the chosen plan."""
    return FINAL_PRICING_S + slowdown * (PER_SAMPLE_S * samples + PER_MICROBATCH_S * microbatches
                                         + PER_GROUP_S * groups)


@dataclass
class Budget:
    """Deadline bookkeeping for one solve."""

    started: float
    limit_s: float
    reserve_s: float
    spent_s: dict[str, float] = field(default_factory=dict)
    """Seconds per phase, in the order they ran."""
    cut: list[str] = field(default_factory=list)
    """What the limit skipped or cut short, in words."""
    sample_pass_s: float = 0.0
    """How long one plain Python pass over the batch's samples took: what the costs of whole
    strategies are guessed from before they run (`warm`)."""
    pricing_s: float = 0.0
    """The longest a candidate's exact pricing took: kept back from every search step that
    ends in one (`search_deadline`)."""

    @classmethod
    def start(cls, limit_s: float, samples: int, started: float | None = None) -> Budget:
        """The budget of a solve that began at `started` (perf_counter; default now)."""
        began = time.perf_counter() if started is None else started
        return cls(began, limit_s, min(final_pricing_s(samples), limit_s / 2))

    @property
    def deadline(self) -> float:
        """When searching must stop so that the final assembly ends within the limit."""
        return self.started + self.limit_s - self.reserve_s

    @property
    def search_deadline(self) -> float:
        """When a search step must stop so that pricing its result ends by `deadline`."""
        return self.deadline - self.pricing_s

    def slowdown(self, samples: int) -> float:
        """How much slower than the benchmark machine's quiet cores this one runs now."""
        if samples < 1000 or self.sample_pass_s <= 0:
            return 2.0  # too short a pass to time
        measured = self.sample_pass_s / (PASS_S_PER_SAMPLE * samples)
        return min(max(measured, MIN_SLOWDOWN), MAX_SLOWDOWN)

    def plan_size(self, samples: int, microbatches: int, groups: int) -> None:
        """The incumbent changed: keep back what assembling it will take."""
        self.reserve_s = min(final_pricing_s(samples, microbatches, groups, self.slowdown(samples)), self.limit_s / 2)

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def until(self, share: float) -> float:
        """A deadline `share` of the way from now to the search deadline."""
        now = time.perf_counter()
        return now + max(0.0, share * (self.search_deadline - now))

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def record(self, phase: str, since: float) -> None:
        self.spent_s[phase] = self.spent_s.get(phase, 0.0) + time.perf_counter() - since

    def skip(self, what: str) -> None:
        if what not in self.cut:
            self.cut.append(what)
