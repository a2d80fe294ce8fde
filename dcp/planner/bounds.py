"""Lower bounds on a global batch's step time, valid for every plan the cost model can price."""

from __future__ import annotations

from collections.abc import Sequence

from dcp.costmodel import CostModel
from dcp.data.workloads import Sample


def lower_bound(batch: Sequence[Sample], cm: CostModel, sp_sizes: Sequence[int] | None = None) -> float:
    """max(total minimal GPU-seconds / N, the longest sample's best time alone) + gradient sync.

    Why it holds: a micro-batch holding a sample has at least its tokens, so needs at least the
    sample's own fewest checkpointed layers r_i(p), and every cost coefficient grows with r; its
    time is at least the sample's solo time (all coefficients are non-negative), and the GPU-seconds
    it adds are at least p times its marginal (per-token and per-pair) cost at r_i(p). A micro-batch
    at p also pays its fixed cost, at least fixed(p, 0), on p GPUs, and holds at most
    max_tokens(p, K) tokens, so each of its tokens carries at least p * fixed(p, 0) / max_tokens(p, K)
    GPU-seconds of it (this matters under ZeRO-3, whose parameter gathers are per micro-batch).
    Groups cover at most N GPUs, so the slowest one runs at least the total GPU-seconds / N.
    """
    from dcp.planner.common import allowed_sp_sizes  # common imports this module

    sizes = allowed_sp_sizes(cm, sp_sizes)
    k = cm.model.num_layers
    capacity = {p: cm.max_tokens(p, k) for p in sizes}
    fixed_per_token = {p: p * cm.linear_time(p, 0).fixed / capacity[p] for p in sizes if capacity[p] > 0}
    work = 0.0
    longest = 0.0
    for s in batch:
        best_work, best_time = float("inf"), float("inf")
        for p in sizes:
            r = cm.min_ckpt_layers(s.tokens, p)
            if r is None:
                continue
            lin = cm.linear_time(p, r)
            marginal = p * (lin.per_token * s.tokens + lin.per_pair * s.attn_pairs)
            best_work = min(best_work, marginal + fixed_per_token[p] * s.tokens)
            best_time = min(best_time, lin(s.tokens, s.attn_pairs))
        work += best_work
        longest = max(longest, best_time)
    return max(work / cm.cluster.num_gpus, longest) + cm.grad_sync_s()
