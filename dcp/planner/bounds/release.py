"""What the step adds to a busy time (stages 0-2: the gradient reductions the last backward
passes cannot hide, from times before which no plan issues them, `_released` and `_Spread`;
ZeRO-3: the fewest slots, `_fewest_slots`, whose collectives `schedule.least_link_s` prices),
for `bounds.lower_bound`."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

import dcp.planner.knobs as knobs
from dcp.costmodel import CostModel
from dcp.costmodel.schedule import least_step_s
from dcp.planner.bounds.work import _MEMORY_RTOL


def _released(cm: CostModel, sizes: Sequence[int], tokens: np.ndarray, pairs: np.ndarray) -> np.ndarray | None:
    """Stages 0-2, per layer u: a time before which no plan issues layer u's gradient reduction
    (None at stage 3, on one GPU or for an empty batch): the most, over the batch's
    `knobs.BOUND_RELEASE_SAMPLES` longest samples, of the least over the layouts where the sample
    fits of its time alone outside layers u-1..0's backward (K forwards, the head, K - u
    backwards). A group issues u no sooner than its last micro-batch has run those, which only
    grow as samples join it (proof: docs/design.md, Why each bound holds)."""
    if cm.training.zero_stage >= 3 or cm.cluster.num_gpus == 1 or not len(tokens) or not cm.model.num_layers:
        return None
    k = cm.model.num_layers
    u = np.arange(k, dtype=np.float64)
    memory = cm.cluster.memory_bytes * (1 + _MEMORY_RTOL)
    out = np.zeros(k)
    for i in np.argsort(-tokens, kind="stable")[:knobs.BOUND_RELEASE_SAMPLES]:
        t, a = float(tokens[i]), float(pairs[i])
        least = np.full(k, math.inf)
        for p in sizes:
            if t > cm.priceable_tokens(p):
                continue
            for layout in cm.layouts(p):
                if cm.memory_bytes(t, p, k, layout) > memory:  # not even with every layer checkpointed
                    continue
                lt = cm.layer_times(t, a, p, layout)
                least = np.minimum(least, k * lt.forward_s + cm.head_s(t, p) + (k - u) * lt.backward_s)
        out = np.maximum(out, np.where(np.isfinite(least), least, 0.0))
    return out


class _Spread:
    """Stages 0-2, per layer u and busy time M: a time before which not every rank has issued
    layer u's reduction in a plan of busy time at most M (`at`): the average over the N ranks of
    what each must run before it issues u (every sample's forwards, head and K - u backwards at
    its fewest GPU-seconds), plus one micro-batch's fixed part. Holds for multi-phase plans too
    (proof: docs/design.md, Why each bound holds)."""

    def __init__(self, cm: CostModel, sizes: Sequence[int], tokens: np.ndarray, pairs: np.ndarray,
                 weight: np.ndarray) -> None:
        k = self.k = cm.model.num_layers
        self.us = sorted({max(k - 2 ** j, 0) for j in range(knobs.BOUND_SPREAD_LAYERS)} | {k - 1}, reverse=True)
        u = np.array(self.us, dtype=np.float64)[:, None]
        self.weight, self.gpus = weight, cm.cluster.num_gpus
        self.fixed = np.full(len(self.us), math.inf)
        self.parts, self.solo = [], []  # per layout: (us, samples) parts where it fits; its samples' solo times
        memory = cm.cluster.memory_bytes * (1 + _MEMORY_RTOL)
        for p in sizes:
            for layout in cm.layouts(p):
                f, b, _ = cm.layer_linear(layout)
                self.fixed = np.minimum(self.fixed, k * f.fixed + cm.fit.microbatch_fixed_s + (k - u[:, 0]) * b.fixed)
                per_token = p * (k * f.per_token + (k - u) * b.per_token) + cm.fit.head_per_token_s
                per_pair = p * (k * f.per_pair + (k - u) * b.per_pair)
                fits = tokens <= cm.max_tokens(p, k, memory, layout)  # with every layer checkpointed
                self.parts.append(np.where(fits, per_token * tokens + per_pair * pairs, math.inf))
                line = cm.layout_linear_time(layout, 0)
                self.solo.append(line.fixed + line.per_token * tokens + line.per_pair * pairs)

    def at(self, busy_s: float) -> np.ndarray:
        """Per layer, the release bound of plans of busy time at most `busy_s` (inf: any)."""
        least = np.full(self.parts[0].shape, math.inf)
        for part, solo in zip(self.parts, self.solo, strict=True):
            least = np.minimum(least, part if not math.isfinite(busy_s) else np.where(solo <= busy_s, part, math.inf))
        spread = np.where(np.isfinite(least), least, 0.0) @ self.weight / self.gpus + self.fixed
        out = np.zeros(self.k)
        for v, value in zip(self.us, spread, strict=True):  # us descending: each fills down to the next
            out[:v + 1] = value
        return out


def _least_step(cm: CostModel, busy_s: float, sizes: Sequence[int], released: np.ndarray | None,
                spread: _Spread | None, slots: int = 1) -> float:
    """The least step of any plan of busy time at least `busy_s` (and, at ZeRO-3, of at least
    `slots` slots): `schedule.least_step_s` with `released` and, on each interval [M_i, M_i+1) of
    busy times, the spread release of busy time M_i+1 (it only falls as M grows), the least over
    the intervals."""
    if spread is None or not math.isfinite(busy_s):  # spread is None exactly where released is
        return least_step_s(cm, busy_s, sizes, released, slots)
    grid = [busy_s * (1 + knobs.BOUND_GRID_STEP * i) for i in range(knobs.BOUND_GRID)] + [math.inf]
    return min(least_step_s(cm, lo, sizes, np.maximum(released, spread.at(hi)), slots)
               for lo, hi in zip(grid[:-1], grid[1:], strict=True))


def _fewest_slots(total_tokens: float, cm: CostModel, sizes: Sequence[int]) -> int:
    """ZeRO-3 (lockstep slots): the fewest slots any plan of the batch runs, a slot holding at
    most N max_p max_tokens(p, K) / p tokens (one micro-batch per group); 1 at other stages or
    where no micro-batch fits."""
    if cm.training.zero_stage < 3:
        return 1
    per_gpu = max(cm.max_tokens(p, cm.model.num_layers) / p for p in sizes)
    if per_gpu <= 0:
        return 1
    return max(math.ceil(total_tokens / (cm.cluster.num_gpus * per_gpu) - 1e-9), 1)

