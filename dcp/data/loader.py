"""torch glue for the global-batch sampler: a DataLoader that yields each rank's LocalBatch.
Imports torch only when called; `dcp.data` itself never imports this module.

Typical torchrun loop (every rank builds the same sampler with the same seed, so every rank
plans the same steps; `Executor.step` compares plan digests across ranks before running)::

    sampler = GlobalBatchSampler(lengths, cost_model, dataset=ds, token_budget=65536, seed=0)
    loader = planned_loader(ds, sampler, rank=dist.get_rank(), num_workers=2)
    for local in loader:                       # LocalBatch: plan + this group's items by id
        stats = executor.step(local.plan, local.items, loss_fn)
        ckpt["sampler"] = sampler.state_dict_after(local)   # exact resume point
"""

from __future__ import annotations

from typing import Any

from dcp.data.local import LocalBatch, PlannedDataset, collate_local
from dcp.data.sampler import GlobalBatchSampler


def planned_loader(dataset: Any, sampler: GlobalBatchSampler, rank: int | None, **kwargs: Any) -> Any:
    """A torch DataLoader yielding one `LocalBatch` per step for `rank` (None: the whole batch).

    kwargs go to DataLoader (num_workers, pin_memory, prefetch_factor, ...); items load in its
    workers while plans are made in the sampler's planner processes. The DataLoader draws steps
    ahead of training, so checkpoint `sampler.state_dict_after(local)`, not `state_dict()`."""
    from torch.utils.data import DataLoader

    for banned in ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last", "collate_fn"):
        if banned in kwargs:
            raise TypeError(f"planned_loader sets {banned} itself (batches come from the sampler)")
    return DataLoader(PlannedDataset(dataset), batch_sampler=sampler.for_rank(rank),
                      collate_fn=collate_local, **kwargs)


__all__ = ["LocalBatch", "planned_loader"]
