"""torch glue for the global-batch sampler: a DataLoader that yields each rank's LocalBatch, and
a cross-rank check (or broadcast) of the step's plan. Imports torch lazily, only when called;
`dcp.data` itself never imports this module.

Typical torchrun loop (every rank builds the same sampler with the same seed)::

    sampler = GlobalBatchSampler(lengths, cost_model, dataset=ds, token_budget=65536, seed=0)
    loader = planned_loader(ds, sampler, rank=dist.get_rank(), num_workers=2)
    for local in loader:                       # LocalBatch: plan + this group's items by id
        plan = agree_on_plan(local.plan)       # same digest on every rank, or a clear error
        ...run plan for this rank...
        ckpt["sampler"] = sampler.state_dict_after(local)   # exact resume point
"""

from __future__ import annotations

from typing import Any

from dcp.data.local import LocalBatch, PlannedDataset, collate_local
from dcp.data.sampler import GlobalBatchSampler
from dcp.planner.plan import Plan, PlanError


class PlanMismatchError(PlanError):
    """Ranks hold different plans for the same step (a non-deterministic planner?)."""


def planned_loader(dataset: Any, sampler: GlobalBatchSampler, rank: int | None, **kwargs: Any) -> Any:
    """A torch DataLoader yielding one `LocalBatch` per step for `rank` (None: the whole batch).

    kwargs go to DataLoader (num_workers, pin_memory, prefetch_factor, ...); items load in its
    workers while plans are made in the sampler's planner processes."""
    from torch.utils.data import DataLoader

    for banned in ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last", "collate_fn"):
        if banned in kwargs:
            raise TypeError(f"planned_loader sets {banned} itself (batches come from the sampler)")
    return DataLoader(PlannedDataset(dataset), batch_sampler=sampler.for_rank(rank),
                      collate_fn=collate_local, **kwargs)


def agree_on_plan(plan: Plan, *, broadcast: bool = False, group: Any = None) -> Plan:
    """Make sure every rank runs the same plan.

    broadcast=False: compare `Plan.digest()` across ranks and raise PlanMismatchError naming the
    ranks that differ. broadcast=True: every rank takes rank 0's plan (for planners that are not
    deterministic, such as a time-limited ILP). Without an initialized process group, a no-op."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return plan
    if broadcast:
        box: list[Any] = [plan.to_dict() if dist.get_rank() == 0 else None]
        src = dist.get_global_rank(group, 0) if group is not None else 0
        dist.broadcast_object_list(box, src=src, group=group)
        return Plan.from_dict(box[0])
    digests: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(digests, plan.digest(), group=group)
    if len(set(digests)) > 1:
        differ = [r for r, d in enumerate(digests) if d != digests[0]]
        raise PlanMismatchError(f"ranks {differ} hold a different plan than rank 0 for the same step "
                                f"(digests {digests[0][:12]} vs {digests[differ[0]][:12]}); use a "
                                "deterministic strategy or agree_on_plan(plan, broadcast=True)")
    return plan


__all__ = ["LocalBatch", "PlanMismatchError", "agree_on_plan", "planned_loader"]
