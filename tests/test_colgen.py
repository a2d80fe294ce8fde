"""The column-generation engine (`dcp.planner.colgen`) on a cutting-stock program, whose full linear
program (every pattern enumerated, solved by scipy's `linprog`: a second implementation) gives
the optimum the generation must reach; its stopping rule; the integer program and `fill`."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.optimize import linprog

from dcp.planner.colgen import Master, fill, generate, integer_copies, knapsack, solve_integer
from dcp.planner.ilp.budget import Deadline

WIDTH = 100
WIDTHS = np.array([45.0, 36.0, 31.0, 14.0])
DEMAND = np.array([97, 610, 395, 211])


def _full_optimum() -> float:
    """The program over every pattern (counts within the roll), by enumeration and linprog."""
    ranges = [range(WIDTH // int(w) + 1) for w in WIDTHS]
    patterns = [k for k in itertools.product(*ranges) if 0 < np.dot(k, WIDTHS) <= WIDTH]
    cover = np.array(patterns, dtype=np.float64).T
    res = linprog(np.ones(cover.shape[1]), A_ub=-cover, b_ub=-DEMAND, bounds=(0, None), method="highs")
    assert res.status == 0
    return float(res.fun)


def _program() -> tuple[Master, object]:
    """The master over one-width patterns (as many of the width as a roll holds) and the knapsack
    pricing (whole units of width: exact)."""
    master = Master(DEMAND, [1])
    for t, w in enumerate(WIDTHS):
        a = np.zeros(len(WIDTHS), dtype=np.int64)
        a[t] = WIDTH // int(w)
        master.add(0, a)

    def price(y: np.ndarray) -> list:
        values, taken = knapsack(y, WIDTHS, WIDTH, DEMAND, np.ones(len(WIDTHS), dtype=bool), False, WIDTH)
        return [(float(values[WIDTH]), 1, (0, taken(WIDTH)))]

    return master, price


def test_generation_reaches_the_full_programs_optimum_and_decides_the_rolls() -> None:
    """With rolls to spare it goes on until no column improves: the program's value is the full
    program's optimum. Below that optimum it answers False (no plan), above it True, and a bound
    (`stop_when_fits`) stops at the first solve that fits, adding nothing."""
    optimum = _full_optimum()
    master, price = _program()
    assert generate(master, price, master.add, 10_000, Deadline(math.inf), 100) is True
    assert master.last[0] == pytest.approx(optimum, rel=1e-9)
    assert len(master.cols) > len(WIDTHS)
    below, price = _program()
    assert generate(below, price, below.add, math.floor(optimum) - 1, Deadline(math.inf), 100) is False
    above, price = _program()
    assert generate(above, price, above.add, math.ceil(optimum), Deadline(math.inf), 100) is True
    bound, price = _program()
    assert generate(bound, price, bound.add, 10_000, Deadline(math.inf), 100, stop_when_fits=True) is True
    assert len(bound.cols) == len(WIDTHS)


def test_out_of_rounds_or_time_it_is_undecided() -> None:
    """One round leaves the one-width program (515 rolls, more than the 460 asked) undecided;
    a passed deadline answers None before any solve; a tail of 2 rounds and 1.0 of 10,000 rolls
    (every decrease counts as flat) stops at the third solve, after two rounds priced."""
    singles = float(np.sum(DEMAND / (WIDTH // WIDTHS)))
    assert singles > 460
    master, price = _program()
    assert generate(master, price, master.add, 460, Deadline(math.inf), 1) is None
    master, price = _program()
    assert generate(master, price, master.add, 460, Deadline(-math.inf), 100) is None and master.last is None
    master, price = _program()
    assert generate(master, price, master.add, 10_000, Deadline(math.inf), 100, tail=(2, 1.0)) is True
    assert len(master.cols) == len(WIDTHS) + 2  # two rounds priced, the third solve saw the tail


def test_integer_copies_and_fill_place_every_piece_once() -> None:
    """Whole copies of the generated columns cover the demand within the rolls asked for (the
    optimum rounded up plus a few: the columns' integer program), and `fill` draws each piece
    once, each group at most its column's counts."""
    optimum = _full_optimum()
    master, price = _program()
    generate(master, price, master.add, 10_000, Deadline(math.inf), 100)
    rolls = math.ceil(optimum) + 5
    z = integer_copies(master.cols, DEMAND, master.sizes, rolls, Deadline(math.inf), 1.0, 10_000)
    assert z is not None and int(z.sum()) <= rolls
    cover = np.stack([a for _, a in master.cols]).T @ z
    assert (cover >= DEMAND).all()
    start = np.concatenate([[0], np.cumsum(DEMAND)])
    members = [np.arange(start[t], start[t + 1]) for t in range(len(DEMAND))]
    shape = np.repeat(np.arange(len(DEMAND)), DEMAND)

    def group(take, column):  # noqa: ANN001, ANN202
        ids = take(column[1])
        return (column[1], ids) if ids else None

    groups, left = fill(members, master.cols, z.tolist(), group)
    assert not any(left)
    assert sorted(i for _, ids in groups for i in ids) == list(range(int(DEMAND.sum())))
    assert all((np.bincount(shape[ids], minlength=len(DEMAND)) <= a).all() for a, ids in groups)


def test_a_program_of_known_columns_solves_whole_to_the_enumerated_optimum() -> None:
    """The master as `ilp.patterns` poses it: a row bounded on both sides (x1 + x2 + x3 = 5), one
    bounded above only (2 x1 + x3 <= 6), columns of their own cost (1, 3, 2) and bound (x1 <= 2,
    x2 <= 10, x3 <= 1.5), x1 and x2 integer. `solve_integer` reaches the optimum found by
    enumerating x1 and x2 (x3 follows from the equality); infeasible when the equality asks 20."""
    def program(total: float) -> Master:
        master = Master(np.array([total, -np.inf]), [1], np.array([total, 6.0]))
        for j, (column, cost, most) in enumerate([((1, 2), 1.0, 2), ((1, 0), 3.0, 10), ((1, 1), 2.0, 1.5)]):
            assert master.add(j, np.array(column, dtype=np.float64), cost, most)
        return master

    best = min((x1 + 3 * x2 + 2 * (5 - x1 - x2), (x1, x2, 5 - x1 - x2))
               for x1 in range(3) for x2 in range(11) if 0 <= 5 - x1 - x2 <= 1.5 and 2 * x1 + (5 - x1 - x2) <= 6)
    values, status = solve_integer(program(5.0), np.array([0, 1]), 10.0, 1000)
    assert status == "optimal" and values is not None
    assert values == pytest.approx(best[1], abs=1e-6)
    assert float(values @ program(5.0).costs()) == pytest.approx(best[0])
    values, status = solve_integer(program(20.0), np.array([0, 1]), 10.0, 1000)
    assert values is None and status == "infeasible"
