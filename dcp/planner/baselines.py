"""The static baselines DCP is measured against: bucket parallel and token-budget packing, each with
one SP size p for the whole training (`DATASET`, as the DCP paper runs them), a given size, or per
batch (`-per-batch`), on N/p identical groups. The ILP's warm start prices their layouts too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from dcp.costmodel import CostModel
from dcp.planner.bounds import lower_bound
from dcp.planner.common import aligned_layout, assemble_indices
from dcp.planner.feasibility import allowed_sp_sizes, check_feasible
from dcp.planner.lpt import by_group, least_loaded
from dcp.planner.options import DATASET, BucketOptions, PackedOptions
from dcp.planner.plan import InfeasibleError, Plan
from dcp.planner.pricing import BatchArrays, Layout, Pricer
from dcp.planner.sample import Sample


def length_bucket(tokens: int) -> int:
    """The power of two at or above `tokens`: the length buckets of bucket parallel and DCP."""
    return 1 << max(0, tokens - 1).bit_length()


def by_bucket(batch: Sequence[Sample]) -> dict[int, list[Sample]]:
    """Samples grouped by length bucket, buckets ascending, samples in batch order."""
    out: dict[int, list[Sample]] = {}
    for s in batch:
        out.setdefault(length_bucket(s.tokens), []).append(s)
    return dict(sorted(out.items()))


def group_share(count: int, sp_size: int, num_gpus: int) -> int:
    """Per-group share of `count`, ceil(count * p / N): a fixed batch keeps every group busy."""
    return max(1, -(-count * sp_size // num_gpus))


def smallest_fitting_sp(tokens: int, cm: CostModel, sizes: Sequence[int]) -> int:
    """The smallest allowed SP size at which a sample of `tokens` fits fully checkpointed."""
    for p in sorted(sizes):
        if cm.min_ckpt_layers(tokens, p) is not None:
            return p
    largest = max(sizes)
    if tokens > cm.priceable_tokens(largest):
        raise InfeasibleError(f"a sample of {tokens} tokens is beyond what the profile can price even at SP size "
                              f"{largest} ({tokens / largest:.0f} tokens per GPU, more than "
                              f"{cm.hardware.extrapolation_factor}x the largest fitted micro-batch of "
                              f"{cm.fit.max_fitted_tokens} tokens); profile longer sequences (dcp profile --max-tokens)")
    raise InfeasibleError(f"no allowed SP size {list(sizes)} fits a sample of {tokens} tokens, even with "
                          "every layer checkpointed")


def static_sp_size(batch: Sequence[Sample], cm: CostModel, sizes: Sequence[int],
                   fixed: int | str | None = None, dataset_longest_tokens: int | None = None,
                   longest_tokens: int | None = None) -> int:
    """A static baseline's SP size: `fixed` (checked), for `DATASET` the smallest that fits the
    dataset's longest sample fully checkpointed, for None the smallest that fits the batch's."""
    longest = max(s.tokens for s in batch) if longest_tokens is None else longest_tokens
    if fixed == DATASET:
        if dataset_longest_tokens is None:
            raise ValueError("a static baseline (strategy bucket or packed) fixes one SP size for the whole "
                             "training: give dataset_longest_tokens (the dataset's longest sample, see "
                             "dcp.planner.options.with_dataset) or use bucket-per-batch / packed-per-batch")
        longest = max(longest, dataset_longest_tokens)
        try:
            return smallest_fitting_sp(longest, cm, sizes)
        except InfeasibleError as e:
            raise InfeasibleError(f"static SP size for the dataset's longest sample: {e}; the per-batch "
                                  "baselines (bucket-per-batch, packed-per-batch) size each batch instead") from e
    if fixed is None:
        # check_feasible has already proven the largest size fits.
        return smallest_fitting_sp(longest, cm, sizes)
    if fixed not in sizes:
        raise InfeasibleError(f"static SP size {fixed} is not among the allowed sizes {list(sizes)}")
    if cm.min_ckpt_layers(longest, fixed) is None:
        raise InfeasibleError(f"static SP size {fixed} does not fit the batch's longest sample "
                              f"({longest} tokens) even with every layer checkpointed")
    return fixed


def strategy_name(options: BucketOptions | PackedOptions) -> str:
    """The plan's strategy name: `bucket` / `packed`, or with `-per-batch` when sized per batch."""
    return options.name if options.static_sp is not None else f"{options.name}-per-batch"


def bucket_layout(batch: Sequence[Sample], cm: CostModel, options: BucketOptions, sizes: Sequence[int],
                  arrays: BatchArrays) -> tuple[Layout, list[list[int]], list[str]]:
    """Bucket parallel's groups (micro-batches of batch indices), checkpointed layers, notes."""
    p = static_sp_size(batch, cm, sizes, options.static_sp, options.dataset_longest_tokens,
                       longest_tokens=int(arrays.tokens.max()))
    k = cm.model.num_layers
    n_groups = cm.cluster.num_gpus // p
    mbs_per_group: list[list[list[int]]] = [[] for _ in range(n_groups)]
    turn = 0
    bucket = np.frexp(arrays.tokens - 1)[1]  # length_bucket's exponent: the bit length of t - 1
    for e in np.unique(bucket):
        idx = np.flatnonzero(bucket == e)  # batch order inside the bucket
        size = max(1, cm.max_tokens(p, k) // int(arrays.tokens[idx].max()))
        size = min(size, group_share(len(idx), p, cm.cluster.num_gpus))
        for i in range(0, len(idx), size):
            mbs_per_group[turn % n_groups].append(idx[i:i + size].tolist())
            turn += 1
    layout = aligned_layout({p: n_groups}, cm.cluster.num_gpus)
    return ([(start, sp, mbs_per_group[gi]) for gi, (start, sp) in enumerate(layout)],
            [[k] * len(mbs) for mbs in mbs_per_group],
            [f"static SP size {p}, {n_groups} groups, all {k} layers checkpointed"])


def solve_bucket(batch: Sequence[Sample], cm: CostModel, options: BucketOptions | None = None) -> Plan:
    """Bucket parallel: static SP size; per power-of-two length bucket, micro-batches of as many of
    its longest as fit fully checkpointed (at most its `group_share`), dealt round-robin."""
    options = options or BucketOptions()
    return plan_by(strategy_name(options), batch, cm, options.sp_sizes,
                   lambda sizes, arrays: bucket_layout(batch, cm, options, sizes, arrays))


def plan_by(strategy: str, batch: Sequence[Sample], cm: CostModel, sp_sizes: Sequence[int] | None,
            layout_of: Callable[[list[int], BatchArrays], tuple[Layout, list[list[int]], list[str]]]) -> Plan:
    """A deterministic strategy's plan: the batch checked, laid out by `layout_of(sizes, arrays)`
    (groups, checkpointed layers, notes), assembled with the batch's lower bound."""
    started = time.perf_counter()
    sizes = allowed_sp_sizes(cm, sp_sizes)
    check_feasible(batch, cm, sizes)
    arrays = BatchArrays.of(batch)
    layout, ckpt, notes = layout_of(sizes, arrays)
    return assemble_indices(strategy, batch, cm, layout, ckpt=ckpt, started=started, notes=notes, arrays=arrays,
                            lower_bound_s=lower_bound(batch, cm))


def ffd_indices(tokens: np.ndarray, ids: np.ndarray, budget_tokens: float) -> list[list[int]]:
    """First fit decreasing (ties by `ids`; one over budget alone): bins of `tokens` indices."""
    n = len(tokens)
    order = np.lexsort((ids, -tokens))
    room = np.zeros(n)
    owner = np.empty(n, dtype=np.int64)
    shortest = float(tokens.min()) if n else 0.0
    used = lo = 0
    for i in order.tolist():
        t = tokens[i]
        b = lo + int((room[lo:used] >= t).argmax()) if used > lo else used
        if b < used and room[b] >= t:
            room[b] -= t
            while lo < used and room[lo] < shortest:
                lo += 1
        else:
            b = used
            room[b] = max(0.0, budget_tokens - t)
            used += 1
        owner[i] = b
    bins: list[list[int]] = [[] for _ in range(used)]
    for i in order.tolist():
        bins[owner[i]].append(i)
    return bins


def lpt_assign(times: Sequence[float], n_groups: int) -> list[list[int]]:
    """Longest processing time first: each job (longest first, ties by index) goes to the least
    loaded group (ties by group index). Returns the job indices of each group, in run order."""
    t = np.asarray(times, dtype=np.float64)
    order = np.lexsort((np.arange(len(t)), -t))
    return [order[jobs].tolist() for jobs in by_group(least_loaded(t[order], n_groups), n_groups)]


def packing_budget(token_budget: int | None, arrays: BatchArrays, cm: CostModel, p: int) -> int:
    """Packing's tokens per micro-batch at SP size p: `token_budget`, else what fits fully
    checkpointed, at most the group's share of the batch (`group_share`)."""
    return token_budget or min(cm.max_tokens(p, cm.model.num_layers),
                               group_share(int(arrays.tokens.sum()), p, cm.cluster.num_gpus))


def packed_layout(batch: Sequence[Sample], cm: CostModel, options: PackedOptions, sizes: Sequence[int],
                  arrays: BatchArrays, pricer: Pricer) -> tuple[Layout, list[list[int]], list[str]]:
    """Packing's groups, checkpointed layers (the fewest that fit) and notes."""
    p = static_sp_size(batch, cm, sizes, options.static_sp, options.dataset_longest_tokens,
                       longest_tokens=int(arrays.tokens.max()))
    k = cm.model.num_layers
    budget = packing_budget(options.token_budget, arrays, cm, p)
    if budget <= 0:
        raise InfeasibleError(f"packed: token budget {budget} must be positive")
    bins = ffd_indices(arrays.tokens, arrays.ids, budget)
    tokens = np.array([arrays.tokens[b].sum() for b in bins])
    pairs = np.array([arrays.pairs[b].sum() for b in bins])
    levels = pricer.levels(p, tokens)
    if (levels > k).any():
        raise InfeasibleError(f"packed: token budget {budget} is more than fits at SP size {p}: a micro-batch "
                              f"of {int(tokens[levels > k][0])} tokens needs more than all {k} layers checkpointed")
    n_groups = cm.cluster.num_gpus // p
    jobs = lpt_assign(pricer.times(p, tokens, pairs).tolist(), n_groups)
    layout = aligned_layout({p: n_groups}, cm.cluster.num_gpus)
    return ([(start, sp, [bins[j] for j in jobs[gi]]) for gi, (start, sp) in enumerate(layout)],
            [levels[jobs[gi]].tolist() for gi in range(n_groups)],
            [f"static SP size {p}, {n_groups} groups, {budget} tokens per micro-batch"])


def solve_packed(batch: Sequence[Sample], cm: CostModel, options: PackedOptions | None = None) -> Plan:
    """Packing: static SP size, first fit decreasing into a token budget (default: what fits fully
    checkpointed, at most `group_share`), LPT over groups, checkpointing only what must."""
    options = options or PackedOptions()
    return plan_by(strategy_name(options), batch, cm, options.sp_sizes,
                   lambda sizes, arrays: packed_layout(batch, cm, options, sizes, arrays, Pricer(cm, sizes)))
