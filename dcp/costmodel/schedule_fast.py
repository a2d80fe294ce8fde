"""The step's time in closed form, for planners that price thousands of plans: the same schedule
as the rank programs of `schedule.py` (the reference, which `simulate` replays and the tests
compare this with), without building them.

Why a closed form exists: every program issues the world's collectives in one order, and a
program's clock only grows, so the time the last rank issues a collective (when it can start)
grows along that order too; the link therefore serves them in program order, and each starts at
max(every rank has issued it, the previous one is done). Only the ranks' clocks at each issue
are needed.

Stages 0-2: group c issues layer u's reduction when its last micro-batch's backward has done
layers K-1..u, at busy_c - sum over layers l < u of that micro-batch's backward of l (busy_c
without overlap), and the root's and the loss scalars' at busy_c; ranks in no group at 0. The
all-gathers after the optimizer start when the scalars are done. Stage 3: every gather is a
barrier, so the clocks of all groups are advanced together, slot by slot, as vectors.

Never imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from dcp.costmodel.schedule import GroupShape, MicroBatchShape, _Step


def _layer_costs(step: _Step, mb: MicroBatchShape, group: GroupShape) -> tuple[float, float, float, float]:
    """(one layer's forward, the head, one layer's backward, its recompute) of a micro-batch,
    all-to-alls and unhidden ring transfers included."""
    lt = step.layer_times(mb, group)
    return lt.forward_s, step.cm.head_s(mb.tokens, group.sp), lt.backward_s, lt.recompute_s


def independent_s(step: _Step, groups: Sequence[GroupShape], busy: Sequence[float], overlap: bool) -> float:
    """Stages 0-2: when the last all-gather (stage 1, 2) or the loss all-reduce ends."""
    k = step.k
    held = [(g, b) for g, b in zip(groups, busy, strict=True) if g.microbatches]
    # Per unit: the latest time any rank issues its reduction (0 where no group runs).
    release = np.zeros(k + 1)
    if held:
        ends = np.array([b for _, b in held])
        release[k] = max(0.0, float(ends.max()))
        if not overlap:
            release[:k] = release[k]
        elif k:
            # below[c, u]: group c's last micro-batch's backward still to run after layer u's
            # (layers u-1 .. 0), the running sum of one layer's backward (and recompute below
            # its checkpointed layers) in the order the layers run, as a loop over u adds it.
            # The last micro-batch's backward runs beside the reductions it issues
            # (`_Step.last_backward_contention`): each layer's extra joins that layer's backward
            # and the group's end.
            steps = np.empty((len(held), k))
            compute = np.empty((len(held), 3))  # the last micro-batch's backward, recompute, checkpointed layers
            for c, (g, _) in enumerate(held):
                last = g.microbatches[-1]
                lt = step.layer_times(last, g)
                bwd, rec = lt.backward_s, lt.recompute_s
                steps[c, 0] = 0.0
                steps[c, 1:] = bwd
                steps[c, 1:min(last.ckpt_layers, k - 1) + 1] += rec
                compute[c] = bwd, rec, last.ckpt_layers
            if step.slowdown:
                extra = step.last_backward_contention(compute[:, 0], compute[:, 1], compute[:, 2])
                steps[:, 1:] += extra[:, :k - 1]
                ends += extra.sum(axis=1)
            release[k] = max(0.0, float(ends.max()))
            below = np.cumsum(steps, axis=1)
            release[:k] = np.maximum((ends[:, None] - below).max(axis=0), 0.0)
    # Issue order: layers K-1..0, the root, then the loss scalars (issued with the root).
    end = 0.0
    for u in [*reversed(range(k)), k]:
        end = max(end, float(release[u])) + step.reduce_s[u]
    end = max(end, release[k]) + step.scalars_s + step.cm.per_step_s
    if step.stage in (1, 2):
        end += sum(step.gather_s)
    return end


def lockstep_s(step: _Step, groups: Sequence[GroupShape], idle_ranks: bool, overlap: bool) -> float:
    """Stage 3: the slots, every group's clock a component of one vector."""
    members = list(groups) + ([None] if idle_ranks or not groups else [])
    clocks = _Clocks(len(members), overlap)
    k = step.k
    gathers = [step.gather_s[step.root], *step.gather_s[:k], *reversed(step.gather_s[:k - 1])]
    for j in range(max((len(g.microbatches) for g in groups), default=0)):
        costs = np.zeros((len(members), 4))
        ckpt = np.zeros(len(members))
        for c, g in enumerate(members):
            if g is not None and j < len(g.microbatches):
                costs[c] = _layer_costs(step, g.microbatches[j], g)
                ckpt[c] = g.microbatches[j].ckpt_layers
        fwd, head, bwd, rec = costs.T
        # Per amount of collectives in flight beside it (`_Step.contention`; a few distinct ones:
        # layers have one size), one layer's forward and its backward with and without the
        # recompute, per member, in the clocks' form (each sum formed before the clocks add it).
        forwards: dict[float, np.ndarray | list[float]] = {}
        backwards: dict[float, tuple[np.ndarray | list[float], np.ndarray | list[float]]] = {}
        if overlap:
            for beside in set(step.fwd_beside):
                forwards[beside] = clocks.of(fwd + step.contended(fwd, beside))
            for beside in set(step.bwd_beside):
                backwards[beside] = (clocks.of(bwd + step.contended(bwd, beside)),
                                     clocks.of(bwd + rec + step.contended(bwd + rec, beside)))
        else:
            forwards[0.0], backwards[0.0] = clocks.of(fwd), (clocks.of(bwd), clocks.of(bwd + rec))
        left = clocks.of(step.last_layer_leftover(fwd, head, np.where(k - 1 < ckpt, bwd + rec, bwd))
                         if overlap and k else np.zeros(len(members)))
        head, ckpt = clocks.of(head), clocks.of(ckpt)
        clocks.slot(gathers)
        clocks.use(0)
        for layer in range(k):
            clocks.use(1 + layer)
            clocks.advance(forwards[step.fwd_beside[layer] if overlap else 0.0])
        clocks.advance(head)
        for layer in reversed(range(k)):
            if layer < k - 1:
                clocks.use(k + 1 + (k - 2 - layer))
            plain, redone = backwards[step.bwd_beside[layer] if overlap else 0.0]
            clocks.advance(clocks.below(layer, ckpt, redone, plain))
            if layer == k - 1:
                clocks.advance(left)
            clocks.reduce_scatter(step.reduce_s[layer])
        clocks.reduce_scatter(step.reduce_s[step.root])
    scalars = clocks.collective(step.scalars_s)
    return max(clocks.latest(), scalars, clocks.inflight or 0.0)


SCALAR_UP_TO = 8
"""`_Clocks` keeps up to this many clocks in a Python list, more in a vector: a plan of one
SP-32 group and 1,409 micro-batches (Llama-70B, 8,192 samples on 32 GPUs) took dcp-greedy's
solve 1.5 s with a vector of one (hundreds of thousands of small numpy calls), 0.5 s with a
list."""


class _Clocks:
    """Every group's clock at once, the link, and the slot's gathers (stage 3). The same
    operations, elementwise and in the same order, on a list (few clocks) or a vector."""

    def __init__(self, members: int, overlap: bool) -> None:
        self.vector = members > SCALAR_UP_TO
        self.t: np.ndarray | list[float] = np.zeros(members) if self.vector else [0.0] * members
        self.overlap = overlap
        self.link = 0.0
        self.inflight: float | None = None
        """When the reduce-scatter in flight is done."""
        self.gathers: list[float] = []
        self.done: list[float] = []

    def of(self, values: np.ndarray) -> np.ndarray | list[float]:
        """Per-member values in the clocks' form."""
        return values if self.vector else values.tolist()

    def below(self, layer: int, ckpt: np.ndarray | list[float], yes: np.ndarray | list[float],
              no: np.ndarray | list[float]) -> np.ndarray | list[float]:
        """Per member, `yes` where `layer` is below its checkpointed layers `ckpt`, else `no`."""
        if self.vector:
            return np.where(layer < ckpt, yes, no)
        return [a if layer < c else b for c, a, b in zip(ckpt, yes, no, strict=True)]

    def latest(self) -> float:
        return float(self.t.max()) if self.vector else max(self.t)

    def advance(self, seconds: np.ndarray | list[float]) -> None:
        """Every clock on by its member's seconds."""
        if self.vector:
            self.t += seconds
        else:
            self.t = [a + b for a, b in zip(self.t, seconds, strict=True)]

    def wait(self, until: float) -> None:
        """Every clock at least `until`."""
        if self.vector:
            self.t = np.maximum(self.t, until)
        else:
            self.t = [a if a >= until else until for a in self.t]

    def collective(self, seconds: float) -> float:
        """Issued by every group now (its clock); starts once the last has and the link is free."""
        self.link = max(self.link, self.latest()) + seconds
        return self.link

    def slot(self, gathers: list[float]) -> None:
        self.gathers, self.done = gathers, [0.0] * len(gathers)
        if self.overlap:
            self.done[0] = self.collective(gathers[0])

    def use(self, n: int) -> None:
        """Wait for gather n (issue it now without overlap), then start gather n + 1."""
        if not self.overlap:
            self.done[n] = self.collective(self.gathers[n])
        self.wait(self.done[n])
        if self.overlap and n + 1 < len(self.gathers):
            self.done[n + 1] = self.collective(self.gathers[n + 1])

    def reduce_scatter(self, seconds: float) -> None:
        """Wait for the one in flight, start this one (and without overlap wait for it too)."""
        if self.inflight is not None:
            self.wait(self.inflight)
        self.inflight = self.collective(seconds)
        if not self.overlap:
            self.wait(self.inflight)
            self.inflight = None
