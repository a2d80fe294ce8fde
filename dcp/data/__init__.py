"""Length sources, built-in workloads and global batches (no torch)."""

from dcp.data.workloads import (
    Sample,
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
    "Sample", "Workload", "WorkloadError", "global_batches", "load_workload", "lognormal",
    "opensora", "read_lengths", "wikipedia",
]
