"""dcp-greedy: the DCP paper's runtime (NUS, "Training Variable Long Sequences With Data-centric
Parallel"; NUS-HPC-AI-Lab/VideoSys), with the cost model standing in for its profiling runs.

1. Profile each power-of-two length bucket: from the smallest SP size that fits the bucket's
   longest sample, raise the batch size until memory runs out, doubling SP when batch size 1
   does not fit; keep the (SP, batch) with the most samples per GPU-second, batch/(SP*time).
2. Cut each bucket into micro-batches of its batch size; the micro-batches of every bucket with
   the same SP size form one SP class.
3. Give each class GPUs in proportion to its GPU-seconds (whole groups, largest SP first, at
   least one group each), then balance accumulation: micro-batches longest-first onto the
   least-loaded group of their class.
4. Improve, as the paper's runtime would by re-profiling: move a block of GPUs from class to
   class, and run a straggling micro-batch at a larger SP size, while that shortens the step.

pyramid=True (DCP-intra) checkpoints only the layers a micro-batch must; pyramid=False
(DCP-inter) checkpoints all K layers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from dcp.costmodel import CostModel
from dcp.planner.baselines import by_bucket, group_share, lpt_assign
from dcp.planner.common import aligned_layout, assemble
from dcp.planner.feasibility import allowed_sp_sizes, check_feasible
from dcp.planner.options import GreedyOptions
from dcp.planner.plan import Plan
from dcp.planner.sample import Sample


@dataclass(frozen=True)
class BucketProfile:
    """The (SP size, batch size) the paper's profiler keeps for one length bucket."""

    sp: int
    batch_size: int
    time_s: float
    """Time of one full micro-batch of the bucket's longest sample."""

    @property
    def samples_per_gpu_s(self) -> float:
        return self.batch_size / (self.sp * self.time_s)


def _ckpt(cm: CostModel, tokens: int, p: int, pyramid: bool) -> int | None:
    """Checkpointed layers for a micro-batch of `tokens` at p; None if it does not fit (memory,
    or beyond what a fitted profile can price)."""
    r = cm.min_ckpt_layers(tokens, p)
    if r is None:
        return None
    return r if pyramid else cm.model.num_layers


def profile_bucket(longest: Sample, count: int, cm: CostModel, sizes: Sequence[int],
                   pyramid: bool) -> BucketProfile:
    """The paper's profile loop, priced by the cost model instead of measured.

    Batches are `b` copies of the bucket's longest sample, b up to the bucket's per-group share
    of its samples in this batch (`group_share`: the paper gives every rank a micro-batch per
    iteration, and balanced accumulation needs micro-batches to balance)."""
    best: BucketProfile | None = None
    for p in sorted(sizes):
        for b in range(1, group_share(count, p, cm.cluster.num_gpus) + 1):
            r = _ckpt(cm, b * longest.tokens, p, pyramid)
            if r is None:
                break  # out of memory: a larger batch will not fit either; try the next SP size
            prof = BucketProfile(p, b, cm.time_s(b * longest.tokens, b * longest.attn_pairs, p, r))
            if best is None or prof.samples_per_gpu_s > best.samples_per_gpu_s * (1 + 1e-12):
                best = prof
    assert best is not None, "check_feasible guarantees the largest SP size fits a lone sample"
    return best


def _mb_time(cm: CostModel, mb: Sequence[Sample], p: int, pyramid: bool) -> float:
    tokens = sum(s.tokens for s in mb)
    r = _ckpt(cm, tokens, p, pyramid)
    assert r is not None, "micro-batches are cut to fit at their class's SP size or a larger one"
    return cm.time_s(tokens, sum(s.attn_pairs for s in mb), p, r)


class _Classes:
    """Micro-batches by SP size with their times, and the group count of each class."""

    def __init__(self, cm: CostModel, pyramid: bool) -> None:
        self.cm, self.pyramid = cm, pyramid
        self.mbs: dict[int, list[list[Sample]]] = {}
        self.times: dict[int, list[float]] = {}
        self.groups: dict[int, int] = {}

    def add(self, p: int, mb: list[Sample]) -> None:
        self.mbs.setdefault(p, []).append(mb)
        self.times.setdefault(p, []).append(_mb_time(self.cm, mb, p, self.pyramid))

    def work(self, p: int) -> float:
        """GPU-seconds of the class."""
        return p * sum(self.times[p])

    def merge_into_next(self, p: int) -> None:
        """Run class p's micro-batches at the next larger class's SP size (memory only drops)."""
        q = min(s for s in self.mbs if s > p)
        for mb in self.mbs.pop(p):
            self.add(q, mb)
        del self.times[p]

    def copy(self) -> _Classes:
        out = _Classes(self.cm, self.pyramid)
        out.mbs = {p: list(v) for p, v in self.mbs.items()}
        out.times = {p: list(v) for p, v in self.times.items()}
        out.groups = dict(self.groups)
        return out

    def promote_longest(self, p: int, q: int) -> None:
        """Move class p's longest micro-batch to SP size q > p."""
        j = max(range(len(self.times[p])), key=lambda i: (self.times[p][i], -i))
        mb = self.mbs[p].pop(j)
        del self.times[p][j]
        if not self.mbs[p]:
            del self.mbs[p], self.times[p]
        self.add(q, mb)

    def step_s(self) -> float:
        return max(self.makespan(p, n) for p, n in self.groups.items())

    def makespan(self, p: int, n: int) -> float:
        assignment = lpt_assign(self.times[p], n)
        return max(sum(self.times[p][j] for j in jobs) for jobs in assignment)


def allocate_groups(classes: _Classes, num_gpus: int) -> None:
    """Groups per class: GPUs proportional to GPU-seconds, in whole groups, largest SP first,
    every class at least one group and at most one per micro-batch, total at most N."""
    # Distinct powers of two can add up past N (e.g. 32 and 16 on 32 GPUs): fold the smallest
    # class into the next larger until one group of each fits.
    while sum(classes.mbs) > num_gpus:
        classes.merge_into_next(min(classes.mbs))
    total = sum(classes.work(p) for p in classes.mbs)
    left = num_gpus
    order = sorted(classes.mbs, reverse=True)
    for i, p in enumerate(order):
        reserve = sum(order[i + 1:])  # one group for every class still to come
        share = num_gpus * classes.work(p) / total if total > 0 else num_gpus / len(order)
        n = max(1, round(share / p))
        n = min(n, (left - reserve) // p, len(classes.mbs[p]))
        classes.groups[p] = n
        left -= n * p
    # Rounding down leaves GPUs over: hand them, a group at a time, to the class whose groups
    # carry the most load per group and can still use one more.
    while True:
        fits = [p for p in order if p <= left and classes.groups[p] < len(classes.mbs[p])]
        if not fits:
            break
        p = max(fits, key=lambda q: (classes.work(q) / (q * classes.groups[q]), q))
        classes.groups[p] += 1
        left -= p


def rebalance(classes: _Classes, num_gpus: int, max_moves: int = 64) -> None:
    """Move a block of GPUs from one class to the slowest while that shortens the step."""
    for _ in range(max_moves):
        spans = {p: classes.makespan(p, n) for p, n in classes.groups.items()}
        slow = max(spans, key=lambda p: (spans[p], p))
        free = num_gpus - sum(p * n for p, n in classes.groups.items())
        best: tuple[float, dict[int, int]] | None = None
        for donor in [None, *sorted(classes.groups)]:
            if donor == slow:
                continue
            block = slow if donor is None else max(slow, donor)
            gain = block // slow
            if classes.groups[slow] + gain > len(classes.mbs[slow]):
                continue
            trial = dict(classes.groups)
            trial[slow] += gain
            if donor is None:
                if block > free:
                    continue
            else:
                trial[donor] -= block // donor
                if trial[donor] < 1:
                    continue
            new = {p: classes.makespan(p, trial[p]) if trial[p] != classes.groups[p] else spans[p]
                   for p in trial}
            span = max(new.values())
            if span < spans[slow] * (1 - 1e-9) and (best is None or span < best[0]):
                best = (span, trial)
        if best is None:
            return
        classes.groups = best[1]


def promote_stragglers(classes: _Classes, sizes: Sequence[int], num_gpus: int,
                       max_tries: int = 32) -> _Classes:
    """Per-GPU throughput barely depends on SP size for attention-bound long samples, so the
    profile runs them at a small SP size, where one of them alone can outlast the step. While it
    shortens the step, run the slowest class's longest micro-batch at the next larger SP size."""
    best = classes
    for _ in range(max_tries):
        spans = {p: best.makespan(p, k) for p, k in best.groups.items()}
        slow = max(spans, key=lambda p: (spans[p], p))
        larger = [q for q in sizes if q > slow]
        if not larger:
            break
        trial = best.copy()
        trial.promote_longest(slow, min(larger))
        trial.groups = {}
        allocate_groups(trial, num_gpus)
        rebalance(trial, num_gpus)
        if trial.step_s() >= best.step_s() * (1 - 1e-9):
            break
        best = trial
    return best


def solve_greedy(batch: Sequence[Sample], cm: CostModel, options: GreedyOptions | None = None) -> Plan:
    """Plan one global batch the way DCP's runtime does (see the module docstring)."""
    started = time.perf_counter()
    options = options or GreedyOptions()
    sizes = allowed_sp_sizes(cm, options.sp_sizes)
    check_feasible(batch, cm, sizes)
    classes = _Classes(cm, options.pyramid)
    notes = []
    for bucket, samples in by_bucket(batch).items():
        longest = max(samples, key=lambda s: (s.tokens, s.attn_pairs, -s.id))
        prof = profile_bucket(longest, len(samples), cm, sizes, options.pyramid)
        notes.append(f"bucket {bucket}: sp {prof.sp}, batch size {prof.batch_size}")
        ordered = sorted(samples, key=lambda s: (-s.tokens, s.id))
        for i in range(0, len(ordered), prof.batch_size):
            classes.add(prof.sp, ordered[i:i + prof.batch_size])
    n = cm.cluster.num_gpus
    allocate_groups(classes, n)
    rebalance(classes, n)
    classes = promote_stragglers(classes, sizes, n)

    layout = aligned_layout(classes.groups, n, cm.cluster.gpus_per_node)
    assignment = {p: lpt_assign(classes.times[p], classes.groups[p]) for p in classes.groups}
    groups, ckpt, seen = [], [], dict.fromkeys(classes.groups, 0)
    for start, p in layout:
        jobs = assignment[p][seen[p]]
        seen[p] += 1
        groups.append((start, p, [[s.id for s in classes.mbs[p][j]] for j in jobs]))
        ckpt.append([cm.model.num_layers] * len(jobs))
    return assemble("dcp-greedy" if options.pyramid else "dcp-greedy-inter", batch, cm, groups,
                    ckpt=None if options.pyramid else ckpt, started=started, notes=notes)
