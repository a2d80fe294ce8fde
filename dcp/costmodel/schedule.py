"""The step as dcp.executor runs it, written as one program per class of ranks, and its time.

Units are the executor's (`zero.unit_params`): the K layers, then the root (embeddings, final
norm, LM head). Collectives run over the whole world, in one fixed order on every rank.

Stages 0, 1, 2 (groups independent). Each group runs its micro-batches back to back,
accumulating its whole local gradient. In its last micro-batch, as soon as layer l's backward
has produced its gradient, the executor starts that unit's reduction (all-reduce at stages 0
and 1, reduce-scatter at 2), so the reductions of layers K-1, ..., 0 run under the backward
of the layers below them; the root's follows the backward, then a tiny all-reduce of the loss
sum and token count. A rank in no group (or whose group has no micro-batch) issues them all at
once. Stages 1 and 2 then step their shard of the optimizer and all-gather each unit's updated
parameters. A unit's reduction starts when the last rank has issued it, so what the step adds
beyond the slowest group (`exposed`) is what its last micro-batch's backward could not hide.

Stage 3 (lockstep slots). Parameters live sharded; a unit is all-gathered just before it runs
and freed after, so every rank must join every gather: the step runs in slots, slot j being
every group's j-th micro-batch, and a group with fewer micro-batches runs empty passes (the
gathers and zero-contribution reduce-scatters, no compute). In a slot: gather the root, then
each layer before its forward, prefetching the next unit while one runs (layer K-1 stays
gathered for the backward); in the backward re-gather layers K-2, ..., 0, and after each
layer's backward reduce-scatter its gradient (one reduce-scatter in flight: starting the next
waits for the previous), the root's last. Each gather is thus a sync point of the whole
world: the step is close to the sum over slots of the slowest group's micro-batch in it, not
the makespan of independent groups, which is why the planner orders micro-batches so that
slots are balanced (longest first in every group).

Never imports torch.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dcp.costmodel.events import Op, Replay, replay
from dcp.costmodel.ring import SPLayout
from dcp.costmodel.schedule_fast import independent_s, lockstep_s
from dcp.costmodel.zero import padded, shard_ranks, unit_params

if TYPE_CHECKING:
    from dcp.costmodel.model import CostModel, LayerTimes

LOSS_SCALARS_BYTES = 16
"""The loss sum and loss-token count (two fp64) all-reduced at the end of every step."""


@dataclass(frozen=True)
class MicroBatchShape:
    """What the schedule needs of a micro-batch."""

    tokens: float
    pairs: float
    ckpt_layers: int


@dataclass(frozen=True)
class GroupShape:
    """An SP group of `sp` ranks and its micro-batches, in run order."""

    sp: int
    microbatches: tuple[MicroBatchShape, ...]
    layout: SPLayout | None = None
    """Its Ulysses x ring layout; None: each micro-batch in its fastest (as `CostModel.time_s`)."""

    def layout_of(self, cm: CostModel, mb: MicroBatchShape) -> SPLayout:
        """The layout `mb` runs in."""
        return self.layout or cm.best_layout([(mb.tokens, mb.pairs, mb.ckpt_layers)], self.sp)


@dataclass
class StepPrice:
    """A priced step."""

    step_time_s: float
    busy_s: float
    """The slowest group's micro-batches alone (the makespan of independent groups)."""
    replay: Replay | None
    """With spans asked for: per program (each group in order, then the ranks in no group when
    any), its spans; None when priced in closed form."""

    @property
    def exposed_s(self) -> float:
        """What the schedule adds beyond `busy_s`: unhidden collectives and lockstep waits."""
        return self.step_time_s - self.busy_s


class _Collectives:
    """Ids, seconds and labels of a step's collectives, by key (the same on every program)."""

    def __init__(self) -> None:
        self.ids: dict[tuple, int] = {}
        self.seconds: list[float] = []
        self.kinds: list[str] = []

    def __call__(self, key: tuple, seconds: float, kind: str) -> int:
        if key not in self.ids:
            self.ids[key] = len(self.seconds)
            self.seconds.append(seconds)
            self.kinds.append(kind)
        return self.ids[key]


class _Step:
    """Builds the programs of one step of `cm`'s model, hardware and ZeRO stage."""

    def __init__(self, cm: CostModel) -> None:
        self.cm, self.k = cm, cm.model.num_layers
        self.stage = cm.training.zero_stage
        self.gather_s, self.reduce_s, self.scalars_s = collective_seconds(cm)
        self.coll = _Collectives()
        self.root = self.k
        self._times = _LAYER_TIMES.setdefault(cm, {})
        if len(self._times) > _LAYER_TIMES_MAX:
            self._times.clear()
        self.slowdown = cm.hardware.overlap_slowdown
        k, g, r = self.k, self.gather_s, self.reduce_s
        if self.stage >= 3:
            # Forward of layer l: the next unit's gather (after the last layer, the backward's
            # first re-gather, layer K-2's; what the last forward leaves of it runs beside the
            # head and layer K-1's backward, `last_layer_leftover`). Backward of layer l < K-1:
            # layer l-1's re-gather and layer l+1's reduce-scatter, one after the other on the link.
            self.fwd_beside = [g[u + 1] if u + 1 < k else (g[k - 2] if k >= 2 else 0.0) for u in range(k)]
            self.bwd_beside = [(g[u - 1] if 1 <= u < k - 1 else 0.0) + (r[u + 1] if u + 1 < k else 0.0)
                               for u in range(k)]
        else:  # the last micro-batch's backward of layer l runs beside layer l+1's reduction
            self.fwd_beside = [0.0] * k
            self.bwd_beside = [r[u + 1] if u + 1 < k else 0.0 for u in range(k)]

    def layer_times(self, mb: MicroBatchShape, group: GroupShape) -> LayerTimes:
        """`CostModel.layer_times` of `mb` in its group's layout (the same for each of its layers),
        cached per cost model: a planner prices thousands of candidate plans whose groups mostly
        repeat the previous candidate's (32,768 samples on 1,024 GPUs: 0.08 s a step price)."""
        key = (mb, group.sp, group.layout_of(self.cm, mb))
        if key not in self._times:
            self._times[key] = self.cm.layer_times(mb.tokens, mb.pairs, group.sp, key[2])
        return self._times[key]

    def contention(self, compute_s: float, beside_s: float) -> float:
        """What `beside_s` of collectives in flight add to a stretch of `compute_s` of a layer's
        work (its all-to-alls and ring transfers included: they share the GPU with the collective
        too; `HardwareProfile.overlap_slowdown` = s): it runs 1 + s times slower while they do, so
        they cover min(beside, (1 + s) compute) of it and add s / (1 + s) of that."""
        return float(self.contended(np.array([compute_s]), beside_s)[0])

    def contended(self, compute_s: np.ndarray, beside_s: float | np.ndarray) -> np.ndarray:
        """`contention` elementwise (over members' work, or layers' collectives)."""
        s = self.slowdown
        if not s:
            return np.zeros_like(compute_s)
        return s / (1 + s) * np.minimum(np.maximum(beside_s, 0.0), compute_s * (1 + s))

    def last_layer_leftover(self, fwd_s: np.ndarray, head_s: np.ndarray, back_s: np.ndarray) -> np.ndarray:
        """Stage 3, elementwise: what layer K-2's re-gather, issued as the last layer's forward
        (`fwd_s`) starts, adds beside the head and that layer's backward (`back_s`, its
        recompute included) once the forward has covered what it can."""
        s = self.slowdown
        left = np.maximum(self.fwd_beside[-1] - fwd_s * (1 + s), 0.0) if self.k and s else np.zeros_like(fwd_s)
        return self.contended(head_s + back_s, left)

    def last_backward_contention(self, bwd_s: np.ndarray, rec_s: np.ndarray, ckpt: np.ndarray) -> np.ndarray:
        """Stages 0-2, per group (rows) and layer u (columns): what the reductions in flight add to
        its last micro-batch's backward of layer u (`bwd_s`, and `rec_s` below its `ckpt`
        checkpointed layers: the whole stretch, all-to-alls and ring transfers included, which
        share the GPU with the reduction too). The layers run K-1..0 and layer u+1's reduction is
        issued as layer u's backward starts; the link works off what is pending (as when this
        group issues last), so a reduction longer than the layer beside it carries over to the
        layers after it: each second the link runs beside the backward adds s / (1 + s)
        (`contention`), whatever layer it lands on. Pending work left after layer 0 is exposed,
        which costs more; so the total is at least s / (1 + s) of layers K-1..1's reductions
        (`least_exposed_s`)."""
        n, k, s = len(bwd_s), self.k, self.slowdown
        extra = np.zeros((n, k))
        if not s:
            return extra
        carry = np.zeros(n)
        for u in reversed(range(k)):
            compute = bwd_s + np.where(u < ckpt, rec_s, 0.0)
            pending = carry + self.bwd_beside[u]
            covered = np.minimum(pending, compute * (1 + s))
            extra[:, u] = s / (1 + s) * covered
            carry = pending - covered
        return extra

    @staticmethod
    def _contention_op(seconds: float, i: int) -> list[Op]:
        """The op of `seconds` of contention in micro-batch `i`'s program (none when 0)."""
        return [("compute", float(seconds), "contention", i)] if seconds > 0 else []

    # -- pieces ----------------------------------------------------------------------------------
    def forward(self, mb: MicroBatchShape, group: GroupShape, i: int) -> tuple[list[Op], Op]:
        """One layer's forward ops (the ring transfers its attention does not hide included) and
        the head (forward and backward, lumped as `microbatch_phases` does)."""
        lt, head = self.layer_times(mb, group), self.cm.head_s(mb.tokens, group.sp)
        return ([("compute", lt.fwd_compute_s, "forward", i), ("compute", lt.comm_s, "all_to_all", i),
                 ("compute", lt.ring_fwd_s, "ring", i)],
                ("compute", head, "forward", i))

    def backward(self, mb: MicroBatchShape, group: GroupShape, i: int, layer: int) -> list[Op]:
        """Layer `layer`'s backward ops, its recompute first when it is checkpointed."""
        lt = self.layer_times(mb, group)
        ops: list[Op] = []
        if layer < mb.ckpt_layers:
            ops += [("compute", lt.rec_compute_s, "recompute", i), ("compute", lt.comm_s, "all_to_all", i),
                    ("compute", lt.ring_fwd_s, "ring", i)]
        return ops + [("compute", lt.bwd_compute_s, "backward", i), ("compute", lt.comm_s, "all_to_all", i),
                      ("compute", lt.ring_bwd_s, "ring", i)]

    def reduce(self, unit: int, slot: int = 0) -> int:
        return self.coll(("reduce", slot, unit), self.reduce_s[unit], "allreduce")

    def gather(self, unit: int, slot: int, backward: bool) -> int:
        return self.coll(("gather", slot, unit, backward), self.gather_s[unit], "param_gather")

    def finish(self, ops: list[Op], pending: list[int]) -> None:
        """The loss scalars, every reduction waited for, and at stages 1 and 2 the parameters
        all-gathered after the optimizer stepped its shard."""
        scalars = self.coll(("scalars",), self.scalars_s, "allreduce")
        ops.append(("issue", scalars))
        ops += [("wait", c) for c in [*pending, scalars]]
        if self.stage in (1, 2):
            after = [self.coll(("updated", u), self.gather_s[u], "allreduce") for u in range(self.k + 1)]
            ops += [("issue", c) for c in after] + [("wait", c) for c in after]

    # -- programs ----------------------------------------------------------------------------------
    def independent(self, group: GroupShape | None, overlap: bool) -> list[Op]:
        """Stages 0-2: the group's micro-batches, its reductions issued as the last one's layers finish."""
        ops: list[Op] = []
        mbs = group.microbatches if group else ()
        issued: list[int] = []
        for i, mb in enumerate(mbs):
            last = overlap and i == len(mbs) - 1
            layer_ops, head = self.forward(mb, group, i)
            ops += layer_ops * self.k + [head]
            if last:
                lt = self.layer_times(mb, group)
                extra = self.last_backward_contention(np.array([lt.backward_s]), np.array([lt.recompute_s]),
                                                      np.array([mb.ckpt_layers]))[0]
            for layer in reversed(range(self.k)):
                ops += self.backward(mb, group, i, layer)
                if last:
                    ops += self._contention_op(extra[layer], i)
                    issued.append(self.reduce(layer))
                    ops.append(("issue", issued[-1]))
        for layer in reversed(range(self.k)):
            if self.reduce(layer) not in issued:
                issued.append(self.reduce(layer))
                ops.append(("issue", issued[-1]))
        issued.append(self.reduce(self.root))
        ops.append(("issue", issued[-1]))
        self.finish(ops, issued)
        return ops

    def lockstep(self, group: GroupShape | None, slots: int, overlap: bool) -> list[Op]:
        """Stage 3: every slot's gathers and reduce-scatters, with the group's micro-batch or an
        empty pass. Without `overlap` nothing is prefetched and every collective is waited for
        at once."""
        ops: list[Op] = []
        inflight: list[int] = []
        mbs = group.microbatches if group else ()

        def reduce_scatter(unit: int, slot: int) -> None:
            if inflight:  # one in flight: the next starts once the previous is done
                ops.append(("wait", inflight.pop()))
            inflight.append(self.reduce(unit, slot))
            ops.append(("issue", inflight[-1]))
            if not overlap:
                ops.append(("wait", inflight.pop()))

        for j in range(slots):
            mb = mbs[j] if j < len(mbs) else None
            # The order in which the executor uses gathered units; each use prefetches the next.
            order = [self.gather(self.root, j, False)] + [self.gather(u, j, False) for u in range(self.k)]
            order += [self.gather(u, j, True) for u in reversed(range(self.k - 1))]
            if overlap:
                ops.append(("issue", order[0]))
            _use(ops, order, 0, overlap)
            layer_ops, head = self.forward(mb, group, j) if mb else ([], None)
            lt = self.layer_times(mb, group) if mb else None
            for layer in range(self.k):
                _use(ops, order, 1 + layer, overlap)
                ops += layer_ops
                if lt and overlap:
                    ops += self._contention_op(self.contention(lt.forward_s, self.fwd_beside[layer]), j)
            if head:
                ops.append(head)
            for layer in reversed(range(self.k)):
                if layer < self.k - 1:
                    _use(ops, order, self.k + 1 + (self.k - 2 - layer), overlap)
                if mb:
                    ops += self.backward(mb, group, j, layer)
                    if overlap:
                        back = lt.backward_s + (lt.recompute_s if layer < mb.ckpt_layers else 0.0)
                        ops += self._contention_op(self.contention(back, self.bwd_beside[layer]), j)
                        if layer == self.k - 1:
                            ops += self._contention_op(self.last_layer_leftover(
                                np.array([lt.forward_s]), np.array([head[1]]), np.array([back]))[0], j)
                reduce_scatter(layer, j)
            reduce_scatter(self.root, j)
        self.finish(ops, inflight)
        return ops


def collective_seconds(cm: CostModel) -> tuple[list[float], list[float], float]:
    """Each unit's all-gather and reduction seconds and the loss scalars' all-reduce, kept per
    cost model (a pure function of it, priced on every step the planners price).

    Over F ranks (`zero.shard_ranks`: the world, 1 at stage 0, the shard group under HSDP) and
    R = n / F replicas: a unit's gather is an all-gather among its shard group (aligned ranks, a
    node when F = GPUs per node); its reduction a reduce-scatter (stages 2, 3; all-reduce at 0,
    1) among the shard group, then, when R > 1, FSDP2's all-reduce of the gradient shard among
    the R ranks holding the same shard (`HardwareProfile.strided_time_s`: across nodes, at one
    GPU's inter-node bandwidth). At stage 0 (F = 1) that is the world's all-reduce of the whole
    gradient, among aligned ranks."""
    if cm not in _SECONDS:
        n, g, recipe = cm.cluster.num_gpus, cm.cluster.gpus_per_node, cm.training.recipe
        f = shard_ranks(cm.training.zero_stage, n, cm.training.shard_group)
        sizes = [padded(u, f) for u in unit_params(cm.model)]
        reduce_op = "reduce_scatter" if cm.training.zero_stage >= 2 else "all_reduce"
        gather = [cm.hardware.collective_time_s("all_gather", s * recipe.param_bytes, f, g) for s in sizes]
        if f == 1:  # replicated: the world's all-reduce
            reduce = [cm.hardware.collective_time_s("all_reduce", s * recipe.reduce_bytes, n, g) for s in sizes]
        else:
            reduce = [cm.hardware.collective_time_s(reduce_op, s * recipe.reduce_bytes, f, g)
                      + cm.hardware.strided_time_s("all_reduce", s / f * recipe.reduce_bytes, n // f, max(1, g // f))
                      for s in sizes]
        _SECONDS[cm] = (gather, reduce, cm.hardware.collective_time_s("all_reduce", LOSS_SCALARS_BYTES, n, g))
    gather, reduce, scalars = _SECONDS[cm]
    return list(gather), list(reduce), scalars


_SECONDS: weakref.WeakKeyDictionary[CostModel, tuple[list[float], list[float], float]] = weakref.WeakKeyDictionary()
"""`collective_seconds` per cost model; the values hold no reference to it, so it still dies."""


def _use(ops: list[Op], order: list[int], n: int, overlap: bool) -> None:
    """Use gathered unit n of a slot: wait for its gather, then start the next one's (prefetch);
    without overlap, start it only now."""
    if not overlap:
        ops.append(("issue", order[n]))
    ops.append(("wait", order[n]))
    if overlap and n + 1 < len(order):
        ops.append(("issue", order[n + 1]))


def price_step(cm: CostModel, groups: Sequence[GroupShape], idle_ranks: bool = False, *,
               overlap: bool = True, spans: bool = False, busy_s: Sequence[float] | None = None) -> StepPrice:
    """The step of `groups` (and of ranks in no group when `idle_ranks`) under `cm`'s ZeRO stage.
    `overlap=False` prices the executor's `overlap` switch: stages 0-2 start their reductions
    only after the last micro-batch, stage 3 prefetches nothing and waits for every collective.
    With `spans` the rank programs are replayed (`events.replay`) and every group's spans kept;
    without, the same time comes from the closed form of `schedule_fast`. `busy_s`: when each
    group's micro-batches end, when the caller has it: their summed `time_s` (a plan has them),
    plus, for the last groups of a multi-phase plan's ranks, the group's start."""
    step = _Step(cm)
    per_group = list(busy_s) if busy_s is not None else [
        sum(cm.time_s(mb.tokens, mb.pairs, g.sp, mb.ckpt_layers, g.layout) for mb in g.microbatches) for g in groups]
    if len(per_group) != len(groups):
        raise ValueError(f"{len(per_group)} busy times for {len(groups)} groups")
    busy = max(per_group, default=0.0)
    if not spans:
        if step.stage >= 3:
            return StepPrice(lockstep_s(step, groups, idle_ranks, overlap) + cm.per_step_s, busy, None)
        return StepPrice(independent_s(step, groups, per_group, overlap), busy, None)
    members: list[GroupShape | None] = [*groups, *([None] if idle_ranks or not groups else [])]
    if step.stage >= 3:
        slots = max((len(g.microbatches) for g in groups), default=0)
        programs = [step.lockstep(g, slots, overlap) for g in members]
    else:
        programs = [step.independent(g, overlap) for g in members]
    programs, seconds, kinds = _in_issue_order(programs, step.coll.seconds, step.coll.kinds)
    result = replay(programs, seconds, kinds, spans=True)
    # The optimizer steps after every reduction (stages 1, 2: before the updated parameters'
    # all-gathers, which then start no earlier): it adds to the step wherever it sits in the tail.
    return StepPrice(max(result.end_s, default=0.0) + cm.per_step_s, busy, result)


def _in_issue_order(programs: list[list[Op]], seconds: list[float], kinds: list[str]
                    ) -> tuple[list[list[Op]], list[float], list[str]]:
    """Renumber collectives in the order the programs issue them (the same in all), so that the
    link breaks ties in readiness in that order, as the executor's process groups do."""
    new: dict[int, int] = {}
    for op in programs[0]:
        if op[0] == "issue":
            new.setdefault(op[1], len(new))
    for cid in range(len(seconds)):
        new.setdefault(cid, len(new))
    renumbered = [[(op[0], new[op[1]]) if op[0] != "compute" else op for op in prog] for prog in programs]
    order = sorted(new, key=new.__getitem__)
    return renumbered, [seconds[c] for c in order], [kinds[c] for c in order]


def least_exposed_s(cm: CostModel, slots: int = 1) -> float:
    """The least any plan's schedule adds beyond its slowest group: at stages 0-2 that group
    finishes its last micro-batch with layer 0's backward (the head's is priced in the forward),
    so layer 0's and the root's reductions and the loss all-reduce run after it, and at stages 1
    and 2 the parameters' all-gathers after those; at stage 3 (`slots` slots, one at least) the
    root's and layer 0's gathers precede the first forward and the root's reduce-scatter and the
    loss all-reduce follow the last backward. At stages 0-2 layers K-1..1's reductions run either
    beside that group's last backward, slowing it by s / (1 + s) of their seconds (`HardwareProfile.
    overlap_slowdown` = s, `_Step.last_backward_contention`), or after it, exposed, which costs
    their whole seconds: s / (1 + s) of them at least; at stage 3 likewise each slot's other
    gathers and reduce-scatters, beside some layer's work or waited for, in every slot (a plan of
    at least `slots` slots: the planner's bounds pass the fewest a batch can run in). A lower
    bound, so a makespan bound plus it stays a lower bound of the step."""
    if cm.cluster.num_gpus == 1:
        return cm.per_step_s
    gather, reduce, _ = collective_seconds(cm)
    k = cm.model.num_layers
    s = cm.hardware.overlap_slowdown
    if cm.training.zero_stage >= 3:
        # A slot's other collectives (layers 1..K-1's gathers, K-2..0's re-gathers, K-1..0's
        # reduce-scatters) each run beside a layer's work or are waited for: s / (1 + s) at least.
        beside = sum(gather[1:k]) + sum(gather[:max(k - 1, 0)]) + sum(reduce[:k])
        return _after_layers_s(cm) + gather[k] + (gather[0] if k else 0.0) + max(slots, 1) * s / (1 + s) * beside
    return _after_layers_s(cm) + (reduce[0] if k else 0.0) + s / (1 + s) * sum(reduce[1:k])


def _after_layers_s(cm: CostModel) -> float:
    """What follows every layer's reduction: the root's reduction, the loss scalars' all-reduce,
    the optimizer's step and, at stages 1 and 2, the all-gathers of the updated parameters."""
    gather, reduce, scalars = collective_seconds(cm)
    return (reduce[cm.model.num_layers] + scalars + cm.per_step_s
            + (sum(gather) if cm.training.zero_stage in (1, 2) else 0.0))


def reduction_chain_s(cm: CostModel) -> np.ndarray | None:
    """Stages 0-2, per layer u: the link's seconds from the start of layer u's reduction to the
    step's end when nothing waits in between: reduce(u) + ... + reduce(0) + the root's + the
    loss scalars' (+ the stage 1 and 2 all-gathers). None at stage 3 or on one GPU."""
    if cm.cluster.num_gpus == 1 or cm.training.zero_stage >= 3 or not cm.model.num_layers:
        return None
    reduce = collective_seconds(cm)[1]
    return np.cumsum(reduce[:cm.model.num_layers]) + _after_layers_s(cm)


def least_step_s(cm: CostModel, busy_s: float, sizes: Sequence[int], released: np.ndarray | None = None,
                 slots: int = 1) -> float:
    """The least step of any plan whose groups have these SP sizes and whose busy time (its
    slowest group's end) is at least `busy_s`: `busy_s + least_exposed_s` (at stage 3 of a plan
    of at least `slots` slots) and, at stages 0-2, the reductions the last backward passes cannot
    hide. `released`, when given, is per layer a time no plan issues that layer's reduction
    before (the planner's, from the batch's longest samples).

    Why it holds: the link serves the reductions in issue order (layers K-1, ..., 0, the root,
    the loss scalars), each once every rank has issued it, so the step ends no sooner than
    when layer u's is issued plus `reduction_chain_s`[u]. The slowest group, ending at M >=
    `busy_s`, issues layer u's once its last micro-batch's backward has done layers K-1..u, at
    M - below(u), where below(u) is that micro-batch's backward (and recompute) of layers
    u-1..0, and that micro-batch runs at most M: `_BackwardShares.release` is the earliest this
    can be, and only grows with M. At u = 0 (below 0) it is `busy_s + least_exposed_s`. When a
    plan's last micro-batches are too short to hide layer K-1's reduction, the whole chain of
    K + 1 reductions is exposed."""
    least = busy_s + least_exposed_s(cm, slots)
    chain = reduction_chain_s(cm)
    if chain is None or not math.isfinite(busy_s):
        return least
    key = tuple(sorted(set(sizes)))
    shares = _SHARES.setdefault(cm, {})
    if key not in shares:
        shares[key] = _BackwardShares(cm, key)
    release = shares[key].release(busy_s)
    if released is not None:
        release = np.maximum(release, released)
    return max(least, float(np.max(release + chain)))


class _BackwardShares:
    """For every layout of the sizes and every checkpointed layer count r, the parts of a
    micro-batch's time and of below(u), its backward and recompute of layers u-1..0 (u =
    0..K-1), as fixed + per token T + per pair A + e, e being the ring's exposed transfers.

    Time is its linear form (`CostModel.layer_linear`: K forwards and backwards, r recomputes,
    and the head) plus e = (K + r) exposed_f + K exposed_b. below(u) = u backwards and min(u, r)
    recomputes (the checkpointed layers are 0..r-1), the same parts, and at most u / K of e.
    Each exposed transfer is (c - 1) max(0, latency + transfer T - step compute) <= (c - 1)
    (latency + max(0, transfer - step compute per token) T), so e <= e0 + e1 T."""

    def __init__(self, cm: CostModel, sizes: Sequence[int]) -> None:
        k, fit = cm.model.num_layers, cm.fit
        u = np.arange(k, dtype=np.float64)[:, None]
        r = np.arange(k + 1, dtype=np.float64)[None, :]
        shape = (k, k + 1)
        rows: list[tuple[np.ndarray, ...]] = []
        for p in sizes:
            for layout in cm.layouts(p):
                ring, c = cm.ring_terms(layout), layout.ring
                f, b, rc = ([x.fixed, x.per_token, x.per_pair] for x in cm.layer_linear(layout))
                head = [fit.microbatch_fixed_s, fit.head_per_token_s / p, 0.0]
                # (u, r) arrays per part: below(u)'s and the time's
                below = [u * b[j] + np.minimum(u, r) * rc[j] for j in range(3)]
                time = [np.broadcast_to(k * (f[j] + b[j]) + r * rc[j] + head[j], shape) for j in range(3)]
                e0 = e1 = np.zeros(shape)
                if c > 1:
                    ef = (c - 1) * max(0.0, ring.fwd_transfer_token_s - ring.fwd_step_token_s)
                    eb = (c - 1) * max(0.0, ring.bwd_transfer_token_s - ring.bwd_step_token_s)
                    e0 = e0 + (2 * k + r) * (c - 1) * ring.step_latency_s
                    e1 = e1 + (k + r) * ef + k * eb
                rows.append((below[0], time[0], below[1], time[1], below[2], time[2], e0, e1))
        self.below0, self.time0, self.below_t, self.time_t, self.below_a, self.time_a, self.e0, self.e1 = (
            np.stack(x) for x in zip(*rows, strict=True))  # (layout, u, r)
        self.sigma = u[None] / k

    def release(self, busy_s: float) -> np.ndarray:
        """Per layer u: the earliest a group of busy time M >= busy_s can issue its reduction,
        min over layouts and r of M_l - below_max(u, M_l) at M_l = max(M, the layout's least
        time): below_max is the most below(u) can be in a micro-batch of time at most M_l (a
        fractional knapsack over its parts: up to e0 of e at u / K, then the best per-second
        rate among tokens with e1 T of e riding along, tokens alone, and pairs), whose slope in
        M is at most 1, so each term grows with M from the least time on and the min over
        M' >= busy_s is at M_l."""
        m = np.maximum(busy_s, self.time0)
        room = m - self.time0
        with np.errstate(divide="ignore", invalid="ignore"):
            rates = [np.where(self.time_t > 0, self.below_t / self.time_t, 0.0),
                     np.where(self.time_t + self.e1 > 0,
                              (self.below_t + self.sigma * self.e1) / (self.time_t + self.e1), 0.0),
                     np.where(self.time_a > 0, self.below_a / self.time_a, 0.0)]
        rate = np.maximum.reduce(rates)
        first = np.where(self.sigma > rate, np.minimum(self.e0, room), 0.0)
        below = self.below0 + self.sigma * first + rate * (room - first)
        return np.min(m - np.minimum(m, below), axis=(0, 2))


_SHARES: weakref.WeakKeyDictionary[CostModel, dict[tuple[int, ...], _BackwardShares]] = weakref.WeakKeyDictionary()
"""`_BackwardShares` per cost model and set of sizes (a pure function of both)."""
_LAYER_TIMES: weakref.WeakKeyDictionary[CostModel, dict[tuple[MicroBatchShape, int, SPLayout], LayerTimes]] = \
    weakref.WeakKeyDictionary()
"""`_Step.layer_times` per cost model (cleared past `_LAYER_TIMES_MAX` entries)."""
_LAYER_TIMES_MAX = 50_000


def least_link_s(cm: CostModel, slots: int) -> float:
    """Stage 3: a step of `slots` slots is at least the seconds its collectives occupy the link:
    every slot's 2K gathers and K + 1 reduce-scatters (`slot_link_s`), and the loss all-reduce
    (they run one at a time, each once every rank joined). 0 at other stages."""
    if cm.training.zero_stage < 3 or cm.cluster.num_gpus == 1:
        return 0.0
    return slots * slot_link_s(cm) + collective_seconds(cm)[2]


def slot_link_s(cm: CostModel) -> float:
    """Stage 3: the seconds one slot's collectives occupy the link, its 2K gathers and K + 1
    reduce-scatters (a slot lasts at least that, its compute prefetching under them). 0 at other
    stages."""
    if cm.training.zero_stage < 3 or cm.cluster.num_gpus == 1:
        return 0.0
    gather, reduce, _ = collective_seconds(cm)
    k = cm.model.num_layers
    return gather[k] + sum(gather[:k]) + sum(gather[:k - 1]) + sum(reduce)
