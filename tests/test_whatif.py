"""The library behind the notebooks: what-if sweeps, calibration frames and their figures."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest

from dcp import calibration
from dcp.costmodel import CostModelError, get_recipe, load_hardware
from dcp.costmodel.elementwise import elementwise_bytes
from dcp.profiler.fitting import mape
from dcp.viz import calibration_figure, sweep_figure
from dcp.whatif import Scenario, grid, sweep

PROFILE = Path(__file__).resolve().parents[1] / "notebooks" / "data" / "cpu-tiny-llama.json"
MODEL = "tiny-llama"
STRATEGIES = ["bucket", "packed", "dcp-greedy"]


def test_grid_is_the_product_over_a_base() -> None:
    base = Scenario(model="llama-13b", tokens_per_gpu=4096)
    scenarios = grid(base, gpus=[8, 16, 32], workload=["wikipedia", "lognormal"])
    assert len(scenarios) == 6
    assert {(s.gpus, s.workload) for s in scenarios} == {(g, w) for g in (8, 16, 32) for w in ("wikipedia", "lognormal")}
    assert all(s.model == "llama-13b" and s.tokens_per_gpu == 4096 for s in scenarios)
    assert grid(base) == [base]
    with pytest.raises(ValueError, match="not both"):
        Scenario(global_batch=64, tokens_per_gpu=4096)


def test_sweep_rows_and_speedups() -> None:
    frame = sweep(grid(Scenario(global_batch=48), gpus=[8, 16]), STRATEGIES, steps=1)
    assert len(frame) == 2 * len(STRATEGIES) and (frame["status"] == "ok").all()
    assert list(frame["scenario"]) == [0, 0, 0, 1, 1, 1]
    for baseline in ("bucket", "packed"):
        own = frame[frame["strategy"] == baseline]
        assert own[f"speedup_vs_{baseline}"].tolist() == pytest.approx([1.0, 1.0])
    for _, rows in frame.groupby("scenario"):
        by = rows.set_index("strategy")
        assert by.loc["dcp-greedy", "speedup_vs_bucket"] == pytest.approx(
            by.loc["bucket", "mean_step_time_s"] / by.loc["dcp-greedy", "mean_step_time_s"])
    assert ((frame["memory_headroom"] >= 0) & (frame["memory_headroom"] < 1)).all()
    assert (frame["mean_lower_bound_s"] <= frame["mean_step_time_s"] * (1 + 1e-9)).all()
    assert (frame["batch_samples"] == 48).all()
    assert (frame.loc[frame["strategy"] == "bucket", "checkpoint_share"] == 1.0).all()  # full checkpointing


def test_sweep_weak_scaling_and_a_scenario_that_cannot_be_planned() -> None:
    base = Scenario(tokens_per_gpu=8192, gpus=8)
    seen: list[int] = []
    frame = sweep([dataclasses.replace(base, model="llama-70b"), base], ["bucket", "dcp-greedy"], steps=1,
                  progress=lambda i, s: seen.append(i))
    assert seen == [0, 1]
    big, small = frame[frame["scenario"] == 0], frame[frame["scenario"] == 1]
    assert big["status"].str.contains("model states of llama-70b need").all()
    assert big["mean_step_time_s"].isna().all() and big["speedup_vs_bucket"].isna().all()
    assert (small["status"] == "ok").all()
    assert (small["batch_tokens"] <= 8192 * 8).all() and (small["batch_tokens"] > 8192 * 4).all()
    fig = sweep_figure(frame, "model", ["speedup_vs_bucket", "memory_headroom"])
    assert len(fig.axes) == 2
    assert "cannot plan: model=llama-70b" in fig._suptitle.get_text()
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["llama-70b", "llama-7b"]


@pytest.fixture(scope="module")
def profile():
    return load_hardware(str(PROFILE))


def test_calibration_terms_match_both_cost_models(profile) -> None:
    terms = calibration.terms(profile, MODEL).set_index("term")
    assert list(terms.index) == list(calibration.DERIVATIONS)
    fitted = profile.fits[MODEL]
    assert terms.loc["fwd_per_token_s", "fitted"] == fitted.fwd_per_token_s
    assert terms.loc["rec_fixed_s", "fitted"] == fitted.recompute_coefficients()[0]
    derived = calibration.cost_models(profile, MODEL)["derived"].fit
    spec = calibration.model_spec(profile, MODEL)
    # The derivation the table names: 2 FLOPs per weight over the measured matmul rate, plus the
    # layer's elementwise bytes as eager kernels move them in the default (bf16) recipe, counted op
    # by op (`tests/test_elementwise.py` checks the count against every aten op's bytes).
    elementwise = elementwise_bytes(spec, get_recipe("bf16"), "eager").fwd / profile.memory_bw_bytes_per_s
    assert derived.fwd_per_token_s == pytest.approx(spec.layer_fwd_flops_per_token() / profile.matmul_flops + elementwise)
    assert terms.loc["bwd_per_pair_s", "derived"] == pytest.approx(2.5 * derived.fwd_per_pair_s)


def test_calibration_points_agree_with_the_profilers_own_predictions(profile) -> None:
    points = calibration.layer_points(profile, MODEL)
    meta = calibration.fit_meta(profile, MODEL)
    assert len(points) == 3 * len(meta["points"]) + len(meta["heldout"])
    held = points[points["set"] == "heldout"]
    # The profiler scored its fit on these points; our CostModel-based prediction must agree.
    assert held["fitted_s"].tolist() == pytest.approx([h["predicted_s"] for h in meta["heldout"]], rel=1e-9)
    assert mape(held["measured_s"], held["fitted_s"]) == pytest.approx(profile.fits[MODEL].heldout_mape)
    fwd = points[(points["set"] == "grid") & (points["phase"] == "forward")].iloc[0]
    f = profile.fits[MODEL]
    assert fwd["fitted_s"] == pytest.approx(f.fwd_fixed_s + f.fwd_per_token_s * fwd["tokens"]
                                            + f.fwd_per_pair_s * fwd["attn_pairs"])
    models = calibration.model_points(profile, MODEL)
    assert set(models["phase"]) == {"1-layer model", "2-layer model"}
    table = calibration.error_table(pd.concat([points, models])).set_index(["set", "phase"])
    assert table.loc[("grid", "forward"), "points"] == len(meta["points"])
    assert table["fitted MAPE"].max() < table["derived MAPE"].max()
    memory = calibration.memory_points(profile, MODEL)
    assert set(memory["kind"]) == {"full", "checkpointed"}
    assert (memory["fitted_bytes_per_token"] >= memory["measured_bytes_per_token"] * (1 - 1e-9)).all()
    fig = calibration_figure(points)
    assert [ax.get_title() for ax in fig.axes] == ["fitted cost model", "derived cost model"]
    assert not any(math.isnan(v) for v in points[["fitted_s", "derived_s"]].to_numpy().ravel())


def test_calibration_needs_measurements(profile) -> None:
    with pytest.raises(CostModelError, match="stores no measurements"):
        calibration.layer_points(load_hardware("h200-sxm"), "llama-7b")
    with pytest.raises(CostModelError, match="no fit for 'llama-7b'"):
        calibration.cost_models(profile, "llama-7b")
