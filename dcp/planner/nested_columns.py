"""Nested plans for few-shape batches, by column generation: a group of p GPUs first splits into
groups of q GPUs running samples of their own, then runs its own at SP p, so the room a long video
leaves in a large group goes to small groups (docs/design.md). At busy-time level theta the program

    min  sum_c p_c z_c   s.t.  sum_c (a1[t,c] + p_c / q_c a2[t,c]) z_c >= n_t,  z >= 0

takes configurations whose parts' group estimates sum to at most theta (`plan_at`, `colgen`);
`_integer` rounds it; `nested_column_plan` searches theta. Never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

import dcp.planner.knobs as knobs
from dcp.costmodel import CostModel
from dcp.planner.backfill import Candidate, assemble_candidate
from dcp.planner.colgen import Column, Master, Priced, fill, generate, integer_copies, knapsack
from dcp.planner.ilp.budget import Deadline
from dcp.planner.ilp.columns import Shapes, master_at, runnable, shapes_of
from dcp.planner.ilp.costs import CostTable, batch_costs, form_microbatches, pack_tokens
from dcp.planner.ilp.pack import group_estimate, place
from dcp.planner.levels import climb, narrow
from dcp.planner.plan import Plan
from dcp.planner.pricing import BatchArrays, Layout, Pricer
from dcp.planner.sample import Sample

NestedColumn = tuple[int, int, np.ndarray, np.ndarray]
"""A nested configuration: group and subgroup size indices, own and per-subgroup shape counts."""


@dataclass
class _Pooled:
    """A column of an earlier level and its parts' summed estimate (None until a level asks)."""

    column: NestedColumn
    estimate: float | None = None


@dataclass(frozen=True)
class Nested:
    """A nested plan's group: size index j and its own samples, then subgroups' jq and samples."""

    j: int
    own: list[int]
    jq: int
    parts: list[list[int]]


def nested_column_plan(batch: Sequence[Sample], cm: CostModel, sizes: Sequence[int], busy_floor_s: float,
                       arrays: BatchArrays | None = None, max_microbatches: int | None = None,
                       costs: tuple[Pricer, CostTable] | None = None, deadline_s: float | Deadline = float("inf"),
                       seed: Plan | None = None) -> Plan | None:
    """The fastest nested plan found by `deadline_s` (perf_counter or a `Deadline`), validated; None
    if inapplicable (many shapes, one size, ZeRO-3) or late. `seed`'s groups start each program."""
    if len(sizes) < 2 or cm.training.zero_stage == 3 or len(batch) < 2:
        return None
    arrays = arrays if arrays is not None else BatchArrays.of(batch)
    pricer, table = costs if costs is not None else batch_costs(arrays, cm, sizes)
    shapes = shapes_of(table)
    if shapes is None:
        return None
    deadline = Deadline.of(deadline_s)
    best: Plan | None = None
    pool: list[_Pooled] = []  # every level's columns, for the next
    starts = _seed_columns(seed, batch, shapes, table) if seed is not None else []
    estimate = _Estimates(table, shapes.first)
    carry: list[NestedColumn] = []  # the last level's fractional optimum, for the next

    def tried(level: float) -> bool:
        """Whether `level` gave a plan."""
        nonlocal best
        groups, _ = plan_at(table, shapes, cm.cluster.num_gpus, busy_floor_s * level, deadline, pool, starts,
                            estimate, carry)
        if groups is None:
            return False
        cand = _candidate(groups, table, cm)
        if max_microbatches is not None and max(len(mbs) for _, _, mbs in cand.first + cand.second) > max_microbatches:
            return False
        plan = assemble_candidate(batch, cm, arrays, pricer, cand)
        if best is None or plan.step_time_s < best.step_time_s:
            best = plan
        return True

    # The lowest level that gave a plan and the highest below it that gave none (1.0: none tried).
    below, lowest = climb(tried, (knobs.NESTED_FIRST_LEVEL, *knobs.NESTED_UP_LEVELS), stop=deadline.passed)
    if lowest is not None:
        narrow(tried, 1.0 if below is None else below, lowest, atol=knobs.NESTED_FINEST + 1e-9,
               stop=deadline.passed, first=knobs.NESTED_GUESS_LEVEL)
    return best


def _seed_columns(plan: Plan, batch: Sequence[Sample], shapes: Shapes, table: CostTable) -> list[Column]:
    """The plan's distinct groups as (size index, shape counts), its sizes the table's."""
    index = {s.id: i for i, s in enumerate(batch)}
    shape = np.empty(len(batch), dtype=np.int64)
    for t, members in enumerate(shapes.members):
        shape[members] = t
    out: dict[tuple[int, bytes], Column] = {}
    for g in plan.groups:
        j = table.sizes.index(g.sp)
        a = np.bincount(shape[[index[i] for mb in g.microbatches for i in mb.samples]], minlength=len(shapes.counts))
        out.setdefault((j, a.tobytes()), (j, a))
    return list(out.values())


def plan_at(table: CostTable, shapes: Shapes, num_gpus: int, theta: float, deadline: Deadline,
            pool: list[_Pooled] | None = None, starts: Sequence[Column] = (),
            estimate: _Estimates | None = None,
            carry: list[NestedColumn] | None = None) -> tuple[list[Nested] | None, bool]:
    """Nested groups within theta from the integer program over the generated columns (or None), and
    whether the fractional program fits; `pool`, `starts`, `carry` seed it and take this level's."""
    program = _Program(table, shapes, num_gpus, theta, pool, starts, estimate, carry or ())
    fits = program.generate(deadline)
    if fits is None:
        return None, False
    fits = program.top_up(deadline, fits)
    if carry is not None and program.master.last is not None:
        carry[:] = program.optimum()
    if fits is not True:
        return None, False
    copies = _integer(program.master, shapes, num_gpus, deadline)
    if copies is None:
        return None, True
    sizes = table.sizes

    def group(take: Callable[[np.ndarray], list[int]], column: tuple) -> Nested | None:
        (j, _), (jq, a1, a2) = column
        own = take(a1)
        parts = [take(a2) for _ in range(sizes[j] // sizes[jq])] if jq != j and a2.any() else []
        return Nested(j, own, jq, parts) if own or any(parts) else None

    return fill(shapes.members, list(zip(program.master.cols, program.kinds, strict=True)), copies.tolist(), group)[0], True


def _integer(master: Master, shapes: Shapes, num_gpus: int, deadline: Deadline) -> np.ndarray | None:
    """Whole copies of columns covering the batch within N GPUs, or None (try the next level)."""
    a = np.stack([col for _, col in master.cols]).astype(np.int64)
    gpus = master.costs()
    rng = np.random.default_rng(0)  # the same optima every run
    values: np.ndarray | None = master.last_values()
    for attempt in range(knobs.NESTED_ATTEMPTS):
        if deadline.passed():
            break
        if attempt:  # another vertex near the optimum: each column's GPUs scaled up by up to NESTED_PERTURB
            values = master.values_at(gpus * (1 + knobs.NESTED_PERTURB * rng.random(len(gpus))), deadline)
            if values is None or float(values @ gpus) > num_gpus * (1 + 1e-9):
                continue
        kept = np.floor(values + 1e-6).astype(np.int64)
        left = num_gpus - int(kept @ gpus)
        if left < 0:
            continue
        rest = np.maximum(shapes.counts - kept @ a, 0)
        if not rest.any():
            return kept
        z = integer_copies(master.cols, rest, master.sizes, left, deadline, knobs.NESTED_IP_SHARE,
                           knobs.COLUMN_IP_NODES)
        if z is not None:
            return kept + z
    return None


class _Program:
    """The program over nested columns at theta, its columns and how each splits."""

    def __init__(self, table: CostTable, shapes: Shapes, num_gpus: int, theta: float,
                 pool: list[_Pooled] | None, starts: Sequence[Column] = (),
                 estimate: _Estimates | None = None, carry: Sequence[NestedColumn] = ()) -> None:
        self.table, self.shapes, self.num_gpus, self.theta, self.pool = table, shapes, num_gpus, theta, pool
        self.estimate = estimate if estimate is not None else _Estimates(table, shapes.first)
        sizes, rows = table.sizes, shapes.first
        self.ok = runnable(table, shapes, theta)
        self.master = master_at(table, shapes, theta)  # the single-sample columns, which do not split
        self.kinds: list[tuple[int, np.ndarray, np.ndarray]] = [(j, a, np.zeros_like(a)) for j, a in self.master.cols]
        """Per column: the size index it splits into (its own if not), its own and subgroup
        parts."""
        # Each part's one whole fixed cost in knapsack units (additive weights charge only shares).
        self.fixed = [min(int(np.ceil(float(table.fixed0[j]) / theta * knobs.NESTED_UNITS - 1e-9)), knobs.NESTED_UNITS) for j in range(len(sizes))]
        if pool is not None:  # the columns of other levels that fit this one by the estimate
            for pooled in pool:
                j, jq, a1, a2 = pooled.column
                if not (self.ok[j][a1 > 0].all() and self.ok[jq][a2 > 0].all()):
                    continue
                if pooled.estimate is None:
                    pooled.estimate = self.estimate(j, a1) + self.estimate(jq, a2)
                if pooled.estimate <= theta:
                    self.add(j, jq, a1, a2, keep=False)
        # A plan's groups (unsplit) and the last level's optimum, cut to fit.
        given = [*((j, j, a, np.zeros_like(a)) for j, a in starts), *carry]
        if given:
            least = np.where(np.stack(self.ok, axis=1), table.gpu_seconds(rows), np.inf).min(axis=1)
            for j, jq, a1, a2 in given:
                b1, b2 = _cut(self.estimate, j, jq, np.where(self.ok[j], a1, 0), np.where(self.ok[jq], a2, 0),
                              least, theta)
                if b1.any() or b2.any():
                    self.add(j, jq, b1, b2, keep=False)

    def add(self, j: int, jq: int, a1: np.ndarray, a2: np.ndarray, keep: bool = True) -> bool:
        if self.master.add(j, a1 + self.table.sizes[j] // self.table.sizes[jq] * a2):
            self.kinds.append((jq, a1, a2))
            if keep and self.pool is not None:
                self.pool.append(_Pooled((j, jq, a1, a2)))
            return True
        return False

    def generate(self, deadline: Deadline) -> bool | None:
        """`colgen.generate` with `price`, until rounds barely help (`knobs.NESTED_TAIL`)."""
        return generate(self.master, self.price, self.add, self.num_gpus, deadline, knobs.NESTED_MAX_ROUNDS,
                        tail=(knobs.NESTED_TAIL_ROUNDS, knobs.NESTED_TAIL))

    def top_up(self, deadline: Deadline, fits: bool) -> bool | None:
        """Top up the optimum's columns and generate on; whether it fits (`fits` if none grew)."""
        counts, theta = self.shapes.counts, self.theta
        for _ in range(knobs.NESTED_TOP_UP_ROUNDS):
            solved = self.master.solve(deadline)
            if solved is None:
                return fits
            _, y = solved
            added = False
            for j, jq, a1, a2 in self.optimum():
                b1, b2 = _top_up(self.estimate, j, jq, a1, a2, y, theta, counts, self.ok[j], self.ok[jq])
                if (b1 != a1).any() or (b2 != a2).any():
                    added |= self.add(j, jq, b1, b2)
            if not added:
                return fits
            fits = self.generate(deadline)
            if fits is None:
                return None
        return fits

    def optimum(self) -> list[NestedColumn]:
        """The columns the last fractional optimum uses."""
        values = self.master.last_values()
        return [(self.master.cols[c][0], *self.kinds[c]) for c in np.flatnonzero(values > 1e-9)]

    def price(self, y: np.ndarray) -> list[Priced]:
        """The best columns at the prices y (below), with their values and GPUs."""
        table, rows, sizes, theta, counts = self.table, self.shapes.first, self.table.sizes, self.theta, self.shapes.counts
        out: list[Priced] = []
        plain = [knapsack(y, table.add[rows, j], theta, counts, self.ok[j], True, knobs.NESTED_UNITS) for j in range(len(sizes))]
        seconds: dict[tuple[int, int], tuple[np.ndarray, Callable[[int], np.ndarray]]] = {}
        for j, p in enumerate(sizes):
            values, taken = plain[j]
            for whole in (True, False):
                # Parts charged a whole fixed cost each, or token shares then cut to fit (`_cut`);
                # per size the best unsplit column and the best split into each smaller size.
                room = knobs.NESTED_UNITS - self.fixed[j] if whole else knobs.NESTED_UNITS
                found = [(float(values[room]), j, room, None, 0)]
                for jq, q in enumerate(sizes):
                    rest = room - self.fixed[jq] if whole else room
                    if q >= p or rest < 0:
                        continue
                    r = p // q
                    if (jq, r) not in seconds:
                        seconds[jq, r] = knapsack(y, table.add[rows, jq], theta, counts // r, self.ok[jq], True, knobs.NESTED_UNITS)
                    total = values[:rest + 1] + r * seconds[jq, r][0][rest::-1]
                    c = int(np.argmax(total))
                    if values[c] > 0:
                        found.append((float(total[c]), jq, c, (jq, r), rest - c))
                for value, jq, c, second, left in found:
                    a1 = taken(c)
                    a2 = seconds[second][1](left) if second is not None else np.zeros_like(a1)
                    if not whole:
                        a1, a2 = _cut(self.estimate, j, jq, a1, a2, y, theta)
                        value = float(a1 @ y + p // sizes[jq] * (a2 @ y))
                    out.append((value, p, (j, jq, a1, a2)))
        return out


class _Estimates:
    """A part's group estimate (shape counts a, size j), shared micro-batches as `pack_tokens`."""

    def __init__(self, table: CostTable, rows: np.ndarray) -> None:
        self.table, self.rows = table, rows
        self.short_tok, self.short_pairs, self.base = (x[rows] for x in table.estimate_terms())
        self.known: dict[tuple[int, bytes], float] = {}

    def __call__(self, j: int, a: np.ndarray) -> float:
        if not a.any():
            return 0.0
        key = (j, a.tobytes())
        found = self.known.get(key)
        if found is None:
            short_tok = self.short_tok[:, j]
            tok = float(a @ short_tok)
            cap = float(self.table.cap0[j])
            if tok <= cap:  # one shared micro-batch holds them all (none: all checkpoint alone)
                bins = 1 if tok > 0 else 0
            else:
                held = np.flatnonzero(a * short_tok)
                tokens = np.repeat(short_tok[held], a[held])
                bins = len(pack_tokens(tokens, np.arange(len(tokens)), cap))
            held = a > 0  # not a @ base: a shape that cannot run at j costs inf there, and 0 * inf is nan
            found = self.known[key] = float(group_estimate(self.table, float(a[held] @ self.base[held, j]), tok,
                                                           float(a @ self.short_pairs[:, j]), j, bins))
        return found


def _top_up(estimate: _Estimates, j: int, jq: int, a1: np.ndarray, a2: np.ndarray, y: np.ndarray, theta: float,
            counts: np.ndarray, ok1: np.ndarray, ok2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The column with the densest samples by dual value added while its estimates fit theta."""
    table, rows = estimate.table, estimate.rows
    split = jq != j
    r = table.sizes[j] // table.sizes[jq] if split else 1
    e1, e2 = estimate(j, a1), estimate(jq, a2)  # an unsplit column's a2 is empty: 0
    if e1 + e2 > theta:
        return a1, a2
    marg = table.estimate_terms()[2][rows]
    m1, m2 = marg[:, j], marg[:, jq]
    dense1 = np.where(ok1 & (y > 0), y / np.maximum(m1, 1e-30), -1.0)
    dense2 = np.where(ok2 & (y > 0), y / np.maximum(m2, 1e-30), -1.0) if split else np.full(len(y), -1.0)
    parts, spent, size = [a1.copy(), a2.copy()], [e1, e2], (j, jq)
    while True:
        room, used = theta - spent[0] - spent[1], parts[0] + r * parts[1]
        dense = [np.where((used < counts) & (m1 <= room), dense1, -1.0),
                 np.where((used + r <= counts) & (m2 <= room), dense2, -1.0)]
        for _ in range(knobs.NESTED_TRIES):
            first = [int(np.argmax(d)) for d in dense]
            side = 0 if dense[0][first[0]] >= dense[1][first[1]] else 1
            k = first[side]
            if dense[side][k] <= 0:
                return parts[0], parts[1]
            parts[side][k] += 1
            grown = estimate(size[side], parts[side])
            if grown + spent[1 - side] <= theta:
                spent[side] = grown
                break
            parts[side][k] -= 1
            dense[side][k] = -1.0
        else:
            return parts[0], parts[1]


def _cut(estimate: _Estimates, j: int, jq: int, a1: np.ndarray, a2: np.ndarray, y: np.ndarray,
         theta: float) -> tuple[np.ndarray, np.ndarray]:
    """The column's parts cut until their estimates fit theta, least dual value per second first."""
    table, rows = estimate.table, estimate.rows
    a1, a2 = a1.copy(), a2.copy()
    r = table.sizes[j] // table.sizes[jq]
    d1 = y / np.maximum(table.add[rows, j], 1e-30)
    d2 = r * y / np.maximum(table.add[rows, jq], 1e-30)
    while (a1.any() or a2.any()) and estimate(j, a1) + estimate(jq, a2) > theta:
        h1, h2 = np.flatnonzero(a1), np.flatnonzero(a2)
        k1 = h1[np.argmin(d1[h1])] if len(h1) else -1
        k2 = h2[np.argmin(d2[h2])] if len(h2) else -1
        if k2 < 0 or (k1 >= 0 and d1[k1] <= d2[k2]):
            a1[k1] -= 1
        else:
            a2[k2] -= 1
    return a1, a2


def _candidate(groups: list[Nested], table: CostTable, cm: CostModel) -> Candidate:
    """The groups laid out aligned, each part with the longest sample last (hides reductions)."""
    sizes = table.sizes
    first: Layout = []
    second: Layout = []
    for start, p, g in place([(sizes[g.j], g) for g in groups], cm.cluster):
        q = sizes[g.jq]
        own = [(start, p, form_microbatches(g.own, g.j, table, cm))] if g.own else []
        parts = [(start + k * q, q, form_microbatches(ids, g.jq, table, cm)) for k, ids in enumerate(g.parts) if ids]
        own_longest = max((float(table.solo[i, g.j]) for i in g.own), default=0.0)
        part_longest = max((float(table.solo[i, g.jq]) for ids in g.parts for i in ids), default=0.0)
        if own_longest >= part_longest:
            first.extend(parts)
            second.extend(own)
        else:
            first.extend(own)
            second.extend(parts)
    return Candidate(first, second, 0.0, False)
