"""One option dataclass per strategy (Alpa-style), instead of string flags threaded through."""

from __future__ import annotations

from dataclasses import dataclass

SOLVERS = ("highs", "cbc")
"""MILP solvers the ILP planner can use through PuLP."""


@dataclass(frozen=True, kw_only=True)
class StrategyOptions:
    sp_sizes: tuple[int, ...] | None = None
    """Allowed SP sizes; None: every aligned power of two dividing the model's (KV) heads."""

    name = "base"


def _check_static_sp(static_sp: int | None) -> None:
    if static_sp is not None and (static_sp < 1 or static_sp & (static_sp - 1)):
        raise ValueError(f"static_sp must be a power of two, got {static_sp}")


@dataclass(frozen=True, kw_only=True)
class BucketOptions(StrategyOptions):
    """Bucket parallel: one static SP size (the smallest that fits the batch's longest sample),
    a batch size per length bucket, full checkpointing, no balancing across groups."""

    static_sp: int | None = None
    """SP size fixed for the whole training, as the DCP paper's bucket parallel chooses it (the
    smallest that fits the dataset's longest sample, see `baselines.smallest_fitting_sp`);
    None: the smallest that fits this batch's longest sample."""
    name = "bucket"

    def __post_init__(self) -> None:
        _check_static_sp(self.static_sp)


@dataclass(frozen=True, kw_only=True)
class PackedOptions(StrategyOptions):
    """Static SP size, samples packed to a fixed token budget per micro-batch."""

    token_budget: int | None = None
    """Tokens per micro-batch; None: the most that fit at the static SP size fully checkpointed."""
    static_sp: int | None = None
    """SP size fixed for the whole training; None: the smallest that fits the batch's longest sample."""
    name = "packed"

    def __post_init__(self) -> None:
        _check_static_sp(self.static_sp)


@dataclass(frozen=True, kw_only=True)
class GreedyOptions(StrategyOptions):
    """The DCP paper's runtime: per length bucket a profiled (SP size, batch size), groups filled
    greedily, accumulation balanced across groups; pyramid checkpointing when `pyramid`."""

    pyramid: bool = True
    """Fewest checkpointed layers that fit per micro-batch (DCP-intra); False: all layers (DCP-inter)."""
    name = "dcp-greedy"


@dataclass(frozen=True, kw_only=True)
class IlpOptions(StrategyOptions):
    """The exact planner: a mixed-integer program over group sizes, assignment and checkpointing."""

    time_limit_s: float = 1.0
    """Solver wall-clock limit; the best incumbent is returned with its gap."""
    solver: str = "highs"
    """highs (highspy, in-process) or cbc (bundled with PuLP)."""
    mip_rel_gap: float = 0.005
    """Stop when the proven gap is below this fraction."""
    max_microbatches: int | None = None
    """Cap on micro-batches per group; None: no cap."""
    name = "ilp"

    def __post_init__(self) -> None:
        if self.solver not in SOLVERS:
            raise ValueError(f"unknown MILP solver {self.solver!r}; expected one of {SOLVERS}")
        if not self.time_limit_s > 0:
            raise ValueError(f"ILP time limit must be positive, got {self.time_limit_s}")
        if not self.mip_rel_gap >= 0:
            raise ValueError(f"mip_rel_gap must be >= 0, got {self.mip_rel_gap}")
        if self.max_microbatches is not None and self.max_microbatches < 1:
            raise ValueError(f"max_microbatches must be at least 1, got {self.max_microbatches}")
