"""The time side of the cost model: collective curves, their keying by group shape, the step's
synchronization per ZeRO stage and recipe, the per-micro-batch weight traffic, attention's
short-sequence term, and profiles of the old schema."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import cost_model

from dcp.costmodel import (
    Cluster,
    CollectiveCurve,
    CostModel,
    CostModelError,
    HardwareProfile,
    ModelSpec,
    PrecisionRecipe,
    TrainingSetup,
    bus_factor,
    load_hardware,
    load_model,
    save_hardware,
)
from dcp.costmodel.attention import achieved_flops, fit_attention_rate
from dcp.costmodel.zero import padded, unit_params

ROOT = Path(__file__).resolve().parents[1]
LLAMA_7B_PARAMS = 6_738_415_616


def with_recipe(spec: ModelSpec, recipe: PrecisionRecipe, like: str = "bf16") -> ModelSpec:
    """`spec` with a memory footprint for a test recipe (these tests price time, not memory)."""
    fp = dataclasses.replace(spec.memory[like], recipe=recipe.name)
    return dataclasses.replace(spec, memory={**spec.memory, recipe.name: fp})


def curve(op: str = "all_reduce", g: int = 8, nodes: int = 4, **kw: object) -> CollectiveCurve:
    return CollectiveCurve(op=op, gpus_per_node=g, nodes=nodes, **kw)


def test_bus_factors_are_nccl_tests() -> None:
    assert bus_factor("all_reduce", 32) == pytest.approx(2 * 31 / 32)
    assert bus_factor("all_gather", 8) == bus_factor("reduce_scatter", 8) == bus_factor("all_to_all", 8) == 7 / 8
    assert bus_factor("broadcast", 16) == 1.0
    assert bus_factor("all_reduce", 1) == 0.0
    with pytest.raises(CostModelError, match="unknown collective 'gather'"):
        bus_factor("gather", 4)


def test_curve_interpolates_bus_bandwidth_in_log_size_and_clamps_at_both_ends() -> None:
    c = curve(points=[(1 << 20, 20e9), (1 << 24, 100e9), (1 << 28, 300e9)])
    f = 2 * 31 / 32
    assert c.time_s(1 << 24) == pytest.approx((1 << 24) * f / 100e9)
    # Halfway in log size between 16 MiB and 256 MiB (64 MiB): halfway in bandwidth.
    assert c.bus_bw(1 << 26) == pytest.approx(200e9)
    assert c.time_s(1 << 26) == pytest.approx((1 << 26) * f / 200e9)
    # Past the last point: its bandwidth; below the first: that point's time (the latency floor).
    assert c.time_s(1 << 32) == pytest.approx((1 << 32) * f / 300e9)
    assert c.time_s(1024) == pytest.approx(c.time_s(1 << 20))
    # Time grows with size even where the bandwidth does not (busbw dips are in published curves).
    dip = curve(points=[(1 << 20, 50e9), (1 << 21, 40e9), (1 << 22, 60e9)])
    sizes = [1 << 19, 1 << 20, 3 << 19, 1 << 21, 3 << 20, 1 << 22, 1 << 23]
    times = [dip.time_s(m) for m in sizes]
    assert times == sorted(times)
    # The same busbw serves another rank count through the bus factor.
    assert c.time_s(1 << 24, ranks=2) == pytest.approx((1 << 24) * 1.0 / 100e9)


def test_alpha_beta_fit_reproduces_the_points_it_came_from() -> None:
    lat, bw, f = 30e-6, 250e9, 7 / 8
    pts = [(m, m * f / (lat + m * f / bw)) for m in (1 << 14, 1 << 18, 1 << 22, 1 << 26, 1 << 30)]
    got_lat, got_bw = curve("all_to_all", 8, 1, points=pts).alpha_beta()
    assert got_lat == pytest.approx(lat, rel=1e-6) and got_bw == pytest.approx(bw, rel=1e-6)
    ab = curve("all_to_all", 8, 1, latency_s=lat, bus_bw_bytes_per_s=bw)
    assert ab.alpha_beta() == (lat, bw)
    assert ab.time_s(1 << 20) == pytest.approx(lat + (1 << 20) * f / bw)


@pytest.mark.parametrize(("kw", "message"), [
    ({}, "either points or latency_s"),
    ({"points": [(1, 1e9)], "latency_s": 1e-5, "bus_bw_bytes_per_s": 1e9}, "not both"),
    ({"latency_s": 1e-5}, "needs both"),
    ({"points": [(2, 1e9), (1, 1e9)]}, "sizes increasing"),
    ({"points": [(1, 0.0)]}, "positive sizes and bandwidths"),
])
def test_bad_curves_are_named(kw: dict, message: str) -> None:
    with pytest.raises(CostModelError, match=message):
        curve(**kw)


def test_curves_are_keyed_by_gpus_per_node_and_node_count() -> None:
    hw = load_hardware("h200-sxm")
    assert (hw.collective("all_to_all", 8, 8).gpus_per_node, hw.collective("all_to_all", 8, 8).nodes) == (8, 1)
    # 16, 32, 64 GPUs in nodes of 8 span 2, 4, 8 nodes: three different curves.
    picked = {p: hw.collective("all_to_all", p, 8) for p in (16, 32, 64)}
    assert [(c.gpus_per_node, c.nodes) for c in picked.values()] == [(8, 2), (8, 4), (8, 8)]
    # The preset's published all-to-all bandwidths for 2, 4 and 8 nodes (h200-sxm.json, input data).
    assert [c.alpha_beta()[1] for c in picked.values()] == pytest.approx([97e9, 64.7e9, 55.4e9])
    # The same 16 GPUs in nodes of 4 span 4 nodes of 4: no such curve, the nearest across nodes.
    assert hw.collective("all_to_all", 16, 4).nodes > 1
    # Beyond the measured node counts: the largest one at or below (8 nodes for 32).
    assert hw.collective("all_to_all", 256, 8).nodes == 8
    # A world all-reduce on 4 nodes is the 4-node published curve, not the one-node NVLS one.
    # Input data: the nccl-tests points at 8 GiB in h200-sxm.json (4 nodes: 330.93 GB/s; 1 node: 479.72).
    assert hw.collective("all_reduce", 32, 8).bus_bw(8 << 30) == pytest.approx(330.93e9)
    assert hw.collective("all_reduce", 8, 8).bus_bw(8 << 30) == pytest.approx(479.72e9)


def test_a_profile_without_a_collective_is_refused() -> None:
    hw = load_hardware("h200-sxm")
    with pytest.raises(CostModelError, match="no curve for broadcast"):
        dataclasses.replace(hw, collectives=tuple(c for c in hw.collectives if c.op != "broadcast"))


def units(cm: CostModel) -> list[int]:
    """The executor's units of the cost model's model, padded to its world."""
    return [padded(n, cm.cluster.num_gpus) for n in unit_params(cm.model)]


def test_grad_sync_reduces_in_the_recipes_reduce_dtype() -> None:
    hw, spec = load_hardware("h200-sxm"), load_model("llama-7b")
    cluster = Cluster(num_gpus=32, gpus_per_node=8, memory_bytes=1e11)
    fp32 = CostModel(spec, hw, cluster, TrainingSetup(precision="autocast-bf16", zero_stage=0))
    bf16_recipe = dataclasses.replace(TrainingSetup().recipe, name="bf16-reduce", reduce_dtype="bf16")
    bf16 = CostModel(with_recipe(spec, bf16_recipe), hw, cluster, TrainingSetup(precision=bf16_recipe, zero_stage=0))
    curve_ = hw.collective("all_reduce", 32, 8)
    sizes = units(fp32)
    assert sum(unit_params(spec)) == LLAMA_7B_PARAMS
    # One all-reduce per unit (32 layers, then embeddings and head), in the reduce dtype.
    assert fp32.sync_terms()["grad_reduce"] == pytest.approx(sum(curve_.time_s(4 * n) for n in sizes))
    assert bf16.sync_terms()["grad_reduce"] == pytest.approx(sum(curve_.time_s(2 * n) for n in sizes))
    # The least a step adds: layer 0's and the root's all-reduces (the backward ends with them), the
    # loss scalars, the optimizer's step (stage 0 steps every parameter, foreach AdamW on fp32
    # parameters at 80 bytes each over 4.3 TB/s), and s / (1 + s) of layers 31..1's all-reduces,
    # which slow the last backward beside them or follow it (overlap_slowdown s = 0.189).
    least = curve_.time_s(4 * sizes[0]) + curve_.time_s(4 * sizes[-1]) + curve_.time_s(16)
    beside = 0.189 / 1.189 * sum(curve_.time_s(4 * n) for n in sizes[1:32])
    assert fp32.grad_sync_s() == pytest.approx(least + 80 * LLAMA_7B_PARAMS / 4.3e12 + beside)


def test_zero1_and_2_all_gather_the_updated_units() -> None:
    zero0, zero1, zero2 = (cost_model(zero_stage=s) for s in (0, 1, 2))
    hw, pb, rb = zero1.hardware, zero1.training.recipe.param_bytes, zero1.training.recipe.reduce_bytes
    gather = sum(hw.collective_time_s("all_gather", n * pb, 32, 8) for n in units(zero1))
    assert "param_all_gather" not in zero0.sync_terms()
    assert zero1.sync_terms()["param_all_gather"] == pytest.approx(gather)
    assert zero2.sync_terms()["param_all_gather"] == pytest.approx(gather)
    # The gathers follow the optimizer: never hidden. Stage 0's optimizer steps every parameter,
    # stage 1's the rank's 1/32 (foreach AdamW, bf16 recipe: 82 bytes a parameter, 4.3 TB/s).
    adam = 82 * LLAMA_7B_PARAMS / 4.3e12
    assert zero1.grad_sync_s() == pytest.approx(zero0.grad_sync_s() - adam + adam / 32 + gather)
    # Stage 2 reduce-scatters what stage 1 all-reduces.
    assert zero2.sync_terms()["grad_reduce"] == pytest.approx(
        sum(hw.collective_time_s("reduce_scatter", n * rb, 32, 8) for n in units(zero2)))


def test_zero3_gathers_each_layer_twice_a_slot_outside_the_microbatch() -> None:
    z2, z3 = cost_model(zero_stage=2), cost_model(zero_stage=3)
    hw, pb = z3.hardware, z3.training.recipe.param_bytes
    sizes = units(z3)
    gather = [hw.collective_time_s("all_gather", n * pb, 32, 8) for n in sizes]
    # Layers 0..K-2 twice (forward, backward), layer K-1 once (kept for its backward), the root once.
    assert z3.sync_terms()["param_all_gather"] == pytest.approx(2 * sum(gather[:-2]) + gather[-2] + gather[-1])
    # The gathers belong to the step's schedule: a micro-batch alone costs the same as at stage 2.
    assert z3.linear_time(8, 0) == z2.linear_time(8, 0)
    assert z3.notes() == [] == z2.notes()


def test_plans_record_their_zero_stage() -> None:
    from conftest import make_batch

    from dcp.planner import BucketOptions, solve

    batch = make_batch([1000, 2000, 3000])
    for stage in (0, 1, 2, 3):
        cm = cost_model(zero_stage=stage)
        plan = solve(batch, cm.cluster, cm, BucketOptions())
        assert plan.zero_stage == stage
        assert not any("simulation only" in n for n in plan.notes)


def test_microbatch_fixed_cost_is_the_weight_traffic() -> None:
    """7B in the autocast recipe: per micro-batch each fp32 weight is read and a bf16 copy written
    (6 B), its gradient cast back (6 B) and accumulated into the fp32 buffer (12 B): 24 B per
    matmul parameter, about 37 ms at the H200's 4.3 TB/s; a recomputed layer casts again. Each
    layer's matmuls also run 192 tokens more than they are given (the preset's small-M offset at
    the 702.9 TFLOP/s a step sustains, 828 x 0.849: 2 FLOPs a weight, about 0.1 ms a layer and pass)."""
    hw, spec = load_hardware("h200-sxm"), load_model("llama-7b")
    cm = CostModel(spec, hw, Cluster(num_gpus=8, gpus_per_node=8, memory_bytes=1e11),
                   TrainingSetup(precision="autocast-bf16"))
    bw, k, f = hw.memory_bw_bytes_per_s, spec.num_layers, cm.fit
    matmul = spec.block_matmul_params()
    gemm = 192 * 2 * matmul / (828e12 * 0.849)
    assert f.fwd_fixed_s == pytest.approx(hw.kernel_overhead_s + 6 * matmul / bw + gemm, rel=1e-3)
    # The two norm weights (4096 values) accumulate too, each at the launch floor.
    assert f.bwd_fixed_s == pytest.approx(2 * hw.kernel_overhead_s + 18 * matmul / bw + 2 * hw.kernel_launch_s
                                          + 2 * gemm, rel=1e-3)
    assert f.rec_fixed_s == pytest.approx(f.fwd_fixed_s)
    # 32 layers x (24 B x 202M weights / 4.3 TB/s = 1.13 ms of casts + 3 x 0.098 ms of GEMM offset),
    # about 46 ms with the launches and the head.
    fixed = cm.linear_time(1, 0).fixed
    assert 0.040 < fixed < 0.055
    assert cm.linear_time(1, k).fixed - fixed == pytest.approx(k * f.rec_fixed_s)
    # Without autocast (bf16 parameters and buffer) only the accumulation is left: 3 x 2 B.
    lean = dataclasses.replace(TrainingSetup().recipe, name="bf16-grads", grad_dtype="bf16")
    cm2 = CostModel(with_recipe(spec, lean), hw, cm.cluster, TrainingSetup(precision=lean))
    assert cm2.fit.fwd_fixed_s == pytest.approx(hw.kernel_overhead_s + gemm)
    assert cm2.fit.bwd_fixed_s == pytest.approx(2 * hw.kernel_overhead_s + 6 * matmul / bw + 2 * hw.kernel_launch_s
                                                + 2 * gemm, rel=1e-3)
    # A small tensor costs its launch, not its bytes: the norm weights' share is the launch floor.
    tiny = CostModel(with_recipe(load_model("tiny-llama"), lean), dataclasses.replace(hw, kernel_launch_s=1e-3),
                     cm.cluster, TrainingSetup(precision=lean))
    matmuls, norms = 7, 2
    tiny_gemm = 192 * 2 * tiny.model.block_matmul_params() / 790e12
    assert tiny.fit.bwd_fixed_s == pytest.approx(2 * hw.kernel_overhead_s + (matmuls + norms) * 1e-3 + 2 * tiny_gemm)


def test_attention_has_a_rate_per_direction_and_a_short_sequence_term() -> None:
    cm = cost_model()
    hw, h = cm.hardware, cm.model.hidden
    f = cm.fit
    clock = hw.sustained_clock  # the kernels' benchmarked rates, at the clock a step sustains
    assert f.fwd_per_pair_s == pytest.approx(4 * h / (hw.attention_fwd_flops * clock))
    assert f.bwd_per_pair_s == pytest.approx(2.5 * 4 * h / (hw.attention_bwd_flops * clock))
    # A causal sample of L tokens runs at L / (L + 2 kappa) of the long-sequence rate.
    kappa = hw.attention_fwd_pairs_per_token
    assert achieved_flops(512, True, 1.0, kappa) == pytest.approx(512 / (513 + 2 * kappa), rel=1e-9)
    one = cm.time_s(512, 512 * 513 // 2, 1, 0) - cm.time_s(512, 0, 1, 0)
    assert one == pytest.approx(32 * (f.fwd_per_pair_s + f.bwd_per_pair_s) * (512 * 513 // 2))


def test_attention_fit_recovers_rate_and_short_sequence_term() -> None:
    rate, kappa = 600e12, 150.0
    pts = [(n, c, achieved_flops(n, c, rate, kappa)) for n in (512, 2048, 8192) for c in (True, False)]
    assert fit_attention_rate(pts) == pytest.approx((rate, kappa), rel=1e-9)
    with pytest.raises(CostModelError, match="two sequence lengths"):
        fit_attention_rate(pts[:1])


def test_preset_attention_reproduces_its_published_curve() -> None:
    """h200-sxm's forward rate and term are the fit of FlashAttention-2's causal forward in the
    FlashAttention-3 paper (arXiv 2407.08608, Fig. 5); the fit stays within 4% of every bar."""
    bench = _benchmark()
    hw = load_hardware("h200-sxm")
    rows = [r for r in bench.ATTENTION if r.kernel == "flash-attn-2" and r.direction == "fwd" and r.causal]
    assert len(rows) == 6
    rate, kappa = fit_attention_rate([(r.length, r.causal, r.tflops * 1e12) for r in rows])
    assert hw.attention_fwd_flops == pytest.approx(rate, rel=1e-3)
    assert hw.attention_fwd_pairs_per_token == pytest.approx(kappa, rel=1e-2)
    for r in rows:
        assert achieved_flops(r.length, True, rate, kappa) == pytest.approx(r.tflops * 1e12, rel=0.04)


def test_schema_1_profile_migrates_to_the_same_prices(tmp_path: Path) -> None:
    old = json.loads((ROOT / "notebooks" / "data" / "cpu-tiny-llama.json").read_text())
    assert old["schema_version"] == 1
    hw = HardwareProfile.from_dict(old)
    assert hw.meta["migrated_from_schema"] == 1 and hw.fits["tiny-llama"].max_fitted_tokens > 0
    assert hw.attention_fwd_flops == hw.attention_bwd_flops == old["attention_flops"]
    lat, bw = hw.collective("all_to_all", 4, 8).alpha_beta()
    assert (lat, bw) == (old["a2a_latency_intra_s"], old["a2a_bw_intra_bytes_per_s"]["4"])
    m = 1 << 30
    assert hw.collective_time_s("all_reduce", m, 16, 8) == pytest.approx(
        old["a2a_latency_inter_s"] + 2 * 15 / 16 * m / old["allreduce_bw_bytes_per_s"])
    # Saved again it is a schema 2 profile that loads unchanged.
    save_hardware(hw, tmp_path / "p.json")
    assert json.loads((tmp_path / "p.json").read_text())["schema_version"] == 2
    assert load_hardware(str(tmp_path / "p.json")) == hw


def test_new_schema_profile_round_trips_with_curves_and_attention(tmp_path: Path) -> None:
    hw = dataclasses.replace(load_hardware("h100-sxm"), attention_backend="cudnn", attention_bwd_pairs_per_token=3.5)
    save_hardware(hw, tmp_path / "p.json")
    back = load_hardware(str(tmp_path / "p.json"))
    assert back == hw and back.collectives == hw.collectives
    raw = json.loads((tmp_path / "p.json").read_text())
    assert raw["attention_backend"] == "cudnn" and {"op", "gpus_per_node", "nodes", "source"} <= set(raw["collectives"][0])
    raw["collectives"][0]["points"] = [[2, 1e9], [1, 2e9]]
    (tmp_path / "bad.json").write_text(json.dumps(raw))
    with pytest.raises(CostModelError, match="sizes increasing"):
        load_hardware(str(tmp_path / "bad.json"))


def _benchmark():  # noqa: ANN202
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return __import__("costmodel")
    finally:
        sys.path.pop(0)


def test_costmodel_benchmark_writes_its_json_and_one_docs_section(tmp_path: Path) -> None:
    bench = _benchmark()
    page = tmp_path / "results.md"
    page.write_text("# results\n\nother sections\n")
    for _ in range(2):  # a second run replaces its section instead of adding one
        assert bench.main(["--json", str(tmp_path / "c.json"), "--docs", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("# results\n\nother sections\n") and text.count(bench.BEGIN) == 1
    doc = json.loads((tmp_path / "c.json").read_text())
    assert set(doc["summary"]) == set(bench.CATEGORIES)
    assert all(r["source"] and r["predicted"] > 0 and r["ratio"] == pytest.approx(r["predicted"] / r["published"])
               for r in doc["rows"])
    # Every end-to-end row is held out but the runs of the one fitted kernel (llm-foundry's Triton
    # attention), and the section reports the held-out MAPE as the JSON has it.
    e2e = doc["summary"]["end-to-end"]
    fitted = [r for r in doc["rows"] if r["category"] == "end-to-end" and r["fitted"]]
    assert fitted and all("triton-fa" in r["what"] for r in fitted)
    assert e2e["held_out"] == e2e["rows"] - len(fitted) >= 12
    assert f"{100 * e2e['mape_held_out']:.1f}%" in text
