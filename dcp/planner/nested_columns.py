"""Nested plans for batches of few shapes, by column generation: a group of p GPUs splits into
p / q groups of q GPUs that each run samples of their own, then runs its own samples at SP p
whole.

At two videos per GPU a single layout loses to the integrality of its groups: a group that
holds a 432,000-token video at SP 16 (0.74 s of a 0.92 s step) fills the rest of its time at SP
16, where a short video costs twice its GPU-seconds at SP 1. On Open-Sora's 512 videos on 256
GPUs, batch 3, no single layout runs below 0.938 s busy (the configuration program's bound by
column generation, `ilp.columns`) while the bound of every plan is 0.915 s; with nested
configurations, a size p and the shapes a1 its group runs whole, a size q < p and the shapes a2
each of its subgroups runs, the same linear program needs 0.918 s.

At a busy-time level theta (`plan_at`) the program

    min  sum_c p_c z_c   s.t.  sum_c (a1[t,c] + p_c / q_c a2[t,c]) z_c >= n_t,  z >= 0

takes the configurations whose parts' group estimates (`pack.group_estimate`, with the
micro-batches the canonical packing makes) sum to at most theta. Its columns come from
knapsacks over every room at once (`colgen.knapsack`, on the additive weights
`CostTable.add` in steps of theta / `knobs.NESTED_UNITS`): per size p, the best column that does not split
and the best that splits into each smaller size q (the room split between a1 at p and p / q
copies of a2 at q, each shape's count divided by p / q), priced twice: with one whole fixed cost
charged to each part (it runs at least one micro-batch; the token shares alone priced a part of
one short video at a tenth of it), and with the token shares alone, the column then cut until
its parts fit (`_cut`). A plan in hand (the single layout's) starts each level's program with
its groups, cut to fit (Open-Sora at 1.0225-1.03: 2,048 on 1,024 GPUs, batch 3, 16-28 rounds a
level instead of 29-37; 512 on 256, batch 0, 22-25 instead of 33-36), and a level's generation
ends where its last rounds barely move the program (`knobs.NESTED_TAIL`). The integer
program (`_integer`) keeps the fractional optimum's whole copies and covers what they leave
over every column found, which near the least level with a plan takes a tenth of the time the
program over the whole batch does; its groups are laid out aligned (the largest first), each
group's part that holds its longest sample (its own, mostly) in the plan's second phase and the
other in its first (`backfill.assemble_candidate`, on the executor's schedule: a group starts
when its subgroups have all ended): that sample's backward pass at the step's end hides the
gradient reductions (the other order exposed twice as much of them: 0.030 s against 0.015 s on
batch 1).

Near the least level with a plan, three things decide whether a level gives one:
- the columns fit their level to the knapsack's step (theta / `knobs.NESTED_UNITS`, rounded up per sample), so
  each leaves room a short video would fill: the fractional optimum's columns are topped up
  (`_top_up`: the shapes of most dual value per second of marginal time first, while the
  parts' estimates fit) and the generation goes on from them, `knobs.NESTED_TOP_UP_ROUNDS` times at most;
- a level's generation starts from the last level's fractional optimum, cut to fit (`carry`):
  the level below the first generates in a quarter of the time (Open-Sora, 512 videos on 256
  GPUs, batch 0: 0.025 s against 0.105 s before its topping up);
- the integer program: with under a GPU to spare, the whole copies of one optimum often leave
  what no whole copies cover, where those of another optimum do; `_integer` tries `knobs.NESTED_ATTEMPTS`
  optima (the program's costs perturbed, seeded: the same ones every run).

`nested_column_plan` tries `knobs.NESTED_FIRST_LEVEL` (1.0225 times the bound of every plan's busy time), or where
it gives no plan higher ones (`knobs.NESTED_UP_LEVELS`) until one does (the columns of the levels below start it),
then `knobs.NESTED_GUESS_LEVEL` below it, then halfway between the lowest level with a plan and the highest below
it without one, down to `knobs.NESTED_FINEST`, until its deadline, and returns the fastest plan priced. A
level takes 0.05-0.45 s at 512 videos on 256 GPUs and 2,048 on 1,024, its integer program
included, so the phase search (`dcp.planner.phases`) gives them most of a 1 s limit.
Never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

import dcp.planner.knobs as knobs
from dcp.costmodel import CostModel
from dcp.planner.backfill import Candidate, assemble_candidate
from dcp.planner.colgen import Column, Master, Priced, draw, generate, integer_copies, knapsack
from dcp.planner.ilp.budget import Deadline
from dcp.planner.ilp.columns import Shapes, master_at, runnable, shapes_of
from dcp.planner.ilp.costs import CostTable, batch_costs, form_microbatches, pack_tokens
from dcp.planner.ilp.pack import group_estimate, place
from dcp.planner.plan import Plan
from dcp.planner.pricing import BatchArrays, Layout, Pricer
from dcp.planner.sample import Sample

NestedColumn = tuple[int, int, np.ndarray, np.ndarray]
"""A nested configuration: the size index of its group and of its subgroups (the same where it
does not split), its own part's shape counts and each subgroup's."""


@dataclass
class _Pooled:
    """A column of an earlier level, and its parts' estimates summed (the levels it fits; None
    until a level asks)."""

    column: NestedColumn
    estimate: float | None = None


@dataclass(frozen=True)
class Nested:
    """One group of a nested plan (table indices): its size index j and the samples it runs
    whole, and where it splits first, the subgroups' size index jq and each one's samples
    (empty: it does not split)."""

    j: int
    own: list[int]
    jq: int
    parts: list[list[int]]


def nested_column_plan(batch: Sequence[Sample], cm: CostModel, sizes: Sequence[int], busy_floor_s: float,
                       arrays: BatchArrays | None = None, max_microbatches: int | None = None,
                       costs: tuple[Pricer, CostTable] | None = None, deadline_s: float | Deadline = float("inf"),
                       seed: Plan | None = None) -> Plan | None:
    """The fastest nested plan found (module docstring) by `deadline_s` (perf_counter, or a
    `Deadline` that records it when it stops the levels), priced and
    validated; None when the batch has more shapes than the column program takes, a single size
    is allowed, ZeRO stage 3 runs one layout, or no level gives a plan in time. `seed`, a plan of
    the batch (the single layout's), starts every level's program with its groups, cut to fit."""
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

    lowest, below = 0.0, 1.0  # the lowest level that gave a plan, the highest below it that gave none
    for level in (knobs.NESTED_FIRST_LEVEL, *knobs.NESTED_UP_LEVELS):
        if deadline.passed():
            return best
        if tried(level):
            lowest = level
            break
        below = level
    else:
        return best
    level = knobs.NESTED_GUESS_LEVEL if below < knobs.NESTED_GUESS_LEVEL < lowest else (lowest + below) / 2
    while lowest - below > knobs.NESTED_FINEST + 1e-9 and not deadline.passed():
        if tried(level):
            lowest = level
        else:
            below = level
        level = (lowest + below) / 2
    return best


def _seed_columns(plan: Plan, batch: Sequence[Sample], shapes: Shapes, table: CostTable) -> list[Column]:
    """The plan's distinct groups as (size index, shape counts); the plan's sizes are the table's."""
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
    """Nested groups within theta by the estimates (module docstring), from the integer program
    over the columns generated at theta and topped up (`_integer`), and whether the fractional
    program fits the cluster; no groups when it does not, the integer program finds no plan, or
    the deadline passes. `pool` holds columns of other levels (those that fit theta start the
    program) and takes this level's; `starts` (size index, shape counts) start it too, cut to
    fit, and so do the columns of `carry` (the last level's fractional optimum), which then holds
    this level's; `estimate` remembers the parts' estimates across levels."""
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
    return _fill(program.master.cols, program.kinds, copies.tolist(), shapes, table.sizes), True


def _integer(master: Master, shapes: Shapes, num_gpus: int, deadline: Deadline) -> np.ndarray | None:
    """Whole copies of the columns covering every sample within N GPUs: an optimum's whole copies
    and the integer program (`colgen.integer_copies`) over every column for what they leave,
    for the fractional optimum and then `knobs.NESTED_ATTEMPTS` - 1 others (`_other_optimum`) while none is
    found. Near the least level with a plan the integer program over the whole batch takes
    seconds where this takes a tenth of one (Open-Sora, 512 on 256 GPUs, batch 3 at 1.0225: 2.1 s
    and 0.2 s); where this finds nothing, the next level is tried."""
    a = np.stack([col for _, col in master.cols]).astype(np.int64)
    gpus = master.gpus()
    rng = np.random.default_rng(0)  # the same optima every run
    values: np.ndarray | None = master.last_values()
    for attempt in range(knobs.NESTED_ATTEMPTS):
        if deadline.passed():
            break
        if attempt:
            values = _other_optimum(master, gpus, rng, num_gpus, deadline)
            if values is None:
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


def _other_optimum(master: Master, gpus: np.ndarray, rng: np.random.Generator, num_gpus: int,
                   deadline: Deadline) -> np.ndarray | None:
    """The columns' values at the optimum of the program with each column's GPUs scaled by up to
    `knobs.NESTED_PERTURB` more (random), another vertex near the optimum; None where it needs more than the
    cluster's GPUs or HiGHS gives no optimum in time. The program's own costs are restored."""
    values = master.values_at(gpus * (1 + knobs.NESTED_PERTURB * rng.random(len(gpus))), deadline)
    if values is None or float(values @ gpus) > num_gpus * (1 + 1e-9):
        return None
    return values


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
        """Per column: the size index it splits into (its own where it does not), its own part and
        each subgroup's."""
        # Each part's one whole fixed cost, in knapsack units (the additive weights charge each
        # sample its token share of it: a part of one short video would be priced at a tenth of it).
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
        # A plan's groups (unsplit) and the last level's optimum, cut to fit (the fewest
        # GPU-seconds per second of weight kept).
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
        """Column generation (`colgen.generate`, `price`): True when the fractional program fits
        the cluster, False when it provably needs more GPUs over the columns this pricing can
        find, None when the deadline runs out first; it ends where the last
        `knobs.NESTED_TAIL_ROUNDS` rounds lowered the program by less than `knobs.NESTED_TAIL`."""
        return generate(self.master, self.price, self.add, self.num_gpus, deadline, knobs.NESTED_MAX_ROUNDS,
                        tail=(knobs.NESTED_TAIL_ROUNDS, knobs.NESTED_TAIL))

    def top_up(self, deadline: Deadline, fits: bool) -> bool | None:
        """`knobs.NESTED_TOP_UP_ROUNDS` rounds at most: the fractional optimum's columns topped up (`_top_up`),
        added, and the generation gone on from them; whether the program then fits (as
        `generate`), `fits` where no column grew."""
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
                # Two pricings: each part charged one whole fixed cost beside its samples'
                # token shares (it runs at least one micro-batch), and the token shares alone,
                # the column then cut until its parts' estimates fit (`_cut`). Per size, the
                # best column that does not split and the best that splits into each smaller
                # size (its own part within c units, each subgroup within the rest).
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
    """The group estimate (`pack.group_estimate`) of a part, shape counts a at size index j, with
    as many shared micro-batches as the canonical packing makes of them (`costs.pack_tokens`:
    three 48,600-token videos in 78,848-token micro-batches take three, where their tokens alone
    ask for two): the exact price of the part, but for rings. Remembered: the column generation
    asks for the same parts again and again."""

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
            found = self.known[key] = float(group_estimate(self.table, float(a @ self.base[:, j]), tok,
                                                           float(a @ self.short_pairs[:, j]), j, bins))
        return found


def _top_up(estimate: _Estimates, j: int, jq: int, a1: np.ndarray, a2: np.ndarray, y: np.ndarray, theta: float,
            counts: np.ndarray, ok1: np.ndarray, ok2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The column with samples added while its parts' estimates sum within theta: one at a time,
    of the shape (the batch holding more of it) of most dual value per second of its marginal
    time at the part's size, to the own part or one to each subgroup (p / q of the shape), the
    next densest where the estimate does not fit (`knobs.NESTED_TRIES` each time)."""
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
    """The column's parts cut until their estimates sum within theta: one sample of the shape
    with the least dual value per second of additive weight out at a time (of either part)."""
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


def _fill(cols: list[Column], kinds: list[tuple[int, np.ndarray, np.ndarray]], copies: list[int],
          shapes: Shapes, sizes: Sequence[int]) -> list[Nested]:
    """Each column's copies as groups, drawing the samples of each shape in turn (a column may
    hold more of a shape than are left: the integer program covers at least every sample)."""
    pool = [list(m) for m in shapes.members]
    out: list[Nested] = []
    for (j, _), (jq, a1, a2), n in zip(cols, kinds, copies, strict=True):
        for _ in range(n):
            own = draw(pool, a1)
            parts = [draw(pool, a2) for _ in range(sizes[j] // sizes[jq])] if jq != j and a2.any() else []
            if own or any(parts):
                out.append(Nested(j, own, jq, parts))
    return out


def _candidate(groups: list[Nested], table: CostTable, cm: CostModel) -> Candidate:
    """The groups laid out aligned, largest first, each group's part with the longest sample (its
    own or a subgroup's) last: its backward pass at the step's end hides the gradient reductions
    (own parts last throughout, Open-Sora's 512 on 256 GPUs, batch 1, exposed 0.030 s of them
    against 0.015 s the other way; and 2,048 on 1,024, batch 4, a group whose own part was one
    0.014 s video after 0.44 s of subgroups exposed 0.041 s: 0.8626 s against 0.8216 s busy)."""
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
