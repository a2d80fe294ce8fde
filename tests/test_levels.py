"""The planner's one level search (`dcp.planner.levels`): climbing a monotone test to its first
level that holds, and narrowing a bracket by halves or by regula falsi."""

from __future__ import annotations

import math
from itertools import islice

from dcp.planner.levels import climb, geometric, narrow


def counted(test):
    calls: list[float] = []

    def wrapped(x: float):
        calls.append(x)
        return test(x)

    return wrapped, calls


def test_climb_brackets_the_first_level_that_holds() -> None:
    holds, tried = counted(lambda x: x >= 10)
    assert climb(holds, geometric(1.0, 2.0)) == (8.0, 16.0)
    assert tried == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert climb(lambda x: True, geometric(3.0, 2.0)) == (None, 3.0)  # holds at once: nothing failed
    assert climb(lambda x: x >= 10, islice(geometric(1.0, 2.0), 3)) == (4.0, None)  # the levels ran out


def test_climb_stops_before_a_try_when_told() -> None:
    holds, tried = counted(lambda x: x >= 10)
    assert climb(holds, geometric(1.0, 2.0), stop=lambda: len(tried) == 2) == (2.0, None)
    assert tried == [1.0, 2.0]


def test_narrow_halves_to_the_threshold_within_the_tolerance() -> None:
    t = 0.3721
    holds, tried = counted(lambda x: x >= t)
    lo, hi = narrow(holds, 0.0, 1.0, steps=100, rtol=1e-6)
    assert lo < t <= hi and hi - lo <= 1e-6 * hi
    # The width after k tries is 2**-k; it is first within 1e-6 * hi (hi just above t) at k = 22.
    assert len(tried) == 22 == math.ceil(math.log2(1 / (1e-6 * t)))


def test_narrow_stops_on_steps_and_on_stop() -> None:
    # 0.5 holds, 0.25 fails, 0.375 holds: three tries, by hand.
    assert narrow(lambda x: x >= 0.3721, 0.0, 1.0, steps=3) == (0.25, 0.375)
    holds, tried = counted(lambda x: x >= 0.3721)
    assert narrow(holds, 0.0, 1.0, steps=50, stop=lambda: len(tried) == 2) == (0.25, 0.5)
    assert tried == [0.5, 0.25]


def test_regula_falsi_brackets_the_root_in_fewer_evaluations_than_halving() -> None:
    excess, tried = counted(lambda m: 4 / m - m)  # decreasing, root 2
    lo, hi = narrow(excess, 1.0, 4.0, steps=100, rtol=1e-9, values=(3.0, -3.0))
    assert lo < 2 <= hi and hi - lo <= 1e-9 * hi
    assert all(1.0 < m < 4.0 for m in tried)
    halving = math.ceil(math.log2(3.0 / (1e-9 * 2)))  # tries halving needs for the same width: 31
    assert len(tried) < halving


def test_narrow_stops_with_the_bracket_kept_when_the_test_cannot_decide() -> None:
    # 0.5 holds, 0.25 fails, then 0.375 is undecided: the bracket stays [0.25, 0.5].
    answers = {0.5: True, 0.25: False, 0.375: None}
    holds, tried = counted(answers.__getitem__)
    assert narrow(holds, 0.0, 1.0, steps=10) == (0.25, 0.5)
    assert tried == [0.5, 0.25, 0.375]


def test_narrow_tries_a_guess_first_when_inside_and_stops_at_an_absolute_width() -> None:
    # Guess 0.75 holds, then halves: 0.375 holds, 0.1875, 0.28125 and 0.328125 fail; the width
    # 0.046875 is first within atol 0.05 (0.09375 before it).
    holds, tried = counted(lambda x: x >= 0.3721)
    assert narrow(holds, 0.0, 1.0, atol=0.05, first=0.75) == (0.328125, 0.375)
    assert tried == [0.75, 0.375, 0.1875, 0.28125, 0.328125]
    # A guess outside the bracket is ignored: the first try is the midpoint.
    holds, tried = counted(lambda x: x >= 0.3721)
    narrow(holds, 0.0, 1.0, steps=1, first=1.5)
    assert tried == [0.5]
