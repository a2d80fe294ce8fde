"""HF checkpoints through DCP's safetensors storage (dcp.executor.hf_checkpoint), on a tiny
randomly initialised Llama built locally and `fully_shard`ed over 2 gloo ranks: the exported
directory loads with `AutoModelForCausalLM.from_pretrained` and gives the sharded model's logits
(fp32, within 1e-6); a HF checkpoint loads into a sharded model with each rank reading only its
shards' elements."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from dist_helpers import run_ranks  # noqa: E402


def _llama(seed: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float()


def _shard(model: torch.nn.Module) -> torch.nn.Module:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _round_trip(rank: int, world: int, out: str) -> dict:
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from transformers import AutoModelForCausalLM

    from dcp.executor.hf_checkpoint import export_hf, load_hf

    model = _shard(_llama(seed=0))
    ids = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(7))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(ids, labels=ids).loss.backward()  # a sharded update: the weights are no longer the init
    opt.step()
    with torch.no_grad():
        logits = model(ids).logits
    export_hf(model, model.config, out)
    result: dict = {"files": sorted(p.name for p in Path(out).iterdir())}
    if rank == 0:
        loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        with torch.no_grad():
            result["export_diff"] = (loaded(ids).logits - logits).abs().max().item()
    read = []  # elements this rank read from the safetensors file
    original = HuggingFaceStorageReader._process_read_request

    def counting(self, f, req, planner) -> None:  # noqa: ANN001
        read.append(int(torch.Size(req.lengths).numel()))
        original(self, f, req, planner)

    HuggingFaceStorageReader._process_read_request = counting
    fresh = _shard(_llama(seed=1))  # other weights
    load_hf(fresh, out)
    result["read"] = sum(read)
    result["local"] = sum(p.to_local().numel() for p in fresh.parameters())  # before a forward gathers them
    result["whole"] = sum(p.numel() for p in fresh.parameters())
    with torch.no_grad():
        result["import_diff"] = (fresh(ids).logits - logits).abs().max().item()
    return result


def test_export_loads_with_from_pretrained_and_imports_sharded(tmp_path: Path) -> None:
    r = run_ranks(_round_trip, 2, str(tmp_path / "hf"), deadline_s=240)
    assert "model.safetensors.index.json" in r[0]["files"] and "config.json" in r[0]["files"]
    assert "sharded" not in r[0]["files"]
    assert r[0]["export_diff"] <= 1e-6, r[0]
    for rank in r:
        assert rank["import_diff"] <= 1e-6, rank
        assert rank["read"] == rank["local"] < rank["whole"], "each rank reads its shards, not the whole model"
