"""Readings in units of the reference kernel timed beside them (`Anchor`).

A CPU's speed wanders: on the 2-core development VM, with nothing else running, the reference
kernel (`dcp.profiler.reference.ReferenceKernel`) read 13.3% faster ten minutes after one profile,
and 3-27% apart between the passes of one. Read against the kernel timed just before and just
after it, a point stretched by a slow spell is divided by a kernel stretched alike, and the
profile's points hold still against each other and against another profile's.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any, Protocol, TypeVar


class Kernel(Protocol):
    def seconds(self) -> float: ...


def timed_fields(reading: Any) -> list[str]:
    """A reading's timed fields (a point's or an executor row's): those named *_s, and a model
    point's `seconds`."""
    names = reading if isinstance(reading, dict) else [f.name for f in fields(reading)]
    return [f for f in names if f.endswith("_s") or f == "seconds"]


def scaled(readings: Any, factor: float) -> Any:
    """A reading (a point, an executor row), a list of them, or a record of such lists (the
    profiler's `Measured`) with every timed field (`timed_fields`) times `factor`; None stays None."""
    if readings is None or isinstance(readings, str):
        return readings
    if isinstance(readings, list):
        return [scaled(r, factor) for r in readings]
    if isinstance(readings, dict):
        return {**readings, **{f: readings[f] * factor for f in timed_fields(readings)}}
    lists = {f.name: scaled(getattr(readings, f.name), factor) for f in fields(readings)
             if isinstance(getattr(readings, f.name), list)}
    return replace(readings, **lists, **{f: getattr(readings, f) * factor for f in timed_fields(readings)})


T = TypeVar("T")


class Anchor:
    """Readings in units of the reference kernel timed beside each of them.

    `anchor(measure)` times the kernel after `measure()` (and before it, unless a reading just
    came before: `gap()` says untimed work ran since) and divides every timed field of what
    `measure()` returned by the mean of the two readings (`bracket` returns both instead). `settle()` fixes the speed the readings
    stand for, the median reading so far, and `seconds(units)` turns readings back into seconds at
    that speed. Without a kernel (`UNANCHORED`: a GPU, whose clocks hold) readings pass through
    as seconds."""

    def __init__(self, kernel: Kernel | None, speed_s: float | None = None) -> None:
        """`speed_s`: already settled, at another measurement's speed (a profile's, to validate it)."""
        self.kernel = kernel
        self.readings: list[float] = []
        self.speed_s = speed_s
        self._last: float | None = None

    def _read(self) -> float:
        assert self.kernel is not None
        self._last = self.kernel.seconds()
        self.readings.append(self._last)
        return self._last

    def gap(self) -> None:
        """Untimed work ran since the last reading (a model built, a warm-up): the next
        measurement times the kernel before it too."""
        self._last = None

    def bracket(self, measure: Callable[[], T]) -> tuple[T, float]:
        """What `measure()` returned, as read, and the mean of the kernel's readings before and
        after it (1.0 without a kernel): for a caller that keeps both."""
        if self.kernel is None:
            return measure(), 1.0
        before = self._last if self._last is not None else self._read()
        out = measure()
        return out, (before + self._read()) / 2

    def __call__(self, measure: Callable[[], T]) -> T:
        out, kernel_s = self.bracket(measure)
        return out if self.kernel is None else scaled(out, 1.0 / kernel_s)

    def settle(self) -> None:
        """The profile's speed: the median reading so far (later readings do not move it)."""
        if self.kernel is not None and self.speed_s is None:
            self.speed_s = statistics.median(self.readings)

    def seconds(self, units: T) -> T:
        if self.kernel is None:
            return units
        assert self.speed_s is not None, "settle() before converting readings to seconds"
        return scaled(units, self.speed_s)


UNANCHORED = Anchor(None)
