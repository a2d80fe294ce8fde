"""`dcp show` and `dcp compare --plot`: summaries, pictures of every rank, one clear line for bad input."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from cli_helpers import FAST, run, run_bad
from matplotlib.collections import PolyCollection

from dcp.costmodel import Cluster, CostModel, TrainingSetup, load_hardware, load_model
from dcp.planner.pricing import group_layout
from dcp.planner.report import (
    group_rows,
    kind_shares,
    load_plan_document,
    memory_headroom,
    reprice,
    unused_ranks,
)
from dcp.planner.simulate import simulate
from dcp.viz import plan_gantt

NOTEBOOK_PROFILE = Path(__file__).resolve().parents[1] / "notebooks" / "data" / "cpu-tiny-llama.json"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; fails on anything that is not a PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("show") / "plan.json"
    run("plan", "--strategy", "dcp-greedy", "--format", "json", "-o", str(path), *FAST)
    return path


def test_show_summarizes_every_step_and_details_one(plan_file: Path) -> None:
    out = run("show", str(plan_file), "--step", "1").stdout
    lines = out.splitlines()
    assert lines[0] == f"{plan_file}: dcp-greedy on 32 x h200-sxm, llama-7b, wikipedia (2 steps)"
    assert "groups (n x sp)" in lines[1] and len([ln for ln in lines if ln[:4].strip() in ("0", "1")]) >= 2
    detail = next(ln for ln in lines if ln.startswith("step 1:"))
    assert "128 samples" in detail and "groups" in detail
    assert any(ln.startswith("predicted") and "lower bound" in ln and "memory headroom" in ln for ln in lines)
    shares = next(ln for ln in lines if ln.startswith("share of rank-seconds"))
    for kind in ("forward", "backward", "recompute", "all_to_all", "idle", "allreduce"):
        assert kind in shares
    plan = load_plan_document(plan_file).step(1)
    header = next(i for i, ln in enumerate(lines) if ln.split()[:3] == ["group", "ranks", "sp"])
    assert len(lines) - header - 1 == len(plan.groups)  # one row per group


def test_show_gantt_draws_every_rank(plan_file: Path, tmp_path: Path) -> None:
    png = tmp_path / "step0.png"
    result = run("show", str(plan_file), "--gantt", str(png))
    assert f"wrote {png}" in result.stderr
    width, height = png_size(png)
    assert width >= 800 and height >= 400 and png.stat().st_size > 20_000
    # The timeline behind the picture: one row per rank, each covering the whole step.
    doc = load_plan_document(plan_file)
    plan, cm = doc.step(0), doc.cost_model()
    tl = simulate(plan, cm)
    assert len(tl.events) == plan.num_gpus == 32
    for events in tl.events:
        assert events[0].start_s == 0 and events[-1].end_s == pytest.approx(tl.step_time_s)
    ax = plan_gantt(plan, tl).axes[0]
    assert ax.get_ylim() == (plan.num_gpus - 0.5, -0.5)
    bars = [path for c in ax.collections if isinstance(c, PolyCollection) for path in c.get_paths()]
    assert {round(path.vertices[:, 1].min() + 0.4) for path in bars} == set(range(plan.num_gpus))


def test_gantt_grows_with_ranks(tmp_path: Path) -> None:
    small, big = tmp_path / "small.json", tmp_path / "big.json"
    run("plan", "--strategy", "bucket", "--gpus", "8", "--steps", "1", "--global-batch", "32",
        "--format", "json", "-o", str(small))
    run("plan", "--strategy", "packed", "--gpus", "64", "--steps", "1", "--global-batch", "256",
        "--format", "json", "-o", str(big))
    run("show", str(small), "--gantt", str(tmp_path / "small.png"))
    run("show", str(big), "--gantt", str(tmp_path / "big.png"))
    assert png_size(tmp_path / "big.png")[1] > png_size(tmp_path / "small.png")[1]


def test_show_bare_plan_and_library_rows(plan_file: Path, tmp_path: Path) -> None:
    doc = json.loads(plan_file.read_text())
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(doc["steps"][0]["plan"]))
    out = run("show", str(bare)).stdout
    assert out.splitlines()[0] == f"{bare}: dcp-greedy on 32"
    plan = load_plan_document(bare).step(0)
    rows = group_rows(plan)
    assert rows["samples"].sum() == len(plan.samples) and rows["sp"].sum() + unused_ranks(plan) == 32
    assert 0 <= memory_headroom(plan) < 1
    shares = kind_shares(simulate(plan, load_plan_document(bare).cost_model()))
    assert sum(shares.values()) == pytest.approx(1.0)


def test_show_profile_path_next_to_the_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan made with `--hardware prof.json` shows from another directory too."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(NOTEBOOK_PROFILE, work / "prof.json")
    monkeypatch.chdir(work)
    run("plan", "--hardware", "prof.json", "--model", "tiny-llama", "--gpus", "8", "--steps", "1",
        "--global-batch", "16", "--workload", "lognormal:max=4096", "--strategy", "dcp-greedy",
        "--format", "json", "-o", "plan.json")
    monkeypatch.chdir(tmp_path)
    assert "tiny-llama" in run("show", "work/plan.json").stdout.splitlines()[0]


def test_show_bad_input(plan_file: Path, tmp_path: Path) -> None:
    assert "does not exist" in run_bad("show", str(tmp_path / "missing.json"))
    assert "step 2 is out of range" in run_bad("show", str(plan_file), "--step", "2")
    assert "steps 0..1" in run_bad("show", str(plan_file), "--step", "-1")
    not_plan = tmp_path / "profile.json"
    shutil.copy(NOTEBOOK_PROFILE, not_plan)
    assert "is not a dcp plan" in run_bad("show", str(not_plan))
    broken = tmp_path / "broken.json"
    broken.write_text("{\"steps\": [")
    assert "is not valid JSON" in run_bad("show", str(broken))
    assert "unknown model preset" in run_bad("show", str(plan_file), "--model", "gpt-9")
    assert "extension must be one of .png, .svg, .pdf" in run_bad("show", str(plan_file), "--gantt",
                                                                   str(tmp_path / "x.nope"))
    # A plan edited to claim another depth is refused, not re-simulated as if nothing had changed.
    doc = json.loads(plan_file.read_text())
    doc["steps"][0]["plan"]["num_layers"] = 1000
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(doc))
    assert "plan is for a model of 1000 layers, the cost model's llama-7b has 32" in run_bad("show", str(edited))


@pytest.mark.parametrize("override", [["--model", "llama-13b"], ["--hardware", "h100-sxm"], ["--zero-stage", "2"]])
def test_show_overrides_reprice_the_plan(plan_file: Path, override: list[str]) -> None:
    """--model/--hardware/--zero-stage keep the plan's groups and checkpointing and price them anew."""
    out = run("show", str(plan_file), *override).stdout.splitlines()
    doc = load_plan_document(plan_file)
    flag, value = override[0].lstrip("-").replace("-", "_"), override[1]
    # The cost model built here from the presets, not with the document's own `cost_model`.
    plan0, stored = doc.step(0), {"model": "llama-7b", "hardware": "h200-sxm", "zero_stage": 1}
    assert plan0.num_layers == load_model("llama-7b").num_layers and "re-priced on" not in " ".join(plan0.notes)
    stored[flag] = int(value) if flag == "zero_stage" else value
    hw = load_hardware(stored["hardware"])
    cm = CostModel(load_model(stored["model"]), hw,
                   Cluster(num_gpus=plan0.num_gpus, gpus_per_node=plan0.gpus_per_node,
                           memory_bytes=plan0.memory_limit_bytes if flag != "hardware" else hw.memory_bytes),
                   TrainingSetup(precision=doc.config.get("precision", "bf16"), zero_stage=stored["zero_stage"]))
    repriced = reprice(plan0, cm)
    assert "re-priced on" in out[0]
    # Every micro-batch priced by hand on that model; the simulator replays the step from them.
    by_id = plan0.sample_map()
    for g, h in zip(plan0.groups, repriced.groups, strict=True):
        for mb, new in zip(g.microbatches, h.microbatches, strict=True):
            tokens, pairs = sum(by_id[i].tokens for i in mb.samples), sum(by_id[i].attn_pairs for i in mb.samples)
            assert new.time_s == pytest.approx(cm.time_s(tokens, pairs, g.sp, mb.ckpt_layers, group_layout(g)), rel=1e-12)
            assert new.memory_bytes == pytest.approx(cm.memory_bytes(tokens, g.sp, mb.ckpt_layers, group_layout(g)),
                                                     rel=1e-12)
    predicted = next(ln for ln in out if ln.startswith("predicted"))
    assert predicted.startswith(f"predicted {simulate(repriced, cm).step_time_s:.3f} s")
    assert repriced.digest() == doc.step(0).digest() or flag == "model"  # same plan, other prices
    assert [[mb.samples for mb in g.microbatches] for g in repriced.groups] == \
        [[mb.samples for mb in g.microbatches] for g in doc.step(0).groups]
    peak = [max(mb.memory_bytes for g in plan.groups for mb in g.microbatches) for plan in (repriced, doc.step(0))]
    # Another model or GPU changes the times; ZeRO-2 only the memory (sharded gradients).
    assert repriced.step_time_s != pytest.approx(doc.step(0).step_time_s) or peak[0] < peak[1]


def test_show_override_that_no_longer_fits_is_one_line(plan_file: Path) -> None:
    line = run_bad("show", str(plan_file), "--model", "llama-70b")
    assert "does not hold on llama-70b x h200-sxm" in line and "GB" in line


def test_compare_plot(tmp_path: Path) -> None:
    png = tmp_path / "compare.png"
    result = run("compare", "--strategies", "bucket,packed,dcp-greedy", "--plot", str(png), *FAST)
    assert f"wrote {png}" in result.stderr and "vs bucket" in result.stdout
    assert png_size(png)[0] >= 500 and png.stat().st_size > 10_000
    tput = tmp_path / "tput.png"
    run("compare", "--strategies", "bucket,dcp-greedy", "--plot", str(tput), "--plot-metric", "throughput", *FAST)
    png_size(tput)


def test_compare_figure_marks_the_bound() -> None:
    from dcp.data.batches import make_batches
    from dcp.planner.run import build_cost_model, compare
    from dcp.viz import compare_figure

    cm = build_cost_model("llama-7b", "h200-sxm", 16)
    frame = compare(make_batches("wikipedia", cm, global_batch=64, steps=1), cm, ["bucket", "dcp-greedy"])
    assert (frame["mean_lower_bound_s"] <= frame["mean_step_time_s"] * (1 + 1e-9)).all()
    ax = compare_figure(frame).axes[0]
    assert [b.get_height() for b in ax.patches] == pytest.approx(list(frame["mean_step_time_s"]))
    bound_lines = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert bound_lines and bound_lines[0].get_ydata()[0] == pytest.approx(frame["mean_lower_bound_s"].max())
    with pytest.raises(ValueError, match="metric"):
        compare_figure(frame, metric="latency")


def test_a_relative_profile_is_stored_relative_to_the_plan_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan written elsewhere records the profile's path from the plan's folder, so `dcp show` finds
    that profile, and not a same-named file where it runs."""
    (tmp_path / "a").mkdir()
    (tmp_path / "plans").mkdir()
    shutil.copy(NOTEBOOK_PROFILE, tmp_path / "a" / "prof.json")
    monkeypatch.chdir(tmp_path / "a")
    run("plan", "--hardware", "prof.json", "--model", "tiny-llama", "--gpus", "8", "--steps", "1",
        "--global-batch", "16", "--workload", "lognormal:max=4096", "--strategy", "dcp-greedy",
        "--format", "json", "-o", "../plans/plan.json")
    assert json.loads((tmp_path / "plans" / "plan.json").read_text())["config"]["hardware"] == "../a/prof.json"
    monkeypatch.chdir(tmp_path / "plans")
    (tmp_path / "plans" / "prof.json").write_text("not the profile")  # a decoy in the current directory
    assert "tiny-llama" in run("show", "plan.json").stdout.splitlines()[0]
    printed = run("plan", "--hardware", "../a/prof.json", "--model", "tiny-llama", "--gpus", "8", "--steps", "1",
                  "--global-batch", "16", "--workload", "lognormal:max=4096", "--strategy", "dcp-greedy",
                  "--format", "json").stdout
    assert json.loads(printed)["config"]["hardware"] == str(tmp_path / "a" / "prof.json")  # stdout: absolute
