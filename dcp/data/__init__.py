"""Length sources, built-in workloads, global batches and the planned global-batch sampler (no torch).

The torch DataLoader glue lives in `dcp.data.loader`, imported only when asked for.
"""

from dcp.data.batches import make_batches
from dcp.data.local import LocalBatch, PlannedDataset, collate_local, fetch_items, local_samples
from dcp.data.prefetch import PlanAhead, PlanningError, SolvePlanner
from dcp.data.sampler import (
    GlobalBatchSampler,
    PlannedBatch,
    PlannedIndices,
    epoch_batches,
    unfittable_ids,
)
from dcp.data.workloads import (
    Workload,
    WorkloadError,
    global_batches,
    load_workload,
    lognormal,
    opensora,
    read_lengths,
    wikipedia,
)

__all__ = [
    "GlobalBatchSampler", "LocalBatch", "PlanAhead", "PlannedBatch", "PlannedDataset", "PlannedIndices",
    "PlanningError", "SolvePlanner", "Workload", "WorkloadError", "collate_local",
    "epoch_batches", "fetch_items", "global_batches", "load_workload", "local_samples", "lognormal", "make_batches",
    "opensora", "read_lengths", "unfittable_ids", "wikipedia",
]
