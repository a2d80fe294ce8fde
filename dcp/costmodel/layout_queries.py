"""The layout side of the cost model: which Ulysses x ring splits a group size may use, the ring's
terms of each, what each holds in memory, the fastest for a set of micro-batches, and what fits
memory at a group size in every one of its layouts (`max_tokens`, `min_ckpt_layers`).

`CostModel` inherits these queries (`LayoutQueries`); the formulas are in `ring.py`. Never imports
torch.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dcp.costmodel.ring import (
    RingCoefficients,
    SPLayout,
    layout_extra_bytes,
    ring_coefficients,
    shard_tokens,
    sp_layouts,
)

if TYPE_CHECKING:
    from dcp.costmodel.hardware import Cluster, HardwareProfile, LayerFit, TrainingSetup
    from dcp.costmodel.memory import MemoryFootprint
    from dcp.costmodel.model import LinearCost  # noqa: F401 - in annotations
    from dcp.costmodel.spec import ModelSpec


class LayoutQueries:
    """Layout queries of a cost model, cached per layout (planners ask them for every sample);
    `time_s`, `_linear_in`, `priceable_tokens` and `static_bytes` are CostModel's."""

    model: ModelSpec
    hardware: HardwareProfile
    cluster: Cluster
    training: TrainingSetup
    fit: LayerFit
    footprint: MemoryFootprint

    def _init_layouts(self) -> None:
        self._layouts: dict[int, tuple[SPLayout, ...]] = {}
        self._rings: dict[SPLayout, RingCoefficients] = {}
        self._token_bytes: dict[tuple[SPLayout, int], float] = {}
        self._envelopes: dict[int, list[float]] = {}
        self._capacities: dict[int, list[int]] = {}

    def layouts(self, sp_size: int) -> tuple[SPLayout, ...]:
        """The layouts a group of p GPUs may run (`ring.sp_layouts`); Ulysses alone for an SP size
        no layout can run, so that any size still prices (the planner offers only runnable ones)."""
        if sp_size not in self._layouts:
            self._layouts[sp_size] = (sp_layouts(self.model, sp_size, self.cluster.gpus_per_node)
                                      or (SPLayout(sp_size),))
        return self._layouts[sp_size]

    def best_layout(self, microbatches: Sequence[tuple[float, float, int]], sp_size: int) -> SPLayout:
        """The layout of p GPUs that runs these (tokens, pairs, checkpointed layers) fastest
        (the first of equals: the largest Ulysses degree)."""
        options = self.layouts(sp_size)
        if len(options) == 1:
            return options[0]
        times = [sum(self.time_s(t, a, sp_size, r, layout) for t, a, r in microbatches) for layout in options]
        return options[max(range(len(options)), key=lambda i: (-times[i], options[i].ulysses))]

    def ring_terms(self, layout: SPLayout) -> RingCoefficients:
        """The ring terms of `layout` (`ring.RingCoefficients`; all zero without a ring)."""
        return self._ring(layout)

    def layout_linear_time(self, layout: SPLayout, ckpt_layers: int) -> LinearCost:
        """The linear part of a micro-batch's time in `layout`: exact without a ring, with one its
        compute-bound form (`time_s` adds the exposed transfers, `ring_terms`)."""
        return self._linear_in(layout, ckpt_layers)

    def _ring(self, layout: SPLayout) -> RingCoefficients:
        """The ring terms of `layout` (all zero without a ring)."""
        if layout not in self._rings:
            hw, f, c, p = self.hardware, self.fit, layout.ring, layout.size
            inter = p > self.cluster.gpus_per_node  # the slowest hop of the ring sets every step
            lat, bw = hw.p2p(inter).alpha_beta()
            self._rings[layout] = ring_coefficients(
                self.model, layout, fwd_pair_s=f.fwd_per_pair_s, bwd_pair_s=f.bwd_per_pair_s,
                fwd_kappa=hw.attention_fwd_pairs_per_token, bwd_kappa=hw.attention_bwd_pairs_per_token,
                memory_bw=hw.memory_bw_bytes_per_s, launch_s=hw.kernel_launch_s, p2p_latency_s=lat if c > 1 else 0.0,
                p2p_bw=bw, acc_bytes=max(4, self.training.recipe.compute_bytes))
        return self._rings[layout]

    def _gpu_token_bytes(self, layout: SPLayout, ckpt_layers: int) -> float:
        """Bytes per token a GPU holds in `layout` with r checkpointed layers."""
        key = (layout, ckpt_layers)
        if key not in self._token_bytes:  # asked for every sample and level the planners try: cached
            f, k, r = self.footprint, self.model.num_layers, ckpt_layers
            saved, working = layout_extra_bytes(self.model, layout, self.training.recipe.compute_bytes)
            self._token_bytes[key] = ((k - r) * (f.act_full_bytes_per_token + saved) + r * f.act_ckpt_bytes_per_token
                                      + f.working_bytes_per_token + working)
        return self._token_bytes[key]

    def _envelope(self, sp_size: int) -> list[float]:
        """Per r = 0..K, the most bytes per GPU token any layout of p holds."""
        if sp_size not in self._envelopes:
            self._envelopes[sp_size] = [max(self._gpu_token_bytes(o, r) for o in self.layouts(sp_size))
                                        for r in range(self.model.num_layers + 1)]
        return self._envelopes[sp_size]

    # -- what fits memory ----------------------------------------------------------------------
    def max_tokens(self, sp_size: int, ckpt_layers: int, memory_bytes: float | None = None,
                   layout: SPLayout | None = None) -> int:
        """Largest micro-batch (tokens) that fits memory at (p, r) in every layout of p (in
        `layout` alone, when given) and that the profile can price; 0 if none: p times the
        tokens one GPU's room holds (2p times half of them under a ring), so that the padded
        shards fit too. `memory_bytes`: per GPU instead of the cluster's."""
        room = (self.cluster.memory_bytes if memory_bytes is None else memory_bytes) - self.static_bytes
        if room <= 0:
            return 0
        fits = []
        for o in (layout,) if layout is not None else self.layouts(sp_size):
            per_gpu = int(room // self._gpu_token_bytes(o, ckpt_layers))
            fits.append(sp_size * (per_gpu if o.ring == 1 else 2 * (per_gpu // 2)))
        return int(min(min(fits), self.priceable_tokens(sp_size)))

    def min_ckpt_layers(self, tokens: float, sp_size: int) -> int | None:
        """Fewest checkpointed layers for which `tokens` fit at SP size p in every layout of p; None
        if even K does not, or if the micro-batch lies beyond the range the profile can price."""
        if tokens > self.priceable_tokens(sp_size):
            return None
        options = self.layouts(sp_size)
        if len(options) == 1:
            return self._min_ckpt_in(tokens, options[0])
        # Several layouts: the fewest layers whose capacity (the least over layouts) holds them.
        if sp_size not in self._capacities:
            self._capacities[sp_size] = [self.max_tokens(sp_size, r) for r in range(self.model.num_layers + 1)]
        r = bisect.bisect_left(self._capacities[sp_size], tokens)
        return r if r <= self.model.num_layers else None

    def _min_ckpt_in(self, tokens: float, layout: SPLayout) -> int | None:
        k = self.model.num_layers
        room = self.cluster.memory_bytes - self.static_bytes
        per_gpu = shard_tokens(tokens, layout.size, layout.ring)
        base = self._gpu_token_bytes(layout, 0) * per_gpu
        # Memory falls linearly in r: each checkpointed layer saves the same bytes per token.
        saved = (self._gpu_token_bytes(layout, 0) - self._gpu_token_bytes(layout, 1)) * per_gpu
        if base <= room:
            return 0
        if saved <= 0:
            return None
        r = math.ceil((base - room) / saved - 1e-9)
        return r if r <= k else None
