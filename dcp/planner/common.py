"""Pieces every strategy shares: allowed SP sizes, feasibility, rank layout, plan assembly."""

from __future__ import annotations

import time
from collections.abc import Sequence

from dcp.costmodel import CostModel
from dcp.data.workloads import Sample
from dcp.planner.bounds import lower_bound
from dcp.planner.plan import Group, InfeasibleError, MicroBatch, Plan
from dcp.planner.sync import price_step


def allowed_sp_sizes(cm: CostModel, requested: Sequence[int] | None = None) -> list[int]:
    """SP sizes a plan may use: aligned powers of two within the cluster whose size divides the
    model's heads and KV heads (Ulysses shards heads), intersected with the user's choice."""
    m, g = cm.model, cm.cluster.gpus_per_node
    # A block up to a node must tile the node (p divides G) and a larger one must be whole nodes
    # (G divides p); otherwise an aligned block can straddle a node boundary when G is not a
    # power of two (e.g. 6 GPUs per node and p = 4).
    sizes = [p for p in cm.cluster.sp_sizes()
             if m.heads % p == 0 and m.kv_heads % p == 0 and (g % p == 0 if p <= g else p % g == 0)]
    if requested is not None:
        bad = [p for p in requested if p not in sizes]
        if bad:
            raise InfeasibleError(
                f"SP size {bad[0]} is not allowed: sizes must be powers of two dividing {cm.cluster.num_gpus} "
                f"GPUs, {m.heads} heads and {m.kv_heads} KV heads ({sizes})"
            )
        sizes = sorted(set(requested))
    if not sizes:
        raise InfeasibleError("no SP size is allowed")
    return sizes


def check_feasible(batch: Sequence[Sample], cm: CostModel, sizes: Sequence[int]) -> None:
    """Raise InfeasibleError naming the first sample that fits nowhere (largest SP, all layers
    checkpointed) and how much memory it needed."""
    p, k = max(sizes), cm.model.num_layers
    room = cm.cluster.memory_bytes
    if cm.static_bytes >= room:
        raise InfeasibleError(
            f"model states of {cm.model.name} need {cm.static_bytes / 1e9:.1f} GB per GPU, more than the "
            f"{room / 1e9:.1f} GB usable; shard more (zero stage 3) or use more GPUs"
        )
    for s in batch:
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


def aligned_layout(groups_per_size: dict[int, int], num_gpus: int, gpus_per_node: int) -> list[tuple[int, int]]:
    """(first rank, SP size) for each group, largest sizes first so every block stays aligned
    (sizes are powers of two) and blocks up to a node never cross one."""
    starts, rank = [], 0
    for p in sorted(groups_per_size, reverse=True):
        for _ in range(groups_per_size[p]):
            starts.append((rank, p))
            rank += p
    if rank > num_gpus:
        raise ValueError(f"layout needs {rank} GPUs, only {num_gpus} exist")
    return starts


def assemble(strategy: str, batch: Sequence[Sample], cm: CostModel,
             layout: Sequence[tuple[int, int, Sequence[Sequence[int]]]],
             ckpt: Sequence[Sequence[int]] | None = None, *, started: float | None = None,
             solver_status: str = "heuristic", gap: float | None = None,
             lower_bound_s: float | None = None, notes: Sequence[str] = ()) -> Plan:
    """Build and validate a Plan from (first rank, SP size, micro-batches as sample-id lists).

    Each micro-batch gets the fewest checkpointed layers that fit, unless `ckpt` gives them
    (one list per group). Times and memory come from the cost model."""
    by_id = {s.id: s for s in batch}
    groups = []
    for gi, (start, p, mbs) in enumerate(layout):
        g = Group(list(range(start, start + p)), p)
        for mi, ids in enumerate(mbs):
            if not ids:
                continue
            tokens = sum(by_id[i].tokens for i in ids)
            pairs = sum(by_id[i].attn_pairs for i in ids)
            r = ckpt[gi][mi] if ckpt is not None else cm.min_ckpt_layers(tokens, p)
            if r is None:
                raise InfeasibleError(f"{strategy}: micro-batch of samples {list(ids)[:8]} ({tokens} tokens) "
                                      f"does not fit at SP size {p}")
            g.microbatches.append(MicroBatch(list(ids), int(r), cm.time_s(tokens, pairs, p, r),
                                             cm.memory_bytes(tokens, p, r)))
        groups.append(g)
    lb = lower_bound(batch, cm) if lower_bound_s is None else lower_bound_s
    plan = Plan(
        strategy=strategy, num_gpus=cm.cluster.num_gpus, gpus_per_node=cm.cluster.gpus_per_node,
        memory_limit_bytes=cm.cluster.memory_bytes, num_layers=cm.model.num_layers, samples=list(batch),
        groups=groups, step_time_s=0.0, lower_bound_s=lb,
        solve_time_s=(time.perf_counter() - started) if started is not None else 0.0,
        solver_status=solver_status, gap=gap, notes=list(notes),
    )
    price_step(plan, cm)  # the step as the executor's schedule runs it (dcp.planner.sync)
    return plan.validate()
