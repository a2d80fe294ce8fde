"""One option dataclass per strategy (Alpa-style), instead of string flags threaded through."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class StrategyOptions:
    sp_sizes: tuple[int, ...] | None = None
    """Allowed SP sizes; None: every aligned power of two dividing the model's (KV) heads."""

    name = "base"


@dataclass(frozen=True, kw_only=True)
class BucketOptions(StrategyOptions):
    """Bucket parallel: one static SP size (the smallest that fits the batch's longest sample),
    a batch size per length bucket, full checkpointing, no balancing across groups."""

    name = "bucket"


@dataclass(frozen=True, kw_only=True)
class PackedOptions(StrategyOptions):
    """Static SP size, samples packed to a fixed token budget per micro-batch."""

    token_budget: int | None = None
    """Tokens per micro-batch; None: the most that fit at the static SP size fully checkpointed."""
    name = "packed"


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
