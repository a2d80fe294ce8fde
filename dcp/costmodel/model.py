"""The cost model: time and memory of one micro-batch, the contract between profiler and planner.

A micro-batch is a set of samples run together (packed, varlen) by one sequence-parallel
(SP) group of size p, with r of the model's K layers checkpointed. Per layer and per GPU
(docs/design.md, "The cost model"):

    compute(T, A, p) = c0 + c_tok * T/p + c_attn * A/p       T = sum tokens, A = sum attn_pairs
    comm(T, p)       = 0 if p == 1 else n_a2a * lat(p) + bytes_per_token * T/p * (p-1)/p / bw(p)
    time             = K * (fwd + bwd) + r * rec (recompute ~ fwd, its all-to-alls included) + head + fixed
    memory           = static + (K - r) * act_full * T/p + r * act_ckpt * T/p + working set of one layer

Everything is linear in T and A for a fixed (p, r), which the ILP planner relies on:
`linear_time(p, r)` and `activation_bytes_per_token(p, r)` expose the coefficients.

This package never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dcp.costmodel.hardware import Cluster, HardwareProfile, LayerFit, TrainingSetup
from dcp.costmodel.spec import CostModelError, ModelSpec


@dataclass(frozen=True)
class LinearCost:
    """time = fixed + per_token * T + per_pair * A for a micro-batch at fixed (p, r)."""

    fixed: float
    per_token: float
    per_pair: float

    def __call__(self, tokens: float, pairs: float) -> float:
        return self.fixed + self.per_token * tokens + self.per_pair * pairs


@dataclass(frozen=True)
class LayerTimes:
    """One layer's forward and backward at SP size p for a micro-batch, split by kind."""

    fwd_compute_s: float
    bwd_compute_s: float
    comm_s: float
    """All-to-alls of one direction (forward or backward; they move the same bytes)."""
    rec_compute_s: float
    """Recompute when the layer is checkpointed (its all-to-alls are another comm_s)."""


class CostModel:
    """Time and memory of a micro-batch for one model, hardware and training setup."""

    def __init__(self, model: ModelSpec, hardware: HardwareProfile, cluster: Cluster,
                 training: TrainingSetup | None = None) -> None:
        self.model = model
        self.hardware = hardware
        self.cluster = cluster
        self.training = training or TrainingSetup()
        self.fit = hardware.fits.get(model.name) or self._derive_fit()
        self.static_bytes = self.training.static_bytes(model.param_count(), cluster.num_gpus)
        self._linear: dict[tuple[int, int], LinearCost] = {}

    # -- coefficients --------------------------------------------------------------------
    def _derive_fit(self) -> LayerFit:
        """Coefficients from FLOPs and bytes when no measurement exists for this model."""
        m, hw = self.model, self.hardware
        # Elementwise work (norms, activations, residuals, RoPE) streams about the layer's
        # activation bytes once (Korthikanti et al., arXiv 2205.05198: 34 s b h bytes).
        act_full = 34.0 * m.hidden * m.blocks_per_layer * m.bytes_per_element / 2
        elementwise_s = act_full / hw.memory_bw_bytes_per_s
        fwd_tok = m.layer_fwd_flops_per_token() / hw.matmul_flops + elementwise_s
        fwd_pair = m.layer_fwd_flops_per_pair() / hw.attention_flops
        # Backward: two matmuls per forward matmul (grad of input and of weight) -> 2x;
        # attention backward recomputes scores and runs 5 matmuls vs 2 forward -> 2.5x (FlashAttention-2).
        head_flops = 2.0 * m.hidden * m.vocab * 3  # LM head forward + backward (x3)
        return LayerFit(
            fwd_fixed_s=hw.kernel_overhead_s,
            fwd_per_token_s=fwd_tok,
            fwd_per_pair_s=fwd_pair,
            bwd_fixed_s=2 * hw.kernel_overhead_s,
            bwd_per_token_s=2 * fwd_tok,
            bwd_per_pair_s=2.5 * fwd_pair,
            act_full_bytes_per_token=act_full,
            # A checkpointed layer keeps only its input: 2 s b h bytes in 16 bit (Korthikanti).
            act_ckpt_bytes_per_token=float(m.hidden * m.bytes_per_element),
            head_per_token_s=head_flops / hw.matmul_flops,
            microbatch_fixed_s=0.0,
            # Logits in 16 bit plus fp32 for the softmax/loss: 6 bytes per vocab entry per token.
            head_bytes_per_token=6.0 * m.vocab,
        )

    def layer_times(self, tokens: float, pairs: float, sp_size: int) -> LayerTimes:
        """Per-GPU time of one layer for a micro-batch of `tokens`, `pairs` at SP size p."""
        fwd, bwd, rec = self._compute_linear(sp_size)
        return LayerTimes(fwd(tokens, pairs), bwd(tokens, pairs), self._comm_linear(sp_size)(tokens, 0.0),
                          rec(tokens, pairs))

    def _compute_linear(self, p: int) -> tuple[LinearCost, LinearCost, LinearCost]:
        """Forward, backward and recompute compute of one layer at SP size p (SP divides tokens
        and pairs); recompute is measured apart when the profile has it, else the forward's."""
        f = self.fit
        rec_fixed, rec_tok, rec_pair = f.recompute_coefficients()
        return (LinearCost(f.fwd_fixed_s, f.fwd_per_token_s / p, f.fwd_per_pair_s / p),
                LinearCost(f.bwd_fixed_s, f.bwd_per_token_s / p, f.bwd_per_pair_s / p),
                LinearCost(rec_fixed, rec_tok / p, rec_pair / p))

    def _comm_linear(self, p: int) -> LinearCost:
        """One direction's all-to-alls of one layer: each moves (p-1)/p of the rank's T/p tokens."""
        if p == 1:
            return LinearCost(0.0, 0.0, 0.0)
        hw, g = self.hardware, self.cluster.gpus_per_node
        lat = self.model.a2a_per_layer * hw.a2a_latency(p, g)
        per_tok = self.model.a2a_bytes_per_token() / p * (p - 1) / p / hw.a2a_bw(p, g)
        return LinearCost(lat, per_tok, 0.0)

    def linear_time(self, sp_size: int, ckpt_layers: int) -> LinearCost:
        """Micro-batch time as a linear function of (T, A) at SP size p with r checkpointed layers."""
        # A pure function of (p, r) that planners ask thousands of times per batch: cache it.
        key = (sp_size, ckpt_layers)
        if key not in self._linear:
            fwd, bwd, rec = self._compute_linear(sp_size)
            # Forward and backward each run the layer's all-to-alls; a recompute re-runs the
            # forward's (DeepSpeed-Ulysses, arXiv 2309.14509).
            comm = self._comm_linear(sp_size)
            k, r = self.model.num_layers, ckpt_layers
            head = self.fit.head_per_token_s / sp_size
            self._linear[key] = LinearCost(
                k * (fwd.fixed + bwd.fixed + 2 * comm.fixed) + r * (rec.fixed + comm.fixed)
                + self.fit.microbatch_fixed_s + (2 + r / k) * self.param_gather_s(),
                k * (fwd.per_token + bwd.per_token + 2 * comm.per_token) + r * (rec.per_token + comm.per_token)
                + head,
                k * (fwd.per_pair + bwd.per_pair) + r * rec.per_pair,
            )
        return self._linear[key]

    def param_gather_s(self) -> float:
        """ZeRO-3: all-gather of every layer's parameters once per pass (forward, backward, and the
        recompute of checkpointed layers), (N-1)/N of the parameter bytes each; 0 below stage 3."""
        n = self.cluster.num_gpus
        if self.training.zero_stage < 3 or n == 1:
            return 0.0
        gather_bytes = self.training.param_bytes * self.model.param_count() * (n - 1) / n
        return gather_bytes / self.hardware.allreduce_bw_bytes_per_s

    def activation_bytes_per_token(self, sp_size: int, ckpt_layers: int) -> float:
        """Activation bytes per token of the micro-batch on each GPU of its group."""
        f, k, r = self.fit, self.model.num_layers, ckpt_layers
        per_gpu_token = (k - r) * f.act_full_bytes_per_token + r * f.act_ckpt_bytes_per_token
        # Working set: backward (or recompute) of one layer materializes its full activations.
        per_gpu_token += f.act_full_bytes_per_token + f.head_bytes_per_token
        return per_gpu_token / sp_size

    # -- the queries the planner makes ----------------------------------------------------
    def time_s(self, tokens: float, pairs: float, sp_size: int, ckpt_layers: int) -> float:
        """Predicted wall time of one micro-batch on its group."""
        self._check(tokens, sp_size, ckpt_layers)
        return self.linear_time(sp_size, ckpt_layers)(tokens, pairs)

    def memory_bytes(self, tokens: float, sp_size: int, ckpt_layers: int) -> float:
        """Peak memory per GPU while running one micro-batch."""
        self._check(tokens, sp_size, ckpt_layers)
        return self.static_bytes + self.activation_bytes_per_token(sp_size, ckpt_layers) * tokens

    def max_tokens(self, sp_size: int, ckpt_layers: int) -> int:
        """Largest micro-batch (tokens) that fits memory at (p, r) and that the profile can price; 0 if none."""
        room = self.cluster.memory_bytes - self.static_bytes
        if room <= 0:
            return 0
        fits = int(room // self.activation_bytes_per_token(sp_size, ckpt_layers))
        return int(min(fits, self.priceable_tokens(sp_size)))

    def priceable_tokens(self, sp_size: int) -> float:
        """Largest micro-batch a fitted profile may price at SP size p (inf for FLOP-derived ones):
        beyond `extrapolation_factor` times the largest fitted point the model refuses to guess."""
        cap = self.fit.max_fitted_tokens
        return cap * self.hardware.extrapolation_factor * sp_size if cap else math.inf

    def min_ckpt_layers(self, tokens: float, sp_size: int) -> int | None:
        """Fewest checkpointed layers for which `tokens` fit at SP size p; None if even K does not,
        or if the micro-batch lies beyond the range the profile can price."""
        if tokens > self.priceable_tokens(sp_size):
            return None
        k = self.model.num_layers
        room = self.cluster.memory_bytes - self.static_bytes
        base = self.activation_bytes_per_token(sp_size, 0) * tokens
        # Memory falls linearly in r: each checkpointed layer saves the same bytes per token.
        saved = (self.activation_bytes_per_token(sp_size, 0) - self.activation_bytes_per_token(sp_size, 1)) * tokens
        if base <= room:
            return 0
        if saved <= 0:
            return None
        r = math.ceil((base - room) / saved - 1e-9)
        return r if r <= k else None

    def grad_sync_s(self) -> float:
        """The step's one gradient all-reduce over the world: ring, 2 (N-1)/N of the grad bytes.

        Gradients are reduced in fp32 under bf16 training (TrainingSetup keeps fp32 grads)."""
        n = self.cluster.num_gpus
        if n == 1:
            return 0.0
        grad_bytes = 4.0 * self.model.param_count()
        return 2 * (n - 1) / n * grad_bytes / self.hardware.allreduce_bw_bytes_per_s

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
