"""The ILP planner's clock: one deadline for the whole solve, shared out by phase. The limit covers
all but the final pricing and validation, a reserve in samples (`final_pricing_s`); each phase takes
its share of what is left (`until`), loops check the clock and solver calls get the time left as
their limit, so the limit holds by construction. A step that stops at its `Deadline` is recorded, so
a plan that depends on the machine's load says so.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import dcp.planner.knobs as knobs


def final_pricing_s(samples: int, microbatches: int = 0, groups: int = 0, slowdown: float = 2.0) -> float:
    """Seconds kept back for assembling and validating the chosen plan, at `slowdown`."""
    return knobs.FINAL_PRICING_S + slowdown * (knobs.PER_SAMPLE_S * samples + knobs.PER_MICROBATCH_S * microbatches
                                         + knobs.PER_GROUP_S * groups)


@contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic garbage collection inside (reference counting still frees what the solve drops;
    the previous state is restored after): in a process with a large heap a full collection in
    the final assembly overran the limit (docs/tuning-log.md)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def machine_probe_s() -> float:
    """The faster of two runs of a `knobs.PROBE_STEPS`-step loop, with garbage collection paused."""
    with paused_gc():
        runs = []
        for _ in range(2):
            t0 = time.perf_counter()
            acc = 0
            for i in range(knobs.PROBE_STEPS):
                acc += i & 7
            runs.append(time.perf_counter() - t0)
        return min(runs)


@dataclass
class Budget:
    """Deadline bookkeeping for one solve."""

    started: float
    limit_s: float
    reserve_s: float
    spent_s: dict[str, float] = field(default_factory=dict)
    """Seconds per phase, in the order they ran."""
    cut: list[str] = field(default_factory=list)
    """What the limit skipped, in words."""
    stopped: list[str] = field(default_factory=list)
    """What the limit stopped before it finished, in words."""
    probe_s: float = 0.0
    """`machine_probe_s` at the start: how much slower than the benchmark machine this one runs."""
    pricing_s: float = 0.0
    """The longest exact pricing of a candidate, kept back from each search step ending in one."""
    cpu_started: float = field(default_factory=time.process_time)
    wall_started: float = field(default_factory=time.perf_counter)
    """The process's CPU time, and the wall clock, when the budget began (`slowdown`)."""
    plan_dims: tuple[int, int, int] | None = None
    """The incumbent's samples, micro-batches and groups: the reserve follows the slowdown."""

    @classmethod
    def start(cls, limit_s: float, samples: int, started: float | None = None) -> Budget:
        """The budget of a solve that began at `started` (perf_counter; default now)."""
        began = time.perf_counter() if started is None else started
        return cls(began, limit_s, min(final_pricing_s(samples), limit_s / 2))

    @property
    def deadline(self) -> float:
        """When searching must stop so that the final assembly ends within the limit."""
        if self.plan_dims is not None:
            self.reserve_s = self._reserve(*self.plan_dims)
        return self.started + self.limit_s - self.reserve_s

    def _reserve(self, samples: int, microbatches: int, groups: int) -> float:
        """What assembling the incumbent will take: `final_pricing_s` at the slowdown, at least
        `knobs.FINISH_PRICINGS` longest candidate pricings so far, at most half the limit."""
        return min(max(final_pricing_s(samples, microbatches, groups, self.slowdown()),
                       knobs.FINISH_PRICINGS * self.pricing_s), self.limit_s / 2)

    @property
    def search_deadline(self) -> float:
        """When a search step must stop so that pricing its result ends by `deadline`: the
        longest pricing so far times `knobs.PRICING_MARGIN` before it."""
        return self.deadline - knobs.PRICING_MARGIN * self.pricing_s

    def slowdown(self) -> float:
        """How much slower than the benchmark machine's quiet cores this one runs now."""
        cpu_s = time.process_time() - self.cpu_started
        shared = (time.perf_counter() - self.wall_started) / cpu_s if cpu_s >= knobs.MIN_CPU_S else 0.0
        if self.probe_s <= 0:  # no probe (batches under knobs.PROBE_FROM): a reserve too small to tune
            return min(max(2.0, shared), knobs.MAX_SLOWDOWN)
        measured = self.probe_s / knobs.PROBE_S
        return min(max(measured, shared, knobs.MIN_SLOWDOWN), knobs.MAX_SLOWDOWN)

    def plan_size(self, samples: int, microbatches: int, groups: int) -> None:
        """The incumbent changed: keep back what assembling it will take."""
        self.plan_dims = (samples, microbatches, groups)
        self.reserve_s = self._reserve(samples, microbatches, groups)

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
        """`what` did not run: the time limit left it no time."""
        if what not in self.cut:
            self.cut.append(what)

    def stop(self, what: str) -> None:
        """`what` ran but the time limit stopped it before it finished."""
        if what not in self.stopped:
            self.stopped.append(what)

    def deadline_for(self, what: str, at: float | None = None) -> Deadline:
        """A deadline (default: the search deadline) that records `what` when it stops it."""
        return Deadline(self.search_deadline if at is None else at, what, self)


@dataclass
class Deadline:
    """When a step must stop (time.perf_counter()), and the budget that records it if it does."""

    at: float
    what: str = ""
    budget: Budget | None = None

    @classmethod
    def of(cls, deadline: float | Deadline) -> Deadline:
        """`deadline` itself, or a plain time as a deadline that records nothing."""
        return deadline if isinstance(deadline, Deadline) else cls(deadline)

    def left(self) -> float:
        return self.at - time.perf_counter()

    def passed(self) -> bool:
        """True once the time is past `at`; then `what` is recorded as cut short."""
        if time.perf_counter() <= self.at:
            return False
        self.record()
        return True

    def record(self) -> None:
        """The step stopped here because of the time (a solver's own time limit, say)."""
        if self.budget is not None and self.what:
            self.budget.stop(self.what)
