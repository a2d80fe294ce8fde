"""The cost model: time and memory of one micro-batch, the contract between profiler and planner.

A micro-batch is a set of samples run together (packed, varlen) by one sequence-parallel
(SP) group of size p, with r of the model's K layers checkpointed. Per layer and per GPU
(DESIGN.md, "The cost model"):

    compute(T, A, p) = c0 + c_tok * T/p + c_attn * A/p       T = sum tokens, A = sum attn_pairs
    comm(T, p)       = 0 if p == 1 else n_a2a * lat(p) + bytes_per_token * T/p * (p-1)/p / bw(p)
    time             = K * (fwd + bwd) + r * rec (recompute ~ fwd, its all-to-alls included) + head + fixed
    memory           = static + (K - r) * act_full * T/p + r * act_ckpt * T/p + working set of one layer

Everything is linear in T and A for a fixed (p, r), which the ILP planner relies on:
`linear_time(p, r)` and `linear_memory(p, r)` expose the coefficients.

This module never imports torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any, Literal

AttentionKind = Literal["causal", "full", "spatial_temporal"]
ATTENTION_KINDS: tuple[str, ...] = ("causal", "full", "spatial_temporal")
PROFILE_SCHEMA_VERSION = 1


class CostModelError(ValueError):
    """A cost-model input is invalid or outside what the model can answer."""


def attention_pairs(kind: str, tokens: int, frames: int = 1) -> int:
    """Query-key pairs one sample's attention computes, per head, per layer.

    causal: L(L+1)/2 (each token attends to itself and earlier ones); full: L^2;
    spatial_temporal: F frames of S tokens, spatial attention inside each frame (F * S^2)
    plus temporal attention across frames at each position (S * F^2).
    """
    if kind == "causal":
        return tokens * (tokens + 1) // 2
    if kind == "full":
        return tokens * tokens
    if kind == "spatial_temporal":
        if frames < 1 or tokens % frames:
            raise CostModelError(f"spatial_temporal sample of {tokens} tokens is not {frames} equal frames")
        s = tokens // frames
        return frames * s * s + s * frames * frames
    raise CostModelError(f"unknown attention kind {kind!r}; expected one of {ATTENTION_KINDS}")


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Shape of a transformer, enough to derive FLOPs, parameters, activations and messages."""

    name: str
    """Preset or user name, e.g. "llama-7b"."""
    num_layers: int
    """K: transformer layers (for spatial_temporal, one layer = one spatial + one temporal block)."""
    hidden: int
    """h: model width."""
    heads: int
    """Attention heads; Ulysses SP needs heads % p == 0."""
    kv_heads: int
    """Key/value heads (GQA); Ulysses SP needs kv_heads % p == 0."""
    ffn_hidden: int
    """MLP inner width."""
    vocab: int = 0
    """Vocabulary size; 0 for models without an LM head (video diffusion)."""
    bytes_per_element: int = 2
    """Activation and communication element size (2 for bf16/fp16)."""
    attention: AttentionKind = "causal"
    """causal, full, or spatial_temporal (samples are F frames of S tokens)."""
    mlp: Literal["swiglu", "gelu"] = "swiglu"
    """swiglu has three matrices (gate, up, down), gelu two."""
    cross_attention: bool = False
    """Each block also cross-attends to a short conditioning sequence (STDiT text captions)."""
    tied_embeddings: bool = False
    """Embedding and LM head share one matrix."""
    source: str = ""
    """Where the shape comes from."""

    def __post_init__(self) -> None:
        for f in ("num_layers", "hidden", "heads", "kv_heads", "ffn_hidden", "bytes_per_element"):
            if getattr(self, f) <= 0:
                raise CostModelError(f"model {self.name!r}: {f} must be positive, got {getattr(self, f)}")
        if self.vocab < 0:
            raise CostModelError(f"model {self.name!r}: vocab must be >= 0, got {self.vocab}")
        if self.hidden % self.heads:
            raise CostModelError(f"model {self.name!r}: hidden {self.hidden} not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            raise CostModelError(f"model {self.name!r}: heads {self.heads} not divisible by kv_heads {self.kv_heads}")
        if self.attention not in ATTENTION_KINDS:
            raise CostModelError(f"model {self.name!r}: unknown attention {self.attention!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def blocks_per_layer(self) -> int:
        """Attention+MLP blocks in one layer: 2 for spatial_temporal (spatial, temporal), else 1."""
        return 2 if self.attention == "spatial_temporal" else 1

    def block_matmul_params(self) -> int:
        """Weights multiplied by every token in one block (biases and norms are negligible)."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        attn = 2 * h * h + 2 * h * kv  # q, o: h x h; k, v: h x kv (GQA)
        mlp = (3 if self.mlp == "swiglu" else 2) * h * self.ffn_hidden
        cross = 4 * h * h if self.cross_attention else 0  # q, k, v, o of the cross-attention
        return attn + mlp + cross

    def layer_params(self) -> int:
        norms = 2 * self.hidden * self.blocks_per_layer
        return self.blocks_per_layer * self.block_matmul_params() + norms

    def param_count(self) -> int:
        embed = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.num_layers * self.layer_params() + embed + self.hidden

    def layer_fwd_flops_per_token(self) -> float:
        """2 FLOPs (multiply+add) per matmul weight per token (Kaplan et al. 2020, nanoGPT estimate_mfu)."""
        return 2.0 * self.blocks_per_layer * self.block_matmul_params()

    def layer_fwd_flops_per_pair(self) -> float:
        """Per query-key pair: QK^T and PV each cost 2 * head_dim FLOPs per head -> 4 * h.

        attn_pairs already counts both blocks of a spatial_temporal layer (F S^2 + S F^2)."""
        return 4.0 * self.hidden

    def a2a_bytes_per_token(self) -> float:
        """Bytes one token sends through the forward all-to-alls of one layer (Ulysses).

        q and the output carry h elements, k and v carry kv_heads * head_dim each
        (DeepSpeed-Ulysses, arXiv 2309.14509: four all-to-alls per attention)."""
        kv = self.kv_heads * self.head_dim
        return self.blocks_per_layer * (2 * self.hidden + 2 * kv) * self.bytes_per_element

    @property
    def a2a_per_layer(self) -> int:
        """All-to-all calls per layer per direction: q, k, v in, output back, per attention block."""
        return 4 * self.blocks_per_layer

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        return _from_dict(cls, d, "model spec")


# --------------------------------------------------------------------------------------------
# Hardware
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LayerFit:
    """Measured per-layer coefficients for one model on one device (fitted by `dcp profile`).

    Times are per layer per GPU at SP size 1; SP divides tokens and pairs by p."""

    fwd_fixed_s: float
    fwd_per_token_s: float
    fwd_per_pair_s: float
    bwd_fixed_s: float
    bwd_per_token_s: float
    bwd_per_pair_s: float
    act_full_bytes_per_token: float
    """Activation bytes one token keeps per non-checkpointed layer."""
    act_ckpt_bytes_per_token: float
    """Bytes one token keeps per checkpointed layer (its input)."""
    head_per_token_s: float = 0.0
    """Embedding + LM head + loss, forward and backward, per token (dual-layer profile)."""
    microbatch_fixed_s: float = 0.0
    """Per micro-batch fixed cost outside the layers (dual-layer profile)."""
    head_bytes_per_token: float = 0.0
    """Peak bytes per token of embedding/head/loss (logits)."""
    max_fitted_tokens: int = 0
    """Largest micro-batch (tokens per GPU) in the fit; 0 means unbounded."""
    heldout_mape: float | None = None
    rec_fixed_s: float | None = None
    """Recompute of a checkpointed layer (the extra time checkpointing costs it), fixed part;
    None: the same as the forward. Measured, it differs: the checkpoint's own bookkeeping adds
    a fixed cost that matters for small layers (tiny-llama on one CPU thread: 1.5 ms vs 0.5 ms)."""
    rec_per_token_s: float | None = None
    """Recompute per token; None: fwd_per_token_s."""
    rec_per_pair_s: float | None = None
    """Recompute per attention pair; None: fwd_per_pair_s."""

    def recompute_coefficients(self) -> tuple[float, float, float]:
        """(fixed, per_token, per_pair) of one layer's recompute, the forward's where unmeasured."""
        return (self.fwd_fixed_s if self.rec_fixed_s is None else self.rec_fixed_s,
                self.fwd_per_token_s if self.rec_per_token_s is None else self.rec_per_token_s,
                self.fwd_per_pair_s if self.rec_per_pair_s is None else self.rec_per_pair_s)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LayerFit:
        return _from_dict(cls, d, "layer fit")


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    """A GPU type and its interconnect: datasheet numbers or a `dcp profile` measurement.

    Every number names its source in `sources` (field name -> text)."""

    name: str
    device: str
    gpus_per_node: int
    memory_bytes: float
    """Memory per GPU the training process may use (allocator and context reserve removed)."""
    matmul_flops: float
    """Achievable dense matmul FLOP/s at the training precision."""
    attention_flops: float
    """Achievable attention-kernel forward FLOP/s."""
    memory_bw_bytes_per_s: float
    """Device memory bandwidth, for elementwise layer work."""
    kernel_overhead_s: float
    """Fixed per-layer launch/sync cost (c0)."""
    a2a_latency_intra_s: float
    a2a_latency_inter_s: float
    a2a_bw_intra_bytes_per_s: dict[int, float]
    """All-to-all bus bandwidth per GPU by group size inside a node."""
    a2a_bw_inter_bytes_per_s: dict[int, float]
    """All-to-all bandwidth per GPU by group size across nodes."""
    allreduce_bw_bytes_per_s: float
    """Bandwidth per GPU of the step's gradient all-reduce (the slowest link it crosses)."""
    sources: dict[str, str] = field(default_factory=dict)
    fits: dict[str, LayerFit] = field(default_factory=dict)
    """Measured coefficients by model name (replace the FLOP-derived ones for that model)."""
    extrapolation_factor: float = 4.0
    """A fitted model refuses micro-batches above this multiple of its largest fitted point."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Provenance: date, device name, software versions, raw points, fit quality."""
    heldout_mape: float | None = None
    """Worst held-out MAPE (a fraction) of the fits `dcp profile` measured; None for a preset."""

    def __post_init__(self) -> None:
        for f in ("gpus_per_node", "memory_bytes", "matmul_flops", "attention_flops", "memory_bw_bytes_per_s"):
            if not getattr(self, f) > 0:
                raise CostModelError(f"hardware {self.name!r}: {f} must be positive, got {getattr(self, f)}")
        if not self.a2a_bw_intra_bytes_per_s or not self.a2a_bw_inter_bytes_per_s:
            raise CostModelError(f"hardware {self.name!r}: all-to-all bandwidth tables must not be empty")

    def a2a_bw(self, p: int, gpus_per_node: int) -> float:
        """Bandwidth per GPU for an all-to-all among p GPUs (nearest measured size at or below)."""
        table = self.a2a_bw_intra_bytes_per_s if p <= gpus_per_node else self.a2a_bw_inter_bytes_per_s
        below = [s for s in table if s <= p]
        return table[max(below)] if below else table[min(table)]

    def a2a_latency(self, p: int, gpus_per_node: int) -> float:
        return self.a2a_latency_intra_s if p <= gpus_per_node else self.a2a_latency_inter_s

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["a2a_bw_intra_bytes_per_s"] = {str(k): v for k, v in self.a2a_bw_intra_bytes_per_s.items()}
        d["a2a_bw_inter_bytes_per_s"] = {str(k): v for k, v in self.a2a_bw_inter_bytes_per_s.items()}
        return {"kind": "dcp-hardware-profile", "schema_version": PROFILE_SCHEMA_VERSION, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HardwareProfile:
        if not isinstance(d, dict) or d.get("kind") != "dcp-hardware-profile":
            raise CostModelError("not a dcp hardware profile (missing kind: dcp-hardware-profile)")
        if d.get("schema_version") != PROFILE_SCHEMA_VERSION:
            raise CostModelError(
                f"hardware profile schema_version {d.get('schema_version')!r} is not supported "
                f"(expected {PROFILE_SCHEMA_VERSION}); re-run `dcp profile`"
            )
        d = {k: v for k, v in d.items() if k not in ("kind", "schema_version")}
        try:
            d["a2a_bw_intra_bytes_per_s"] = {int(k): float(v) for k, v in d["a2a_bw_intra_bytes_per_s"].items()}
            d["a2a_bw_inter_bytes_per_s"] = {int(k): float(v) for k, v in d["a2a_bw_inter_bytes_per_s"].items()}
            d["fits"] = {k: LayerFit.from_dict(v) for k, v in d.get("fits", {}).items()}
        except (KeyError, AttributeError, TypeError, ValueError) as e:
            raise CostModelError(f"hardware profile {d.get('name', '?')!r}: malformed field ({e})") from e
        return _from_dict(cls, d, "hardware profile")


@dataclass(frozen=True, kw_only=True)
class TrainingSetup:
    """What the user's training keeps in memory besides activations."""

    precision: Literal["bf16", "fp32"] = "bf16"
    """bf16: bf16 params, fp32 master weights, fp32 grads (mixed precision); fp32: all fp32."""
    zero_stage: Literal[0, 1, 2, 3] = 1
    """0: nothing sharded; 1: optimizer state (incl. master weights) sharded over the world
    (DeepSpeed ZeRO-1, as the DCP paper trained); 2: gradients sharded as well; 3: parameters
    too, gathered for every layer's forward, backward and recompute (FSDP-style)."""
    optimizer_state_bytes_per_param: int = 8
    """Adam: fp32 first and second moments."""

    def __post_init__(self) -> None:
        if self.precision not in ("bf16", "fp32"):
            raise CostModelError(f"precision must be bf16 or fp32, got {self.precision!r}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise CostModelError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")

    @property
    def param_bytes(self) -> int:
        return 2 if self.precision == "bf16" else 4

    def static_bytes(self, params: int, world: int) -> float:
        """Params, grads and optimizer state per GPU (Rajbhandari et al., ZeRO, arXiv 1910.02054:
        mixed-precision Adam keeps 2 + 2 + 12 bytes/param; we keep fp32 grads, 2 + 4 + 12)."""
        if self.precision == "bf16":
            weights, grads, opt = 2 * params, 4 * params, (4 + self.optimizer_state_bytes_per_param) * params
        else:
            weights, grads, opt = 4 * params, 4 * params, self.optimizer_state_bytes_per_param * params
        if self.zero_stage >= 1:
            opt /= world
        if self.zero_stage >= 2:
            grads /= world
        if self.zero_stage >= 3:
            weights /= world
        return float(weights + grads + opt)


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """The GPUs one job plans for."""

    num_gpus: int
    gpus_per_node: int
    memory_bytes: float
    """Usable memory per GPU."""

    def __post_init__(self) -> None:
        if self.num_gpus <= 0:
            raise CostModelError(f"number of GPUs must be positive, got {self.num_gpus}")
        if self.gpus_per_node <= 0:
            raise CostModelError(f"GPUs per node must be positive, got {self.gpus_per_node}")
        if self.num_gpus % self.gpus_per_node and self.num_gpus > self.gpus_per_node:
            raise CostModelError(f"{self.num_gpus} GPUs is not a whole number of nodes of {self.gpus_per_node}")
        if not self.memory_bytes > 0:
            raise CostModelError(f"memory per GPU must be positive, got {self.memory_bytes}")

    def sp_sizes(self) -> list[int]:
        """Powers of two up to the world size (aligned blocks)."""
        return [1 << i for i in range(self.num_gpus.bit_length()) if self.num_gpus % (1 << i) == 0]


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
    rec_compute_s: float | None = None
    """Recompute when the layer is checkpointed (its all-to-alls are another comm_s); None: fwd_compute_s."""


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
        self._cache: dict[tuple[int, int], tuple[LinearCost, LinearCost]] = {}
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
        f, p = self.fit, sp_size
        fwd = f.fwd_fixed_s + f.fwd_per_token_s * tokens / p + f.fwd_per_pair_s * pairs / p
        bwd = f.bwd_fixed_s + f.bwd_per_token_s * tokens / p + f.bwd_per_pair_s * pairs / p
        rc = f.recompute_coefficients()
        rec = rc[0] + rc[1] * tokens / p + rc[2] * pairs / p
        return LayerTimes(fwd, bwd, self._comm_linear(sp_size)(tokens, 0.0), rec)

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
            fwd, bwd = self._fwd_bwd(sp_size)
            rec = self._recompute(sp_size)
            k, r = self.model.num_layers, ckpt_layers
            head = self.fit.head_per_token_s / sp_size
            self._linear[key] = LinearCost(
                k * (fwd.fixed + bwd.fixed) + r * rec.fixed + self.fit.microbatch_fixed_s
                + (2 + r / k) * self.param_gather_s(),
                k * (fwd.per_token + bwd.per_token) + r * rec.per_token + head,
                k * (fwd.per_pair + bwd.per_pair) + r * rec.per_pair,
            )
        return self._linear[key]

    def _recompute(self, p: int) -> LinearCost:
        """Recompute of one checkpointed layer: its measured compute (the forward's when not
        measured) plus the forward's all-to-alls, which it re-runs (REFERENCES.md, Ulysses)."""
        fixed, per_tok, per_pair = self.fit.recompute_coefficients()
        comm = self._comm_linear(p)
        return LinearCost(fixed + comm.fixed, per_tok / p + comm.per_token, per_pair / p)

    def _fwd_bwd(self, p: int) -> tuple[LinearCost, LinearCost]:
        """Forward and backward of one layer (compute + all-to-alls) as linear costs."""
        if (p, 0) not in self._cache:
            f, comm = self.fit, self._comm_linear(p)
            fwd = LinearCost(f.fwd_fixed_s + comm.fixed, f.fwd_per_token_s / p + comm.per_token, f.fwd_per_pair_s / p)
            bwd = LinearCost(f.bwd_fixed_s + comm.fixed, f.bwd_per_token_s / p + comm.per_token, f.bwd_per_pair_s / p)
            self._cache[(p, 0)] = (fwd, bwd)
        return self._cache[(p, 0)]

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
        f = self.fit
        base = (f.act_full_bytes_per_token * (k + 1) + f.head_bytes_per_token) * tokens / sp_size
        saved = (f.act_full_bytes_per_token - f.act_ckpt_bytes_per_token) * tokens / sp_size
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


# --------------------------------------------------------------------------------------------
# Presets and files
# --------------------------------------------------------------------------------------------


def _from_dict(cls: type, d: dict[str, Any], what: str) -> Any:
    if not isinstance(d, dict):
        raise CostModelError(f"{what}: expected a JSON object, got {type(d).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = set(d) - known
    if unknown:
        raise CostModelError(f"{what}: unknown field(s) {sorted(unknown)}")
    try:
        return cls(**d)
    except TypeError as e:
        raise CostModelError(f"{what}: {e}") from e


def _preset_dir(kind: str) -> Any:
    return resources.files("dcp.presets") / kind


def preset_names(kind: Literal["models", "hardware"]) -> list[str]:
    return sorted(p.name[:-5] for p in _preset_dir(kind).iterdir() if p.name.endswith(".json"))


def _load_json(path: Any, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CostModelError(f"{what} {path}: not valid JSON ({e.msg} at line {e.lineno})") from e


def load_model(name_or_path: str) -> ModelSpec:
    """A model preset by name (see `dcp presets`) or a JSON file path."""
    if name_or_path.endswith(".json") or Path(name_or_path).is_file():
        path = Path(name_or_path)
        if not path.is_file():
            raise CostModelError(f"model file {name_or_path} does not exist")
        return ModelSpec.from_dict(_load_json(path, "model file"))
    if name_or_path not in preset_names("models"):
        raise CostModelError(f"unknown model preset {name_or_path!r}; known: {', '.join(preset_names('models'))}")
    return ModelSpec.from_dict(_load_json(_preset_dir("models") / f"{name_or_path}.json", "model preset"))


def load_hardware(name_or_path: str) -> HardwareProfile:
    """A hardware preset by name (see `dcp presets`) or a profile JSON path from `dcp profile`."""
    if name_or_path.endswith(".json") or Path(name_or_path).is_file():
        path = Path(name_or_path)
        if not path.is_file():
            raise CostModelError(f"hardware profile {name_or_path} does not exist")
        return HardwareProfile.from_dict(_load_json(path, "hardware profile"))
    if name_or_path not in preset_names("hardware"):
        raise CostModelError(
            f"unknown hardware preset {name_or_path!r}; known: {', '.join(preset_names('hardware'))}"
        )
    return HardwareProfile.from_dict(_load_json(_preset_dir("hardware") / f"{name_or_path}.json", "hardware preset"))


def save_hardware(profile: HardwareProfile, path: str | Path) -> None:
    Path(path).write_text(json.dumps(profile.to_dict(), indent=1) + "\n")
