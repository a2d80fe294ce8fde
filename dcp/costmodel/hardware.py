"""The machine side of the cost model: hardware profiles (datasheet or measured), the training
setup's static memory, and the cluster a plan is made for."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from dcp.costmodel.collectives import (
    COLLECTIVES,
    CollectiveCurve,
    bus_factor,
    group_shape,
    nearest_curve,
)
from dcp.costmodel.memory import MemoryFootprint
from dcp.costmodel.precision import PrecisionRecipe, get_recipe
from dcp.costmodel.schema import PROFILE_SCHEMA_VERSION, migrate
from dcp.costmodel.spec import CostModelError, _from_dict


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
    """Embedding + LM head + loss, forward and backward, per token (the model without layers, profiled)."""
    microbatch_fixed_s: float = 0.0
    """Per micro-batch fixed cost outside the layers (the intercept of the model without layers, profiled)."""
    step_fixed_s: float = 0.0
    """Per step, what the executor's first and last micro-batches (the parameters' gather, the
    gradients' reduction) cost beyond what the collectives' curves price for them: measured by
    `dcp profile` through the executor (`dcp.profiler.executor_cost`), 0 for a preset."""
    a2a_call_s: float = 0.0
    """Per Ulysses all-to-all the executor issues (`ModelSpec.a2a_per_layer` a layer and direction),
    what it costs beyond the all-to-all curve's latency: the autograd wrapper, the contiguous send
    buffer, the fresh receive buffer, the collective's CPU time as the executor calls it between
    layers. Measured by `dcp profile` through the executor on SP groups (`dcp.profiler.executor_cost`),
    0 for a preset."""
    a2a_token_s: float = 0.0
    """Per such all-to-all, per token of the rank's shard, beyond the curve's bytes / bandwidth."""
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
    memory: MemoryFootprint | None = None
    """The model's measured memory footprint in the recipe it was profiled in (dcp profile);
    the cost model takes it over the model spec's for that recipe."""

    def recompute_coefficients(self) -> tuple[float, float, float]:
        """(fixed, per_token, per_pair) of one layer's recompute, the forward's where unmeasured."""
        return (self.fwd_fixed_s if self.rec_fixed_s is None else self.rec_fixed_s,
                self.fwd_per_token_s if self.rec_per_token_s is None else self.rec_per_token_s,
                self.fwd_per_pair_s if self.rec_per_pair_s is None else self.rec_per_pair_s)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LayerFit:
        if isinstance(d, dict) and isinstance(d.get("memory"), dict):
            d = {**d, "memory": MemoryFootprint.from_dict(d["memory"])}
        return _from_dict(cls, d, "layer fit")


_KERNEL_ALIASES = {"fa2": "flash-attn-2", "fa3": "flash-attn-3"}
"""Short names of the kernels a profile's `attention_backend` spells out."""


@dataclass(frozen=True, kw_only=True)
class AttentionKernel:
    """One attention kernel's speed on a device, forward and backward apart, in the two-term
    form of `dcp.costmodel.attention` (rate on long sequences, short-sequence pairs per token),
    from cited measurements (`source`)."""

    fwd_flops: float
    fwd_pairs_per_token: float
    bwd_flops: float
    """Backward FLOP/s without a causal mask, FLOPs counted as 2.5x the forward's."""
    bwd_pairs_per_token: float
    bwd_causal_flops: float | None = None
    """The causal backward's own long-sequence rate, where measured; None: the unmasked one."""
    source: str = ""

    def __post_init__(self) -> None:
        if not (self.fwd_flops > 0 and self.bwd_flops > 0) or min(self.fwd_pairs_per_token,
                                                                   self.bwd_pairs_per_token) < 0:
            raise CostModelError(f"attention kernel: rates must be positive and pairs per token >= 0 ({self})")

    def backward_flops(self, causal: bool) -> float:
        return self.bwd_causal_flops if causal and self.bwd_causal_flops else self.bwd_flops


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    """A GPU type and its interconnect: datasheet numbers or a `dcp profile` measurement.

    Every number names its source in `sources` (field name -> text); each collective curve
    carries its own."""

    name: str
    device: str
    gpus_per_node: int
    memory_capacity_bytes: float
    """Device memory per GPU as the device reports it (torch.cuda.get_device_properties)."""
    matmul_flops: float
    """Achievable dense matmul FLOP/s at the training precision, as a kernel benchmark measures it
    (a burst at the boost clock)."""
    attention_fwd_flops: float
    """Attention kernel forward FLOP/s on long sequences (4 h FLOPs per query-key pair)."""
    attention_bwd_flops: float
    """Attention kernel backward FLOP/s on long sequences, FLOPs counted as 2.5x the forward's
    (FlashAttention's convention: the backward's five matmuls against the forward's two)."""
    attention_fwd_pairs_per_token: float = 0.0
    """Short-sequence cost of the forward kernel as extra pairs per token: a kernel over T tokens
    and A pairs takes (A + this * T) pairs' time, so a causal sample of L tokens runs at
    L / (L + 2 * this) of the long-sequence rate (linear in T and A for the planner)."""
    attention_bwd_pairs_per_token: float = 0.0
    """The same for the backward kernel."""
    attention_bwd_causal_flops: float | None = None
    """The default kernel's causal backward on long sequences, where measured apart from the
    unmasked one (`attention_bwd_flops`); None: the unmasked rate."""
    attention_backend: str = ""
    """The attention kernel the rates describe (flash-attn 2/3, cudnn, torch varlen_attn, sdpa)."""
    attention_kernels: dict[str, AttentionKernel] = field(default_factory=dict)
    """Other attention kernels measured on this device, by name (fa2, fa3, cudnn, triton, sdpa);
    `TrainingSetup.attention` picks one, none picks the rates above (`attention_backend`)."""
    matmul_tokens_offset: float = 0.0
    """Small-M GEMM efficiency: a matmul over M tokens takes the time of (M + this) tokens at
    `matmul_flops`, so it reaches M / (M + this) of the large-shape rate (fitted to published
    cuBLAS measurements by shape; linear in tokens, so a fixed cost per layer and pass)."""
    sustained_clock: float = 1.0
    """The share of the benchmarked compute rates (`matmul_flops`, every attention kernel's) a
    training step sustains: kernel benchmarks run in bursts at the boost clock, a step holds the
    tensor cores busy for seconds and the power limit pulls the clock down (H200: 702.9 TFLOP/s
    sustained against 828 in a burst). 1 for a profile that timed the layer itself."""
    overlap_slowdown: float = 0.0
    """Compute that runs while a collective is in flight takes (1 + this) times as long: NCCL's
    kernels hold SMs and memory bandwidth beside the matmuls. The step's schedule charges it on
    the stretch each prefetched gather or overlapped reduction shares with a layer's compute
    (`schedule._Step.contention`). 0 for a profile that measured no overlapped collective."""
    memory_bw_bytes_per_s: float
    """Device memory bandwidth (bytes read plus written per second), for elementwise work and
    the per-micro-batch weight traffic."""
    kernel_overhead_s: float
    """Fixed per-layer launch/sync cost (c0)."""
    kernel_launch_s: float
    """Smallest time of one kernel launch: the floor of each per-tensor weight operation."""
    collectives: tuple[CollectiveCurve, ...]
    """Bus bandwidth against message size per collective and group shape (GPUs per node, nodes)."""
    sources: dict[str, str] = field(default_factory=dict)
    fits: dict[str, LayerFit] = field(default_factory=dict)
    """Measured coefficients by model name (replace the FLOP-derived ones for that model)."""
    extrapolation_factor: float = 4.0
    """A fitted model refuses micro-batches above this multiple of its largest fitted point."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Provenance: date, device name, software versions, raw points, fit quality."""
    heldout_mape: float | None = None
    """Worst held-out MAPE (a fraction) of the fits `dcp profile` measured; None for a preset."""
    memory_reserve_fraction: float = 0.07
    """Share of the capacity kept back for the caching allocator's fragmentation (reserved but
    unallocated blocks; variable-length micro-batches fragment more than fixed shapes)."""
    memory_reserve_bytes: float = 0.0
    """Memory outside the caching allocator: CUDA context, NCCL communicators' buffers."""

    def __post_init__(self) -> None:
        for f in ("gpus_per_node", "memory_capacity_bytes", "matmul_flops", "attention_fwd_flops",
                  "attention_bwd_flops", "memory_bw_bytes_per_s"):
            if not getattr(self, f) > 0:
                raise CostModelError(f"hardware {self.name!r}: {f} must be positive, got {getattr(self, f)}")
        for f in ("attention_fwd_pairs_per_token", "attention_bwd_pairs_per_token", "kernel_overhead_s",
                  "kernel_launch_s"):
            if getattr(self, f) < 0:
                raise CostModelError(f"hardware {self.name!r}: {f} must be >= 0, got {getattr(self, f)}")
        if not 0 <= self.memory_reserve_fraction < 1 or self.memory_reserve_bytes < 0:
            raise CostModelError(f"hardware {self.name!r}: memory reserve must be a fraction in [0, 1) and bytes "
                                 f">= 0, got {self.memory_reserve_fraction} and {self.memory_reserve_bytes}")
        if not self.memory_bytes > 0:
            raise CostModelError(f"hardware {self.name!r}: the memory reserve leaves nothing of "
                                 f"{self.memory_capacity_bytes / 1e9:.1f} GB")
        if not 0 < self.sustained_clock <= 1:
            raise CostModelError(f"hardware {self.name!r}: sustained_clock must be in (0, 1], got {self.sustained_clock}")
        if not 0 <= self.overlap_slowdown < 1:
            raise CostModelError(f"hardware {self.name!r}: overlap_slowdown must be in [0, 1), got {self.overlap_slowdown}")
        if self.matmul_tokens_offset < 0:
            raise CostModelError(f"hardware {self.name!r}: matmul_tokens_offset must be >= 0")
        try:
            kernels = {k: v if isinstance(v, AttentionKernel) else AttentionKernel(**v)
                       for k, v in self.attention_kernels.items()}
        except TypeError as e:
            raise CostModelError(f"hardware {self.name!r}: malformed attention kernel ({e})") from e
        object.__setattr__(self, "attention_kernels", kernels)
        curves = tuple(c if isinstance(c, CollectiveCurve) else CollectiveCurve.from_dict(c)
                       for c in self.collectives)
        object.__setattr__(self, "collectives", curves)
        missing = [op for op in COLLECTIVES if not any(c.op == op for c in curves)]
        if missing:
            raise CostModelError(f"hardware {self.name!r}: no curve for {', '.join(missing)}; every collective "
                                 "needs one (re-run `dcp profile`, or copy one from a preset)")

    @property
    def memory_bytes(self) -> float:
        """Memory per GPU a plan may fill (what the caching allocator can hand out): the capacity
        less the fragmentation share and the memory outside the allocator."""
        return self.memory_capacity_bytes * (1 - self.memory_reserve_fraction) - self.memory_reserve_bytes

    def attention_kernel(self, name: str | None = None) -> AttentionKernel:
        """The kernel `name` from `attention_kernels`; None (or the profile's `attention_backend`,
        or its short name) the default kernel, whose rates are the profile's `attention_*` fields."""
        if name is None or self.attention_backend in (name, _KERNEL_ALIASES.get(name)):
            return AttentionKernel(fwd_flops=self.attention_fwd_flops,
                                   fwd_pairs_per_token=self.attention_fwd_pairs_per_token,
                                   bwd_flops=self.attention_bwd_flops,
                                   bwd_pairs_per_token=self.attention_bwd_pairs_per_token,
                                   bwd_causal_flops=self.attention_bwd_causal_flops,
                                   source=self.sources.get("attention_fwd_flops", ""))
        if name not in self.attention_kernels:
            known = sorted({*self.attention_kernels, self.attention_backend} - {""})
            raise CostModelError(f"hardware {self.name!r} has no attention kernel {name!r}; known: {', '.join(known)}")
        return self.attention_kernels[name]

    def collective(self, op: str, ranks: int, gpus_per_node: int) -> CollectiveCurve:
        """The curve for `op` among `ranks` aligned ranks in nodes of `gpus_per_node` GPUs: this
        shape's, else the nearest measured one (`collectives.nearest_curve`)."""
        curve = nearest_curve(self.collectives, op, *group_shape(ranks, gpus_per_node))
        assert curve is not None  # __post_init__ saw one of every collective
        return curve

    def p2p(self, across_nodes: bool) -> CollectiveCurve:
        """The send/recv curve between two GPUs of one node or of two nodes (ring attention's
        neighbours). A profile without one (measured before rings, or a preset without a published
        figure) falls back to the all-to-all among two GPUs of a node / across two nodes: NCCL runs
        an all-to-all as grouped send/recv, so its bus bandwidth is a link's (an estimate)."""
        shape = (1, 2) if across_nodes else (2, 1)
        curve = nearest_curve(self.collectives, "send_recv", *shape)
        if curve is not None and ((curve.nodes > 1) == across_nodes):
            return curve
        fallback = nearest_curve(self.collectives, "all_to_all", *((self.gpus_per_node, 2) if across_nodes else shape))
        assert fallback is not None  # __post_init__ saw one of every collective
        return fallback

    def collective_time_s(self, op: str, message_bytes: float, ranks: int, gpus_per_node: int) -> float:
        """Seconds of one `op` call on `message_bytes` among `ranks` aligned ranks."""
        if ranks <= 1:
            return 0.0
        return self.collective(op, ranks, gpus_per_node).time_s(message_bytes, ranks)

    def strided_time_s(self, op: str, message_bytes: float, ranks: int, per_node: int) -> float:
        """Seconds of one `op` call among `ranks` ranks holding `per_node` GPUs of each node they
        span: HSDP's replica groups (rank i of every shard group; one GPU per node when a shard
        group fills a node). Within a node, that node's curve. Across nodes, the profile's curve of
        exactly this shape when it has one; else a ring whose slowest link is the inter-node one
        (a GPU's own NIC, `p2p(True)`): its latency plus the bus bytes over its bandwidth, since
        each of the node's other GPUs drives its own replica group over its own NIC at once."""
        if ranks <= 1 or message_bytes <= 0:
            return 0.0
        if ranks <= per_node:
            return self.collective_time_s(op, message_bytes, ranks, per_node)
        nodes = math.ceil(ranks / per_node)
        curve = nearest_curve(self.collectives, op, per_node, nodes)
        if curve is not None and (curve.gpus_per_node, curve.nodes) == (per_node, nodes):
            return curve.time_s(message_bytes, ranks)
        latency, bandwidth = self.p2p(across_nodes=True).alpha_beta()
        return latency + message_bytes * bus_factor(op, ranks) / bandwidth

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["collectives"] = [c.to_dict() for c in self.collectives]
        if not d["attention_kernels"]:
            del d["attention_kernels"]
        for optional in ("matmul_tokens_offset", "attention_bwd_causal_flops", "overlap_slowdown"):
            if not d[optional]:
                del d[optional]
        if d["sustained_clock"] == 1.0:
            del d["sustained_clock"]
        return {"kind": "dcp-hardware-profile", "schema_version": PROFILE_SCHEMA_VERSION, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HardwareProfile:
        if not isinstance(d, dict) or d.get("kind") != "dcp-hardware-profile":
            raise CostModelError("not a dcp hardware profile (missing kind: dcp-hardware-profile)")
        d = migrate(d)
        d = {k: v for k, v in d.items() if k not in ("kind", "schema_version")}
        if "memory_bytes" in d and "memory_capacity_bytes" not in d:
            # Profiles written before capacity and reserve were separate: memory_bytes was usable memory.
            d["memory_capacity_bytes"] = d.pop("memory_bytes")
            d.setdefault("memory_reserve_fraction", 0.0)
        try:
            d["collectives"] = tuple(CollectiveCurve.from_dict(c) for c in d["collectives"])
            d["fits"] = {k: LayerFit.from_dict(v) for k, v in d.get("fits", {}).items()}
        except (KeyError, AttributeError, TypeError, ValueError) as e:
            if isinstance(e, CostModelError):
                raise
            raise CostModelError(f"hardware profile {d.get('name', '?')!r}: malformed field ({e})") from e
        return _from_dict(cls, d, "hardware profile")


@dataclass(frozen=True, kw_only=True)
class TrainingSetup:
    """What the user's training keeps in memory besides activations: the precision recipe (the
    same one the executor runs) and how much of the training state ZeRO shards."""

    precision: str | PrecisionRecipe = "bf16"
    """The precision recipe, by name (`dcp.costmodel.precision.RECIPES`: bf16, autocast-bf16,
    fp32) or given whole."""
    zero_stage: Literal[0, 1, 2, 3] = 1
    """0: nothing sharded; 1 and 2 (the same under FSDP2, which always reduce-scatters):
    parameters, gradients and optimizer state sharded between steps, each rank's parameters
    gathered for the whole step; 3: each layer gathered for its forward and again for its
    backward, every rank in lockstep (dcp.costmodel.schedule)."""
    shard_group: int | None = None
    """Ranks the state is sharded over (HSDP: shard within each group of this many consecutive
    ranks, a node by default for large clusters, replicate across the groups); None: the world."""
    kernels: Literal["eager", "compiled"] = "eager"
    """How the elementwise work runs, for the FLOP-derived coefficients: one kernel per op (eager
    PyTorch, as dcp's executor runs it: the default) or fused between matmuls (torch.compile).
    `dcp.costmodel.elementwise` counts the bytes of each; the derivation also prices the loss's
    bytes, the optimizer's step, the small-M GEMM offset and the causal backward's rate
    (docs/design.md, "The cost model"). The optimizer's step is priced with a measured fit too
    (`CostModel.optimizer_s`); the rest only where the coefficients are derived."""
    loss: Literal["upcast", "fused"] = "upcast"
    """The loss over the vocabulary: logits upcast to fp32 before cross-entropy (dcp's `lm_loss`,
    torchtitan), or one fused cross-entropy kernel (flash-attn's xentropy, llm-foundry);
    `dcp.costmodel.elementwise.loss_bytes_per_token`."""
    optimizer: Literal["foreach", "fused"] = "foreach"
    """AdamW's implementation: torch's default multi-tensor passes, or its one fused kernel
    (`dcp.costmodel.traffic.optimizer_bytes_per_param`)."""
    attention: str | None = None
    """The attention kernel the run uses (a name in the hardware's `attention_kernels`, e.g.
    fa2, fa3, cudnn, triton); None: the hardware profile's own (`attention_backend`)."""

    def __post_init__(self) -> None:
        get_recipe(self.precision)  # an unknown name is a clear error here, not later
        if self.kernels not in ("eager", "compiled"):
            raise CostModelError(f"kernels must be eager or compiled, got {self.kernels!r}")
        if self.loss not in ("upcast", "fused"):
            raise CostModelError(f"loss must be upcast or fused, got {self.loss!r}")
        if self.optimizer not in ("foreach", "fused"):
            raise CostModelError(f"optimizer must be foreach or fused, got {self.optimizer!r}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise CostModelError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.shard_group is not None and self.shard_group < 1:
            raise CostModelError(f"shard_group must be a positive number of ranks, got {self.shard_group!r}")

    @property
    def recipe(self) -> PrecisionRecipe:
        return get_recipe(self.precision)

    @property
    def param_bytes(self) -> int:
        """Bytes per parameter element (the recipe's)."""
        return self.recipe.param_bytes

    @property
    def optimizer_state_bytes_per_param(self) -> int:
        """Optimizer state per parameter, master weights not included (the recipe's)."""
        return self.recipe.optimizer_state_bytes_per_param

    def static_bytes(self, params: int, world: int) -> float:
        """Bytes per GPU the training state holds between steps (gradients freed by zero_grad):
        sharded parameters (the fp32 master weights when the recipe keeps them) and optimizer
        state, over the shard group at stages 1-3 as FSDP2 holds them (ZeRO: Rajbhandari et
        al., arXiv 1910.02054). bf16 with Adam: (4 + 8) / F bytes per parameter; stage 0: 12.
        (`dcp.costmodel.zero.resident_bytes` counts the same in FSDP2's padded units.)"""
        r = self.recipe
        weights = 4 if r.master_weights else r.param_bytes
        per_param = weights + r.optimizer_state_bytes_per_param
        shard = 1 if self.zero_stage == 0 else (self.shard_group or world)
        return float(per_param * params / shard)


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
