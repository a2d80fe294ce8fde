"""Shared fixtures: cost models for the paper's setting and small clusters, seeded hypothesis."""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from dcp.costmodel import (
    Cluster,
    CostModel,
    HardwareProfile,
    TrainingSetup,
    load_hardware,
    load_model,
)
from dcp.planner.sample import Sample

# Seeded and without deadlines: CI machines (2 cores) vary in speed, results must not.
settings.register_profile("dcp", derandomize=True, deadline=None, max_examples=40,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("dcp")

FAKECLOCK_DIR = os.path.join(os.path.dirname(__file__), "fakeclock")
sys.path.insert(0, FAKECLOCK_DIR)
import fakeclock  # noqa: E402


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--clock-speed", type=float, default=None, metavar="N",
                     help="run time.perf_counter and time.monotonic N times fast for the whole session, "
                          "in every process it starts (tests/fakeclock): a test whose verdict needs a "
                          "fast machine fails")


def pytest_configure(config: pytest.Config) -> None:
    speed = config.getoption("--clock-speed")
    if speed is None or speed == 1:
        return
    fakeclock.install(speed)
    # Processes the tests start (planner workers, `dcp` subprocesses) load sitecustomize.py there.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (FAKECLOCK_DIR, os.environ.get("PYTHONPATH")) if p)


UNHURRIED = 0.01
"""How fast the clock runs for a test that uses `unhurried`."""


@pytest.fixture
def unhurried() -> Iterator[None]:
    """The clock runs a hundred times slow for the test (`fakeclock.running`): a time limit of
    1 s gives the planner 100 s of this machine, so the test checks what the planner finds when
    its deadlines do not stop it, on any machine under any load (it still stops at its own
    convergence rules: gaps, node limits, rounds). A test that uses it says what that takes."""
    with fakeclock.running(UNHURRIED):
        yield


def pytest_report_header(config: pytest.Config) -> str | None:
    speed = fakeclock.speed()
    return f"fake clock: perf_counter and monotonic run {speed:g}x fast" if speed != 1 else None


@pytest.fixture(scope="module")
def state() -> Iterator[Any]:
    """A one-rank gloo world (file store) and its `ParallelState`, per test module."""
    import torch.distributed as dist

    from dcp.executor.parallel_state import ParallelState

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'store')}", rank=0, world_size=1)
        try:
            yield ParallelState.create(timeout_s=30)
        finally:
            dist.destroy_process_group()


def tested_hardware(name: str, overlap_slowdown: float = 0.0) -> HardwareProfile:
    """A preset as the planner tests' cases were chosen on: h200-sxm at 790 TFLOP/s and its
    benchmarked clock (before `sustained_clock` lowered every compute rate by 15%), and every
    preset without the compute a collective in flight slows (`overlap_slowdown`; test_schedule
    prices it, and checks the closed form against the replay with it on). The planner's
    guarantees hold on any linear model; these cases exercise paths (fillers, reductions, column
    levels) that a 15% shift in compute against memory and network can move elsewhere. The
    shipped presets' own numbers are tested in test_costmodel_terms and test_collectives."""
    hw = dataclasses.replace(load_hardware(name), overlap_slowdown=overlap_slowdown)
    if name == "h200-sxm":
        hw = dataclasses.replace(hw, matmul_flops=790e12, sustained_clock=1.0)
    return hw


@functools.cache
def cost_model(model: str = "llama-7b", gpus: int = 32, gpus_per_node: int = 8,
               memory_gb: float | None = None, zero_stage: int = 1, hardware: str = "h200-sxm",
               overlap_slowdown: float = 0.0) -> CostModel:
    """A cached cost model (hypothesis tests cannot take function-scoped fixtures). On h200-sxm
    it prices at the preset's burst matmul rate of 790 TFLOP/s and no clock drop, the numbers the
    planner tests' cases were chosen on (`tested_hardware`)."""
    hw = tested_hardware(hardware, overlap_slowdown)
    cluster = Cluster(num_gpus=gpus, gpus_per_node=gpus_per_node,
                      memory_bytes=hw.memory_bytes if memory_gb is None else memory_gb * 1e9)
    return CostModel(load_model(model), hw, cluster, TrainingSetup(zero_stage=zero_stage))


@functools.cache
def heavy_cost_model(gpus: int = 32, gpus_per_node: int = 8, fixed_s: float = 0.05,
                     activation_scale: float = 1.6) -> CostModel:
    """Llama 7B on H200 with the kind of corrections a calibrated profile brings: every micro-batch
    pays `fixed_s` outside the layers (tens of ms), each layer's kernels cost ten times the
    datasheet overhead, and activations take `activation_scale` times the memory (so less fits
    and more must be checkpointed). The same linear shape: the planner's guarantees must hold."""
    import dataclasses

    base = cost_model(gpus=gpus, gpus_per_node=gpus_per_node)
    # Memory comes from the footprint a fit carries (dcp.costmodel.memory.footprint_for).
    act_full = activation_scale * base.footprint.act_full_bytes_per_token
    memory = dataclasses.replace(base.footprint, act_full_bytes_per_token=act_full)
    # Ten times the datasheet kernel overhead per layer and pass (the weight traffic stays as it is).
    extra_s = 9 * base.hardware.kernel_overhead_s
    fit = dataclasses.replace(base.fit, microbatch_fixed_s=fixed_s, fwd_fixed_s=base.fit.fwd_fixed_s + extra_s,
                              bwd_fixed_s=base.fit.bwd_fixed_s + 2 * extra_s, act_full_bytes_per_token=act_full,
                              memory=memory)
    hw = dataclasses.replace(base.hardware, fits={**base.hardware.fits, base.model.name: fit})
    return CostModel(base.model, hw, base.cluster, base.training)


def make_batch(lengths: list[int], attention: str = "causal") -> list[Sample]:
    """Samples with ids 0..n-1 (text: one frame each)."""
    from dcp.costmodel import attention_pairs

    return [Sample(i, t, attention_pairs(attention, t)) for i, t in enumerate(lengths)]


ZERO3_LENGTHS = [200 + (97 * i) % 3000 for i in range(300)] + [20_000]
"""Wikipedia-like: many short samples and one long one (the ZeRO-3 bound and warm-start tests)."""


@pytest.fixture(scope="session")
def llama_cm() -> CostModel:
    """Llama 7B on 32 H200 in nodes of 8: the DCP paper's 1D setting."""
    return cost_model()


@pytest.fixture(scope="session")
def wiki_batches(llama_cm: CostModel) -> list[list[Sample]]:
    """Three 512-sample global batches of the built-in Wikipedia lengths."""
    from dcp.data.batches import make_batches

    return make_batches("wikipedia", llama_cm, global_batch=512, steps=3)
