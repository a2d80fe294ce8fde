"""A plan's step priced on the executor's schedule (dcp.costmodel.schedule): `price_step` sets
`grad_sync_s` to what the schedule adds beyond the busy time, so makespan bounds plus
`grad_sync_s()` stay bounds. Stage 3's slots go longest first (best, by an exchange argument); at
stages 0-2 a group's longest micro-batch moves last where faster (its backward hides reductions).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from dcp.costmodel import CostModel
from dcp.costmodel.schedule import GroupShape, MicroBatchShape, StepPrice
from dcp.planner.plan import MicroBatch, Plan, PlanError
from dcp.planner.pricing import Layout, PricedLayout, group_layout

T = TypeVar("T")


def group_shapes(plan: Plan, *, ends_only: bool = False,
                 moves: Sequence[int | None] | None = None) -> tuple[list[GroupShape], bool]:
    """The plan's groups as the schedule sees them, and whether some rank is idle. `ends_only`: each
    group's last micro-batch only (after `moves`), all the stage-0-2 closed form reads."""
    by_id = plan.sample_map()

    def shape(mb: MicroBatch) -> MicroBatchShape:
        return MicroBatchShape(sum(by_id[i].tokens for i in mb.samples), sum(by_id[i].attn_pairs for i in mb.samples),
                               mb.ckpt_layers)

    shapes = []
    for gi, g in enumerate(plan.groups):
        mbs = _moved(g.microbatches, moves[gi] if moves is not None else None)
        held = mbs[-1:] if ends_only else mbs
        shapes.append(GroupShape(g.sp, tuple(shape(mb) for mb in held), group_layout(g)))
    covered = sum(len(g.ranks) for g in plan.groups)
    return shapes, covered < plan.num_gpus


def balance_slots(plan: Plan) -> None:
    """Order every group's micro-batches longest first (stage 3's lockstep slots)."""
    for g in plan.groups:
        g.microbatches.sort(key=lambda mb: -mb.time_s)


def _longest_moves(plan: Plan) -> list[int | None]:
    """Stages 0-2: per group, its longest micro-batch if not already last (else None)."""
    return [_longest_of([mb.time_s for mb in g.microbatches]) for g in plan.groups]


def longest_last(microbatches: Sequence[MicroBatch]) -> list[MicroBatch]:
    """A group's micro-batches, the longest moved last (what `price_step` tries)."""
    return _moved(microbatches, _longest_of([mb.time_s for mb in microbatches]))


def _longest_of(times: Sequence[float]) -> int | None:
    """The index of the longest of a group's micro-batch times if it is not the last (else None)."""
    if not times:
        return None
    k = max(range(len(times)), key=lambda i: (times[i], i))
    return k if times[k] > times[-1] else None


def _moved(items: Sequence[T], k: int | None) -> list[T]:
    """`items` with item k moved to the end (unchanged for None)."""
    return list(items) if k is None else [*items[:k], *items[k + 1:], items[k]]


def _apply(plan: Plan, moves: Sequence[int | None]) -> None:
    for g, k in zip(plan.groups, moves, strict=True):
        g.microbatches = _moved(g.microbatches, k)


def price_step(plan: Plan, cm: CostModel, *, spans: bool = False) -> StepPrice:
    """Set the plan's step time, gradient sync and ZeRO stage from the executor's schedule; returns
    the priced step (with spans if asked; a multi-phase plan via `phased_step_s`, without)."""
    stage, phased = cm.training.zero_stage, plan.num_phases > 1
    if phased and stage == 3:
        raise PlanError("ZeRO stage 3 runs one layout (lockstep slots): no multi-phase plans")
    if stage == 3:
        balance_slots(plan)
    ends_only = stage < 3 and (phased or not spans)  # the closed form reads only the last micro-batches
    busy_s = [g.busy_s for g in plan.groups]  # summed once: the starts and the step read them
    starts = plan.group_starts_s(busy_s) if phased else None
    busy = plan.busy_s(busy_s)

    def priced(moves: Sequence[int | None] | None) -> StepPrice:
        shapes, idle = group_shapes(plan, ends_only=ends_only, moves=moves)
        if phased:
            return StepPrice(phased_step_s(plan, cm, shapes, starts, busy_s), busy, None)
        return cm.step_price(shapes, idle, spans=spans, busy_s=busy_s)

    price = priced(None)
    moves = _longest_moves(plan) if stage < 3 else []
    if any(k is not None for k in moves):
        other = priced(moves)
        if other.step_time_s < price.step_time_s:
            _apply(plan, moves)
            price = other
            busy = plan.busy_s()  # summed in the new order, as the plan's readers sum it
    plan.step_time_s = max(price.step_time_s, busy)
    plan.grad_sync_s = plan.step_time_s - busy
    plan.zero_stage = stage
    return StepPrice(plan.step_time_s, busy, None) if phased else price


def layout_step_s(cm: CostModel, layout: Layout, priced: PricedLayout, idle_ranks: bool) -> float:
    """The step (s) `price_step` would give a priced layout's plan, without assembling it (the ILP's
    incumbent); stages 0-2 read only busy times and last (or longest) micro-batches."""
    assert priced.pairs is not None
    lockstep = cm.training.zero_stage == 3
    last, longest, m = [], [], 0
    for (_, p, _), count, sp_layout in zip(layout, priced.counts, priced.layouts, strict=True):
        held = [i for i in range(m, m + count) if priced.tokens[i] > 0]
        m += count

        def shape(i: int) -> MicroBatchShape:
            return MicroBatchShape(float(priced.tokens[i]), float(priced.pairs[i]), int(priced.levels[i]))

        if lockstep:  # every slot counts, longest first (as balance_slots orders them)
            held.sort(key=lambda i: -float(priced.times_s[i]))
            last.append(GroupShape(p, tuple(shape(i) for i in held), sp_layout))
            continue
        last.append(GroupShape(p, (shape(held[-1]),) if held else (), sp_layout))
        k = _longest_of([float(priced.times_s[i]) for i in held])
        longest.append(last[-1] if k is None else GroupShape(p, (shape(held[k]),), sp_layout))
    busy = [float(b) for b in priced.busy_s]
    step = cm.step_price(last, idle_ranks, busy_s=busy).step_time_s
    if longest and any(a is not b for a, b in zip(last, longest, strict=True)):
        step = min(step, cm.step_price(longest, idle_ranks, busy_s=busy).step_time_s)
    return max(step, max(busy, default=0.0))


def phased_step_s(plan: Plan, cm: CostModel, shapes: Sequence[GroupShape] | None = None,
                  starts: Sequence[float] | None = None, busy: Sequence[float] | None = None) -> float:
    """A multi-phase plan's step (s) at stages 0-2: the schedule on each rank's last group, ending
    on the phases' timeline (where a member goes on, an empty-pass reduction prices the same)."""
    finals = list(plan.closing_groups())
    shapes = group_shapes(plan, ends_only=True)[0] if shapes is None else shapes
    busy = [g.busy_s for g in plan.groups] if busy is None else busy
    starts = plan.group_starts_s(busy) if starts is None else starts
    return cm.step_price([shapes[gi] for gi in finals],
                         busy_s=[starts[gi] + busy[gi] for gi in finals]).step_time_s
