"""Brute force for tiny planning problems: a small model on a slow, small-memory cluster, and the
optimal step time by enumeration, against which the ILP planner and the lower bounds are checked."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable

import numpy as np

from dcp.costmodel import (
    Cluster,
    CollectiveCurve,
    CostModel,
    ModelSpec,
    TrainingSetup,
    load_hardware,
)
from dcp.costmodel.memory import MemoryFootprint
from dcp.planner.feasibility import allowed_sp_sizes

# Memory figures chosen for the tests (a checkpointed layer keeps 1/17 of a plain one), not measured:
# the planner only needs a model whose memory fills up at a few hundred tokens.
_TEST_MEMORY = MemoryFootprint(recipe="bf16", act_full_bytes_per_token=2176.0, act_ckpt_bytes_per_token=128.0,
                               working_bytes_per_token=2176.0, how="test figures, not measured")
TINY_MODEL = ModelSpec(name="brute", num_layers=4, hidden=64, heads=4, kv_heads=4, ffn_hidden=256, vocab=0,
                       source="test model: a few hundred tokens fill the memory", memory={"bf16": _TEST_MEMORY})
TINY_CASES = [  # (sample lengths, GPUs, GPUs per node)
    ([100, 200, 300], 2, 2),
    ([50, 80, 120, 500, 900], 4, 2),
    ([700, 650, 90, 60, 40, 30], 4, 2),
    ([1500, 400, 300, 200, 100, 50], 4, 4),
    ([2300, 1200, 600, 30, 20, 10], 4, 2),
    ([590, 590, 590, 590], 2, 2),
    ([1000, 999, 20, 21, 22, 23], 4, 4),
]


@functools.cache
def tiny_cm(gpus: int = 4, gpus_per_node: int = 2, cap_tokens: int = 600, zero_stage: int = 1) -> CostModel:
    """A slow, small-memory cluster: micro-batch fixed costs, all-to-alls and checkpointing all
    matter at a few hundred tokens; `cap_tokens` fit one GPU without checkpointing. Under ZeRO-3
    a slow network makes each pass's parameter gathers cost about one micro-batch's kernels
    (0.1 s), the regime of a 70B model's gathers. No compute slowed beside collectives
    (`overlap_slowdown`): it depends on which micro-batch runs last, which the programs the brute
    force checks do not price (on the first case it moved the plan 6e-6 above brute force's)."""
    base = load_hardware("h200-sxm")
    slow = [CollectiveCurve(op="all_to_all", gpus_per_node=g, nodes=1, latency_s=5e-3, bus_bw_bytes_per_s=2e8)
            for g in (2, 4)] + [CollectiveCurve(op="all_to_all", gpus_per_node=2, nodes=2, latency_s=1.5e-2,
                                                bus_bw_bytes_per_s=5e7)]
    others = [c for c in base.collectives if c.op != "all_to_all"]
    if zero_stage == 3:
        others = [CollectiveCurve(op=op, gpus_per_node=2, nodes=nodes, latency_s=0.0, bus_bw_bytes_per_s=4e6)
                  for op in ("all_reduce", "reduce_scatter", "all_gather", "broadcast") for nodes in (1, 2)]
    hw = dataclasses.replace(
        base, matmul_flops=1e9, sustained_clock=1.0, attention_fwd_flops=1e9, attention_bwd_flops=1e9,
        attention_fwd_pairs_per_token=0.0,
        attention_bwd_pairs_per_token=0.0, attention_bwd_causal_flops=None, attention_kernels={},
        matmul_tokens_offset=0.0, memory_bw_bytes_per_s=1e12, kernel_overhead_s=1e-2,
        collectives=tuple(slow + others), overlap_slowdown=0.0)
    training = TrainingSetup(zero_stage=zero_stage)
    probe = CostModel(TINY_MODEL, hw, Cluster(num_gpus=gpus, gpus_per_node=gpus_per_node, memory_bytes=1e12),
                      training)
    memory = probe.static_bytes + cap_tokens * probe.activation_bytes_per_token(1, 0)
    return CostModel(TINY_MODEL, hw, Cluster(num_gpus=gpus, gpus_per_node=gpus_per_node, memory_bytes=memory),
                     training)


def group_timer(batch: list, cm: CostModel) -> Callable[[int, frozenset], float]:
    """group_time(p, members): the best split of the `members` samples into micro-batches run one
    after another on p GPUs, each with its fewest checkpointed layers (inf if one fits nowhere)."""

    @functools.cache
    def mb_time(p: int, members: frozenset) -> float:
        tokens = sum(batch[i].tokens for i in members)
        r = cm.min_ckpt_layers(tokens, p)
        return math.inf if r is None else cm.time_s(tokens, sum(batch[i].attn_pairs for i in members), p, r)

    @functools.cache
    def group_time(p: int, members: frozenset) -> float:
        if not members:
            return 0.0
        first, rest = min(members), sorted(members - {min(members)})
        best = math.inf
        for k in range(len(rest) + 1):
            for combo in itertools.combinations(rest, k):
                mb = frozenset((first, *combo))
                best = min(best, mb_time(p, mb) + group_time(p, members - mb))
        return best

    return group_time


def brute_force(batch: list, cm: CostModel) -> float:
    """Optimal step time by enumeration: every multiset of group sizes that fits the cluster,
    every assignment of samples to groups, every micro-batch partition of each group's samples,
    each micro-batch with its fewest checkpointed layers."""
    sizes = allowed_sp_sizes(cm)
    n = len(batch)
    group_time = group_timer(batch, cm)

    def layouts(left: int, smallest_allowed: int) -> list[tuple[int, ...]]:
        out = [()]
        for p in sizes:
            if p <= left and p >= smallest_allowed:
                out += [(p, *rest) for rest in layouts(left - p, p)]
        return out

    best = math.inf
    for layout in layouts(cm.cluster.num_gpus, 1):
        if not layout:
            continue
        for assign in itertools.product(range(len(layout)), repeat=n):
            busy = max(group_time(p, frozenset(i for i in range(n) if assign[i] == g)) for g, p in enumerate(layout))
            best = min(best, busy)
    return best + cm.grad_sync_s()



def _pareto(points: np.ndarray) -> np.ndarray:
    """The rows of `points` no other row is at most everywhere (one of equal rows kept)."""
    points = np.unique(points, axis=0)
    if len(points) <= 1:
        return points
    le = (points[:, None, :] <= points[None, :, :]).all(axis=2)  # le[b, a]: b at most a everywhere
    np.fill_diagonal(le, False)
    return points[~le.any(axis=0)]


def brute_force_phases(batch: list, cm: CostModel, max_phases: int = 3) -> float:
    """Optimal step time over every plan the executor can run with at most `max_phases` phases,
    by enumeration: a phase runs a subset of the samples not yet run on a layout (aligned blocks
    tiling the ranks), each group its samples' best micro-batching; a group with work starts
    when the last of its ranks is free (`Plan.group_starts_s`) and holds them until it ends.
    Per subset of samples run so far, the Pareto front of when each rank is free, cut at the
    single-layout optimum (`brute_force`, one phase): no state past it can end sooner."""
    sizes = allowed_sp_sizes(cm)
    n, num_gpus = len(batch), cm.cluster.num_gpus
    best = brute_force(batch, cm) - cm.grad_sync_s()

    group_time = group_timer(batch, cm)

    def tilings(start: int) -> list[tuple[tuple[int, int], ...]]:
        if start == num_gpus:
            return [()]
        return [((start, p), *rest) for p in sizes if start % p == 0 and start + p <= num_gpus
                for rest in tilings(start + p)]

    layouts = tilings(0)

    @functools.cache
    def outcomes(subset: int) -> list[tuple[tuple[tuple[int, int], ...], np.ndarray]]:
        """Per layout, the Pareto-minimal busy times of its groups over every assignment of the
        subset's samples to them."""
        members = [i for i in range(n) if subset >> i & 1]
        out = []
        for layout in layouts:
            busy = np.array([[group_time(p, frozenset(i for i, g in zip(members, assign, strict=True) if g == gi))
                              for gi, (_, p) in enumerate(layout)]
                             for assign in itertools.product(range(len(layout)), repeat=len(members))])
            busy = busy[(busy <= best).all(axis=1)]
            if len(busy):
                out.append((layout, _pareto(busy)))
        return out

    def run(free: np.ndarray, subset: int) -> np.ndarray:
        """When each rank is free after the phase `subset`, from `free`, for each outcome."""
        found = []
        for layout, busy in outcomes(subset):
            after = np.repeat(free[None, :], len(busy), axis=0)
            for gi, (start, p) in enumerate(layout):
                ends = free[start:start + p].max() + busy[:, gi]
                after[:, start:start + p] = np.where(busy[:, gi:gi + 1] > 0, ends[:, None], free[None, start:start + p])
            found.append(after)
        return np.concatenate(found) if found else np.zeros((0, num_gpus))

    everything = (1 << n) - 1
    front = {0: np.zeros((1, num_gpus))}
    for _ in range(max_phases):
        nxt: dict[int, list[np.ndarray]] = {}
        for done, points in front.items():
            rest = everything ^ done
            sub = rest
            while sub:  # every non-empty subset of the samples not yet run, as the next phase
                for free in points:
                    after = run(free, sub)
                    after = after[after.max(axis=1) < best]
                    if len(after):
                        if done | sub == everything:
                            best = float(after.max(axis=1).min())
                        else:
                            nxt.setdefault(done | sub, []).append(after)
                sub = (sub - 1) & rest
        front = {d: _pareto(np.concatenate(v)) for d, v in nxt.items()}
        front = {d: v[v.max(axis=1) < best] for d, v in front.items()}
    return best + cm.grad_sync_s()


def fitting_tiny_case(lengths: list[int], cap: int, zero_stage: int,
                      cluster: tuple[int, int]) -> tuple[CostModel, list] | None:
    """`tiny_cm` on a (GPUs, per node) cluster and a batch of `lengths`, or None when some sample
    fits nowhere (nothing to bound): what the random tiny-batch bound tests draw."""
    from tests.conftest import make_batch

    cm = tiny_cm(*cluster, cap, zero_stage=zero_stage)
    if any(cm.min_ckpt_layers(t, max(allowed_sp_sizes(cm))) is None for t in lengths):
        return None
    return cm, make_batch(lengths)


def random_plans(batch: list, cm: CostModel, seed: int, count: int = 40) -> list:
    """Valid plans of random layouts, assignments and micro-batch splits, priced by `assemble`."""
    import random

    from dcp.planner.common import aligned_layout, assemble

    rng = random.Random(seed)
    sizes, n = allowed_sp_sizes(cm), cm.cluster.num_gpus
    out = []
    while len(out) < count:
        counts: dict[int, int] = {}
        left = n
        while left and (not counts or rng.random() < 0.7):
            p = rng.choice([q for q in sizes if q <= left])
            counts[p] = counts.get(p, 0) + 1
            left -= p
        layout = aligned_layout(counts, n)
        members: list[list[int]] = [[] for _ in layout]
        for s in batch:
            members[rng.randrange(len(layout))].append(s.id)
        groups = []
        for (start, p), ids in zip(layout, members, strict=True):
            rng.shuffle(ids)
            cuts = sorted(rng.sample(range(1, len(ids)), rng.randint(0, max(0, len(ids) - 1)))) if ids else []
            groups.append((start, p, [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)], strict=True)]))
        try:
            out.append(assemble("random", batch, cm, groups, lower_bound_s=0.0))
        except ValueError:  # a micro-batch that fits nowhere
            continue
    return out
