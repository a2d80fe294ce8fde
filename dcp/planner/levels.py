"""Level search, the one loop behind every "try a level, raise it or narrow it" in the planner, on a
monotone test (does a plan fit busy time theta? does FFD pack at capacity c?). `climb` tries rising
levels until one holds; `narrow` halves a bracket [lo, hi] (lo fails, hi holds). One stopping rule,
checked before each try: the bracket within `rtol` or `atol`, the steps spent, `stop()` (a deadline,
a closed gap), or an undecided test (None).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator


def geometric(start: float, factor: float) -> Iterator[float]:
    """start, start * factor, start * factor ** 2, ... (each the last times `factor`)."""
    while True:
        yield start
        start *= factor


def climb(holds: Callable[[float], bool], levels: Iterable[float],
          stop: Callable[[], bool] | None = None) -> tuple[float | None, float | None]:
    """The last level of `levels` at which `holds` failed and the first at which it held, in
    order (None for either where none: it held at the first, or at none before the levels ran out
    or `stop()`). Cap an endless `levels` with `itertools.islice` unless some level surely holds."""
    failed = None
    for level in levels:
        if stop is not None and stop():
            break
        if holds(level):
            return failed, level
        failed = level
    return failed, None


def narrow(test: Callable[[float], bool | None] | Callable[[float], float], lo: float, hi: float, *,
           steps: int | None = None, rtol: float = 0.0, atol: float | None = None, stop: Callable[[], bool] | None = None,
           first: float | None = None, values: tuple[float, float] | None = None) -> tuple[float, float]:
    """[lo, hi] narrowed, lo where the test fails and hi where it holds, in at most `steps` tries
    (None: no limit), until hi - lo <= `rtol` * hi or `atol`, or `stop()`; each try halves the
    bracket, the first at `first` instead where that lies inside. A test that returns None
    (undecided: its time ran out) stops the search, the bracket as it was.

    With `values` (its values at lo and hi) the test is an excess, a decreasing function that
    holds where not positive, and each try is regula falsi (Illinois), kept 1% inside the
    bracket: the bounds' work functions are smooth and each evaluation a pass over every sample."""
    f_lo, f_hi = values if values is not None else (0.0, 0.0)
    side = 0
    for _ in range(steps) if steps is not None else itertools.count():
        if hi - lo <= rtol * hi or (atol is not None and hi - lo <= atol) or (stop is not None and stop()):
            break
        if values is None:
            mid = first if first is not None and lo < first < hi else (lo + hi) / 2
            first = None
            held = test(mid)
            if held is None:
                break
            lo, hi = (lo, mid) if held else (mid, hi)
            continue
        mid = (lo * f_hi - hi * f_lo) / (f_hi - f_lo)
        mid = (lo + hi) / 2 if not math.isfinite(mid) else mid
        mid = min(max(mid, lo + 0.01 * (hi - lo)), hi - 0.01 * (hi - lo))
        f_mid = test(mid)
        if f_mid > 0:
            lo, f_lo = mid, f_mid
            f_hi, side = (f_hi / 2 if side == 1 else f_hi), 1
        else:
            hi, f_hi = mid, f_mid
            f_lo, side = (f_lo / 2 if side == -1 else f_lo), -1
    return lo, hi
