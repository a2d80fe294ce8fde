"""Checks that keep ranks from hanging: bad plans fail before any collective, and ranks agree on
one plan (hash compared across ranks) before the first all-to-all."""

from __future__ import annotations

import torch.distributed as dist

from dcp.executor.parallel_state import ParallelState
from dcp.executor.ulysses import ulysses_heads_error
from dcp.planner.plan import Plan, PlanError


class ExecutorError(RuntimeError):
    """The executor cannot run a step: bad plan, missing data, or ranks that disagree."""


def check_plan(plan: Plan, state: ParallelState, num_layers: int, heads: tuple[int, int] | None,
               zero_stage: int | None = None) -> None:
    """Raise ExecutorError if the plan cannot run here. Looks only at the plan and the model, so
    every rank holding the same plan raises the same error, before issuing any collective. A
    plan priced for another ZeRO stage is refused: its memory and step assume that stage's
    schedule (a stage-3 plan's micro-batches do not fit next to stage 1's whole replicas)."""
    if plan.num_gpus != state.world_size:
        raise ExecutorError(f"plan is for {plan.num_gpus} GPUs but this job has {state.world_size} ranks")
    if zero_stage is not None and plan.zero_stage is not None and plan.zero_stage != zero_stage:
        raise ExecutorError(f"plan was made for ZeRO stage {plan.zero_stage} (its memory and step time assume it), "
                            f"but the executor runs stage {zero_stage}: plan with the executor's stage")
    try:
        plan.validate()
    except PlanError as e:
        raise ExecutorError(f"plan does not validate: {e}") from e
    if zero_stage == 3 and plan.num_phases > 1:
        raise ExecutorError(f"plan has {plan.num_phases} phases, but ZeRO stage 3 runs the plan's micro-batch slots "
                            "in lockstep over one layout: plan with max_phases=1 at stage 3")
    if plan.num_layers != num_layers:
        raise ExecutorError(f"plan is for a model of {plan.num_layers} layers, this model has {num_layers}")
    if heads is not None:
        h, kv = heads
        for gi, g in enumerate(plan.groups):
            problem = ulysses_heads_error(h, kv, g.ulysses)
            if problem:
                raise ExecutorError(f"group {gi} (ranks {g.ranks}) has SP size {g.sp} as Ulysses {g.ulysses} x ring "
                                    f"{g.ring}: {problem} (Ulysses shards heads; a ring can take the rest)")


def agree_on_plan(plan: Plan, state: ParallelState, local_error: str | None = None,
                  extra: object = None) -> list[object]:
    """One small all-gather of (plan digest, this rank's error or None, `extra`). Every rank then
    raises the same ExecutorError if any rank had an error or any plan differs from rank 0's, so
    a problem seen by one rank stops all of them instead of leaving the others in a collective.
    Returns every rank's `extra`, in rank order."""
    try:
        digest = plan.digest()
    except Exception as e:  # a plan too broken to hash is that rank's error, not a crash before the gather
        digest, local_error = "", local_error or f"plan cannot be hashed ({type(e).__name__}: {e})"
    mine = (digest, local_error, extra)
    if state.world_size == 1:
        everyone = [mine]
    else:
        everyone = [None] * state.world_size
        dist.all_gather_object(everyone, mine)
    by_error: dict[str, list[int]] = {}
    for r, (_, err, _) in enumerate(everyone):
        if err:
            by_error.setdefault(err, []).append(r)
    if by_error:
        raise ExecutorError("cannot run the step; " + "; ".join(
            f"{_ranks(ranks, state.world_size)}: {err}" for err, ranks in by_error.items()))
    differ = [r for r, (d, _, _) in enumerate(everyone) if d != everyone[0][0]]
    if differ:
        raise ExecutorError(f"ranks disagree on the plan: rank(s) {differ} hold a plan whose digest differs "
                            f"from rank 0's ({everyone[0][0][:12]}); plan on rank 0 and broadcast it "
                            "(broadcast_plan) or plan deterministically")
    return [e for _, _, e in everyone]


def _ranks(ranks: list[int], world_size: int) -> str:
    if len(ranks) == world_size > 1:
        return "every rank"
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def broadcast_plan(plan: Plan | None, state: ParallelState, src: int = 0) -> Plan:
    """Rank `src` sends its plan (as JSON) to every rank; the others pass None."""
    box = [plan.to_json() if state.rank == src and plan is not None else None]
    if state.world_size > 1:
        dist.broadcast_object_list(box, src=src)
    if box[0] is None:
        raise ExecutorError(f"rank {src} had no plan to broadcast")
    return Plan.from_json(box[0])
