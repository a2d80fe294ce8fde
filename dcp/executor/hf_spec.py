"""What the planner must know about a Hugging Face model, read from its config.

Works on any config with transformers' standard attribute names (num_hidden_layers, hidden_size,
num_attention_heads, num_key_value_heads, intermediate_size, vocab_size); imports neither torch
nor transformers, so the planner side can call it too.
"""

from __future__ import annotations

from typing import Any, Literal

from dcp.costmodel import ModelSpec


def _attr(config: Any, name: str) -> int:
    value = getattr(config, name, None)
    if value is None:
        raise ValueError(f"{type(config).__name__} has no {name!r}; build the ModelSpec by hand "
                         "(dcp.costmodel.ModelSpec) for this model")
    return int(value)


def model_heads(config: Any) -> tuple[int, int]:
    """(attention heads, KV heads); configs without GQA leave num_key_value_heads unset."""
    heads = _attr(config, "num_attention_heads")
    return heads, int(getattr(config, "num_key_value_heads", None) or heads)


def allowed_sp_sizes(config: Any, world_size: int, *, ulysses_only: bool = False) -> list[int]:
    """SP sizes the executor can run the model at on `world_size` ranks: aligned powers of two
    (the executor's groups). A causal or full self-attention model runs any of them: Ulysses over
    the heads and a ring over the rest (dcp.costmodel.ring.sp_layouts is what the planner picks);
    `ulysses_only`: the sizes Ulysses alone shards, dividing both the heads and the KV heads."""
    if world_size <= 0:
        raise ValueError(f"world size must be positive, got {world_size}")
    heads, kv_heads = model_heads(config)
    sizes, p = [], 1
    while p <= world_size:
        if not ulysses_only or (heads % p == 0 and kv_heads % p == 0):
            sizes.append(p)
        p *= 2
    return sizes


def model_spec_from_hf_config(config: Any, *, name: str | None = None, bytes_per_element: int = 2,
                              mlp: Literal["swiglu", "gelu"] = "swiglu") -> ModelSpec:
    """The cost model's ModelSpec of a transformers decoder config. The planner's own SP filter
    (dcp.planner.feasibility.allowed_sp_sizes) reads heads and KV heads from it, so a cost model built
    on this spec never plans an SP size the model refuses.

    `bytes_per_element`: 2 for bf16/fp16 training, 4 for fp32. `mlp`: "swiglu" for the gated
    gate/up/down MLP of Llama, Mistral, Qwen2 and Gemma; "gelu" for two-matrix MLPs. A config
    whose head_dim differs from hidden_size / heads is costed as if it did not (ModelSpec has
    no separate head size)."""
    heads, kv_heads = model_heads(config)
    return ModelSpec(
        name=name or getattr(config, "name_or_path", None) or getattr(config, "model_type", "hf-model"),
        num_layers=_attr(config, "num_hidden_layers"), hidden=_attr(config, "hidden_size"), heads=heads,
        kv_heads=kv_heads, ffn_hidden=_attr(config, "intermediate_size"), vocab=_attr(config, "vocab_size"),
        bytes_per_element=bytes_per_element,
        attention="causal" if getattr(config, "is_causal", True) else "full", mlp=mlp,
        tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        source=f"transformers {getattr(config, 'model_type', type(config).__name__)} config")
