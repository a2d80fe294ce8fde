"""One option dataclass per strategy (Alpa-style), instead of string flags threaded through."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

SOLVERS = ("highs", "cbc")
"""MILP solvers the ILP planner can use through PuLP."""


@dataclass(frozen=True, kw_only=True)
class StrategyOptions:
    sp_sizes: tuple[int, ...] | None = None
    """Allowed SP sizes; None: every aligned power of two dividing the model's (KV) heads."""

    name = "base"


DATASET = "dataset"
"""`static_sp=DATASET`: one SP size for the whole training, the smallest that fits the dataset's
longest sample fully checkpointed (the DCP paper's static baselines)."""


def _check_static(static_sp: int | str | None, dataset_longest_tokens: int | None) -> None:
    if static_sp == DATASET or static_sp is None:
        pass
    elif isinstance(static_sp, str) or static_sp < 1 or static_sp & (static_sp - 1):
        raise ValueError(f"static_sp must be a power of two, {DATASET!r} or None, got {static_sp!r}")
    if dataset_longest_tokens is not None and dataset_longest_tokens < 1:
        raise ValueError(f"dataset_longest_tokens must be positive, got {dataset_longest_tokens}")


@dataclass(frozen=True, kw_only=True)
class BucketOptions(StrategyOptions):
    """Bucket parallel: one static SP size, batch size per bucket, full checkpointing."""

    static_sp: int | str | None = None
    """A power of two fixed for the whole training; `DATASET` (strategy `bucket`): the smallest that
    fits `dataset_longest_tokens`; None (`bucket-per-batch`): the smallest that fits this batch."""
    dataset_longest_tokens: int | None = None
    """The training data's longest sample, for `static_sp=DATASET` (set by `run`, the sampler)."""
    name = "bucket"

    def __post_init__(self) -> None:
        _check_static(self.static_sp, self.dataset_longest_tokens)


@dataclass(frozen=True, kw_only=True)
class PackedOptions(StrategyOptions):
    """Static SP size, samples packed to a fixed token budget per micro-batch."""

    token_budget: int | None = None
    """Tokens per micro-batch; None: the most that fit at the static SP size fully checkpointed."""
    static_sp: int | str | None = None
    """As `BucketOptions.static_sp` (`DATASET`: strategy `packed`; None: `packed-per-batch`)."""
    dataset_longest_tokens: int | None = None
    """The longest sample of the whole training data, for `static_sp=DATASET`."""
    name = "packed"

    def __post_init__(self) -> None:
        _check_static(self.static_sp, self.dataset_longest_tokens)
        if self.token_budget is not None and self.token_budget < 1:
            raise ValueError(f"token_budget must be positive, got {self.token_budget}")


@dataclass(frozen=True, kw_only=True)
class GreedyOptions(StrategyOptions):
    """The DCP paper's runtime (`dcp.planner.greedy`); pyramid checkpointing when `pyramid`."""

    pyramid: bool = True
    """Fewest checkpointed layers that fit (DCP-intra); False: all layers (DCP-inter)."""
    name = "dcp-greedy"


@dataclass(frozen=True, kw_only=True)
class IlpOptions(StrategyOptions):
    """The exact planner: a mixed-integer program over group sizes, assignment and checkpointing."""

    time_limit_s: float = 1.0
    """Wall-clock seconds from the start of `solve`; the best plan found returns with its gap. What
    keeps the plan no worse than a baseline is not cut (input checks, cost table, baselines no bound
    rules out, first backfill target, final assembly), so a loaded machine can run past it."""
    solver: str = "highs"
    """highs (highspy, in-process) or cbc (bundled with PuLP)."""
    mip_rel_gap: float = 0.005
    """Stop when the proven gap is below this fraction."""
    max_microbatches: int | None = None
    """Cap on micro-batches per group; None: no cap."""
    max_phases: int = 2
    """Most layouts a step may run one after another (`dcp.planner.phases`); 1: one layout."""
    name = "ilp"

    def __post_init__(self) -> None:
        if self.solver not in SOLVERS:
            raise ValueError(f"unknown MILP solver {self.solver!r}; expected one of {SOLVERS}")
        if not (self.time_limit_s > 0 and math.isfinite(self.time_limit_s)):
            raise ValueError(f"ILP time limit must be a positive, finite number of seconds, got {self.time_limit_s}")
        if not self.mip_rel_gap >= 0:
            raise ValueError(f"mip_rel_gap must be >= 0, got {self.mip_rel_gap}")
        if self.max_microbatches is not None and self.max_microbatches < 1:
            raise ValueError(f"max_microbatches must be at least 1, got {self.max_microbatches}")
        if isinstance(self.max_phases, bool) or not isinstance(self.max_phases, int) or self.max_phases < 1:
            raise ValueError(f"max_phases must be a whole number >= 1, got {self.max_phases!r}")

    def explain_budget(self, samples: int) -> str:
        """How `time_limit_s` divides among the stages for a batch of `samples` (`timebudget`)."""
        from dcp.planner.timebudget import explain_budget

        return explain_budget(self.time_limit_s, samples)


def with_dataset(options: StrategyOptions, longest_tokens: int) -> StrategyOptions:
    """`options` with the dataset's longest sample filled in where `static_sp=DATASET` needs it."""
    if getattr(options, "static_sp", None) == DATASET and getattr(options, "dataset_longest_tokens", 0) is None:
        return dataclasses.replace(options, dataset_longest_tokens=int(longest_tokens))  # type: ignore[type-var]
    return options


STRATEGIES: dict[str, StrategyOptions] = {
    "ilp": IlpOptions(),
    "dcp-greedy": GreedyOptions(),
    "dcp-greedy-inter": GreedyOptions(pyramid=False),
    "bucket": BucketOptions(static_sp=DATASET),
    "bucket-per-batch": BucketOptions(),
    "packed": PackedOptions(static_sp=DATASET),
    "packed-per-batch": PackedOptions(),
}
"""Strategies by name: `bucket` and `packed` are the DCP paper's static baselines (one SP size for
the training: `with_dataset`), `-per-batch` re-chosen per batch (docs/results.md)."""

STRATEGY_HELP = {
    "ilp": "the exact planner (MILP over SP group sizes, assignment and checkpointing)",
    "dcp-greedy": "the DCP paper's runtime: per-bucket SP and batch size, pyramid checkpointing",
    "dcp-greedy-inter": "dcp-greedy with every layer checkpointed (the paper's DCP-inter)",
    "bucket": "bucket parallel with one SP size for the whole training (the paper's baseline)",
    "bucket-per-batch": "bucket parallel re-choosing its SP size for every global batch",
    "packed": "token-budget packing at one SP size for the whole training",
    "packed-per-batch": "token-budget packing re-choosing its SP size for every global batch",
}
"""One line per strategy, for help texts."""


def strategy_options(name: str) -> StrategyOptions:
    """The options of a strategy name (see STRATEGIES); ValueError naming the known ones."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]
