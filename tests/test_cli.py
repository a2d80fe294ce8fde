"""The CLI through click's CliRunner: plan, compare, presets, and one clear line for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pandas as pd
import pytest
from cli_helpers import FAST, run, run_bad

from dcp.cli import main
from dcp.costmodel import load_hardware, preset_names
from dcp.planner import STRATEGIES, Plan


def test_presets() -> None:
    out = run("presets").output
    assert "llama-7b" in out and "6.74B params, 32 layers" in out
    assert "h200-sxm" in out and "137.1 GB usable" in out


def test_plan_table() -> None:
    out = run("plan", "--strategy", "dcp-greedy", *FAST).output
    lines = out.splitlines()
    assert lines[0].startswith("dcp-greedy on 32 x h200-sxm, llama-7b, wikipedia")
    assert "groups (n x sp)" in lines[1] and "gap" in lines[1]
    assert len(lines) == 2 + 2 + 1  # title, header, two steps, summary
    assert lines[-1].startswith("mean step") and "tokens/s" in lines[-1] and "idle" in lines[-1]


def test_plan_json_validates(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    run("plan", "--workload", "wikipedia", "--gpus", "32", "--format", "json", "-o", str(path),
        "--steps", "2", "--strategy", "bucket")
    doc = json.loads(path.read_text())
    assert doc["config"]["gpus"] == 32 and doc["config"]["strategy"] == "bucket"
    assert len(doc["steps"]) == 2
    for step in doc["steps"]:
        plan = Plan.from_dict(step["plan"]).validate()
        assert plan.num_gpus == 32
        assert step["simulation"]["step_time_s"] == pytest.approx(plan.step_time_s)
    assert doc["summary"]["steps"] == 2 and doc["summary"]["mean_step_time_s"] > 0


def test_plan_csv(tmp_path: Path) -> None:
    path = tmp_path / "plan.csv"
    run("plan", "--strategy", "packed", "--format", "csv", "-o", str(path), *FAST)
    frame = pd.read_csv(path)
    assert list(frame.columns[:2]) == ["step", "group"]
    assert set(frame["step"]) == {0, 1}
    assert frame.groupby("step")["samples"].sum().tolist() == [128, 128]


def test_plan_by_tokens_and_overrides() -> None:
    out = run("plan", "--strategy", "dcp-greedy-inter", "--global-tokens", "200000", "--steps", "1",
              "--gpus", "16", "--gpus-per-node", "4", "--memory-gb", "80", "--zero-stage", "3",
              "--model", "llama-13b", "--hardware", "h100-sxm", "--seed", "3").output
    assert "dcp-greedy-inter on 16 x h100-sxm, llama-13b" in out
    assert "simulation only" not in out  # the executor runs every stage the cost model prices
    # ZeRO-2 keeps the whole local gradient through the step (groups run different numbers of
    # micro-batches): 13B's parameters and fp32 gradients alone are 78 GB, no room in 80.
    failed = run("plan", "--gpus", "16", "--gpus-per-node", "4", "--memory-gb", "80", "--zero-stage", "2",
                 "--model", "llama-13b", "--hardware", "h100-sxm", "--steps", "1", ok=False).output
    assert "model states of llama-13b need" in failed


def test_compare_opensora() -> None:
    out = run("compare", "--workload", "opensora", "--gpus", "32", "--steps", "2").output
    lines = out.splitlines()
    assert "opensora-stdit-1.1b" in lines[0]  # the video workload's model by default
    assert "vs bucket" in lines[1] and "gap to bound" in lines[1]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == set(STRATEGIES)
    assert rows["bucket"][2] == "1.00x"


def test_compare_formats(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    run("compare", "--strategies", "bucket,dcp-greedy", "--format", "json", "-o", str(path), *FAST)
    results = json.loads(path.read_text())["results"]
    assert [r["strategy"] for r in results] == ["bucket", "dcp-greedy"]
    assert results[0]["speedup_vs_bucket"] == pytest.approx(1.0)
    csv = run("compare", "--strategies", "packed,bucket", "--format", "csv", *FAST).output
    assert csv.splitlines()[0].startswith("strategy,mean_step_time_s,speedup_vs_bucket")


def test_every_command_has_help_with_an_example() -> None:
    for name in list(main.commands):
        out = run(name, "--help").output
        assert "Example:" in out, name
        assert f"dcp {name}" in out, name
    assert "plan" in run("--help").output


@pytest.mark.parametrize(("args", "culprit"), [
    (["plan", "--model", "gpt-9"], "unknown model preset 'gpt-9'"),
    (["plan", "--hardware", "tpu-v9"], "unknown hardware preset 'tpu-v9'"),
    (["plan", "--gpus", "0"], "--gpus"),
    (["plan", "--gpus", "12", "--gpus-per-node", "8"], "12 GPUs is not a whole number of nodes of 8"),
    (["plan", "--strategy", "magic"], "unknown strategy 'magic'"),
    (["compare", "--strategies", "bucket,magic"], "unknown strategy 'magic'"),
    (["plan", "--workload", "wikipedia2"], "unknown workload 'wikipedia2'"),
    (["plan", "--global-batch", "8", "--global-tokens", "1000"], "exactly one"),
    (["plan", "--memory-gb", "20"], "model states of llama-7b need"),
    (["plan", "--hardware", "missing.json"], "missing.json does not exist"),
])
def test_bad_input_is_one_clear_line(args: list[str], culprit: str) -> None:
    if "--strategy" not in args and args[0] == "plan":
        args = [*args, "--strategy", "bucket"]
    assert culprit in run_bad(*args)


@pytest.mark.parametrize(("text", "culprit"), [
    ("100\n2x0\n", "line 2: '2x0' is not an integer length"),
    ("100\n-5\n", "line 2: length -5 must be positive"),
])
def test_bad_lengths_file(tmp_path: Path, text: str, culprit: str) -> None:
    path = tmp_path / "lengths.txt"
    path.write_text(text)
    out = run_bad("plan", "--workload", str(path), "--strategy", "bucket")
    assert culprit in out and "lengths.txt" in out


def test_sample_that_fits_nowhere(tmp_path: Path) -> None:
    path = tmp_path / "long.txt"
    path.write_text("1000\n9000000\n2000\n")
    out = run_bad("plan", "--workload", str(path), "--gpus", "8", "--strategy", "dcp-greedy", "--global-batch", "3")
    assert "sample 1 (9000000 tokens) fits nowhere" in out and "GB per GPU" in out


def test_unwritable_output(tmp_path: Path) -> None:
    out = run_bad("plan", "--strategy", "bucket", *FAST, "-o", str(tmp_path / "no" / "such" / "dir.json"))
    assert "dir.json" in out


def test_plan_with_the_default_strategy() -> None:
    out = run("plan", "--steps", "1", "--global-batch", "64", "--time-limit", "0.5").output
    assert out.startswith("ilp on 32 x h200-sxm")


def test_library_errors_become_click_errors() -> None:
    # Another engineer registers `dcp profile` with main.add_command: it gets the same handling.
    @click.command()
    def boom() -> None:
        """Raise a library error.

        Example: dcp boom
        """
        raise ValueError("boom: the culprit")

    main.add_command(boom)
    try:
        assert run_bad("boom").strip() == "Error: boom: the culprit"
    finally:
        main.commands.pop("boom")


def test_planner_never_imports_torch() -> None:
    code = ("import sys, dcp.planner, dcp.costmodel, dcp.data, dcp.cli, dcp.planner.run, "
            "dcp.planner.simulate, dcp.planner.greedy, dcp.planner.baselines; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_progress_on_stderr_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    quiet = run("plan", "--strategy", "dcp-greedy", *FAST)
    assert "planning" not in quiet.stderr
    monkeypatch.setattr("dcp.commands.common.stderr_is_terminal", lambda: True)
    shown = run("compare", "--strategies", "bucket,dcp-greedy", *FAST)
    for name in ("bucket", "dcp-greedy"):
        assert f"planning {name}: 2/2 global batches" in shown.stderr
    assert "planning" not in shown.stdout  # the table stays clean for pipes


def test_presets_list_their_sources() -> None:
    out = run("presets").stdout
    assert "source: Llama 2 7B shape (Touvron et al., arXiv 2307.09288" in " ".join(out.split())
    assert out.count("source:") == len(preset_names("models")) and out.count("sources:") == len(preset_names("hardware"))
    full = run("presets", "h200-sxm").stdout
    assert "models:" not in full
    for field in load_hardware("h200-sxm").sources:
        assert f"{field}:" in full
    assert "unknown preset 'h300'" in run_bad("presets", "h300")


def test_plan_json_labels_its_samples(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    run("plan", "--strategy", "bucket", *FAST, "--format", "json", "-o", str(path))
    plan = json.loads(path.read_text())["steps"][0]["plan"]
    assert plan["sample_fields"] == ["id", "tokens", "attn_pairs", "frames"]
    assert all(len(s) == 4 for s in plan["samples"])
    assert Plan.from_dict(plan).validate().samples[0].id == plan["samples"][0][0]


def test_help_shows_defaults_and_names(monkeypatch: pytest.MonkeyPatch) -> None:
    text = " ".join(run("plan", "--help").output.split())
    assert "ILP limit per global batch, in wall-clock seconds: it bounds the search" in text
    assert "on a loaded one it can end later. [default: 1.0" in text
    assert "ZeRO sharding of the model states" in text and "gap = (step - bound) / step" in text
    for name in STRATEGIES:
        assert name in text
    assert "[id, tokens, attn_pairs, frames]" in text
    compare_help = " ".join(run("compare", "--help").output.split())
    assert all(name in compare_help for name in STRATEGIES) and "idle is the share" in compare_help
    profile_help = " ".join(run("profile", "--help").output.split())
    for flag in ("--min-tokens", "--max-tokens", "--heldout"):
        assert f"{flag} INTEGER RANGE" in profile_help
    assert "held-out MAPE" in profile_help and "4x this many tokens" in profile_help
