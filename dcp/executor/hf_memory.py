"""The measured memory footprint of a Hugging Face causal LM, as `hf_executor` runs it.

    from dcp.executor.hf_memory import hf_footprint, measured_model_spec
    spec = measured_model_spec(config, "autocast-bf16")   # ModelSpec with its measured memory

The model is built from its config with `depth` layers on fake tensors (nothing is allocated,
whatever its size), dcp attention installed, and run exactly as the executor does
(`hf_forward`, `causal_lm_loss`) under dcp.profiler.memory's counting.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from dcp.costmodel import ModelSpec
from dcp.costmodel.memory import MemoryFootprint, shape_of
from dcp.costmodel.precision import RECIPES, PrecisionRecipe
from dcp.executor.batch import PackedBatch
from dcp.executor.hf import causal_lm_loss, decoder_layers, hf_forward, install_dcp_attention
from dcp.executor.hf_spec import model_spec_from_hf_config
from dcp.executor.ulysses import SPContext
from dcp.models.packing import PackedSeqs
from dcp.profiler.memory import DEFAULT_TOKENS, FootprintTarget, default_dtype, measure_footprint


def hf_target(config: Any, spec: ModelSpec | None = None) -> FootprintTarget:
    """A transformers causal LM of `config` as the memory profiler measures it."""
    from transformers import AutoModelForCausalLM

    spec = spec or model_spec_from_hf_config(config)

    def build(n: int, dtype: torch.dtype) -> nn.Module:
        cfg = copy.deepcopy(config)
        cfg.num_hidden_layers = n
        with default_dtype(dtype):
            model = AutoModelForCausalLM.from_config(cfg)
        install_dcp_attention(model, SPContext())
        return model

    def inputs(tokens: int) -> PackedBatch:
        gen = torch.Generator().manual_seed(0)
        seqs = PackedSeqs.pack([tokens])
        seqs.positions(), seqs.segment_ids_full()  # cached now: fake tensors have no values
        return PackedBatch({"input_ids": torch.randint(spec.vocab, (tokens,), generator=gen),
                            "labels": torch.randint(spec.vocab, (tokens,), generator=gen)}, seqs)

    def run(model: nn.Module, batch: PackedBatch) -> torch.Tensor:
        return causal_lm_loss(hf_forward(model, batch), batch)[0]

    return FootprintTarget(name=spec.name, build=build, layers=decoder_layers, inputs=inputs, run=run,
                           shape=shape_of(spec))


def hf_footprint(config: Any, recipe: str | PrecisionRecipe, *, tokens: Sequence[int] = DEFAULT_TOKENS
                 ) -> MemoryFootprint:
    """The measured memory footprint of the transformers model of `config` in `recipe`."""
    return measure_footprint(hf_target(config), recipe, tokens=tokens)


def measured_model_spec(config: Any, recipes: str | Sequence[str] = tuple(RECIPES), **kwargs: Any) -> ModelSpec:
    """`model_spec_from_hf_config(config, **kwargs)` with the model's footprint measured in each
    of `recipes` (about a second each), ready for the cost model."""
    spec = model_spec_from_hf_config(config, **kwargs)
    names = [recipes] if isinstance(recipes, str) else list(recipes)
    target = hf_target(config, spec)
    return dataclasses.replace(spec, memory={r: measure_footprint(target, r) for r in names})
