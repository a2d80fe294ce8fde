"""What a plan may use: the allowed SP sizes, and whether every sample fits somewhere at all."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dcp.costmodel import CostModel, sp_layouts
from dcp.planner.plan import InfeasibleError
from dcp.planner.sample import Sample


def allowed_sp_sizes(cm: CostModel, requested: Sequence[int] | None = None) -> list[int]:
    """SP sizes a plan may use: aligned powers of two within the cluster that some layout can run
    (Ulysses over sizes dividing the heads, with a ring over the rest: `ring.sp_layouts`),
    intersected with the user's choice."""
    m, g = cm.model, cm.cluster.gpus_per_node
    # A block up to a node must tile the node (p divides G) and a larger one must be whole nodes
    # (G divides p); otherwise an aligned block can straddle a node boundary when G is not a
    # power of two (e.g. 6 GPUs per node and p = 4).
    sizes = [p for p in cm.cluster.sp_sizes() if sp_layouts(m, p, g) and (g % p == 0 if p <= g else p % g == 0)]
    if requested is not None:
        bad = [p for p in requested if p not in sizes]
        if bad:
            raise InfeasibleError(
                f"SP size {bad[0]} is not allowed: sizes must be powers of two dividing {cm.cluster.num_gpus} "
                f"GPUs that Ulysses ({m.heads} heads, {m.kv_heads} KV heads), with a ring, can run ({sizes})"
            )
        sizes = sorted(set(requested))
    if not sizes:
        raise InfeasibleError("no SP size is allowed")
    return sizes


def check_feasible(batch: Sequence[Sample], cm: CostModel, sizes: Sequence[int],
                   tokens: np.ndarray | None = None) -> None:
    """Raise InfeasibleError naming the first sample that fits nowhere (largest SP, all layers
    checkpointed) and how much memory it needed. `tokens`, when given, are the samples' token
    counts (float64, in batch order), which saves reading them again."""
    p, k = max(sizes), cm.model.num_layers
    room = cm.cluster.memory_bytes
    if cm.static_bytes >= room:
        raise InfeasibleError(
            f"model states of {cm.model.name} need {cm.static_bytes / 1e9:.1f} GB per GPU, more than the "
            f"{room / 1e9:.1f} GB usable; shard more (zero stage 3) or use more GPUs"
        )
    # Both limits grow with the tokens alone: only samples longer than the largest micro-batch
    # the cost model accepts can fail, and the first of those in batch order is named.
    if tokens is None:
        tokens = np.fromiter((s.tokens for s in batch), dtype=np.float64, count=len(batch))
    too_long = np.flatnonzero(tokens > min(cm.priceable_tokens(p), cm.max_tokens(p, k)))
    for i in too_long:
        s = batch[int(i)]
        if s.tokens > cm.priceable_tokens(p):
            raise InfeasibleError(
                f"sample {s.id} ({s.tokens} tokens) is beyond what the profile can price: "
                f"{s.tokens / p:.0f} tokens per GPU at SP size {p}, more than {cm.hardware.extrapolation_factor}x "
                f"the largest fitted micro-batch ({cm.fit.max_fitted_tokens} tokens); profile longer sequences "
                f"(dcp profile --max-tokens)"
            )
        if cm.min_ckpt_layers(s.tokens, p) is None:
            need = cm.memory_bytes(s.tokens, p, k)
            raise InfeasibleError(
                f"sample {s.id} ({s.tokens} tokens) fits nowhere: at SP size {p} with all {k} layers "
                f"checkpointed it needs {need / 1e9:.1f} GB per GPU, more than the {room / 1e9:.1f} GB usable"
            )
