"""Memory counted a second way: the bytes a layer keeps for backward, read off the autograd graph
its forward built (every node's saved tensors, each storage once, parameters apart), without
`dcp.profiler.live_bytes` (whose `layer_counting` both the executor's saved-bytes test and the
cost model's memory figures use, so an error there would cancel out)."""

from __future__ import annotations

import pytest
import torch

from dcp.costmodel import Cluster, CostModel, TrainingSetup, load_hardware, load_model
from dcp.models import PackedSeqs, build_layer
from dcp.models.attention import forced_kernels
from dcp.profiler.flash_standin import flash_dense_standin, flash_varlen_standin
from dcp.profiler.live_bytes import layer_counting


def _saved_tensors(node: object) -> list[torch.Tensor]:
    """What one autograd node keeps: built-in nodes' `_saved_*` attributes, a custom Function's
    `saved_tensors`."""
    found: list[torch.Tensor] = []
    names = [n for n in dir(node) if n.startswith("_saved_")]
    values = [getattr(node, n) for n in names]
    if hasattr(node, "saved_tensors"):
        values.append(node.saved_tensors)
    for v in values:
        for t in v if isinstance(v, (list, tuple)) else [v]:
            if isinstance(t, torch.Tensor):
                found.append(t)
    return found


def _weight_copy(t: torch.Tensor, params: list[torch.Tensor]) -> bool:
    """Whether `t` is a parameter cast to another dtype (a norm's fp32 weight): a weight copy,
    which the memory model counts apart from activations."""
    return any(p.shape == t.shape and p.dtype != t.dtype and torch.equal(p.detach().to(t.dtype), t) for p in params)


def graph_saved_bytes(out: torch.Tensor, params: list[torch.Tensor]) -> int:
    """Bytes of the storages the autograd graph behind `out` keeps for backward, each once,
    the parameters' (and their views' and casts') apart."""
    param_storages = {p.untyped_storage().data_ptr() for p in params}
    seen_nodes, storages = set(), {}
    stack = [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        for t in _saved_tensors(node):
            s = t.untyped_storage()
            if s.data_ptr() not in param_storages and not _weight_copy(t, params):
                storages[s.data_ptr()] = s.nbytes()
        stack.extend(fn for fn, _ in node.next_functions)
    return sum(storages.values())


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-stdit"])
def test_a_layers_saved_bytes_counted_off_the_autograd_graph(name: str) -> None:
    """One bf16 layer, attention on the flash stand-ins (what a GPU's flash kernel keeps): the
    graph's saved bytes equal `layer_counting`'s, and per token the cost model's activation
    figure for a layer (its footprint, measured with `layer_counting` on fake tensors) within 2%."""
    spec = load_model(name)
    layer = build_layer(spec, dtype=torch.bfloat16)
    video = spec.attention == "spatial_temporal"
    lengths, frames = [768, 256], ([12, 4] if video else [1, 1])
    seqs = PackedSeqs.pack(lengths, frames)
    x = torch.randn(sum(lengths), spec.hidden, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    x.requires_grad_(True)
    params = list(layer.parameters())
    with forced_kernels(flash_varlen_standin, flash_dense_standin), layer_counting([layer], params) as counted:
        out = layer(x, seqs, None) if video else layer(x, seqs)
        walked = graph_saved_bytes(out, params)
        out.float().square().sum().backward()
    assert walked > 0
    assert walked == counted.saved.by_bucket.get(0, 0)
    cm = CostModel(spec, load_hardware("cpu"), Cluster(num_gpus=1, gpus_per_node=8, memory_bytes=1e12),
                   TrainingSetup(precision="bf16"))
    assert walked / sum(lengths) == pytest.approx(cm.fit.act_full_bytes_per_token, rel=0.02)
