"""Hugging Face checkpoints in and out of a sharded (FSDP2) model, through DCP's safetensors
storage (torch.distributed.checkpoint.HuggingFaceStorageWriter / Reader).

    export_hf(executor.model, model.config, "out/")     # every rank; rank 0 writes the config
    AutoModelForCausalLM.from_pretrained("out/")        # anywhere, no dcp needed
    load_hf(executor.model, "meta-llama/...local dir/") # every rank, before training

Export: every rank writes its own shards of the parameters (safetensors, `out/sharded/`), then
the coordinator consolidates them tensor by tensor into `model-00001-of-00001.safetensors` with
`model.safetensors.index.json`, the layout `from_pretrained` reads, and removes the shards. No
rank gathers the whole model in memory; the coordinator reads and writes every byte once (the
consolidation is serial: it costs the model's size in file I/O on one rank).

Import: every rank asks DCP for its own shard of each parameter; the reader opens the
safetensors file and reads only that slice (`safe_open(...).get_slice`), so no rank holds more
than its shards (the files are read with mmap; the page cache may hold more).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

SHARDED_DIR = "sharded"
"""Where HuggingFaceStorageWriter puts the per-rank shards before consolidating them."""


def _tied_keys(model: nn.Module, config: Any) -> set[str]:
    """State-dict keys of weights tied to another one (HF saves the first of a tie only)."""
    if not getattr(config, "tie_word_embeddings", False):
        return set()
    return {k for k in ("lm_head.weight",) if k in model.state_dict()}


def export_hf(model: nn.Module, config: Any, out_dir: str | Path) -> Path:
    """Write `model` (sharded or not; HF parameter names) as a consolidated safetensors checkpoint
    with `config` (a transformers PretrainedConfig) that `from_pretrained` loads. Call on every rank."""
    out = Path(out_dir)
    rank = dist.get_rank() if dist.is_initialized() else 0
    state = get_model_state_dict(model)
    for k in _tied_keys(model, config):
        state.pop(k)
    writer = HuggingFaceStorageWriter(str(out), save_distributed=True, enable_consolidation=True)
    dcp.save(state, storage_writer=writer, no_dist=not dist.is_initialized())
    if rank == 0:
        config.save_pretrained(out)
        shutil.rmtree(out / SHARDED_DIR, ignore_errors=True)
    if dist.is_initialized():
        dist.barrier()
    return out


def load_hf(model: nn.Module, path: str | Path, config: Any = None) -> None:
    """Load a HF safetensors checkpoint (a directory of *.safetensors, e.g. a downloaded model)
    into `model` (sharded or not; HF parameter names), each rank reading only its shards. Every
    parameter must be in the checkpoint (tied weights excepted when `config` ties them)."""
    state = get_model_state_dict(model)
    tied = _tied_keys(model, config) if config is not None else set()
    for k in tied:
        state.pop(k)
    dcp.load(state, storage_reader=HuggingFaceStorageReader(str(path)), no_dist=not dist.is_initialized())
    set_model_state_dict(model, state, options=_non_strict() if tied else None)


def _non_strict() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(strict=False)
