"""Replay a plan on the cost model: a per-rank timeline (the executor's schedule as
dcp.costmodel.schedule prices it, micro-batches split into their parts, waits into idle and the
collective), idle and communication shares, a Gantt chart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from dcp.costmodel import CostModel, SPLayout
from dcp.planner.plan import Group, MicroBatch, Plan, PlanError
from dcp.planner.pricing import group_layout
from dcp.planner.sync import group_shapes, phased_step_s

EventKind = Literal["forward", "backward", "recompute", "all_to_all", "ring", "param_gather", "idle", "allreduce",
                    "contention"]
EVENT_KINDS: tuple[str, ...] = ("forward", "backward", "recompute", "all_to_all", "ring", "param_gather", "idle",
                                "allreduce", "contention")
COMM_KINDS = ("all_to_all", "ring", "param_gather", "allreduce")
"""`ring`: ring attention's point-to-point transfers its block attention does not hide. Not
`contention`: the compute a collective in flight slows (`HardwareProfile.overlap_slowdown`)."""
# Plan times and re-priced phase sums are the same floats added in different orders.
_RTOL = 1e-6


@dataclass(frozen=True)
class Event:
    """One stretch of a rank's step."""

    start_s: float
    end_s: float
    kind: EventKind
    microbatch: int | None = None
    """Index of the micro-batch in its group's list; None for idle and the all-reduce."""
    phase: int | None = None
    """The phase of the event's group (idle: of the group waited for); None at the step's end."""

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass
class Timeline:
    """A simulated step: every rank's events, and the shares that matter."""

    events: list[list[Event]]
    """events[rank]: that rank's events in time order, covering [0, step_time_s]."""
    step_time_s: float
    idle_fraction: float
    """Idle rank-seconds / (N * step time)."""
    comm_fraction: float
    """All-to-all, parameter-gather and gradient-reduction rank-seconds / (N * step time)."""
    busy_s: list[float] = field(default_factory=list)
    """Per rank: seconds running micro-batches (compute and all-to-alls)."""

    def seconds_by_kind(self) -> dict[str, float]:
        """Rank-seconds spent in each kind of event, summed over ranks."""
        out = dict.fromkeys(EVENT_KINDS, 0.0)
        for rank_events in self.events:
            for e in rank_events:
                out[e.kind] += e.end_s - e.start_s
        return out

    def stats(self) -> dict[str, float]:
        return {"step_time_s": self.step_time_s, "idle_fraction": self.idle_fraction,
                "comm_fraction": self.comm_fraction}

    def to_frame(self) -> Any:
        """One row per event (pandas DataFrame): rank, start/end/duration_s, kind, microbatch."""
        import pandas as pd

        rows = [{"rank": rank, "start_s": e.start_s, "end_s": e.end_s, "duration_s": e.duration_s,
                 "kind": e.kind, "microbatch": e.microbatch, "phase": e.phase}
                for rank, rank_events in enumerate(self.events) for e in rank_events]
        return pd.DataFrame(rows, columns=["rank", "start_s", "end_s", "duration_s", "kind", "microbatch", "phase"])


def _simulate_phases(plan: Plan, cm: CostModel) -> Timeline:
    """Multi-phase timeline: a group starts when its last rank frees (others idle), sync after."""
    per_rank: list[list[Event]] = [[] for _ in range(plan.num_gpus)]
    for g, start in sorted(zip(plan.groups, plan.group_starts_s(), strict=True), key=lambda x: x[0].phase):
        events = _group_events(plan, g, cm, start)
        for rank in g.ranks:
            free = per_rank[rank][-1].end_s if per_rank[rank] else 0.0
            if events and start > free:
                per_rank[rank].append(Event(free, start, "idle", None, g.phase))
            per_rank[rank].extend(events)  # a group's ranks run in lockstep
    ends = [rank_events[-1].end_s if rank_events else 0.0 for rank_events in per_rank]
    busy = [sum(e.duration_s for e in rank_events if e.kind != "idle") for rank_events in per_rank]
    compute_end = max(ends, default=0.0)
    step = max(phased_step_s(plan, cm), compute_end)  # the world's reductions, on the schedule
    sync = step - compute_end
    for rank, rank_events in enumerate(per_rank):
        if ends[rank] < compute_end:
            rank_events.append(Event(ends[rank], compute_end, "idle"))
        if sync > 0:
            rank_events.append(Event(compute_end, step, "allreduce"))
    return _shares(Timeline(per_rank, step, 0.0, 0.0, busy), plan)


def microbatch_phases(cm: CostModel, tokens: int, pairs: int, sp_size: int,
                      ckpt_layers: int, layout: SPLayout | None = None) -> list[tuple[EventKind, float]]:
    """(kind, seconds) of one micro-batch in run order, lumped per phase, summing to cm.time_s
    (checked); head, loss and fixed cost count as forward; `simulate` places ZeRO's collectives."""
    k, r, p = cm.model.num_layers, ckpt_layers, sp_size
    layout = layout or cm.best_layout([(tokens, pairs, r)], p)
    lt = cm.layer_times(tokens, pairs, p, layout)
    head = cm.head_s(tokens, p)
    phases: list[tuple[EventKind, float]] = [
        ("forward", k * lt.fwd_compute_s + head), ("all_to_all", k * lt.comm_s), ("ring", k * lt.ring_fwd_s),
        ("recompute", r * lt.rec_compute_s), ("all_to_all", r * lt.comm_s), ("ring", r * lt.ring_fwd_s),
        ("backward", k * lt.bwd_compute_s), ("all_to_all", k * lt.comm_s), ("ring", k * lt.ring_bwd_s),
    ]
    # The split is derived independently of linear_time; they must agree.
    total, expected = sum(s for _, s in phases), cm.time_s(tokens, pairs, p, r, layout)
    if abs(total - expected) > _RTOL * max(total, expected, 1e-12):
        raise PlanError(f"cost model's phase split {total:.6g} s differs from its micro-batch time {expected:.6g} s")
    return [(kind, s) for kind, s in phases if s > 0]


def _group_events(plan: Plan, g: Group, cm: CostModel, start_s: float = 0.0) -> list[Event]:
    tokens = {s.id: s.tokens for s in plan.samples}
    pairs = {s.id: s.attn_pairs for s in plan.samples}
    t, out = start_s, []
    for mi, mb in enumerate(g.microbatches):
        phases = microbatch_phases(cm, sum(tokens[i] for i in mb.samples),
                                   sum(pairs[i] for i in mb.samples), g.sp, mb.ckpt_layers, group_layout(g))
        _check_time(mb, sum(s for _, s in phases), g, mi)
        for kind, seconds in phases:
            out.append(Event(t, t + seconds, kind, mi, g.phase))
            t += seconds
    return out


def _check_time(mb: MicroBatch, priced_s: float, g: Group, mi: int) -> None:
    if abs(priced_s - mb.time_s) > _RTOL * max(priced_s, mb.time_s, 1e-12):
        raise PlanError(f"group at rank {g.ranks[0]} micro-batch {mi}: plan says {mb.time_s:.6g} s, the "
                        f"cost model prices it at {priced_s:.6g} s (plan made with another cost model?)")


def simulate(plan: Plan, cm: CostModel) -> Timeline:
    """Replay `plan` on `cm`; the step time equals plan.step_time_s (checked)."""
    if plan.num_gpus != cm.cluster.num_gpus:
        raise PlanError(f"plan is for {plan.num_gpus} GPUs, the cost model for {cm.cluster.num_gpus}")
    if plan.num_layers != cm.model.num_layers:
        raise PlanError(f"plan is for a model of {plan.num_layers} layers, the cost model's {cm.model.name} "
                        f"has {cm.model.num_layers}")
    if plan.num_phases > 1:
        return _simulate_phases(plan, cm)
    tokens = {s.id: s.tokens for s in plan.samples}
    pairs = {s.id: s.attn_pairs for s in plan.samples}
    for g in plan.groups:
        for mi, mb in enumerate(g.microbatches):
            priced = cm.time_s(sum(tokens[i] for i in mb.samples), sum(pairs[i] for i in mb.samples), g.sp,
                               mb.ckpt_layers, group_layout(g))
            _check_time(mb, priced, g, mi)
    shapes, idle = group_shapes(plan)
    price = cm.step_price(shapes, idle, spans=True)
    spans = price.replay.spans
    assert spans is not None
    idle_events = [Event(*span) for span in spans[-1]] if idle else []
    per_rank: list[list[Event]] = [list(idle_events) for _ in range(plan.num_gpus)]
    for g, group_spans in zip(plan.groups, spans, strict=False):
        events = [Event(*span) for span in group_spans]
        for rank in g.ranks:
            per_rank[rank] = list(events)  # a group's ranks run in lockstep
    step = price.step_time_s
    for rank_events in per_rank:
        end = rank_events[-1].end_s if rank_events else 0.0
        if end < step:
            rank_events.append(Event(end, step, "idle"))
    busy = [0.0] * plan.num_gpus
    for g in plan.groups:
        for rank in g.ranks:
            busy[rank] = g.busy_s
    return _shares(Timeline(per_rank, step, 0.0, 0.0, busy), plan)


def _shares(timeline: Timeline, plan: Plan) -> Timeline:
    """`timeline` with idle and communication fractions; PlanError if its step is not the plan's."""
    step = timeline.step_time_s
    if abs(step - plan.step_time_s) > _RTOL * max(step, 1.0):
        raise PlanError(f"simulated step {step:.6g} s differs from the plan's {plan.step_time_s:.6g} s")
    by_kind = timeline.seconds_by_kind()
    total = len(timeline.events) * timeline.step_time_s
    if total > 0:
        timeline.idle_fraction = by_kind["idle"] / total
        timeline.comm_fraction = sum(by_kind[k] for k in COMM_KINDS) / total
    return timeline


KIND_COLORS = {"forward": "#4c72b0", "backward": "#55a868", "recompute": "#dd8452",
               "all_to_all": "#c44e52", "ring": "#da8bc3", "param_gather": "#937860", "idle": "#dddddd", "allreduce": "#8172b3",
               "contention": "#ccb974"}


def gantt(timeline: Timeline, title: str = "") -> Any:
    """A Gantt chart (matplotlib Figure), one row per rank, colored by event kind; built on an Agg
    canvas without pyplot, so it works headless and leaves a notebook's backend alone."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    n = len(timeline.events)
    fig = Figure(figsize=(10, max(2.0, 0.25 * n + 1.5)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for rank, rank_events in enumerate(timeline.events):
        for kind in EVENT_KINDS:
            spans = [(e.start_s, e.duration_s) for e in rank_events if e.kind == kind]
            if spans:
                ax.broken_barh(spans, (rank - 0.4, 0.8), facecolors=KIND_COLORS[kind])
        # A multi-phase plan: a black tick where the rank moves on to its next phase's group.
        moves = [b.start_s for a, b in zip(rank_events, rank_events[1:], strict=False)
                 if b.phase is not None and a.phase is not None and b.phase != a.phase]
        if moves:
            ax.vlines(moves, rank - 0.45, rank + 0.45, colors="black", linewidth=1.0)
    ax.set_xlim(0, timeline.step_time_s or 1.0)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("rank")
    ax.set_title(title or f"step {timeline.step_time_s:.3f} s, idle {100 * timeline.idle_fraction:.1f}%, "
                          f"comm {100 * timeline.comm_fraction:.1f}%")
    ax.legend(handles=[Patch(color=KIND_COLORS[k], label=k) for k in EVENT_KINDS],
              loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=len(EVENT_KINDS), fontsize="small")
    fig.tight_layout()
    return fig
