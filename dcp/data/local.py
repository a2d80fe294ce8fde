"""What one rank loads for a step: the samples its SP groups run, fetched from the dataset.

Every rank of an SP group loads the whole of each of its samples (the executor then keeps its
sequence shard), so `local_samples` is per group (per phase), not per rank. Never imports torch: a
`PlannedDataset` is a plain map-style dataset that torch's DataLoader accepts as is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dcp.planner.plan import Plan


def local_samples(plan: Plan, rank: int) -> list[int]:
    """Ids of the samples `rank`'s groups run, phase by phase, micro-batch by micro-batch (empty
    if idle)."""
    if not 0 <= rank < plan.num_gpus:
        raise ValueError(f"rank {rank} outside the plan's {plan.num_gpus} GPUs")
    return [i for group in plan.groups_of_rank(rank) for mb in group.microbatches for i in mb.samples]


def fetch_items(dataset: Any, ids: Sequence[int]) -> dict[int, Any]:
    """Dataset items by sample id (`dataset[i]` for each id)."""
    return {int(i): dataset[int(i)] for i in ids}


@dataclass
class LocalBatch:
    """One step as a rank's executor needs it: the plan, and its group's items by sample id."""

    epoch: int
    step: int
    rank: int | None
    plan: Plan
    items: dict[int, Any]
    plan_wait_s: float


class PlannedDataset:
    """Wraps a map-style dataset so a DataLoader whose batch_sampler is
    `GlobalBatchSampler.for_rank(rank)` yields `LocalBatch`es (with `collate_fn=collate_local`).

    torch's map-style fetcher hands the whole index list to `__getitems__`, and the list the
    sampler yields carries the step's plan, so plan and items travel together through workers.
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: Sequence[int]) -> LocalBatch:
        batch = getattr(indices, "batch", None)
        if batch is None:
            raise TypeError("PlannedDataset needs the index lists of GlobalBatchSampler.for_rank(rank) "
                            f"as its batch_sampler, got a plain {type(indices).__name__}")
        return LocalBatch(batch.epoch, batch.step, getattr(indices, "rank", None), batch.plan,
                          fetch_items(self.dataset, indices), batch.plan_wait_s)


def collate_local(batch: LocalBatch) -> LocalBatch:
    """DataLoader collate_fn for PlannedDataset: the LocalBatch is already the step's input."""
    return batch
