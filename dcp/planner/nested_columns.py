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
knapsacks over every room at once (`columns.knapsack`, on the additive weights
`CostTable.add` in steps of theta / `UNITS`): per size p, the best column that does not split
and the best that splits into each smaller size q (the room split between a1 at p and p / q
copies of a2 at q, each shape's count divided by p / q), priced twice: with one whole fixed cost
charged to each part (it runs at least one micro-batch; the token shares alone priced a part of
one short video at a tenth of it), and with the token shares alone, the column then cut until
its parts fit (`_cut`). The integer program over the columns found (`columns.integer_plan`)
gives the groups, laid out aligned (the largest first): the subgroups as the plan's first
phase, the groups whole as its second (`backfill.assemble_candidate`, on the executor's
schedule: a group starts when its subgroups have all ended). Its own part holds its longest
samples, whose backward passes at the step's end hide the gradient reductions (the other order
exposed twice as much of them: 0.030 s against 0.015 s on batch 1).

`nested_column_plan` tries levels upward from the bound of every plan's busy time until one
gives a plan (columns of a level fit every level above it, and start its program), then bisects
below it, while its deadline lasts, and returns the fastest plan priced. A level takes 0.1-0.5 s
at 512 videos on 256 GPUs, its integer program up to a second more near the bound, so the phase
search (`dcp.planner.phases`) runs it only when the time limit leaves it 1.5 s. Never imports
torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dcp.costmodel import CostModel
from dcp.planner.backfill import Candidate, assemble_candidate
from dcp.planner.ilp.budget import Deadline
from dcp.planner.ilp.columns import Shapes, draw, integer_plan, knapsack, master_at, shapes_of
from dcp.planner.ilp.costs import CostTable, batch_costs, form_microbatches, pack_tokens
from dcp.planner.ilp.pack import group_estimate, place
from dcp.planner.plan import Plan
from dcp.planner.pricing import BatchArrays, Pricer
from dcp.planner.sample import Sample

LEVELS = (1.02, 1.03, 1.045, 1.07)
"""Levels tried upward, as multiples of the bound of every plan's busy time, until one gives a
plan (Open-Sora, 512 on 256 GPUs: the first plans come at 1.018-1.035, by batch)..."""
SPLITS = 3
"""...then levels halfway between the highest without a plan and the lowest with one, at most
this many, while the time lasts."""
MAX_ROUNDS = 40
"""Column-generation rounds per level at most."""
UNITS = 500
"""Knapsack weights in steps of theta / UNITS (the single-layout program's `columns.UNITS`:
1,000; the nested pricing runs three times as many knapsacks)."""


NestedColumn = tuple[int, int, np.ndarray, np.ndarray]
"""A nested configuration: the size index of its group and of its subgroups (the same where it
does not split), its own part's shape counts and each subgroup's."""


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
                       costs: tuple[Pricer, CostTable] | None = None, deadline_s: float = float("inf")) -> Plan | None:
    """The fastest nested plan found (module docstring) by `deadline_s` (perf_counter), priced and
    validated; None when the batch has more shapes than the column program takes, a single size
    is allowed, ZeRO stage 3 runs one layout, or no level gives a plan in time."""
    if len(sizes) < 2 or cm.training.zero_stage == 3 or len(batch) < 2:
        return None
    arrays = arrays if arrays is not None else BatchArrays.of(batch)
    pricer, table = costs if costs is not None else batch_costs(arrays, cm, sizes)
    shapes = shapes_of(table)
    if shapes is None:
        return None
    deadline = Deadline(deadline_s)
    best: Plan | None = None
    pool: list[NestedColumn] = []  # every level's columns, for the next

    def tried(theta: float) -> bool:
        nonlocal best
        groups = plan_at(table, shapes, cm.cluster.num_gpus, theta, deadline, pool)
        if groups is None:
            return False
        cand = _candidate(groups, table, cm)
        if max_microbatches is not None and max(len(mbs) for _, _, mbs in cand.first + cand.second) > max_microbatches:
            return False
        plan = assemble_candidate(batch, cm, arrays, pricer, cand)
        if best is None or plan.step_time_s < best.step_time_s:
            best = plan
        return True

    lo, hi = busy_floor_s, None
    for level in LEVELS:
        if deadline.passed():
            return best
        if tried(busy_floor_s * level):
            hi = busy_floor_s * level
            break
        lo = busy_floor_s * level
    for _ in range(SPLITS):
        if hi is None or deadline.passed():
            break
        theta = (lo + hi) / 2
        lo, hi = (lo, theta) if tried(theta) else (theta, hi)
    return best


def plan_at(table: CostTable, shapes: Shapes, num_gpus: int, theta: float, deadline: Deadline,
            pool: list[NestedColumn] | None = None) -> list[Nested] | None:
    """Nested groups within theta by the additive estimates (module docstring), from the integer
    program over the columns generated at theta: those the fractional optimum uses and the
    single-sample ones first, then all of them; None when the fractional program needs more GPUs
    than the cluster's, the integer program finds no plan, or the deadline passes. `pool` holds
    columns of other levels (those that fit theta start the program) and takes this level's."""
    program = _Program(table, shapes, num_gpus, theta, pool)
    if program.generate(deadline) is not True:
        return None
    copies = integer_plan(program.master, shapes, num_gpus, deadline)
    return None if copies is None else _fill(program.master.cols, program.kinds, copies.tolist(), shapes, table.sizes)


class _Program:
    """The program over nested columns at theta, its columns and how each splits."""

    def __init__(self, table: CostTable, shapes: Shapes, num_gpus: int, theta: float,
                 pool: list[NestedColumn] | None) -> None:
        self.table, self.shapes, self.num_gpus, self.theta, self.pool = table, shapes, num_gpus, theta, pool
        sizes, rows = table.sizes, shapes.first
        self.ok = [(table.ckpt[rows, j] >= 0) & (table.solo[rows, j] <= theta) for j in range(len(sizes))]
        self.master = master_at(table, shapes, theta)  # the single-sample columns, which do not split
        self.kinds: list[tuple[int, np.ndarray, np.ndarray]] = [(j, a, np.zeros_like(a)) for j, a in self.master.cols]
        """Per column: the size index it splits into (its own where it does not), its own part and
        each subgroup's."""
        # Each part's one whole fixed cost, in knapsack units (the additive weights charge each
        # sample its token share of it: a part of one short video would be priced at a tenth of it).
        self.fixed = [min(int(np.ceil(float(table.fixed0[j]) / theta * UNITS - 1e-9)), UNITS) for j in range(len(sizes))]
        if pool is not None:  # the columns of other levels that fit this one by the estimate
            for j, jq, a1, a2 in pool:
                if (self.ok[j][a1 > 0].all() and self.ok[jq][a2 > 0].all()
                        and _part_estimate(table, rows, j, a1) + _part_estimate(table, rows, jq, a2) <= theta):
                    self.add(j, jq, a1, a2, keep=False)

    def add(self, j: int, jq: int, a1: np.ndarray, a2: np.ndarray, keep: bool = True) -> bool:
        if self.master.add(j, a1 + self.table.sizes[j] // self.table.sizes[jq] * a2):
            self.kinds.append((jq, a1, a2))
            if keep and self.pool is not None:
                self.pool.append((j, jq, a1, a2))
            return True
        return False

    def generate(self, deadline: Deadline) -> bool | None:
        """Column generation: True when the fractional program fits the cluster, False when it
        provably needs more GPUs over the columns this pricing can find (Farley's bound), None
        when the rounds or the deadline run out first."""
        table, rows, sizes, theta = self.table, self.shapes.first, self.table.sizes, self.theta
        counts, n = self.shapes.counts, self.num_gpus
        for _ in range(MAX_ROUNDS):
            if deadline.passed():
                return None
            solved = self.master.solve(deadline)
            if solved is None:
                return None
            gpus, y = solved
            added, ratio = False, 0.0
            plain = [knapsack(y, table.add[rows, j], theta, counts, self.ok[j], True, UNITS) for j in range(len(sizes))]
            seconds: dict[tuple[int, int], tuple[np.ndarray, Callable[[int], np.ndarray]]] = {}
            for j, p in enumerate(sizes):
                values, taken = plain[j]
                for whole in (True, False):
                    # Two pricings: each part charged one whole fixed cost beside its samples'
                    # token shares (it runs at least one micro-batch), and the token shares alone,
                    # the column then cut until its parts' estimates fit (`_cut`). Per size, the
                    # best column that does not split and the best that splits into each smaller
                    # size (its own part within c units, each subgroup within the rest).
                    room = UNITS - self.fixed[j] if whole else UNITS
                    found = [(float(values[room]), j, room, None, 0)]
                    for jq, q in enumerate(sizes):
                        rest = room - self.fixed[jq] if whole else room
                        if q >= p or rest < 0:
                            continue
                        r = p // q
                        if (jq, r) not in seconds:
                            seconds[jq, r] = knapsack(y, table.add[rows, jq], theta, counts // r, self.ok[jq], True, UNITS)
                        total = values[:rest + 1] + r * seconds[jq, r][0][rest::-1]
                        c = int(np.argmax(total))
                        if values[c] > 0:
                            found.append((float(total[c]), jq, c, (jq, r), rest - c))
                    for value, jq, c, second, left in found:
                        a1 = taken(c)
                        a2 = seconds[second][1](left) if second is not None else np.zeros_like(a1)
                        if not whole:
                            a1, a2 = _cut(table, rows, j, jq, a1, a2, y, theta)
                            value = float(a1 @ y + p // sizes[jq] * (a2 @ y))
                        ratio = max(ratio, value / p)
                        if value > p * (1 + 1e-7) and (a1.any() or a2.any()):
                            added |= self.add(j, jq, a1, a2)
            if gpus / max(ratio, 1.0) > n * (1 + 1e-9):
                return False  # Farley: y / ratio is dual feasible for every column this pricing finds
            if not added:
                return gpus <= n * (1 + 1e-9)
        return None


def _part_estimate(table: CostTable, rows: np.ndarray, j: int, a: np.ndarray) -> float:
    """The group estimate (`pack.group_estimate`) of `a` (counts of the shapes `rows`) at size
    index j, with as many shared micro-batches as the canonical packing makes of them
    (`costs.pack_tokens`: three 48,600-token videos in 78,848-token micro-batches take three,
    where their tokens alone ask for two): the exact price of the part, but for rings."""
    if not a.any():
        return 0.0
    short_tok, short_pairs, base = (x[rows, j] for x in table.estimate_terms())
    held = np.flatnonzero(a * short_tok)
    tokens = np.repeat(short_tok[held], a[held])
    bins = len(pack_tokens(tokens, np.arange(len(tokens)), float(table.cap0[j]))) if len(tokens) else 0
    return float(group_estimate(table, a @ base, a @ short_tok, a @ short_pairs, j, bins))


def _cut(table: CostTable, rows: np.ndarray, j: int, jq: int, a1: np.ndarray, a2: np.ndarray, y: np.ndarray,
         theta: float) -> tuple[np.ndarray, np.ndarray]:
    """The column's parts cut until their estimates sum within theta: one sample of the shape
    with the least dual value per second of additive weight out at a time (of either part)."""
    a1, a2 = a1.copy(), a2.copy()
    r = table.sizes[j] // table.sizes[jq]
    d1 = y / np.maximum(table.add[rows, j], 1e-30)
    d2 = r * y / np.maximum(table.add[rows, jq], 1e-30)
    while (a1.any() or a2.any()) and _part_estimate(table, rows, j, a1) + _part_estimate(table, rows, jq, a2) > theta:
        h1, h2 = np.flatnonzero(a1), np.flatnonzero(a2)
        k1 = h1[np.argmin(d1[h1])] if len(h1) else -1
        k2 = h2[np.argmin(d2[h2])] if len(h2) else -1
        if k2 < 0 or (k1 >= 0 and d1[k1] <= d2[k2]):
            a1[k1] -= 1
        else:
            a2[k2] -= 1
    return a1, a2


def _fill(cols: list[tuple[int, np.ndarray]], kinds: list[tuple[int, np.ndarray, np.ndarray]], copies: list[int],
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
    """The groups laid out aligned, largest first: the subgroups in the first phase, the
    groups' own parts after them (they hold the longest samples, whose backward passes at the
    step's end hide the gradient reductions: in the other order Open-Sora's 512 on 256 GPUs,
    batch 1, exposed 0.030 s of them against 0.015 s)."""
    sizes = table.sizes
    whole, split = [], []
    for start, p, g in place([(sizes[g.j], g) for g in groups], cm.cluster):
        if g.own:
            whole.append((start, p, form_microbatches(g.own, g.j, table, cm)))
        q = sizes[g.jq]
        for k, ids in enumerate(g.parts):
            if ids:
                split.append((start + k * q, q, form_microbatches(ids, g.jq, table, cm)))
    return Candidate(split, whole, 0.0, False)
