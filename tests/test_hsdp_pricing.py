"""HSDP priced in time: gathers and reduce-scatters within the shard group at its node's bandwidth,
the replicas' all-reduce of each gradient shard across nodes at one GPU's inter-node bandwidth.
Expected seconds are written from the h200-sxm preset's curves by hand (alpha + bytes x bus
factor / bus bandwidth)."""

from __future__ import annotations

import dataclasses

import pytest

from dcp.costmodel import Cluster, CostModel, TrainingSetup, load_hardware, load_model
from dcp.costmodel.collectives import CollectiveCurve

LAYER = 218_112_000
"""Llama-3-8B's elements per layer: attention 2 x 4096^2 + 2 x 4096 x 1024, SwiGLU 3 x 4096 x 14336, two norms."""
ROOT = 2 * 128_256 * 4096 + 4096
"""Its root: embedding and LM head (untied), the final norm."""
NVLINK = (1e-5, 370e9)
"""The preset's all-gather and reduce-scatter among the 8 GPUs of a node: 10 us, 370 GB/s bus."""
NIC = (46e-6, 46e9)
"""Its inter-node send/recv: one 400G NIC per GPU, 46 us, 46 GB/s."""


def hsdp(gpus: int, shard_group: int | None, stage: int = 2, hardware: object = None) -> CostModel:
    hw = hardware or load_hardware("h200-sxm")
    return CostModel(load_model("llama-3-8b"), hw, Cluster(num_gpus=gpus, gpus_per_node=8, memory_bytes=hw.memory_bytes),
                     TrainingSetup(precision="bf16", zero_stage=stage, shard_group=shard_group))


def ring_s(curve: tuple[float, float], message: float, factor: float) -> float:
    return curve[0] + message * factor / curve[1]


def test_hsdp_over_a_node_prices_node_collectives_and_the_replicas_all_reduce() -> None:
    """256 GPUs, shards of 8 (a node), 32 replicas: per unit, a bf16 all-gather and an fp32
    reduce-scatter over NVLink (7/8 of the unit), then the fp32 shard (1/8) all-reduced among 32
    GPUs, one per node, over each GPU's NIC (bus factor 2 x 31/32)."""
    cm = hsdp(256, 8)
    units = [LAYER] * 32 + [ROOT]
    gather = [ring_s(NVLINK, 2 * u, 7 / 8) for u in units]
    reduce = [ring_s(NVLINK, 4 * u, 7 / 8) + ring_s(NIC, 4 * u / 8, 2 * 31 / 32) for u in units]
    terms = cm.sync_terms()
    assert terms["param_all_gather"] == pytest.approx(sum(gather), rel=1e-12)
    assert terms["grad_reduce"] == pytest.approx(sum(reduce), rel=1e-12)
    # Stage 3 gathers layers 30..0 again for the backward: 2 x 31 layers + layer 31 + the root.
    z3 = hsdp(256, 8, stage=3).sync_terms()
    assert z3["param_all_gather"] == pytest.approx(sum(gather) + 31 * gather[0], rel=1e-12)
    assert z3["grad_reduce"] == pytest.approx(sum(reduce), rel=1e-12)
    # Memory: the state sharded over 8, not 256 (fp32 master weights + two fp32 moments).
    assert cm.resident_bytes == pytest.approx(12 * sum(units) / 8, rel=1e-12)


def test_half_node_shard_groups_put_two_replicas_per_node_on_the_nic() -> None:
    """16 GPUs, shards of 4: 4 replicas, two in each node; the ring still crosses nodes, so the
    NIC prices it (bus factor 2 x 3/4); the shard group's all-gather is the node curve among 4."""
    cm = hsdp(16, 4)
    units = [LAYER] * 32 + [ROOT]
    gather = [ring_s(NVLINK, 2 * u, 3 / 4) for u in units]
    reduce = [ring_s(NVLINK, 4 * u, 3 / 4) + ring_s(NIC, 4 * u / 4, 2 * 3 / 4) for u in units]
    assert cm.sync_terms()["param_all_gather"] == pytest.approx(sum(gather), rel=1e-12)
    assert cm.sync_terms()["grad_reduce"] == pytest.approx(sum(reduce), rel=1e-12)


def test_a_measured_curve_of_the_replica_groups_shape_is_used() -> None:
    """A profile with an all-reduce curve measured on 1 GPU x 32 nodes prices the replicas with it."""
    base = load_hardware("h200-sxm")
    curve = CollectiveCurve(op="all_reduce", gpus_per_node=1, nodes=32, latency_s=2e-4, bus_bw_bytes_per_s=20e9)
    hw = dataclasses.replace(base, collectives=(*base.collectives, curve))
    units = [LAYER] * 32 + [ROOT]
    reduce = [ring_s(NVLINK, 4 * u, 7 / 8) + ring_s((2e-4, 20e9), 4 * u / 8, 2 * 31 / 32) for u in units]
    assert hsdp(256, 8, hardware=hw).sync_terms()["grad_reduce"] == pytest.approx(sum(reduce), rel=1e-12)
    # Sharding over the world never asks for it: the world's reduce-scatter, unchanged.
    assert hsdp(256, None, hardware=hw).sync_terms() == hsdp(256, None).sync_terms()


def test_the_shard_group_reaches_the_step_price() -> None:
    """The least a step adds at stage 2 (after the slowest group: layer 0's and the root's
    reductions, the loss scalars, the optimizer's step, every unit's all-gather; and s / (1 + s)
    of layers 31..1's reductions, beside the last backward or after it, overlap_slowdown s =
    0.189) moves with the shard group's collectives. The optimizer steps the rank's 1/8 of the
    parameters (foreach AdamW, bf16 recipe: 82 bytes a parameter) at the preset's 4.3 TB/s."""
    world, node = hsdp(256, None), hsdp(256, 8)
    scalars = world.sync_terms()["loss_all_reduce"]  # 16 bytes among the same 256 ranks either way
    assert scalars == node.sync_terms()["loss_all_reduce"]
    reduce = [ring_s(NVLINK, 4 * u, 7 / 8) + ring_s(NIC, 4 * u / 8, 2 * 31 / 32) for u in (LAYER, ROOT)]
    gather = sum(ring_s(NVLINK, 2 * u, 7 / 8) for u in [LAYER] * 32 + [ROOT])
    adam = 82 * (32 * LAYER + ROOT) / 8 / 4.3e12
    beside = 0.189 / 1.189 * 31 * reduce[0]
    assert node.grad_sync_s() == pytest.approx(sum(reduce) + scalars + adam + gather + beside, rel=1e-12)
    assert node.grad_sync_s() != pytest.approx(world.grad_sync_s(), rel=1e-3)
