"""No plan runs out of memory by the project's own accounting: a few batches of the sweep in
benchmarks/memory_fit.py (which runs 100 per case), every strategy, re-priced from the measured
footprint against the real capacity."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcp.costmodel import Cluster, CostModel, TrainingSetup, load_hardware, load_model
from dcp.data.batches import make_batches
from dcp.planner import STRATEGIES, solve
from dcp.planner.run import resolve_options

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
try:
    import memory_fit
finally:
    sys.path.pop(0)


@pytest.mark.parametrize(("model", "workload"), memory_fit.CASES)
def test_every_microbatch_of_every_strategy_fits(model: str, workload: str) -> None:
    row = memory_fit.run_case(model, workload, "bf16", list(STRATEGIES), steps=2, time_limit_s=0.5)
    assert row["usable_memory_gb"] > 135  # the H200's 139.8 GiB less the allocator reserve, not 90% of 141 GB
    for name, s in row["strategies"].items():
        assert s["plans"] == 2 and s["infeasible_batches"] == 0, name
        assert s["microbatches"] > 0 and s["microbatches_over"] == 0, name
        assert 0 < s["max_fill"] <= 1.0, name


def test_the_check_finds_a_plan_made_for_more_memory_than_the_device_has() -> None:
    hw = load_hardware("h200-sxm")
    big = Cluster(num_gpus=32, gpus_per_node=8, memory_bytes=1.2 * hw.memory_bytes)
    cm = CostModel(load_model("llama-7b"), hw, big, TrainingSetup(zero_stage=1))
    batch = make_batches("lognormal:scale=16", cm, global_batch=128, steps=1)[0]
    report = memory_fit.check_plan(solve(batch, cm.cluster, cm, resolve_options("dcp-greedy")), cm)
    assert report["over"] > 0 and report["max_fill"] > 1.0


@given(st.integers(1, 500_000), st.sampled_from([1, 2, 4, 8, 16, 32]), st.integers(0, 32),
       st.sampled_from(["bf16", "autocast-bf16"]))
def test_repricing_agrees_with_the_cost_model(tokens: int, sp: int, r: int, recipe: str) -> None:
    hw = load_hardware("h200-sxm")
    cm = CostModel(load_model("llama-7b"), hw, Cluster(num_gpus=32, gpus_per_node=8, memory_bytes=hw.memory_bytes),
                   TrainingSetup(precision=recipe))
    assert memory_fit.microbatch_need_bytes(cm, tokens, sp, r) == pytest.approx(cm.memory_bytes(tokens, sp, r))
    # A micro-batch of max_tokens fits with its padded shards; one more token per GPU does not.
    m = cm.max_tokens(sp, r)
    if m:
        assert cm.memory_bytes(m, sp, r) <= hw.memory_bytes < cm.memory_bytes(m + sp, sp, r)


def test_capacity_is_the_device_less_a_configurable_reserve() -> None:
    hw = load_hardware("h200-sxm")
    assert hw.memory_capacity_bytes == pytest.approx(139.80 * 2**30, rel=1e-6)
    assert hw.memory_bytes == pytest.approx(hw.memory_capacity_bytes * (1 - 0.07) - 2.5e9)
    tighter = dataclasses.replace(hw, memory_reserve_fraction=0.10)
    assert tighter.memory_bytes == pytest.approx(hw.memory_capacity_bytes * 0.9 - 2.5e9)
    assert "fragmentation" in hw.sources["memory_reserve_fraction"]
