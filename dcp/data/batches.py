"""Global batches of a workload for a cost model's attention kind: what `dcp plan`, the what-if
sweeps and the benchmarks plan."""

from __future__ import annotations

from dcp.costmodel import CostModel
from dcp.data.workloads import Workload, global_batches, load_workload
from dcp.planner.sample import Sample

DEFAULT_GLOBAL_BATCH = 512
"""Samples per global batch when neither a count nor a token budget is given."""


def make_batches(workload: str | Workload, cm: CostModel, *, global_batch: int | None = None,
                 global_tokens: int | None = None, steps: int | None = 10, seed: int = 0,
                 full_only: bool = False) -> list[list[Sample]]:
    """Global batches of a workload (or its spec), `global_batch` samples (default 512) or at most
    `global_tokens` tokens each, with attention pairs for the cost model's model; `full_only`:
    no partial last batch (see `dcp.data.workloads.global_batches`)."""
    if global_batch is None and global_tokens is None:
        global_batch = DEFAULT_GLOBAL_BATCH
    if isinstance(workload, str):
        workload = load_workload(workload, seed=seed)
    return global_batches(workload, cm.model.attention, batch_size=global_batch,
                          token_budget=global_tokens, steps=steps, seed=seed, full_only=full_only)
