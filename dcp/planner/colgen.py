"""Column generation, the engine of every column program of the planner (`ilp.columns`,
`nested_columns`, `ilp.patterns`). Column c places a[t,c] samples of shape t on g_c GPUs; the
restricted master (`Master`, HiGHS with columns added in place) is

    min  sum_c g_c z_c   s.t.  sum_c a[t,c] z_c >= n_t  (every sample placed),  z >= 0

over the columns found so far. `generate` alternates solving it with the program's pricing
(`knapsack`, shared) and holds the stopping rule; `integer_copies` is the integer program over the
columns, `fill` its groups; `solve_integer` solves a master whose columns are all known.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from dcp.planner.ilp.budget import Deadline

Column = tuple[int, np.ndarray]
"""A column of the master: the index of its size in `Master.sizes` and its shape counts."""


class Master:
    """The linear program over the columns found so far (HiGHS, columns added in place)."""

    def __init__(self, counts: np.ndarray, sizes: Sequence[int], upper: np.ndarray | None = None) -> None:
        """Rows `counts` <= a z <= `upper` (None: unbounded); `add` sets costs (default: GPUs)."""
        import highspy

        from dcp.planner.ilp.solvers import _silence_highs_banner

        _silence_highs_banner()
        self.h = highspy.Highs()
        self.h.setOptionValue("output_flag", False)
        self.h.setOptionValue("threads", 1)
        self.inf = highspy.kHighsInf
        self.sizes = list(sizes)
        high = np.full(len(counts), self.inf) if upper is None else np.asarray(upper, dtype=np.float64)
        self.h.addRows(len(counts), np.asarray(counts, dtype=np.float64), high, 0,
                       np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0))
        self.cols: list[Column] = []
        self.cost: list[float] = []
        self.seen: set[tuple[int, bytes]] = set()
        self.last: tuple[float, np.ndarray] | None = None
        """The last optimum: its GPUs and column values (columns added since hold 0)."""

    def add(self, j: int, a: np.ndarray, cost: float | None = None, most: float | None = None) -> bool:
        """Column (j, a) added, at `cost` (default: its size's GPUs) and at most `most` copies
        (default: no bound); False when the program has it already."""
        key = (j, a.tobytes())
        if key in self.seen:
            return False
        self.seen.add(key)
        idx = np.flatnonzero(a).astype(np.int32)
        cost = float(self.sizes[j]) if cost is None else float(cost)
        self.h.addCol(cost, 0.0, self.inf if most is None else float(most), len(idx), idx,
                      a[idx].astype(np.float64))
        self.cols.append((j, a))
        self.cost.append(cost)
        return True

    def costs(self) -> np.ndarray:
        """Each column's cost (its GPUs, unless `add` gave another)."""
        return np.array(self.cost)

    def solve(self, deadline: Deadline) -> tuple[float, np.ndarray] | None:
        """The program's value (GPUs) and row duals; None if HiGHS gave no optimum in time."""
        import highspy

        self.h.setOptionValue("time_limit", max(deadline.left(), 0.001))
        self.h.run()
        if self.h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            deadline.record()
            return None
        gpus = self.h.getInfo().objective_function_value
        self.last = gpus, np.array(self.h.getSolution().col_value)
        return gpus, np.maximum(np.array(self.h.getSolution().row_dual), 0.0)

    def last_values(self) -> np.ndarray:
        """The last optimum's value of every column so far (0 for those added after it)."""
        assert self.last is not None
        values = np.zeros(len(self.cols))
        values[:len(self.last[1])] = self.last[1]
        return values

    def values_at(self, costs: np.ndarray, deadline: Deadline) -> np.ndarray | None:
        """The columns' values at the optimum with `costs` in place of theirs (a nearby vertex);
        None if HiGHS gave none in time. The costs are restored and `last` left as it was."""
        import highspy

        n = len(self.cols)
        index = np.arange(n, dtype=np.int32)
        self.h.changeColsCost(n, index, costs.astype(np.float64))
        self.h.setOptionValue("time_limit", max(deadline.left(), 0.001))
        self.h.run()
        ok = self.h.getModelStatus() == highspy.HighsModelStatus.kOptimal
        values = np.array(self.h.getSolution().col_value) if ok else None
        self.h.changeColsCost(n, index, self.costs().astype(np.float64))
        return values


Priced = tuple[float, int, tuple]
"""A column the pricing found: its value at the duals, its GPUs, and `add`'s arguments for it."""


def generate(master: Master, price: Callable[[np.ndarray], list[Priced]], add: Callable[..., bool],
             num_gpus: int, deadline: Deadline, rounds: int, stop_when_fits: bool = False,
             tail: tuple[int, float] | None = None) -> bool | None:
    """Whether the fractional program fits `num_gpus`: True once it does and no column improves
    it (at once with `stop_when_fits`) or the last tail[0] rounds gained less than tail[1] of the
    GPUs; False when Farley's bound proves it needs more; out of `rounds`, whether it fits (None
    if not); None when the time ran out. `price(y)` lists the columns at the duals y, in the
    order to add them; `add(*column)` adds one, returning whether it was new."""
    enough = num_gpus * (1 + 1e-9)
    seen: list[float] = []
    for _ in range(rounds):
        if deadline.passed():
            return None
        solved = master.solve(deadline)
        if solved is None:
            return None
        gpus, y = solved
        fits = gpus <= enough
        seen.append(gpus)
        if fits and stop_when_fits:
            return True
        if tail is not None and len(seen) > tail[0] and seen[-1 - tail[0]] - gpus < tail[1] * num_gpus:
            return fits  # the tail: columns that barely move the program
        found = price(y)
        ratio = max([value / p for value, p, _ in found], default=0.0)
        added = False
        for value, p, column in found:
            if value > p * (1 + 1e-7):
                added |= add(*column)
        if gpus / max(ratio, 1.0) > enough:
            return False  # Farley: y / ratio is dual feasible, so the program needs more than N
        if not added:
            return fits
    return True if master.last is not None and master.last[0] <= enough else None


def knapsack(y: np.ndarray, weight: np.ndarray, room: float, counts: np.ndarray, ok: np.ndarray,
             round_up: bool, units: int) -> tuple[np.ndarray, Callable[[int], np.ndarray]]:
    """Bounded knapsacks at every room c = 0..`units` steps of room / `units` at once: the shape
    counts a (a[t] <= counts[t], only where `ok`) of most value a y with sum a weight within c
    steps (weights rounded down, or up): that value per c, and a function giving the counts at c."""
    if room <= 0:
        return np.zeros(units + 1), lambda c: np.zeros(len(counts), dtype=np.int64)
    scaled = weight / room * units
    steps_of = np.ceil(scaled - 1e-9) if round_up else np.floor(scaled + 1e-9)
    steps: list[tuple[int, int, int]] = []  # (shape, pieces of it, their weight)
    for t in np.flatnonzero(ok & (y > 1e-12)):
        w = int(steps_of[t])
        if w > units:
            continue
        left = int(counts[t]) if w == 0 else min(int(counts[t]), units // w)
        piece = 1
        while left > 0:  # binary splitting: pieces 1, 2, 4, ... make every count up to `left`
            m = min(piece, left)
            left -= m
            steps.append((int(t), m, w * m))
            piece *= 2
    # value[c]: the most value within c units, updated in place piece by piece (one row stays in
    # cache); took[k][c]: whether piece k raised it at c, which reading the counts back needs.
    value, shifted = np.zeros(units + 1), np.empty(units + 1)
    took = np.zeros((len(steps), units + 1), dtype=bool)
    for k, (t, m, ww) in enumerate(steps):
        vv = float(y[t]) * m
        if ww == 0:
            value += vv
            took[k] = True
            continue
        with_it = shifted[:units + 1 - ww]
        np.add(value[:-ww], vv, out=with_it)  # computed before the row below is overwritten
        np.greater(with_it, value[ww:], out=took[k, ww:])
        np.maximum(value[ww:], with_it, out=value[ww:])

    def taken(c: int) -> np.ndarray:
        a = np.zeros(len(counts), dtype=np.int64)
        for k in range(len(steps) - 1, -1, -1):
            if took[k, c]:
                t, m, ww = steps[k]
                a[t] += m
                c -= ww
        return a

    return value, taken


def integer_copies(cols: list[Column], counts: np.ndarray, sizes: Sequence[int], num_gpus: int, deadline: Deadline,
                   share: float, nodes: int) -> np.ndarray | None:
    """Whole copies of each column covering `counts` within `num_gpus` (HiGHS's first solution
    within `nodes` nodes and `share` of the time left); None if it found none."""
    ip = Master(counts, sizes)
    for j, a in cols:
        ip.add(j, a)
    n, gpus = len(ip.cols), ip.costs()
    ip.h.addRow(0.0, float(num_gpus), n, np.arange(n, dtype=np.int32), gpus.astype(np.float64))
    values, status = solve_integer(ip, np.arange(n), share * deadline.left(), nodes, mip_max_improving_sols=1)
    if values is None:
        if deadline.left() <= 0 or status == TIME_LIMIT:
            deadline.record()  # its share of the time ran out: with more, it may have found copies
        return None
    z = np.rint(values).astype(np.int64)
    return z if float(z @ gpus) <= num_gpus else None


TIME_LIMIT = "time limit reached"
"""`solve_integer`'s status when the time stopped it (HiGHS's own words for its time limit)."""


def solve_integer(master: Master, whole: np.ndarray, seconds: float, nodes: int, stop_at: float | None = None,
                  **options: float | int | bool) -> tuple[np.ndarray | None, str]:
    """The master's program with the columns `whole` integer, by HiGHS within `seconds` and
    `nodes` nodes, interrupted at `stop_at` (perf_counter) where given (its time limit is checked
    between nodes only); `options` are HiGHS's. Returns the best solution's values (None if none)
    and HiGHS's status in lower case (`TIME_LIMIT` when the time stopped it)."""
    import highspy

    from dcp.planner.ilp.solvers import _interrupt_at

    h = master.h
    h.changeColsIntegrality(len(whole), np.asarray(whole, dtype=np.int32),
                            np.full(len(whole), highspy.HighsVarType.kInteger))
    h.setOptionValue("mip_max_nodes", nodes)
    h.setOptionValue("time_limit", max(seconds, 0.001))
    for key, value in options.items():
        h.setOptionValue(key, value)
    if stop_at is not None:
        _interrupt_at(h, stop_at)
    h.run()
    status = h.modelStatusToString(h.getModelStatus()).lower()
    status = TIME_LIMIT if status == "interrupted by user" else status  # only the interrupt at `stop_at`
    found = h.getInfo().primal_solution_status == 2  # kSolutionStatusFeasible
    return (np.array(h.getSolution().col_value) if found else None), status


def fill(members: Sequence[np.ndarray], columns: Sequence, copies: Sequence[int],
         group: Callable[[Callable[[np.ndarray], list[int]], object], object]) -> tuple[list, list[list[int]]]:
    """Each column's copies as groups, and the samples left per shape: `group(take, column)`
    makes one copy's group (None if it took no sample), `take(a)` drawing a[t] samples of each
    shape t (fewer where fewer are left: the integer program may cover more)."""
    pool = [list(m) for m in members]

    def take(a: np.ndarray) -> list[int]:
        ids: list[int] = []
        for t in np.flatnonzero(a):
            ids += [int(i) for i in pool[t][:int(a[t])]]
            pool[t] = pool[t][int(a[t]):]
        return ids

    out = [g for column, n in zip(columns, copies, strict=True) for _ in range(n) if (g := group(take, column)) is not None]
    return out, pool
