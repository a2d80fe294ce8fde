"""What the cost model prices: a transformer's shape (ModelSpec) and its samples' attention pairs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from dcp.costmodel.memory import MemoryFootprint

AttentionKind = Literal["causal", "full", "spatial_temporal"]
ATTENTION_KINDS: tuple[str, ...] = ("causal", "full", "spatial_temporal")


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


NORMS: tuple[str, ...] = ("rmsnorm", "layernorm", "layernorm-lowp")


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
    norm: Literal["rmsnorm", "layernorm", "layernorm-lowp"] = "rmsnorm"
    """The blocks' normalization, for their elementwise traffic (dcp.costmodel.elementwise):
    rmsnorm as dcp.models runs it (eager ops in fp32), layernorm (torch's one kernel, in fp32
    under autocast), layernorm-lowp (MPT's low_precision_layernorm: input cast to the compute
    dtype, one kernel there)."""
    positions: Literal["rope", "learned"] = "rope"
    """rope rotates q and k in every block; learned adds a table once, at the embedding."""
    biases: bool = False
    """The projections carry biases (MPT's default, GPT-2): added inside the matmul forward, each
    summed over the tokens backward (one read of its output's gradient)."""
    fused_qkv: bool = False
    """q, k and v come from one projection (MPT's Wqkv, GPT-2's c_attn): the normed input feeds
    one matmul, not three (one autocast cast, no gradient sum)."""
    source: str = ""
    """Where the shape comes from."""
    memory: dict[str, MemoryFootprint] = field(default_factory=dict, compare=False)
    """Measured memory footprint by precision recipe name (dcp.profiler.memory; presets carry
    one for every recipe, made by scripts/measure_memory.py)."""

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
        if self.norm not in NORMS:
            raise CostModelError(f"model {self.name!r}: unknown norm {self.norm!r}; known: {', '.join(NORMS)}")
        if self.positions not in ("rope", "learned"):
            raise CostModelError(f"model {self.name!r}: positions must be rope or learned, got {self.positions!r}")
        if self.attention not in ATTENTION_KINDS:
            raise CostModelError(f"model {self.name!r}: unknown attention {self.attention!r}")
        for name, fp in self.memory.items():
            if getattr(fp, "recipe", None) != name:
                raise CostModelError(f"model {self.name!r}: memory[{name!r}] is not a footprint of recipe {name!r}")

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
        from dcp.costmodel.memory import MemoryFootprint

        if isinstance(d, dict) and isinstance(d.get("memory"), dict):
            d = {**d, "memory": {k: MemoryFootprint.from_dict(v) for k, v in d["memory"].items()}}
        return _from_dict(cls, d, "model spec")


def _from_dict(cls: type, d: dict[str, Any], what: str) -> Any:
    if not isinstance(d, dict):
        raise CostModelError(f"{what}: expected a JSON object, got {type(d).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = set(d) - set(known)
    if unknown:
        raise CostModelError(f"{what}: unknown field(s) {sorted(unknown)}")
    for name, value in d.items():
        # Annotations are strings (postponed evaluation): the numeric fields say "int" or "float".
        if known[name].type in ("int", "float") and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise CostModelError(f"{what} {d.get('name', '?')!r}: {name} must be a number, got {value!r}")
        if known[name].type == "int" and isinstance(value, float):
            raise CostModelError(f"{what} {d.get('name', '?')!r}: {name} must be an integer, got {value!r}")
    try:
        return cls(**d)
    except TypeError as e:
        raise CostModelError(f"{what}: {e}") from e
