"""Pieces every strategy shares: the rank layout and plan assembly."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from dcp.costmodel import CostModel
from dcp.planner.plan import Group, InfeasibleError, MicroBatch, Plan, PlanError
from dcp.planner.pricing import BatchArrays, Layout, Pricer, price_layout
from dcp.planner.sample import Sample
from dcp.planner.sync import price_step


def aligned_layout(groups_per_size: dict[int, int], num_gpus: int) -> list[tuple[int, int]]:
    """(first rank, SP size) per group, largest first: aligned blocks that never cross a node."""
    starts, rank = [], 0
    for p in sorted(groups_per_size, reverse=True):
        for _ in range(groups_per_size[p]):
            starts.append((rank, p))
            rank += p
    if rank > num_gpus:
        raise ValueError(f"layout needs {rank} GPUs, only {num_gpus} exist")
    return starts


def assemble(strategy: str, batch: Sequence[Sample], cm: CostModel,
             layout: Sequence[tuple[int, int, Sequence[Sequence[int]]]], *, lower_bound_s: float = 0.0) -> Plan:
    """`assemble_indices` for micro-batches given as sample-id lists."""
    position = {s.id: k for k, s in enumerate(batch)}
    index_layout = [(start, p, [[position[i] for i in mb] for mb in mbs]) for start, p, mbs in layout]
    return assemble_indices(strategy, batch, cm, index_layout, lower_bound_s=lower_bound_s)


def assemble_indices(strategy: str, batch: Sequence[Sample], cm: CostModel, layout: Layout,
                     ckpt: Sequence[Sequence[int]] | None = None, *, started: float | None = None,
                     solver_status: str = "heuristic", lower_bound_s: float = 0.0, notes: Sequence[str] = (),
                     pricer: Pricer | None = None, arrays: BatchArrays | None = None, validate: bool = True,
                     step: bool = True) -> Plan:
    """A validated Plan from (first rank, SP size, micro-batches as batch indices), each at the
    fewest layers that fit or `ckpt`; empty ones dropped. `lower_bound_s`: the proven bound (0:
    none); `validate=False`: the caller validates; `step=False`: a multi-phase part, step
    unpriced."""
    arrays = arrays if arrays is not None else BatchArrays.of(batch)
    pricer = pricer or Pricer(cm, sorted({p for _, p, _ in layout}))
    priced = price_layout(layout, arrays, pricer, ckpt)
    ids = arrays.ids.tolist()
    k = cm.model.num_layers
    groups, m = [], 0
    for gi, (start, p, mbs) in enumerate(layout):
        sp = priced.layouts[gi]  # the Ulysses x ring split fastest for the group's micro-batches
        g = Group(list(range(start, start + p)), p, ring=sp.ring)
        r = priced.levels[m:m + len(mbs)]
        bad = np.flatnonzero(r > k)
        if len(bad):
            members = [ids[i] for i in mbs[int(bad[0])]]
            raise InfeasibleError(f"{strategy}: micro-batch of samples {members[:8]} ({int(priced.tokens[m + bad[0]])} "
                                  f"tokens) does not fit at SP size {p}" + (" with the given checkpointing" if ckpt else ""))
        memory = pricer.memory_bytes(p, priced.tokens[m:m + len(mbs)], r, sp).tolist()
        times = priced.times_s[m:m + len(mbs)].tolist()
        levels = r.tolist()
        g.microbatches = [MicroBatch([ids[i] for i in mb], levels[mi], times[mi], memory[mi])
                          for mi, mb in enumerate(mbs) if len(mb)]
        groups.append(g)
        m += len(mbs)
    plan = Plan(
        strategy=strategy, num_gpus=cm.cluster.num_gpus, gpus_per_node=cm.cluster.gpus_per_node,
        memory_limit_bytes=cm.cluster.memory_bytes, num_layers=cm.model.num_layers, samples=list(batch),
        groups=groups, step_time_s=0.0, lower_bound_s=lower_bound_s,
        solve_time_s=(time.perf_counter() - started) if started is not None else 0.0,
        solver_status=solver_status, notes=list(notes),
    )
    if step:
        price_step(plan, cm)  # the step as the executor's schedule runs it (dcp.planner.sync)
    return plan.validate() if validate else plan


def chain(strategy: str, batch: Sequence[Sample], plans: Sequence[Plan], cm: CostModel, *,
          mirror: Sequence[bool] = (), lower_bound_s: float = 0.0, copy: bool = True) -> Plan:
    """One plan running `plans` (parts of the batch) as phases in order, plan i on mirrored ranks
    where `mirror[i]`, priced by `sync.phased_step_s`; `copy=False` reuses micro-batches."""
    if cm.training.zero_stage == 3:
        raise PlanError("ZeRO stage 3 runs one layout (lockstep slots): no multi-phase plans")
    first = plans[0]
    groups, phase = [], 0
    for i, plan in enumerate(plans):
        flip = i < len(mirror) and mirror[i]
        for g in plan.groups:
            ranks = [first.num_gpus - 1 - r for r in reversed(g.ranks)] if flip else list(g.ranks)
            mbs = [MicroBatch(list(mb.samples), mb.ckpt_layers, mb.time_s, mb.memory_bytes) for mb in g.microbatches] \
                if copy else g.microbatches
            groups.append(Group(ranks, g.sp, mbs, ring=g.ring, phase=phase + g.phase))
        phase += plan.num_phases
    out = Plan(strategy=strategy, num_gpus=first.num_gpus, gpus_per_node=first.gpus_per_node,
               memory_limit_bytes=first.memory_limit_bytes, num_layers=first.num_layers, samples=list(batch),
               groups=groups, step_time_s=0.0, lower_bound_s=0.0, solver_status=first.solver_status)
    price_step(out, cm)
    out.lower_bound_s = min(lower_bound_s, out.step_time_s)
    return out.validate()
