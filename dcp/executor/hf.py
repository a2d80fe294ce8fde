"""Hugging Face transformers models under dcp, without forking the model.

    from dcp.executor.hf import causal_lm_loss, hf_executor, lm_sample
    executor = hf_executor(model, ParallelState.create())      # e.g. a LlamaForCausalLM
    samples = {i: lm_sample(input_ids[i]) for i in planned.local_samples(rank)}
    executor.step(planned.plan, samples, causal_lm_loss)

Importing this module registers "dcp" with transformers' AttentionInterface. `hf_executor` sets
the model's `attn_implementation` to it, so every attention module that dispatches through the
interface (Llama, Mistral, Qwen2, ...) runs Ulysses (and ring) attention in the SP group of the
micro-batch being run. The model sees one packed micro-batch shard at a time, as batch size 1:

- `position_ids` restart at 0 for every sample and are the *global* (unsharded) positions of the
  shard's tokens (its zigzag chunks under a ring), so RoPE rotates exactly as it would for the
  sample alone;
- the packing layout (`PackedSeqs`, passed as the `dcp_seqs` keyword, which transformers hands
  through to the attention function) keeps samples apart: after the all-to-all each rank runs
  block-diagonal causal varlen attention over the whole sequence for its heads;
- pads (up to a multiple of the SP size) form a segment of their own with label -100.

Transformers builds no attention mask for an implementation it has no mask function for, so
no O(S^2) mask is ever materialized. The planner learns what the model allows from its config:
`model_spec_from_hf_config` and `allowed_sp_sizes` (dcp.executor.hf_spec).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

try:
    from transformers import AttentionInterface
except ImportError as e:  # transformers is an extra, not a dependency
    raise ImportError(f"dcp.executor.hf needs transformers ({e}): install dcp's hf extra with "
                      "`scripts/setup_env.sh hf` (or `.venv/bin/pip install -e '.[hf]'`) in the repository") from e

from dcp.executor.batch import PackedBatch
from dcp.executor.executor import Executor
from dcp.executor.hf_spec import allowed_sp_sizes, model_heads, model_spec_from_hf_config
from dcp.executor.parallel_state import ParallelState
from dcp.executor.ulysses import SPContext, UlyssesAttention
from dcp.models.attention import varlen_attention
from dcp.models.losses import IGNORE_INDEX, lm_loss
from dcp.models.packing import PackedSeqs

ATTN_IMPLEMENTATION = "dcp"
"""The name under which dcp's attention is registered with transformers."""
CONTEXT_ATTR = "dcp_sp_context"
"""Attribute of a model's submodules holding the executor's SPContext (a plain attribute: no
parameter, no state-dict entry)."""


def _layout(q_len: int, ctx: SPContext, device: torch.device, dcp_seqs: PackedSeqs | None,
            cu_seq_lens: torch.Tensor | None, position_ids: torch.Tensor | None) -> PackedSeqs:
    """The packing layout of the micro-batch, from the most direct source available."""
    sp_size = ctx.size
    if dcp_seqs is not None:  # from hf_forward: host-side, no device sync per layer
        return dcp_seqs
    if cu_seq_lens is not None:  # HF's flattening convention, over the whole (unsharded) sequence
        lengths = cu_seq_lens.diff().tolist()
        return PackedSeqs.pack(lengths, sp_size=sp_size, sp_rank=ctx.rank, device=device, ring=ctx.ring_size)
    if sp_size > 1:
        raise ValueError("under sequence parallelism dcp attention needs the layout of the whole packed sequence: "
                         "run the model through dcp.executor.hf.hf_forward, or pass cu_seq_lens_q")
    if position_ids is None:
        return PackedSeqs.pack([q_len], device=device)
    # One process: a sample starts wherever the position does not follow on (as HF's packing does).
    pos = position_ids.reshape(-1)
    starts = torch.nonzero(pos.diff(prepend=pos[:1] - 2) != 1).flatten().tolist()
    return PackedSeqs.pack([b - a for a, b in zip(starts, [*starts[1:], q_len], strict=True)], device=device)


def dcp_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, *, scaling: float | None = None, dropout: float = 0.0,
                  is_causal: bool | None = None, sliding_window: int | None = None,
                  dcp_seqs: PackedSeqs | None = None, cu_seq_lens_q: torch.Tensor | None = None,
                  position_ids: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query [1, H, S, D], key/value [1, Hkv, S, D]
    (S this rank's shard) -> ([1, S, H, D], no weights). Ulysses in the module's SP context."""
    if attention_mask is not None:
        raise ValueError("dcp attention masks from the packing layout (samples apart, pads apart); call the model "
                         "without attention_mask")
    if dropout:
        raise ValueError(f"dcp attention has no attention dropout (got p={dropout}); set attention_dropout=0")
    for name in ("softcap", "s_aux"):
        if kwargs.get(name) is not None:
            raise ValueError(f"dcp attention does not support {name!r} ({type(module).__name__})")
    if query.shape[0] != 1 or query.shape[2] != key.shape[2]:
        raise ValueError(f"dcp attention runs one packed sequence without a KV cache (batch 1, as many keys as "
                         f"queries); got query {tuple(query.shape)}, key {tuple(key.shape)}. For generation switch "
                         "back, e.g. model.set_attn_implementation('sdpa')")
    ctx = getattr(module, CONTEXT_ATTR, None) or SPContext()
    seqs = _layout(query.shape[2], ctx, query.device, dcp_seqs, cu_seq_lens_q, position_ids)
    if sliding_window is not None:
        longest = max(seqs.lengths[:seqs.num_real])
        if longest > sliding_window:  # inside the window every earlier token is visible: plain causal
            raise ValueError(f"a sample of {longest} tokens exceeds the model's sliding window of {sliding_window}; "
                             "dcp attention has no sliding-window mask")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    head_dim = query.shape[-1]
    if scaling is not None and not math.isclose(scaling, head_dim ** -0.5, rel_tol=1e-12):
        # Our kernels scale by 1/sqrt(D); folding the model's own scale into q is the same softmax.
        query = query * (scaling * math.sqrt(head_dim))
    # [1, H, S, D] -> [S, H, D], the packed layout of dcp's kernels (contiguous for the all-to-all).
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))
    out = UlyssesAttention(varlen_attention, ctx)(q, k, v, seqs, "causal" if causal else "full")
    return out.unsqueeze(0), None


AttentionInterface.register(ATTN_IMPLEMENTATION, dcp_attention)


def install_dcp_attention(model: nn.Module, ctx: SPContext) -> None:
    """Switch `model` to dcp attention and hand its modules the SP context the executor sets.

    Every submodule with a `config` gets the context: attention modules read
    `config._attn_implementation`, so they all have one, whatever the model calls them."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "set_attn_implementation"):
        raise TypeError(f"{type(model).__name__} is not a transformers PreTrainedModel with set_attn_implementation "
                        "(transformers 5 is what dcp is tested with)")
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    # transformers only warns when a model cannot switch; attention left on sdpa would silently
    # attend within each rank's shard, so refuse.
    if config._attn_implementation != ATTN_IMPLEMENTATION:
        raise ValueError(f"{type(model).__name__} does not dispatch attention through transformers' "
                         "AttentionInterface, so dcp cannot run its attention with sequence parallelism")
    for m in model.modules():
        if getattr(m, "config", None) is not None:
            setattr(m, CONTEXT_ATTR, ctx)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's list of transformer layers (`model.model.layers` for *ForCausalLM), whose
    first r are checkpointed per micro-batch."""
    n = model.config.num_hidden_layers
    found = [m for name, m in model.named_modules()
             if isinstance(m, nn.ModuleList) and name.rsplit(".", 1)[-1] == "layers" and len(m) == n]
    if len(found) != 1:
        raise ValueError(f"found {len(found)} module lists named 'layers' of {n} layers in {type(model).__name__}; "
                         "pass layers= explicitly")
    return found[0]


def hf_forward(model: nn.Module, batch: PackedBatch) -> torch.Tensor:
    """The executor's forward for a causal LM: one packed shard as batch 1 -> logits [N, vocab]."""
    out = model(input_ids=batch["input_ids"].unsqueeze(0), position_ids=batch.seqs.positions().unsqueeze(0),
                dcp_seqs=batch.seqs, use_cache=False)
    return out.logits[0]


def causal_lm_loss(logits: torch.Tensor, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token cross-entropy summed over the shard's labelled tokens, and their count."""
    return lm_loss(logits, batch["labels"])


def lm_sample(input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """One sample's tensors for `hf_executor`: `labels` in HF's convention (default: the input
    ids; -100 is ignored) are shifted here, per sample, so that token t is labelled with t+1's
    label. Shifting after packing would label a sample's last token with the next sample's first,
    and after sharding would lose the label across every shard boundary."""
    input_ids = torch.as_tensor(input_ids).reshape(-1)
    labels = input_ids if labels is None else torch.as_tensor(labels).reshape(-1)
    if labels.shape != input_ids.shape:
        raise ValueError(f"{labels.numel()} labels for {input_ids.numel()} input ids")
    return {"input_ids": input_ids, "labels": torch.cat([labels[1:], labels.new_full((1,), IGNORE_INDEX)])}


def hf_executor(model: nn.Module, state: ParallelState, *, layers: Sequence[nn.Module] | None = None,
                **kwargs: Any) -> Executor:
    """An Executor for a transformers causal LM: dcp attention installed, the decoder layers as
    checkpoint switches, heads from the config (a plan whose SP size does not divide them is
    refused before any collective), `hf_forward` as the forward. Samples are `lm_sample` dicts;
    kwargs go to Executor (recipe, gather_stats, ...)."""
    executor = Executor(model, state, layers=layers if layers is not None else decoder_layers(model),
                        heads=model_heads(model.config), forward_fn=hf_forward, per_sample_keys=(), **kwargs)
    install_dcp_attention(model, executor.ctx)
    return executor


def plain_hf_step(model: nn.Module, input_ids: Sequence[torch.Tensor]) -> float:
    """Plain single-process HF training on one global batch, the reference dcp must equal: each
    sample alone through the model with its own attention and `labels`, the loss a sum over
    tokens divided by the batch's token count (`num_items_in_batch`). Gradients land in `.grad`
    (zeroed first); returns the mean loss per token."""
    model.zero_grad(set_to_none=True)
    count = sum(len(ids) - 1 for ids in input_ids)  # HF labels every token but the last
    total = 0.0
    for ids in input_ids:
        ids = ids.reshape(1, -1)
        loss = model(input_ids=ids, labels=ids, num_items_in_batch=count, use_cache=False).loss
        loss.backward()
        total += loss.item()
    return total


__all__ = [
    "ATTN_IMPLEMENTATION", "allowed_sp_sizes", "causal_lm_loss", "dcp_attention", "decoder_layers", "hf_executor",
    "hf_forward", "install_dcp_attention", "lm_sample", "model_heads", "model_spec_from_hf_config",
    "plain_hf_step",
]
