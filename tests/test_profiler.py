"""The profiler: fits recover known coefficients, profiles round-trip and fail clearly, the
all-to-all is measured over gloo, and a real (tiny) profile runs end to end and is used."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_helpers import check_validation_status
from click.testing import CliRunner
from dist_helpers import run_ranks
from torch import nn

from dcp.costmodel import (
    COLLECTIVES,
    Cluster,
    CostModel,
    CostModelError,
    HardwareProfile,
    LayerFit,
    load_hardware,
    load_model,
    save_hardware,
)
from dcp.costmodel.schedule import GroupShape, MicroBatchShape
from dcp.profiler import (
    Call,
    LayerBench,
    MicroBatchMeasurement,
    ProfileOptions,
    fit_nnls,
    profile_bench,
    refit,
)
from dcp.profiler.anchor import UNANCHORED, Anchor
from dcp.profiler.comm import CommPoint, curves_from_points
from dcp.profiler.compute import LayerPoint, ModelPoint, Repeats
from dcp.profiler.layer_fit import fit_layer
from dcp.profiler.timing import count_saved_bytes

RNG = np.random.default_rng(0)
TRUE = {  # seconds: fixed, per token, per pair (orders of magnitude of a 7B layer on an H200)
    "fwd": (2e-4, 5e-7, 1.5e-11), "bwd": (3e-4, 1e-6, 4e-11), "rec": (2.5e-4, 5.5e-7, 1.6e-11)}


def lin(c: tuple[float, float, float], t: float, a: float) -> float:
    return c[0] + c[1] * t + c[2] * a


def noisy(x: float, rel: float = 0.003) -> float:
    return float(x * (1 + RNG.normal(0, rel)))


def synthetic_points(grid: list[tuple[int, int]]) -> list[LayerPoint]:
    pts = []
    for t, a in grid:
        f, b, r = (lin(TRUE[k], t, a) for k in ("fwd", "bwd", "rec"))
        pts.append(LayerPoint(t, a, 1, noisy(f), noisy(b), noisy(f + b + r), 40 * t, 2 * t))
    return pts


def grid_points() -> list[tuple[int, int]]:
    out = []
    for t in (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072):
        for length in (t, t // 8, t // 64):
            out.append((t, (t // length) * length * (length + 1) // 2))
    return out


def test_nnls_recovers_known_coefficients_within_2_percent() -> None:
    x = np.array([[1.0, t, a] for t, a in grid_points()])
    y = [noisy(lin(TRUE["fwd"], t, a)) for t, a in grid_points()]
    fit = fit_nnls(x, y, ("fixed", "per_token", "per_pair"))
    for got, want in zip(fit.coef, TRUE["fwd"], strict=True):
        assert got == pytest.approx(want, rel=0.02)
    assert fit.r2 > 0.999 and fit.mape < 0.01


def test_nnls_never_returns_negative_coefficients() -> None:
    # y falls with x: the least-squares slope would be negative; NNLS clamps it at zero.
    fit = fit_nnls([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]], [3.0, 2.0, 1.0], ("fixed", "slope"))
    assert fit.coef[1] == 0.0 and fit.coef[0] > 0


def test_fit_layer_recovers_fwd_bwd_recompute_and_head() -> None:
    points = synthetic_points(grid_points())
    heldout = synthetic_points([(3000, 1_500_000), (50_000, 300_000_000), (9000, 9_000_000)])
    head = (1e-3, 2e-7)  # microbatch fixed, per token
    model_points = [ModelPoint(t, t * 256, 0, 0, noisy(head[0] + head[1] * t), 10 * t) for t in (64, 256, 1024, 4096)]
    for t in (1024, 4096, 16384):
        layer = lin(TRUE["fwd"], t, t * 256) + lin(TRUE["bwd"], t, t * 256)
        for n in (1, 2):
            model_points.append(ModelPoint(t, t * 256, n, 0, noisy(head[0] + head[1] * t + n * layer, 0.0005),
                                           (40 * n + 10) * t))
    report = fit_layer(points, model_points, heldout)
    f = report.fit
    for name, key in (("fwd", "fwd"), ("bwd", "bwd"), ("rec", "rec")):
        got = (getattr(f, f"{name}_fixed_s"), getattr(f, f"{name}_per_token_s"), getattr(f, f"{name}_per_pair_s"))
        for g, w in zip(got, TRUE[key], strict=True):
            assert g == pytest.approx(w, rel=0.02), (name, got)
    assert f.microbatch_fixed_s == pytest.approx(head[0], rel=0.02)
    assert f.head_per_token_s == pytest.approx(head[1], rel=0.02)
    assert report.below_threshold() == {}
    assert f.act_full_bytes_per_token == 40 and f.act_ckpt_bytes_per_token == 2
    assert f.head_bytes_per_token == pytest.approx(10)
    assert f.max_fitted_tokens == 131072
    assert report.heldout_mape < 0.02 and f.heldout_mape == report.heldout_mape


def one_sided(x: float, repeats: int, rng: np.random.Generator) -> list[float]:
    """`repeats` readings of work taking x seconds on a busy machine: noise only adds (a
    preemption, an evicted cache), here up to 3x the work and in half the runs."""
    return [x * (1 + (rng.exponential(0.5) if rng.random() < 0.5 else rng.exponential(0.002)))
            for _ in range(repeats)]


def test_fastest_of_repeats_recovers_coefficients_where_the_median_does_not() -> None:
    rng = np.random.default_rng(1)
    grid = grid_points()
    x = np.array([[1.0, t, a] for t, a in grid])
    runs = [one_sided(lin(TRUE["fwd"], t, a), 7, rng) for t, a in grid]
    fastest = fit_nnls(x, [min(r) for r in runs], ("fixed", "per_token", "per_pair"))
    for got, want in zip(fastest.coef, TRUE["fwd"], strict=True):
        assert got == pytest.approx(want, rel=0.02)
    assert fastest.r2 > 0.999
    # The same readings' medians: a quarter of the points off by more than 10%.
    median = [float(np.median(r)) for r in runs]
    off = [m / lin(TRUE["fwd"], t, a) - 1 for m, (t, a) in zip(median, grid, strict=True)]
    assert sum(o > 0.1 for o in off) >= len(grid) // 4


def test_timed_best_keeps_each_clocks_fastest_and_remeasured_points_their_fastest() -> None:
    from dcp.profiler.profile import _fastest
    from dcp.profiler.timing import Timed

    assert Timed.best([(3.0, 9.0), (2.0, 10.0), (4.0, 8.5)]) == Timed(2.0, 8.5)
    first = synthetic_points([(1024, 1024 * 512), (2048, 2048 * 512)])
    again = [replace(first[0], fwd_s=first[0].fwd_s / 2, bwd_s=first[0].bwd_s * 2),
             *synthetic_points([(4096, 4096 * 512)])]
    merged = _fastest(first, again, lambda p: (p.tokens, p.num_samples, p.attn_pairs))
    assert [p.tokens for p in merged] == [1024, 4096, 2048]
    assert merged[0].fwd_s == first[0].fwd_s / 2 and merged[0].bwd_s == first[0].bwd_s
    assert merged[2] == first[1]


def test_passes_merge_each_points_median_of_the_passes_fastest_readings_and_the_executors_rows() -> None:
    from dcp.profiler.profile import Measured, merge_passes, merge_rows

    first = Measured(synthetic_points([(1024, 1024 * 512)]), [ModelPoint(64, 64 * 32, 0, 0, 2e-3, 640)],
                     synthetic_points([(3000, 1_500_000)]))
    p = first.points[0]
    # Three passes' fastest readings of one point: forward a, 2a, 3a (median 2a); backward b, b/2,
    # 5b (median b: the one fast pass does not carry it); the head point 2, 1 and 4 ms (median 2).
    second = Measured([replace(p, fwd_s=2 * p.fwd_s, bwd_s=p.bwd_s / 2)], [ModelPoint(64, 64 * 32, 0, 0, 1e-3, 640)],
                      first.heldout)
    third = Measured([replace(p, fwd_s=3 * p.fwd_s, bwd_s=5 * p.bwd_s)], [ModelPoint(64, 64 * 32, 0, 0, 4e-3, 640)],
                     [])
    merged = merge_passes([first, second, third])
    assert merged.points[0].fwd_s == pytest.approx(2 * p.fwd_s) and merged.points[0].bwd_s == pytest.approx(p.bwd_s)
    assert merged.model_points[0].seconds == pytest.approx(2e-3) and merged.heldout == first.heldout
    assert merge_passes([first]) == first
    rows_a = [{"tokens": 16, "measured_s": 3.0, "step_s": 9.0},
              {"tokens": 32, "sp": 2, "ckpt_layers": 2, "measured_s": 5.0, "step_s": 20.0}]
    rows_b = [{"tokens": 16, "measured_s": 4.0, "step_s": 8.0},
              {"tokens": 32, "sp": 2, "ckpt_layers": 0, "measured_s": 1.0, "step_s": 2.0}]
    rows_c = [{"tokens": 16, "measured_s": 1.0, "step_s": 30.0}]
    by_key = {(r["tokens"], r.get("ckpt_layers", 0)): (r["measured_s"], r["step_s"])
              for r in merge_rows([rows_a, rows_b, rows_c])}
    # Same size, SP and checkpointing: each clock's median over the passes (3, 4, 1 -> 3; 9, 8, 30
    # -> 9); another checkpointing is another row, here measured in one pass.
    assert by_key == {(16, 0): (3.0, 9.0), (32, 0): (1.0, 2.0), (32, 2): (5.0, 20.0)}


def test_cpu_profiles_pass_three_times_and_gpu_or_quick_once() -> None:
    from dcp.profiler.profile import CPU_PASSES

    assert ProfileOptions().passes == CPU_PASSES == 3
    assert ProfileOptions(quick=True).passes == 1 and ProfileOptions(device="cuda").passes == 1


def test_profile_records_its_reference_kernel_and_warns_when_an_unanchored_machine_drifted() -> None:
    from dcp.profiler.profile import REFERENCE_DRIFT, build_profile, reference_record

    record = reference_record([0.010, 0.0104, 0.0112])
    assert record is not None and record["fastest_s"] == 0.010 and record["median_s"] == 0.0104
    assert record["drift"] == pytest.approx(0.12) and reference_record([]) is None
    points = synthetic_points(grid_points())
    report = fit_layer(points, [], synthetic_points([(3000, 1_500_000)]))
    bench = LayerBench(name="my-layer", device=torch.device("cpu"), build_layer=TinyLayer,
                       layer_inputs=lambda s: Call(torch.zeros(1, 32)))
    unanchored = ProfileOptions(device="cuda")  # readings in seconds: a drift moves the points
    drifted = build_profile(load_hardware("cpu"), bench, report, points, [], unanchored,
                            reference_s=[0.010, 0.0104, 0.0112])
    assert drifted.meta["reference"] == record
    assert any("12.0% slower" in w for w in drifted.meta["warnings"])
    still = build_profile(load_hardware("cpu"), bench, report, points, [], unanchored,
                          reference_s=[0.010, 0.010 * (1 + REFERENCE_DRIFT / 2)])
    assert not any("reference kernel" in w for w in still.meta["warnings"])
    # Anchored, each point was read in the kernel's units: the drift is recorded, not warned of.
    anchored = build_profile(load_hardware("cpu"), bench, report, points, [], ProfileOptions(),
                             reference_s=[0.010, 0.0104, 0.0112])
    assert anchored.meta["reference"]["anchored"] and anchored.meta["reference"]["drift"] == pytest.approx(0.12)
    assert not any("reference kernel" in w for w in anchored.meta["warnings"])


class FakeKernel:
    """A reference kernel on a machine whose speed the test sets: it reads 10 ms x `speed`."""

    def __init__(self) -> None:
        self.speed, self.reads = 1.0, 0

    def seconds(self) -> float:
        self.reads += 1
        return 0.010 * self.speed


def test_anchor_reads_each_point_in_units_of_the_kernel_beside_it() -> None:
    kernel = FakeKernel()
    anchor = Anchor(kernel)
    point = ModelPoint(64, 64 * 32, 0, 0, 0.0, 640)

    def work(seconds: float) -> Callable[[], ModelPoint]:
        return lambda: replace(point, seconds=seconds, wall_s=2 * seconds)

    # The machine slows from 1x to 3x while the first point runs: read against the mean of the
    # kernel before (10 ms) and after (30 ms), its 40 ms are 2 units.
    def slowing() -> ModelPoint:
        kernel.speed = 3.0
        return work(0.040)()

    first = anchor(slowing)
    assert first.seconds == pytest.approx(2.0) and first.wall_s == pytest.approx(4.0)
    assert (first.tokens, first.act_bytes) == (64, 640)  # untimed fields untouched
    # The next point reuses the reading after the first as its own before: one kernel run more.
    second = anchor(work(0.060))
    assert second.seconds == pytest.approx(2.0) and kernel.reads == 3
    anchor.gap()  # untimed work since: read before it again
    third = anchor(lambda: {"tokens": 16, "measured_s": 0.030, "step_s": 0.090})
    assert third == pytest.approx({"tokens": 16, "measured_s": 1.0, "step_s": 3.0}) and kernel.reads == 5
    # Settled at the median reading (10, 30, 30, 30, 30 ms: 30 ms), units are seconds at 3x; a
    # later reading does not move it.
    anchor.settle()
    kernel.speed = 1.0
    anchor(work(0.010))
    assert anchor.speed_s == pytest.approx(0.030)
    assert anchor.seconds([first, second])[1].seconds == pytest.approx(0.060)
    with pytest.raises(AssertionError, match="settle"):
        Anchor(FakeKernel()).seconds(first)
    assert UNANCHORED(work(0.5)).seconds == 0.5 and UNANCHORED.seconds(first) is first


def test_cpu_profiles_are_anchored_and_gpu_or_quick_ones_are_not() -> None:
    assert ProfileOptions().anchored
    assert not ProfileOptions(quick=True).anchored and not ProfileOptions(device="cuda").anchored


def test_measure_passes_anchors_every_point_and_the_executor_to_the_kernel_beside_them(monkeypatch) -> None:  # noqa: ANN001
    import dcp.profiler.profile as profile_mod

    kernel = FakeKernel()
    monkeypatch.setattr(profile_mod, "ReferenceKernel", lambda device: kernel)

    calls: list[Repeats] = []

    # The machine runs 1x, 2x, then 4x slow from each pass's points on (their inputs are built as
    # each is measured), the kernel with it: in the kernel's units every pass's executor rows
    # read the same 100 units.
    def inputs(samples):  # noqa: ANN001, ANN202
        kernel.speed = 2.0 ** len(calls)
        lengths = [s.tokens for s in samples]
        return Call(torch.randn(sum(lengths), 32), (lengths,))

    bench = LayerBench(name="my-layer", device=torch.device("cpu"), build_layer=TinyLayer, layer_inputs=inputs)

    def executor(reps: Repeats, anchor: Anchor) -> list[dict[str, float]]:  # one step read by the anchor
        calls.append(reps)
        anchor.gap()
        return [anchor(lambda: {"tokens": 16, "measured_s": 1.0 * kernel.speed, "step_s": 3.0 * kernel.speed})]

    opts = ProfileOptions(min_tokens=64, max_tokens=128, heldout=1, device_bench=False)
    passes = profile_mod.measure_passes(bench, opts, executor=executor)
    assert calls == [opts.repeats] * 3 and passes.anchor.kernel is kernel
    measured = passes.measured
    assert measured is not None
    points = len(measured.points) + len(measured.heldout)
    # Each pass reads the kernel before the grid, beside every point, and around the executor.
    assert len(passes.reference_s) == kernel.reads == 3 * (points + 3)
    # Recorded at the median reading: every pass's executor rows are 100 units, at that speed.
    speed = passes.anchor.speed_s
    assert speed == pytest.approx(statistics.median(passes.reference_s))
    assert passes.rows == [pytest.approx({"tokens": 16, "measured_s": 100 * speed, "step_s": 300 * speed})]


def test_measure_passes_unanchored_times_the_reference_around_the_passes(monkeypatch) -> None:  # noqa: ANN001
    from dcp.profiler.profile import measure_passes

    def inputs(samples):  # noqa: ANN001, ANN202
        lengths = [s.tokens for s in samples]
        return Call(torch.randn(sum(lengths), 32), (lengths,))

    bench = LayerBench(name="my-layer", device=torch.device("cpu"), build_layer=TinyLayer, layer_inputs=inputs)
    calls: list[Repeats] = []

    def executor(reps: Repeats, anchor: Anchor) -> list[dict[str, float]]:
        calls.append(reps)
        return [anchor(lambda: {"tokens": 16, "measured_s": 1.0 / len(calls), "step_s": 3.0})]

    opts = ProfileOptions(min_tokens=64, max_tokens=128, heldout=1, device_bench=False)
    monkeypatch.setattr(ProfileOptions, "anchored", property(lambda self: False))  # as on a GPU, three passes
    passes = measure_passes(bench, opts, executor=executor)
    assert calls == [opts.repeats] * 3 and len(passes.reference_s) == 4
    assert passes.rows == [{"tokens": 16, "measured_s": 1.0 / 2, "step_s": 3.0}]  # median of 1, 1/2, 1/3
    assert passes.measured is not None and len(passes.measured.points) == len({(p.tokens, p.num_samples, p.attn_pairs)
                                                                            for p in passes.measured.points})


def test_r2_gate_names_the_component_that_fits_badly_and_the_profile_carries_it() -> None:
    from dcp.profiler.fitting import R2_THRESHOLD
    from dcp.profiler.profile import build_profile

    points = synthetic_points(grid_points())
    # The head's time does not follow its tokens: alternating 1 ms and 3 ms.
    model_points = [ModelPoint(t, t * 256, 0, 0, 1e-3 if i % 2 else 3e-3, 10 * t)
                    for i, t in enumerate((64, 128, 256, 512, 1024, 2048, 4096, 8192))]
    report = fit_layer(points, model_points, synthetic_points([(3000, 1_500_000)]))
    below = report.below_threshold()
    assert list(below) == ["head+loss"] and below["head+loss"] < R2_THRESHOLD
    assert report.head is not None and below["head+loss"] == report.head.r2
    bench = LayerBench(name="my-layer", device=torch.device("cpu"), build_layer=TinyLayer,
                       layer_inputs=lambda s: Call(torch.zeros(1, 32)))
    prof = build_profile(load_hardware("cpu"), bench, report, points, model_points, ProfileOptions(),
                         remeasured=["head+loss"])
    meta = prof.meta["fits"]["my-layer"]
    assert meta["r2_below"] == below and meta["remeasured"] == ["head+loss"]
    assert set(meta["r2"]) == {"forward", "backward", "recompute", "head+loss"}
    assert any("head+loss fit R^2" in w for w in prof.meta["warnings"])
    # A recompute that is pure noise is named too; the good components are not.
    bad_rec = [replace(p, ckpt_s=p.fwd_s + p.bwd_s + (1e-3 if i % 2 else 5e-2)) for i, p in enumerate(points)]
    assert list(fit_layer(bad_rec, [], []).below_threshold()) == ["recompute"]


NOTEBOOK_PROFILE = Path(__file__).resolve().parents[1] / "notebooks" / "data" / "cpu-tiny-llama.json"


def test_executor_fit_recovers_the_fixed_cost_beyond_layers_and_head() -> None:
    from dcp.profiler.executor_cost import bare_modules, executor_fit

    profile, spec = load_hardware(str(NOTEBOOK_PROFILE)), load_model("tiny-llama")
    fit = profile.fits["tiny-llama"]
    cm = CostModel(spec, profile, Cluster(num_gpus=1, gpus_per_node=1, memory_bytes=profile.memory_bytes))
    rows = []
    for n in (16, 64, 256, 1024):
        pairs = n * (n + 1) // 2
        bare = cm.time_s(n, pairs, 1, 0) - fit.microbatch_fixed_s
        rows.append({"tokens": n, "attn_pairs": pairs, "measured_s": bare + 3e-3 + 1e-6 * n,
                     "step_s": 3 * (bare + 3e-3 + 1e-6 * n) + 4e-3})
    new, record = executor_fit(profile, spec, torch.float32, rows, world=1)
    assert new.microbatch_fixed_s == pytest.approx(3e-3, rel=1e-6)
    assert new.head_per_token_s == pytest.approx(fit.head_per_token_s + 1e-6, rel=1e-6)
    assert record["head_intercept_s"] == fit.microbatch_fixed_s and record["measured"]
    # The step beyond three middle micro-batches: 4 ms at every size.
    assert record["step_extra_s"] == pytest.approx(4e-3, rel=1e-6)
    # One rank prices no collective, so all of it is the executor's per-step cost, and the step
    # price of the profiled model carries it once a step, as does the least any step adds.
    assert record["priced_extra_s"] == pytest.approx(0.0, abs=1e-12)
    assert new.step_fixed_s == pytest.approx(4e-3, rel=1e-6)
    measured = replace(profile, fits={**profile.fits, "tiny-llama": new})
    cm_new = CostModel(spec, measured, Cluster(num_gpus=1, gpus_per_node=1, memory_bytes=profile.memory_bytes))
    # A training step also steps the optimizer, which the executor's step (and so the fit) leaves
    # out: one rank steps every parameter, foreach AdamW in the bf16 recipe at 82 bytes each, over
    # the profile's memory bandwidth.
    adam = 82 * spec.param_count() / profile.memory_bw_bytes_per_s
    mbs = (MicroBatchShape(512.0, 512 * 513 / 2, 0),) * 3
    busy = 3 * cm_new.time_s(512, 512 * 513 / 2, 1, 0)
    assert cm_new.step_price([GroupShape(1, mbs)]).step_time_s - busy == pytest.approx(new.step_fixed_s + adam,
                                                                                      rel=1e-9)
    assert cm_new.grad_sync_s() == pytest.approx(new.step_fixed_s + adam, rel=1e-9)
    # --validate times the modules without the executor: it prices them with the extras taken out.
    meta = {**profile.meta, "fits": {**profile.meta["fits"], "tiny-llama": {"executor": record}}}
    with_executor = replace(profile, fits={**profile.fits, "tiny-llama": new}, meta=meta)
    bare = bare_modules(with_executor, "tiny-llama").fits["tiny-llama"]
    assert bare.microbatch_fixed_s == fit.microbatch_fixed_s and bare.step_fixed_s == 0.0
    assert bare.head_per_token_s == pytest.approx(fit.head_per_token_s, rel=1e-9)
    assert bare_modules(profile, "tiny-llama") == profile  # no executor record: unchanged


def test_executor_fit_recovers_the_all_to_all_extra_from_sp_rows() -> None:
    from dcp.costmodel.ring import SPLayout
    from dcp.profiler.executor_cost import bare_modules, executor_fit
    from dcp.profiler.profile import executor_r2

    profile, spec = load_hardware(str(NOTEBOOK_PROFILE)), load_model("tiny-llama")
    fit = profile.fits["tiny-llama"]
    cm = CostModel(spec, profile, Cluster(num_gpus=1, gpus_per_node=1, memory_bytes=profile.memory_bytes))
    rows = []
    for n in (16, 64, 256, 1024):  # SP 1: 3 ms fixed, no per-token extra, 4 ms a step
        pairs = n * (n + 1) // 2
        mb = cm.time_s(n, pairs, 1, 0) - fit.microbatch_fixed_s + 3e-3
        rows.append({"tokens": n, "attn_pairs": pairs, "measured_s": mb, "step_s": 3 * mb + 4e-3})
    # SP 2 with the SP-1 extras above: priced by hand as the micro-batch without the executor's
    # all-to-all extra, then 50 us for each of its (2 K + r) x 4 all-to-alls (tiny-llama: K = 2).
    with_sp1 = replace(fit, microbatch_fixed_s=3e-3)
    cm2 = CostModel(spec, replace(profile, fits={"tiny-llama": with_sp1}),
                    Cluster(num_gpus=2, gpus_per_node=2, memory_bytes=profile.memory_bytes))
    for n in (32, 128, 512, 2048):
        for r in (0, 2):
            pairs = n * (n + 1) // 2
            calls = (2 * 2 + r) * 4
            rows.append({"tokens": n, "attn_pairs": pairs, "sp": 2, "ckpt_layers": r,
                         "measured_s": cm2.time_s(n, pairs, 2, r, SPLayout(2)) + calls * 50e-6,
                         "step_s": 0.0})
    new, record = executor_fit(profile, spec, torch.float32, rows, world=2)
    assert new.microbatch_fixed_s == pytest.approx(3e-3, rel=1e-6)  # the SP rows do not move it
    assert new.a2a_call_s == pytest.approx(50e-6, rel=1e-6)
    assert new.a2a_token_s == 0.0  # per call only (executor_cost's docstring: a slope there is noise)
    assert record["all_to_all"]["r2"] == pytest.approx(1.0) and record["r2"] == pytest.approx(1.0)
    assert executor_r2(record) == {"executor": record["r2"], "all_to_all": record["all_to_all"]["r2"]}
    assert executor_r2({**record, "all_to_all": None}) == {"executor": record["r2"]}
    assert [r["calls"] for r in record["all_to_all"]["points"]] == [16, 24] * 4
    # --validate's bare modules have no executor, so no all-to-all extra either.
    meta = {**profile.meta, "fits": {**profile.meta["fits"], "tiny-llama": {"executor": record}}}
    bare = bare_modules(replace(profile, fits={**profile.fits, "tiny-llama": new}, meta=meta), "tiny-llama")
    assert bare.fits["tiny-llama"].a2a_call_s == 0.0 and bare.fits["tiny-llama"].a2a_token_s == 0.0


def test_sp_sizes_the_executor_fit_runs() -> None:
    from dcp.profiler.executor_cost import sp_sizes

    spec = load_model("tiny-llama")  # 4 heads, 2 KV heads: Ulysses over 2 or 4 ranks, not 8
    assert sp_sizes(spec, 1) == [] and sp_sizes(spec, 3) == []
    assert sp_sizes(spec, 2) == [2] and sp_sizes(spec, 8) == [2, 4]
    assert sp_sizes(spec, 6) == [2]  # 4 does not divide 6 ranks


def test_executor_rows_time_the_middle_microbatch_on_a_group_of_its_own() -> None:
    import torch.distributed as dist

    from dcp.profiler.executor_cost import executor_rows

    rows = executor_rows(load_model("tiny-llama"), torch.float32, torch.device("cpu"), 64, 256,
                         Repeats(warmup=0, repeats=1))
    assert rows is not None and [r["tokens"] for r in rows] == [16, 64, 256]
    assert all(r["measured_s"] > 0 and r["step_s"] >= r["measured_s"] for r in rows)
    assert not dist.is_initialized()  # its one-rank group is gone again
    assert executor_rows(load_model("tiny-llama"), torch.float16, torch.device("cpu"), 64, 256, Repeats()) is None


def test_executor_rows_run_round_robin_so_every_row_spans_the_same_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from dcp.executor import Executor
    from dcp.profiler.executor_cost import executor_rows

    order: list[int] = []
    step = Executor.step

    def recording(self, plan, tensors, loss_fn):  # noqa: ANN001, ANN202
        order.append(sum(s.tokens for s in plan.samples) // 3)  # one rank, 3 single-sample micro-batches
        return step(self, plan, tensors, loss_fn)

    monkeypatch.setattr(Executor, "step", recording)
    kernel = FakeKernel()
    rows = executor_rows(load_model("tiny-llama"), torch.float32, torch.device("cpu"), 64, 256,
                         Repeats(warmup=1, repeats=2), Anchor(kernel))
    assert rows is not None and [r["tokens"] for r in rows] == [16, 64, 256]
    assert order == [16, 64, 256] * 3  # one step of each row in turn, warm-up included, not row after row
    assert kernel.reads == 1 + 2 * 3  # the kernel read before the first timed step and after each


def test_collective_points_become_curves_keyed_by_shape_with_their_latency_and_bandwidth() -> None:
    pts = []
    for op, p, lat, bw in (("all_to_all", 2, 20e-6, 120e9), ("all_to_all", 4, 25e-6, 100e9),
                           ("all_to_all", 16, 60e-6, 10e9), ("all_reduce", 16, 40e-6, 30e9)):
        factor = 2 * (p - 1) / p if op == "all_reduce" else (p - 1) / p
        for m in (1 << 16, 1 << 20, 1 << 24, 1 << 26):
            pts.append(CommPoint(op, p, m, noisy(lat + m * factor / bw)))
    curves = {(c.op, c.gpus_per_node, c.nodes): c for c in curves_from_points(pts, gpus_per_node=8, source="test")}
    assert set(curves) == {("all_to_all", 2, 1), ("all_to_all", 4, 1), ("all_to_all", 8, 2), ("all_reduce", 8, 2)}
    lat, bw = curves["all_to_all", 2, 1].alpha_beta()
    assert bw == pytest.approx(120e9, rel=0.02) and lat == pytest.approx(20e-6, rel=0.1)
    assert curves["all_to_all", 8, 2].alpha_beta()[1] == pytest.approx(10e9, rel=0.02)
    assert curves["all_reduce", 8, 2].alpha_beta()[1] == pytest.approx(30e9, rel=0.02)
    # The stored points are nccl-tests bus bandwidths: the interpolated time is the measured one.
    big = [p for p in pts if p.op == "all_reduce" and p.message_bytes == 1 << 24][0]
    assert curves["all_reduce", 8, 2].time_s(1 << 24) == pytest.approx(big.seconds, rel=1e-9)


def test_saved_bytes_counts_activations_once_and_skips_parameters() -> None:
    lin1 = nn.Linear(8, 16)
    x = torch.randn(10, 8, requires_grad=True)
    with count_saved_bytes(list(lin1.parameters())) as saved:
        y = torch.relu(lin1(x))
    # Linear saves its input (10x8) and ReLU its output (10x16), fp32; the weight is not counted.
    assert saved.total == 4 * (10 * 8 + 10 * 16)
    y.sum().backward()


def test_grid_spreads_attention_pairs_at_fixed_tokens_for_text_and_video() -> None:
    from dcp.profiler.bench import heldout_batches, packing_grid

    for attention in ("causal", "spatial_temporal"):
        bench = LayerBench(name="x", device=torch.device("cpu"), attention=attention,
                           build_layer=nn.Identity, layer_inputs=lambda s: Call(torch.zeros(1)))
        grid = packing_grid(bench, 256, 4096)
        at_4k = {bench.pairs(b) for b in grid if sum(s.tokens for s in b) == 4096}
        assert len(at_4k) >= 2 and max(at_4k) > 4 * min(at_4k), attention
        for batch in heldout_batches(bench, 256, 4096, 5, seed=1):
            assert all(s.tokens % s.frames == 0 for s in batch) and len(batch) <= 256


# -- profile files --------------------------------------------------------------------------------

def measured_profile() -> HardwareProfile:
    fit = LayerFit(fwd_fixed_s=1e-4, fwd_per_token_s=1e-6, fwd_per_pair_s=1e-11, bwd_fixed_s=2e-4,
                   bwd_per_token_s=2e-6, bwd_per_pair_s=2e-11, rec_fixed_s=3e-4, rec_per_token_s=1.1e-6,
                   rec_per_pair_s=1e-11, act_full_bytes_per_token=5000, act_ckpt_bytes_per_token=256,
                   max_fitted_tokens=4096, heldout_mape=0.05)
    return replace(load_hardware("cpu"), name="test", fits={"tiny-llama": fit}, heldout_mape=0.05,
                   meta={"kind": "dcp profile", "measured": ["fits.tiny-llama"]})


def test_profile_json_round_trip_with_top_level_heldout_mape(tmp_path: Path) -> None:
    prof = measured_profile()
    path = tmp_path / "p.json"
    save_hardware(prof, path)
    raw = json.loads(path.read_text())
    assert raw["kind"] == "dcp-hardware-profile" and raw["heldout_mape"] == 0.05
    assert load_hardware(str(path)) == prof


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda text: text[: len(text) // 2], "not valid JSON"),
    (lambda text: text.replace('"schema_version": 2', '"schema_version": 99'), "schema_version 99 is not supported"),
    (lambda text: text.replace('"dcp-hardware-profile"', '"something-else"'), "not a dcp hardware profile"),
    (lambda text: text.replace('"fwd_fixed_s"', '"fwd_fixd_s"'), "unknown field(s) ['fwd_fixd_s']"),
])
def test_corrupt_or_wrong_version_profile_fails_clearly(tmp_path: Path, mutate, message: str) -> None:  # noqa: ANN001
    path = tmp_path / "p.json"
    save_hardware(measured_profile(), path)
    path.write_text(mutate(path.read_text()))
    with pytest.raises(CostModelError, match=__import__("re").escape(message)):
        load_hardware(str(path))


def test_cost_model_uses_the_fit_and_its_recompute() -> None:
    prof = measured_profile()
    spec = load_model("tiny-llama")
    cm = CostModel(spec, prof, Cluster(num_gpus=1, gpus_per_node=8, memory_bytes=1e10))
    assert cm.fit is prof.fits["tiny-llama"]
    extra = cm.time_s(1000, 0, 1, 1) - cm.time_s(1000, 0, 1, 0)
    assert extra == pytest.approx(3e-4 + 1.1e-6 * 1000)  # one layer's recompute, not its forward


def test_refit_recovers_scale_factors_of_each_term() -> None:
    prof, spec = measured_profile(), load_model("tiny-llama")
    truth = replace(prof, fits={"tiny-llama": _scale(prof.fits["tiny-llama"], (1.3, 0.8, 1.5))})
    cm = CostModel(spec, truth, Cluster(num_gpus=4, gpus_per_node=8, memory_bytes=1e10))
    stats = [MicroBatchMeasurement(t, t * L // 2, p, r, cm.time_s(t, t * L // 2, p, r))
             for t, L, p, r in [(512, 512, 1, 0), (4096, 256, 1, 2), (4096, 4096, 2, 1), (2048, 64, 1, 0),
                                (8192, 8192, 4, 2), (1024, 1024, 2, 0)]]
    new = refit(prof, stats)  # the profile's only model, tiny-llama
    with pytest.raises(ValueError, match="at least 3"):
        refit(prof, stats[:2], spec)
    got, want = new.fits["tiny-llama"], truth.fits["tiny-llama"]
    for f in ("fwd_fixed_s", "bwd_per_token_s", "rec_per_pair_s", "rec_fixed_s", "microbatch_fixed_s",
              "head_per_token_s", "fwd_per_pair_s"):
        assert getattr(got, f) == pytest.approx(getattr(want, f), rel=0.02), f
    assert new.meta["refits"][-1]["mape_after"] < 0.01 < new.meta["refits"][-1]["mape_before"]
    # The refitted profile itself predicts the measurements (the whole fit, every field scaled).
    refitted = CostModel(spec, new, cm.cluster)
    for m in stats:
        assert refitted.time_s(m.tokens, m.attn_pairs, m.sp, m.ckpt_layers) == pytest.approx(m.measured_s, rel=0.02)


def _scale(fit: LayerFit, s: tuple[float, float, float]) -> LayerFit:
    """Every coefficient of the fixed / per-token / per-pair part times its factor, written out
    field by field from `LayerFit` (not with refitting's own helper, which the refit test checks);
    an unmeasured recompute coefficient is the forward's."""
    fixed, token, pair = s

    def rec(own: float | None, forward: float) -> float:
        return forward if own is None else own

    return replace(
        fit,
        fwd_fixed_s=fixed * fit.fwd_fixed_s, bwd_fixed_s=fixed * fit.bwd_fixed_s,
        rec_fixed_s=fixed * rec(fit.rec_fixed_s, fit.fwd_fixed_s), microbatch_fixed_s=fixed * fit.microbatch_fixed_s,
        fwd_per_token_s=token * fit.fwd_per_token_s, bwd_per_token_s=token * fit.bwd_per_token_s,
        rec_per_token_s=token * rec(fit.rec_per_token_s, fit.fwd_per_token_s),
        head_per_token_s=token * fit.head_per_token_s,
        fwd_per_pair_s=pair * fit.fwd_per_pair_s, bwd_per_pair_s=pair * fit.bwd_per_pair_s,
        rec_per_pair_s=pair * rec(fit.rec_per_pair_s, fit.fwd_per_pair_s))


# -- all-to-all over gloo -------------------------------------------------------------------------

def _comm_rank(rank: int, world: int) -> dict:
    from dcp.profiler.profile import measure_comm

    fields, sources, meta = measure_comm(torch.device("cpu"), torch.float32, quick=True, base=load_hardware("cpu"))
    return {"fields": fields, "meta": meta}


def test_collectives_measured_over_two_gloo_ranks() -> None:
    results = run_ranks(_comm_rank, 2, deadline_s=120)
    fields, meta = results[0]["fields"], results[0]["meta"]
    assert meta["measured"] and meta["world"] == 2
    measured = {(c.op, c.gpus_per_node, c.nodes): c for c in fields["collectives"] if c.source.startswith("measured")}
    # Every collective among the 2 ranks, one 'node' of 2 (the CPU run's ranks per node), and the
    # ring's neighbour exchange inside it (none across nodes: there is one).
    assert set(measured) == {(op, 2, 1) for op in COLLECTIVES} | {("send_recv", 2, 1)}
    assert all(len(c.points) >= 3 and c.alpha_beta()[1] > 0 for c in measured.values())
    kept = [c for c in fields["collectives"] if c not in measured.values()]
    assert kept and all(c in load_hardware("cpu").collectives for c in kept)  # the rest: the base preset's
    assert "inter_node" in meta  # no group spans nodes: those curves stay the preset's
    assert results[1]["meta"]["points"] == meta["points"]  # every rank agrees (max over ranks)


# -- a real profile, tiny ------------------------------------------------------------------------

class TinyLayer(nn.Module):
    """A user's own layer: forward(x [N, h], lengths) with per-sample causal attention."""

    def __init__(self, h: int = 32) -> None:
        super().__init__()
        self.qkv, self.out, self.mlp = nn.Linear(h, 3 * h), nn.Linear(h, h), nn.Linear(h, h)

    def forward(self, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, -1)
        att = [torch.nn.functional.scaled_dot_product_attention(a[None], b[None], c[None], is_causal=True)[0]
               for a, b, c in zip(q.split(lengths), k.split(lengths), v.split(lengths), strict=True)]
        x = x + self.out(torch.cat(att))
        return x + self.mlp(x)


def test_profile_of_a_user_layer_through_the_python_api(tmp_path: Path) -> None:
    def inputs(samples):  # noqa: ANN001, ANN202
        lengths = [s.tokens for s in samples]
        return Call(torch.randn(sum(lengths), 32), (lengths,))

    bench = LayerBench(name="my-layer", device=torch.device("cpu"), build_layer=TinyLayer, layer_inputs=inputs)
    opts = ProfileOptions(quick=True, min_tokens=64, max_tokens=256, heldout=2, device_bench=False)
    prof = profile_bench(bench, load_hardware("cpu"), opts)
    fit = prof.fits["my-layer"]
    assert fit.fwd_per_token_s > 0 and fit.act_full_bytes_per_token > 0 and fit.max_fitted_tokens == 256
    assert prof.heldout_mape == fit.heldout_mape is not None
    assert prof.meta["measured"][0] == "fits.my-layer" and "collectives" in prof.meta["from_preset"]
    assert "world size 1" in prof.meta["comm"]["why"]
    assert len(prof.meta["fits"]["my-layer"]["points"]) >= 4
    save_hardware(prof, tmp_path / "p.json")
    assert load_hardware(str(tmp_path / "p.json")) == prof


def test_dcp_profile_cli_writes_a_profile_that_plan_and_validate_use(tmp_path: Path) -> None:
    from dcp.cli import main

    out = tmp_path / "p.json"
    args = ["profile", "--device", "cpu", "--quick", "--min-tokens", "64", "--max-tokens", "256",
            "--heldout", "2", "-o", str(out)]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    raw = json.loads(out.read_text())
    assert "tiny-llama" in raw["fits"] and isinstance(raw["heldout_mape"], float)
    # The model's measured memory: the profiled dtype's recipe in the fit, every recipe in the meta.
    fit = raw["fits"]["tiny-llama"]
    assert fit["memory"]["recipe"] == "fp32"
    assert fit["act_full_bytes_per_token"] == fit["memory"]["act_full_bytes_per_token"]
    assert set(raw["meta"]["fits"]["tiny-llama"]["memory"]) == {"bf16", "autocast-bf16", "fp32"}
    assert "kernel_overhead_s" in raw["meta"]["measured"] and "measured" in raw["sources"]["matmul_flops"]
    assert raw["meta"]["attention_kernel"] == "sdpa per sample"  # CPU: no varlen kernel
    # The micro-batch's fixed cost measured through the executor, the head's intercept kept beside.
    executor = raw["meta"]["fits"]["tiny-llama"]["executor"]
    assert executor["measured"] and fit["microbatch_fixed_s"] == executor["coef"]["fixed"]
    # Every fitted component's R^2, the executor's micro-batch fit's among them (one rank: no SP groups).
    assert set(raw["meta"]["fits"]["tiny-llama"]["r2"]) == {"forward", "backward", "recompute", "head+loss", "executor"}
    assert raw["meta"]["fits"]["tiny-llama"]["r2"]["executor"] == executor["r2"]
    plan = CliRunner().invoke(main, ["plan", "--hardware", str(out), "--model", "tiny-llama", "--gpus", "2",
                                     "--steps", "1", "--strategy", "bucket", "--workload",
                                     "lognormal:mean=128,min=16,max=512,size=64", "--global-batch", "16"],
                              catch_exceptions=False)
    assert plan.exit_code == 0, plan.output
    val = CliRunner().invoke(main, ["profile", "--validate", str(out), "--layers", "1", "--quick"],
                             catch_exceptions=False)
    check_validation_status(val)


def test_cli_reports_a_corrupt_profile_in_one_line(tmp_path: Path) -> None:
    from dcp.cli import main

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    result = CliRunner().invoke(main, ["profile", "--validate", str(bad)])
    assert result.exit_code == 1 and "not valid JSON" in result.output


def _benchmark_module(name: str, folder: str = "benchmarks/gpu"):  # noqa: ANN202
    """A script module of the benchmarks (they are not a package)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / folder))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


DEVICE_MACHINE_LACKS = ("pulp", "highspy", "transformers", "pyarrow", "hypothesis")
"""Installed here, absent on the GPU machine (its Python has torch, numpy, scipy, pandas, click,
rich and matplotlib only): benchmarks/gpu/run.sh must not need them."""


@pytest.fixture(scope="module")
def tiny_calibration(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run of benchmarks/gpu/run.sh in its CPU --tiny mode, where every package the GPU
    machine lacks fails to import."""
    out, shim = tmp_path_factory.mktemp("calibration"), tmp_path_factory.mktemp("absent")
    for name in DEVICE_MACHINE_LACKS:
        (shim / name).mkdir()
        (shim / name / "__init__.py").write_text(f"raise ImportError('{name} is not on the GPU machine')\n")
    root = Path(__file__).resolve().parents[1]
    # One torch thread: the suite shares two cores, and oversubscribed OpenMP threads can slow a
    # tiny step from milliseconds to seconds (past the smoke check's 45 s cap).
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "PYTHONPATH": str(shim), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(["bash", str(root / "benchmarks" / "gpu" / "run.sh"), "--device", "cpu", "--tiny"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return out


def test_gpu_run_script_checks_the_executor_too(tiny_calibration: Path) -> None:
    smoke = json.loads((tiny_calibration / "executor-smoke.json").read_text())
    assert smoke["exit_code"] == 0 and smoke["max_grad_diff"] < 1e-4  # fp32 on CPU: rounding only
    assert "no GPU" in smoke["fsdp_bf16_stage3"]["skipped"]  # stage 3 in bf16 runs on a GPU only
    # Every micro-batch it ran: the plan's memory against max_memory_allocated (None on a CPU).
    rows = smoke["microbatch_memory"]
    assert rows and {r["step"] for r in rows} == {0, 1, 2}
    assert all(r["predicted_memory_bytes"] > 0 and r["max_memory_allocated"] is None for r in rows)


def test_gpu_run_script_records_memory_of_every_microbatch(tiny_calibration: Path) -> None:
    res = json.loads((tiny_calibration / "gpu-calibration-tiny.json").read_text())
    rows = res["validation"]["rows"]
    assert rows and all(r["predicted_memory_bytes"] > 0 and r["max_memory_allocated"] is None for r in rows)
    timed = [r for r in res["checkpointing"]["rows"] if "full_s" in r]
    assert timed and all(r[f"{k}_predicted_memory_bytes"] > 0 and r[f"{k}_max_memory_allocated"] is None
                         for r in timed for k in ("planned", "full"))


def test_gpu_calibration_script_runs_on_cpu_tiny(tiny_calibration: Path) -> None:
    res = json.loads((tiny_calibration / "gpu-calibration-tiny.json").read_text())
    assert res["profile"]["heldout_mape"] is not None and res["validation"]["rows"]
    assert res["checkpointing"]["measured_speedup"] > 0
    assert not res["validation"]["truncated"] and not res["checkpointing"]["truncated"]
    assert res["environment"]["torch"] == torch.__version__ and res["environment"]["date"]
    assert load_hardware(str(tiny_calibration / "profile-tiny.json")).fits["tiny-llama"].heldout_mape is not None


def test_calibration_phases_stop_at_their_deadline(tiny_calibration: Path) -> None:
    """Under run.sh's hard time limit, a phase whose deadline has passed starts no micro-batch."""
    from dcp.profiler.validate import validate_profile

    prof = load_hardware(str(tiny_calibration / "profile-tiny.json"))
    report = validate_profile(prof, load_model("tiny-llama"), layers=1, count=1, deadline=time.monotonic())
    assert report.truncated and report.rows == [] and report.mape != report.mape  # NaN: nothing measured
    speed = _benchmark_module("calibrate").checkpoint_speedup(
        prof, "tiny-llama", device="cpu", layers=1, cap_tokens=256, count=2, deadline=time.monotonic(),
        reps=Repeats(warmup=0, repeats=1))
    assert speed["truncated"] and speed["rows"] == [] and speed["measured_speedup"] is None


def test_validation_reads_an_anchored_profile_at_its_speed(tiny_calibration: Path, monkeypatch) -> None:  # noqa: ANN001
    """Against an anchored (CPU) profile each micro-batch is read in units of the reference kernel
    beside it and priced back at the profile's speed: a machine twice as slow as when profiled
    measures the same seconds; an unanchored profile's readings stay as measured."""
    import dcp.profiler.validate as validate

    kernel = FakeKernel()
    kernel.speed = 2.0  # reads 20 ms: twice the profile's 10 ms below
    monkeypatch.setattr(validate, "ReferenceKernel", lambda device: kernel)
    monkeypatch.setattr(validate, "measure_model", lambda model, bench, samples, n, reps, ckpt_layers: ModelPoint(
        sum(s.tokens for s in samples), 0, n, ckpt_layers, 0.5, 0))
    prof = load_hardware(str(tiny_calibration / "profile-tiny.json"))
    assert not prof.meta["reference"]["anchored"]  # a quick profile
    plain = validate.validate_profile(prof, load_model("tiny-llama"), layers=1, count=1)
    assert plain.rows and {r.measured_s for r in plain.rows} == {0.5} and plain.machine_speed is None
    anchored = replace(prof, meta={**prof.meta, "reference": {**prof.meta["reference"], "anchored": True,
                                                              "median_s": 0.010}})
    report = validate.validate_profile(anchored, load_model("tiny-llama"), layers=1, count=1)
    assert [r.measured_s for r in report.rows] == pytest.approx([0.25] * len(plain.rows))
    assert report.machine_speed == pytest.approx(2.0) and kernel.reads == len(report.rows) + 1


def test_adopt_makes_the_run_a_preset_with_its_provenance(tiny_calibration: Path, tmp_path: Path) -> None:
    adopt = _benchmark_module("adopt")
    presets, results = tmp_path / "presets", tmp_path / "results"
    args = [str(tiny_calibration), "--suffix", "tiny", "--name", "tiny-measured",
            "--presets-dir", str(presets), "--results-dir", str(results)]
    assert adopt.main(args) == 1 and not presets.exists()  # a CPU run is no GPU preset
    assert adopt.main([*args, "--allow-cpu"]) == 0
    preset = load_hardware(str(presets / "tiny-measured.json"))
    run = json.loads((tiny_calibration / "gpu-calibration-tiny.json").read_text())
    assert preset.name == "tiny-measured" and preset.fits == load_hardware(str(tiny_calibration / "profile-tiny.json")).fits
    adopted = preset.meta["adopted"]
    assert adopted["environment"] == run["environment"] and adopted["heldout_mape"] == run["profile"]["heldout_mape"]
    assert adopted["meets_target"] == (adopted["heldout_mape"] <= 0.05)
    assert adopted["validation"]["mape"] == run["validation"]["mape"] and "rows" not in adopted["validation"]
    assert json.loads((results / "gpu-calibration-tiny.json").read_text()) == run
    smoke = json.loads((tiny_calibration / "executor-smoke.json").read_text())
    assert json.loads((results / "executor-smoke.json").read_text()) == smoke
    assert adopted["executor_smoke"] == {"exit_code": 0, "max_grad_diff": smoke["max_grad_diff"]}


def test_adopt_refuses_a_folder_without_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _benchmark_module("adopt").main([str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error:") and "profile-h200.json" in err[0]


def test_results_page_reports_a_committed_gpu_run(tiny_calibration: Path, tmp_path: Path) -> None:
    measured_section = _benchmark_module("paper_tables", "benchmarks").measured_section
    assert "None yet" in measured_section(tmp_path)
    (tmp_path / "gpu-calibration-h200.json").write_bytes((tiny_calibration / "gpu-calibration-tiny.json").read_bytes())
    run = json.loads((tmp_path / "gpu-calibration-h200.json").read_text())
    text = measured_section(tmp_path)
    assert f"held-out MAPE: {run['profile']['heldout_mape']:.1%}" in text
    assert f"over {len(run['validation']['rows'])} micro-batches" in text and "measured" in text
    (tmp_path / "executor-smoke.json").write_bytes((tiny_calibration / "executor-smoke.json").read_bytes())
    assert "executor on the device" in measured_section(tmp_path)
