"""The configuration program by column generation (Gilmore and Gomory 1961), for batches of few
sample shapes (videos: a few dozen resolutions and frame counts). A configuration is a group: an SP
size p and a[t] samples of each shape t. At a busy-time level theta the linear program

    min  sum_q p_q z_q   s.t.  sum_q a[t,q] z_q >= n_t  (every sample placed),  z >= 0

over the configurations within theta asks how many GPUs the batch needs; columns come from a bounded
knapsack per size on the duals (`colgen.knapsack`, in `knobs.COLUMN_UNITS` steps).

- bound (`column_bound`): a configuration fits when fixed(p, 0) + sum_t a[t] m_tp <= theta (m:
  `CostTable.marg`), each sample alone within theta; if even the fractional program needs more than
  N GPUs (Farley's bound), no plan runs within theta.
- plan (`column_plan`): on the additive estimates (`CostTable.add`), the integer program's groups,
  or if it finds none in `knobs.COLUMN_IP_SHARE` of the time, `_rounded`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import dcp.planner.knobs as knobs
from dcp.planner.colgen import Column, Master, Priced, fill, generate, integer_copies, knapsack
from dcp.planner.ilp.budget import Deadline
from dcp.planner.ilp.costs import CostTable
from dcp.planner.ilp.pack import Groups
from dcp.planner.levels import narrow


@dataclass
class Shapes:
    """The batch's distinct samples: members of each shape (table rows) and their counts."""

    members: list[np.ndarray]
    first: np.ndarray
    counts: np.ndarray


Columns = list[Column]


def shapes_of(table: CostTable) -> Shapes | None:
    """Distinct (tokens, pairs) of the batch; None when there are more than `knobs.COLUMN_MAX_SHAPES`."""
    if len(table.tokens) > knobs.COLUMN_MAX_SHAPES and len(np.unique(table.tokens)) > knobs.COLUMN_MAX_SHAPES:
        return None  # at least as many shapes as token counts: one plain sort decides
    keys = np.stack([table.tokens.astype(np.float64), table.pairs], axis=1)
    _, first, inverse, counts = np.unique(keys, axis=0, return_index=True, return_inverse=True, return_counts=True)
    if len(first) > knobs.COLUMN_MAX_SHAPES:
        return None
    inverse = inverse.ravel()
    order = np.argsort(inverse, kind="stable")
    cuts = np.searchsorted(inverse[order], np.arange(len(first) + 1))
    return Shapes([order[cuts[t]:cuts[t + 1]] for t in range(len(first))], first, counts)


def runnable(table: CostTable, shapes: Shapes, theta: float) -> list[np.ndarray]:
    """Per size index: whether each shape runs there, alone within theta."""
    rows = shapes.first
    return [(table.ckpt[rows, j] >= 0) & (table.solo[rows, j] <= theta) for j in range(len(table.sizes))]


def _generate(master: Master, table: CostTable, shapes: Shapes, theta: float, num_gpus: int, plan: bool,
              deadline: Deadline) -> bool | None:
    """`colgen.generate` at level theta, one knapsack column per size: for a bound it stops once
    the program fits N GPUs, for a plan it goes on while columns improve it."""
    weights, rows, ok = table.add if plan else table.marg, shapes.first, runnable(table, shapes, theta)

    def price(y: np.ndarray) -> list[Priced]:
        found = []
        for j, p in enumerate(table.sizes):
            room = theta if plan else theta - float(table.fixed0[j])
            values, taken = knapsack(y, weights[rows, j], room, shapes.counts, ok[j], plan, knobs.COLUMN_UNITS)
            found.append((float(values[knobs.COLUMN_UNITS]), p, (j, taken(knobs.COLUMN_UNITS))))
        return found

    return generate(master, price, master.add, num_gpus, deadline, knobs.COLUMN_MAX_ROUNDS, stop_when_fits=not plan)


def master_at(table: CostTable, shapes: Shapes, theta: float, columns: Columns = ()) -> Master:
    """A program with `columns` (valid at theta) and a single-sample column per shape and size."""
    master = Master(shapes.counts, table.sizes)
    single = np.eye(len(shapes.first), dtype=np.int64)
    for j, ok in enumerate(runnable(table, shapes, theta)):
        for t in np.flatnonzero(ok):
            master.add(j, single[t])
    for j, a in columns:
        master.add(j, a)
    return master


def column_bound(table: CostTable, shapes: Shapes, num_gpus: int, lower: float, upper: float,
                 deadline: Deadline, steps: int = 5) -> tuple[float, float, Columns]:
    """The largest level in [lower, upper] found at which no plan runs (`lower` if none), by
    bisection on theta (`levels.narrow`), each level's program proven infeasible or feasible;
    the lowest level found feasible (`upper` if none) and its columns (a start for
    `column_plan`). Columns found at a level proven infeasible fit every level above it, so the
    next levels start from them. A deadline leaves the program undecided, which stops the
    bisection, perhaps with the two levels far apart. The level proven infeasible is returned a
    hair lower (1e-9 relative): the program proves it only to the LP's tolerance."""
    known: Columns = []
    feasible: Columns = []

    def fits(theta: float) -> bool | None:
        nonlocal known, feasible
        master = master_at(table, shapes, theta, known)
        fit = _generate(master, table, shapes, theta, num_gpus, False, deadline)
        if fit is not None:
            if fit:
                feasible = master.cols
            else:
                known = master.cols
        return fit

    lo, hi = narrow(fits, lower, upper, steps=steps, rtol=1e-4)
    return (lo if lo == lower else lo * (1 - 1e-9)), hi, feasible


def column_plan(table: CostTable, shapes: Shapes, num_gpus: int, theta: float, deadline: Deadline,
                start: Columns = ()) -> Groups | None:
    """Groups within theta by the additive estimate: the integer program over the columns
    generated at theta (from `start`'s that fit), or its last fractional optimum rounded
    (`_rounded`) when it or the time runs out; None when it needs more GPUs or never solved."""

    rows = shapes.first
    fit = [(j, a) for j, a in start  # the shapes a holds only: one that cannot run at j costs inf
           if float(a[a > 0] @ table.add[rows[a > 0], j]) <= theta and (table.solo[rows[a > 0], j] <= theta).all()]
    master = master_at(table, shapes, theta, fit)
    fits = _generate(master, table, shapes, theta, num_gpus, True, deadline)
    if fits is False or master.last is None or master.last[0] > num_gpus * (1 + 1e-9):
        return None
    values = master.last_values()
    if fits is None:
        # Out of time with a fractional program that fits the GPUs: its values rounded.
        return _rounded(master.cols, values, shapes, table, num_gpus)
    copies = integer_plan(master, shapes, num_gpus, deadline)
    if copies is None:
        return _rounded(master.cols, values, shapes, table, num_gpus)
    groups, pool = fill(shapes.members, master.cols, copies.tolist(), _group)
    return None if any(pool) else groups


def integer_plan(master: Master, shapes: Shapes, num_gpus: int, deadline: Deadline) -> np.ndarray | None:
    """Whole copies of the program's columns covering every sample within N GPUs
    (`integer_copies`): first over the columns its fractional optimum uses and the single-sample
    ones (a tenth of the columns), then over all. Any solution will do: every column fits."""
    values = master.last_values()
    single = np.array([a.sum() == 1 for _, a in master.cols])
    for use in (np.flatnonzero((values > 1e-9) | single), np.arange(len(master.cols))):
        z = integer_copies([master.cols[c] for c in use], shapes.counts, master.sizes, num_gpus, deadline,
                           knobs.COLUMN_IP_SHARE, knobs.COLUMN_IP_NODES)
        if z is not None:
            copies = np.zeros(len(master.cols), dtype=np.int64)
            copies[use] = z
            return copies
    return None


def _group(take: Callable[[np.ndarray], list[int]], column: Column) -> tuple[int, list[int]] | None:
    """One copy of the column as a group (`colgen.fill`)."""
    ids = take(column[1])
    return (column[0], ids) if ids else None


def _rounded(cols: Columns, values: np.ndarray, shapes: Shapes, table: CostTable, num_gpus: int) -> Groups | None:
    """The fractional optimum rounded down, then, while GPUs remain, copies of the column that
    places the most unplaced samples per GPU (each at its fewest GPU-seconds, so the largest go
    first), and the rest each to the least-loaded group that runs it (additive estimate); None if
    one fits no group. Why not rounding up: docs/tuning-log.md, `COLUMN_IP_SHARE`."""
    copies = np.floor(values + 1e-9).astype(np.int64)
    gpus = np.array([table.sizes[j] for j, _ in cols])
    a = np.stack([col for _, col in cols]).astype(np.int64)  # columns x shapes
    rows = shapes.first
    work = table.gpu_seconds(rows).min(axis=1)  # per shape
    left = np.maximum(shapes.counts - copies @ a, 0)
    free = num_gpus - int(copies @ gpus)
    while free > 0 and left.any():
        placed = np.minimum(a, left[None, :]) @ work
        score = np.where((gpus <= free) & (placed > 0), placed / gpus, -np.inf)
        c = int(np.argmax(score))  # ties: the first column
        if not np.isfinite(score[c]):
            break
        copies[c] += 1
        free -= int(gpus[c])
        left = np.maximum(left - a[c], 0)
    groups, pool = fill(shapes.members, cols, copies.tolist(), _group)
    if not groups:
        return None
    loads = [float(table.add[ids, j].sum()) for j, ids in groups]
    for i in (int(i) for members in pool for i in members):
        fits = [g for g, (j, _) in enumerate(groups) if table.ckpt[i, j] >= 0]
        if not fits:
            return None
        g = min(fits, key=lambda q: (loads[q] + float(table.add[i, groups[q][0]]), q))
        groups[g][1].append(i)
        loads[g] += float(table.add[i, groups[g][0]])
    return groups
