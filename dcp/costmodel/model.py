"""The cost model: time and memory of one micro-batch, the contract between profiler and planner.

A micro-batch is a set of samples run together (packed, varlen) by one sequence-parallel
(SP) group of size p, with r of the model's K layers checkpointed. Per layer and per GPU
(docs/design.md, "The cost model"):

    compute(T, A, p) = c0 + c_tok * T/p + c_attn * A/p       T = sum tokens, A = sum attn_pairs
    comm(T, p)       = 0 if p == 1 else n_a2a * lat(p) + bytes_per_token * T/p * (p-1)/p / bw(p)
    time             = K * (fwd + bwd) + r * rec (recompute ~ fwd, its all-to-alls included) + head + fixed
    memory           = static + (K - r) * act_full * T/p + r * act_ckpt * T/p + working * T/p
                       (static: training state + weight copies + the peak's fixed part; all measured)

lat(p) and bw(p) are the alpha-beta fit of the hardware's all-to-all curve for the group's shape
(GPUs per node, nodes; `collectives.py`). Everything per micro-batch is linear in T and A for a
fixed (p, r), which the ILP planner relies on: `linear_time(p, r)` and
`activation_bytes_per_token(p, r)` expose the coefficients. The step's ZeRO collectives (gradient
reductions overlapped with the last backward, stage 3's per-layer gathers in lockstep slots) are
priced on a whole plan by `step_price` (`schedule.py`); `grad_sync_s` is the least they add.

This package never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dcp.costmodel.collectives import bus_factor
from dcp.costmodel.elementwise import elementwise_bytes, loss_bytes_per_token
from dcp.costmodel.hardware import Cluster, HardwareProfile, LayerFit, TrainingSetup
from dcp.costmodel.layout_queries import LayoutQueries
from dcp.costmodel.memory import footprint_for
from dcp.costmodel.ring import SPLayout, kv_width, shard_tokens
from dcp.costmodel.schedule import (
    GroupShape,
    StepPrice,
    collective_seconds,
    least_exposed_s,
    price_step,
)
from dcp.costmodel.spec import CostModelError, ModelSpec
from dcp.costmodel.traffic import optimizer_step_s, weight_traffic
from dcp.costmodel.zero import in_step_bytes, resident_bytes, shard_ranks, unit_params


@dataclass(frozen=True)
class LinearCost:
    """time = fixed + per_token * T + per_pair * A for a micro-batch at fixed (p, r)."""

    fixed: float
    per_token: float
    per_pair: float

    def __call__(self, tokens: float, pairs: float) -> float:
        return self.fixed + self.per_token * tokens + self.per_pair * pairs

    def terms(self) -> tuple[float, float, float]:
        return self.fixed, self.per_token, self.per_pair


def _least(forms: list[LinearCost]) -> LinearCost:
    """The least of linear forms coefficient by coefficient (the one form when there is one): a
    lower bound on each of them for non-negative (T, A)."""
    if len(forms) == 1:
        return forms[0]
    return LinearCost(*(min(c) for c in zip(*(f.terms() for f in forms), strict=True)))


@dataclass(frozen=True)
class LayerTimes:
    """One layer's forward and backward at SP size p for a micro-batch, split by kind."""

    fwd_compute_s: float
    bwd_compute_s: float
    comm_s: float
    """All-to-alls of one direction (forward or backward; they move the same bytes)."""
    rec_compute_s: float
    """Recompute when the layer is checkpointed (its all-to-alls are another comm_s)."""
    ring_fwd_s: float = 0.0
    """Ring transfers of the forward (and of a recompute) not hidden behind its attention."""
    ring_bwd_s: float = 0.0
    """Ring transfers of the backward not hidden, the last gradient block's return included."""

    @property
    def forward_s(self) -> float:
        """The whole forward of the layer: compute, all-to-alls, unhidden ring transfers."""
        return self.fwd_compute_s + self.comm_s + self.ring_fwd_s

    @property
    def backward_s(self) -> float:
        """The whole backward of the layer (its recompute apart)."""
        return self.bwd_compute_s + self.comm_s + self.ring_bwd_s

    @property
    def recompute_s(self) -> float:
        """The whole recompute of a checkpointed layer (a forward's compute and transfers again)."""
        return self.rec_compute_s + self.comm_s + self.ring_fwd_s


class CostModel(LayoutQueries):
    """Time and memory of a micro-batch for one model, hardware and training setup; the layout
    queries (Ulysses x ring) come from `LayoutQueries`."""

    def __init__(self, model: ModelSpec, hardware: HardwareProfile, cluster: Cluster,
                 training: TrainingSetup | None = None) -> None:
        self.model = model
        self.hardware = hardware
        self.cluster = cluster
        self.training = training or TrainingSetup()
        fitted = hardware.fits.get(model.name)
        self.footprint = footprint_for(model, self.training.recipe, fitted)
        """The measured memory of this model in the training's recipe (dcp.costmodel.memory)."""
        self.fit = fitted or self._derive_fit()
        units, n, stage = unit_params(model), cluster.num_gpus, self.training.zero_stage
        shard_group = self.training.shard_group
        self.resident_bytes = resident_bytes(self.training.recipe, stage, units, n, shard_group)
        """Training state held between steps: sharded parameters (master weights), gradients,
        optimizer, in FSDP2's padded units (dcp.costmodel.zero)."""
        self.in_step_bytes = in_step_bytes(self.training.recipe, stage, units, n, shard_group)
        """What FSDP2's schedule adds during a step: stages 0-2 the gathered parameters and the
        whole local gradient, stage 3 the gathered units and their gradients."""
        local = sum(units) / shard_ranks(stage, n, shard_group)
        self.optimizer_s = optimizer_step_s(self.training.recipe, local, hardware.memory_bw_bytes_per_s,
                                            self.training.optimizer)
        """The optimizer's step over this rank's shard, once per step (`traffic.optimizer_step_s`)."""
        self.per_step_s = self.optimizer_s + self.fit.step_fixed_s
        """What every step adds once beyond its micro-batches and its collectives' curves: the
        optimizer's step and, where `dcp profile` measured it, the executor's own per-step cost
        (`LayerFit.step_fixed_s`)."""
        fp = self.footprint
        self.static_bytes = (self.resident_bytes + self.in_step_bytes + fp.weight_copy_bytes(model.num_layers)
                             + fp.working_fixed_bytes)
        """Memory every micro-batch needs whatever its tokens: the training state and what the
        schedule gathers, autocast's weight copies, and the token-independent part of the peak."""
        self._linear: dict[tuple[int, int], LinearCost] = {}
        self._layout_linear: dict[tuple[SPLayout, int], LinearCost] = {}
        self._less_below: dict[tuple[int, int], LinearCost] = {}
        self._init_layouts()

    # -- coefficients --------------------------------------------------------------------
    def _derive_fit(self) -> LayerFit:
        """Coefficients from FLOPs and bytes when no measurement exists for this model."""
        m, hw, tr = self.model, self.hardware, self.training
        bw = hw.memory_bw_bytes_per_s
        # Elementwise work (norms, RoPE, residual adds, the MLP's activation, autocast's casts)
        # streams its bytes through device memory: counted op by op from the layer's structure,
        # eager or fused (dcp.costmodel.elementwise).
        ew = elementwise_bytes(m, tr.recipe, tr.kernels)
        # Tensor-core work runs at the clock a step sustains, below the benchmarks' burst
        # (HardwareProfile.sustained_clock): the matmuls, the attention kernels, the LM head.
        clock = hw.sustained_clock
        matmul_rate = hw.matmul_flops * clock
        matmul_s = m.layer_fwd_flops_per_token() / matmul_rate
        # Small-M GEMMs: each of the layer's matmuls over M tokens runs as M + offset tokens
        # (HardwareProfile.matmul_tokens_offset): a fixed cost per layer and pass.
        offset = hw.matmul_tokens_offset
        matmul_fixed = offset * matmul_s
        # Attention per kernel and direction: a kernel over T tokens and A pairs takes (A + kappa T)
        # pairs at its long-sequence rate, kappa the short-sequence cost per token of each attention
        # call (one per block). Backward FLOPs are 2.5x the forward's: five matmuls against two
        # (FlashAttention-2, arXiv 2307.08691); the rates count them so (HardwareProfile). The
        # kernel is the run's (TrainingSetup.attention), the causal backward on its own rate.
        kern = hw.attention_kernel(tr.attention)
        fwd_pair = m.layer_fwd_flops_per_pair() / (kern.fwd_flops * clock)
        bwd_pair = 2.5 * m.layer_fwd_flops_per_pair() / (kern.backward_flops(m.attention == "causal") * clock)
        fwd_tok = matmul_s + ew.fwd / bw + m.blocks_per_layer * kern.fwd_pairs_per_token * fwd_pair
        # Backward: two matmuls per forward matmul (grad of input and of weight) -> 2x.
        bwd_tok = 2 * matmul_s + ew.bwd / bw + m.blocks_per_layer * kern.bwd_pairs_per_token * bwd_pair
        # The per-tensor weight work (casts, gradient accumulation) is fixed per layer and pass.
        w = weight_traffic(m, tr.recipe, bw, hw.kernel_launch_s)
        head_flops = 2.0 * m.hidden * m.vocab * 3  # LM head forward + backward (x3)
        loss_s = loss_bytes_per_token(m, tr.recipe, tr.loss) / bw  # the logits' upcast, the loss
        return LayerFit(
            fwd_fixed_s=hw.kernel_overhead_s + w.fwd_layer_s + matmul_fixed,
            fwd_per_token_s=fwd_tok,
            fwd_per_pair_s=fwd_pair,
            bwd_fixed_s=2 * hw.kernel_overhead_s + w.bwd_layer_s + 2 * matmul_fixed,
            bwd_per_token_s=bwd_tok,
            bwd_per_pair_s=bwd_pair,
            rec_fixed_s=hw.kernel_overhead_s + w.rec_layer_s + matmul_fixed,
            rec_per_token_s=fwd_tok,
            rec_per_pair_s=fwd_pair,
            # Memory is measured, never derived: the model's footprint in the training's recipe.
            act_full_bytes_per_token=self.footprint.act_full_bytes_per_token,
            act_ckpt_bytes_per_token=self.footprint.act_ckpt_bytes_per_token,
            head_per_token_s=head_flops / matmul_rate + loss_s,
            microbatch_fixed_s=w.head_s + offset * head_flops / matmul_rate,
            head_bytes_per_token=self.footprint.working_bytes_per_token,
        )

    # -- layouts: Ulysses x ring (dcp.costmodel.ring) -------------------------------------------
    def layer_times(self, tokens: float, pairs: float, sp_size: int, layout: SPLayout | None = None) -> LayerTimes:
        """Per-GPU time of one layer for a micro-batch of `tokens`, `pairs` at SP size p, in
        `layout` (default: the fastest for this micro-batch without checkpointing)."""
        layout = layout or self.best_layout([(tokens, pairs, 0)], sp_size)
        fwd, bwd, rec = self._compute_linear(sp_size)
        ring = self._ring(layout)
        exposed_f, exposed_b = ring.exposed_s(tokens, pairs)
        extra_f = ring.extra_fixed_s + ring.fwd_extra_token_s * tokens
        extra_b = ring.extra_fixed_s + ring.bwd_extra_token_s * tokens
        home = (ring.step_latency_s + ring.grad_return_token_s * tokens) if layout.ring > 1 else 0.0
        return LayerTimes(fwd(tokens, pairs) + extra_f, bwd(tokens, pairs) + extra_b,
                          self._comm_linear(layout.ulysses, sp_size)(tokens, 0.0), rec(tokens, pairs) + extra_f,
                          exposed_f, exposed_b + home)

    def head_s(self, tokens: float, sp_size: int) -> float:
        """The LM head and loss (forward and backward, per token) and the per-micro-batch fixed
        cost: what a micro-batch runs besides its layers."""
        return self.fit.head_per_token_s * tokens / sp_size + self.fit.microbatch_fixed_s

    def _compute_linear(self, p: int) -> tuple[LinearCost, LinearCost, LinearCost]:
        """Forward, backward and recompute compute of one layer at SP size p (SP divides tokens
        and pairs); recompute is measured apart when the profile has it, else the forward's."""
        f = self.fit
        rec_fixed, rec_tok, rec_pair = f.recompute_coefficients()
        return (LinearCost(f.fwd_fixed_s, f.fwd_per_token_s / p, f.fwd_per_pair_s / p),
                LinearCost(f.bwd_fixed_s, f.bwd_per_token_s / p, f.bwd_per_pair_s / p),
                LinearCost(rec_fixed, rec_tok / p, rec_pair / p))

    def _comm_linear(self, u: int, p: int | None = None) -> LinearCost:
        """One direction's all-to-alls of one layer among the u Ulysses ranks of an SP group of p
        (default u): each moves (u-1)/u of the rank's T/p tokens, at the alpha-beta fit of the
        all-to-all curve for a group of u (GPUs per node, nodes). KV heads replicated for u above
        them travel as u heads. Where `dcp profile` ran the executor on SP groups, each call also
        costs what it measured there beyond the curve (`LayerFit.a2a_call_s`, `a2a_token_s`)."""
        p = u if p is None else p
        if u == 1:
            return LinearCost(0.0, 0.0, 0.0)
        lat, bw = self.hardware.collective("all_to_all", u, self.cluster.gpus_per_node).alpha_beta()
        m, calls = self.model, self.model.a2a_per_layer
        bytes_per_token = m.blocks_per_layer * (2 * m.hidden + 2 * kv_width(m, u)) * m.bytes_per_element
        per_tok = bytes_per_token / p * bus_factor("all_to_all", u) / bw
        return LinearCost(calls * (lat + self.fit.a2a_call_s), per_tok + calls * self.fit.a2a_token_s / p, 0.0)

    def linear_time(self, sp_size: int, ckpt_layers: int) -> LinearCost:
        """Micro-batch time as a linear function of (T, A) at SP size p with r checkpointed layers.

        With one layout (Ulysses alone) it is exact. With several it is, coefficient by
        coefficient, the least of the layouts' compute-bound forms (`ring.py`): a lower bound on
        every layout's exact time, exact where the fastest layout's ring is compute-bound and its
        fixed cost the least (long samples, where rings are used), which is what keeps the ILP's
        coefficients lower bounds and its dual bound proven."""
        key = (sp_size, ckpt_layers)
        if key not in self._linear:  # a pure function of (p, r) planners ask thousands of times: cached
            self._linear[key] = _least([self._linear_in(layout, ckpt_layers) for layout in self.layouts(sp_size)])
        return self._linear[key]

    def linear_less_below(self, sp_size: int, ckpt_layers: int) -> LinearCost:
        """`linear_time` less the micro-batch's backward and recomputes of layers K-2..0 (what it
        runs after issuing layer K-1's gradient reduction), coefficient by coefficient the least
        over the layouts: a lower bound on every layout's exact time less that exact backward,
        as the ring's exposed transfers add at least as much to the time as to the backward of
        those layers. Cached like `linear_time`."""
        key = (sp_size, ckpt_layers)
        if key not in self._less_below:
            k, r = self.model.num_layers, ckpt_layers
            forms = []
            for layout in self.layouts(sp_size):
                _, bwd, rec = self.layer_linear(layout)
                time = self._linear_in(layout, r)
                forms.append(LinearCost(*(t - (k - 1) * b - min(k - 1, r) * c for t, b, c in
                                          zip(time.terms(), bwd.terms(), rec.terms(), strict=True))))
            self._less_below[key] = _least(forms)
        return self._less_below[key]

    def _linear_in(self, layout: SPLayout, ckpt_layers: int) -> LinearCost:
        """The linear part of a micro-batch's time in `layout`: exact without a ring, the ring's
        transfers hidden with one (their compute-bound form)."""
        key = (layout, ckpt_layers)
        if key not in self._layout_linear:
            fwd, bwd, rec = self.layer_linear(layout)
            k, r = self.model.num_layers, ckpt_layers
            self._layout_linear[key] = LinearCost(
                k * (fwd.fixed + bwd.fixed) + r * rec.fixed + self.fit.microbatch_fixed_s,
                k * (fwd.per_token + bwd.per_token) + r * rec.per_token + self.fit.head_per_token_s / layout.size,
                k * (fwd.per_pair + bwd.per_pair) + r * rec.per_pair,
            )
        return self._layout_linear[key]

    def layer_linear(self, layout: SPLayout) -> tuple[LinearCost, LinearCost, LinearCost]:
        """One layer's forward, backward and recompute in `layout` as linear functions of the
        micro-batch's (T, A), the ring's transfers hidden (what `layer_times` adds to them
        beyond is the exposed part): compute, the all-to-alls (forward and backward each run the
        layer's; a recompute re-runs the forward's, DeepSpeed-Ulysses, arXiv 2309.14509), the
        ring's extra steps, and in the backward the last gradient block's return."""
        p = layout.size
        fwd, bwd, rec = self._compute_linear(p)
        ring, comm = self._ring(layout), self._comm_linear(layout.ulysses, p)
        home = (ring.step_latency_s, ring.grad_return_token_s) if layout.ring > 1 else (0.0, 0.0)
        return (LinearCost(fwd.fixed + comm.fixed + ring.extra_fixed_s,
                           fwd.per_token + comm.per_token + ring.fwd_extra_token_s, fwd.per_pair),
                LinearCost(bwd.fixed + comm.fixed + ring.extra_fixed_s + home[0],
                           bwd.per_token + comm.per_token + ring.bwd_extra_token_s + home[1], bwd.per_pair),
                LinearCost(rec.fixed + comm.fixed + ring.extra_fixed_s,
                           rec.per_token + comm.per_token + ring.fwd_extra_token_s, rec.per_pair))

    def activation_bytes_per_token(self, sp_size: int, ckpt_layers: int, layout: SPLayout | None = None) -> float:
        """Activation bytes per token of the micro-batch on each GPU of its group: what the layers
        save (all of it, or a checkpointed layer's input), plus the peak's working memory (the
        larger of the logits/loss peak and one layer's backward with its recompute), all measured
        (dcp.costmodel.memory). SP divides tokens: each GPU holds T/p of them (Ulysses keeps q, k, v
        of the whole sequence but 1/p of the heads: the same bytes). Without `layout`, the most any
        layout of p needs (`ring.layout_extra_bytes`: replicated KV heads, the ring's buffers)."""
        if layout is not None:
            return self._gpu_token_bytes(layout, ckpt_layers) / sp_size
        return self._envelope(sp_size)[ckpt_layers] / sp_size

    # -- the queries the planner makes ----------------------------------------------------
    def time_s(self, tokens: float, pairs: float, sp_size: int, ckpt_layers: int,
               layout: SPLayout | None = None) -> float:
        """Predicted wall time of one micro-batch on its group, in `layout` (default: the fastest
        of the group size's layouts for this micro-batch). Exact: with a ring it adds to the
        linear form the transfers its attention does not hide (`ring.py`)."""
        self._check(tokens, sp_size, ckpt_layers)
        if layout is None:
            return min(self.time_s(tokens, pairs, sp_size, ckpt_layers, o) for o in self.layouts(sp_size))
        if layout.size != sp_size:
            raise CostModelError(f"layout {layout.label} is not a group of {sp_size} GPUs")
        exact = self._linear_in(layout, ckpt_layers)(tokens, pairs)
        if layout.ring > 1:
            exposed_f, exposed_b = self._ring(layout).exposed_s(tokens, pairs)
            exact += (self.model.num_layers + ckpt_layers) * exposed_f + self.model.num_layers * exposed_b
        return exact

    def memory_bytes(self, tokens: float, sp_size: int, ckpt_layers: int, layout: SPLayout | None = None) -> float:
        """Peak memory per GPU while running one micro-batch in `layout` (default: the most any
        layout of p needs). Each GPU of the group holds ceil(T/p) tokens (2 ceil(T/2p) under a ring):
        the executor pads the packed micro-batch to a multiple of p (2p)."""
        self._check(tokens, sp_size, ckpt_layers)
        options = (layout,) if layout is not None else self.layouts(sp_size)
        return self.static_bytes + max(self._gpu_token_bytes(o, ckpt_layers) * shard_tokens(tokens, sp_size, o.ring)
                                       for o in options)

    def priceable_tokens(self, sp_size: int) -> float:
        """Largest micro-batch a fitted profile may price at SP size p (inf for FLOP-derived ones):
        beyond `extrapolation_factor` times the largest fitted point the model refuses to guess."""
        cap = self.fit.max_fitted_tokens
        return cap * self.hardware.extrapolation_factor * sp_size if cap else math.inf

    def grad_sync_s(self) -> float:
        """The least the step's synchronization adds beyond the slowest group's micro-batches,
        whatever the plan (`schedule.least_exposed_s`): what strategies add to a makespan before
        `step_price` prices their plan, and what lower bounds add to theirs."""
        return least_exposed_s(self)

    def step_price(self, groups: Sequence[GroupShape], idle_ranks: bool = False, *, overlap: bool = True,
                   spans: bool = False, busy_s: Sequence[float] | None = None) -> StepPrice:
        """The step time of these groups' micro-batches as the executor runs them at this ZeRO
        stage (`schedule.price_step`): independent groups with overlapped reductions at stages
        0-2, lockstep slots at stage 3. `busy_s`: when each group's micro-batches end, if known."""
        return price_step(self, groups, idle_ranks, overlap=overlap, spans=spans, busy_s=busy_s)

    def sync_terms(self) -> dict[str, float]:
        """Seconds of each kind of the step's collectives (`schedule.collective_seconds`: over the
        shard group, and across its replicas under HSDP), summed as if run back to back (the
        schedule hides part of them under backward passes; see `step_price`):

        - grad_reduce: each unit's gradient all-reduce (stages 0, 1) or reduce-scatter (2, 3),
          plus HSDP's all-reduce of its shard across the replicas, once per step, at stage 3 once
          per slot (this is one slot's);
        - loss_all_reduce: the loss sum and token count;
        - param_all_gather: stages 1 and 2, each unit's updated parameters after the optimizer;
          stage 3, one slot's gathers (the root's and every layer's, layers K-2..0 twice)."""
        if self.cluster.num_gpus == 1:
            return {}
        stage, k = self.training.zero_stage, self.model.num_layers
        gather, reduce, scalars = collective_seconds(self)
        terms = {"grad_reduce": sum(reduce), "loss_all_reduce": scalars}
        if stage in (1, 2):
            terms["param_all_gather"] = sum(gather)
        if stage == 3:
            terms["param_all_gather"] = sum(gather) + sum(gather[:k - 1])
        return terms

    def notes(self) -> list[str]:
        """What a plan priced by this model should say about how far to trust it (nothing now:
        dcp.executor runs every ZeRO stage the model prices, on the schedule it prices)."""
        return []

    def _check(self, tokens: float, sp_size: int, ckpt_layers: int) -> None:
        if sp_size < 1 or sp_size & (sp_size - 1) or sp_size > self.cluster.num_gpus:
            raise CostModelError(f"SP size {sp_size} is not a power of two within {self.cluster.num_gpus} GPUs")
        if not 0 <= ckpt_layers <= self.model.num_layers:
            raise CostModelError(f"checkpointed layers {ckpt_layers} outside 0..{self.model.num_layers}")
        cap = self.fit.max_fitted_tokens
        if tokens > self.priceable_tokens(sp_size):
            raise CostModelError(
                f"micro-batch of {tokens / sp_size:.0f} tokens per GPU is beyond the profile's fitted range "
                f"({cap} tokens) by more than {self.hardware.extrapolation_factor}x; profile longer sequences"
            )
