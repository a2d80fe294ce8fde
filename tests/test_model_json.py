"""A model of one's own from the CLI (issue 56, item 3): a model JSON with only its shape plans,
its memory footprint measured on fake tensors, said on stderr and cached beside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run

from dcp.costmodel import RECIPES, CostModelError, load_model
from dcp.costmodel.presets import footprint_cache_path
from dcp.planner.run import build_cost_model

SHAPE_FIELDS = ("name", "num_layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "attention", "mlp")
"""The nine fields a new user writes (a preset's shape without its measured memory)."""


def shape_only(preset: str, where: Path, **changes: object) -> Path:
    spec = json.loads((Path(__file__).parents[1] / "dcp" / "presets" / "models" / f"{preset}.json").read_text())
    path = where / "my.json"
    path.write_text(json.dumps({**{k: spec[k] for k in SHAPE_FIELDS}, **changes}))
    return path


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_a_nine_field_model_plans_in_every_recipe(recipe: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    shape_only("llama-3-8b", tmp_path)
    (tmp_path / "one-512k-sample.txt").write_text("524288\n")
    args = ["plan", "--gpus", "64", "--global-batch", "1", "--workload", "one-512k-sample.txt", "--precision", recipe,
            "--strategy", "dcp-greedy", "--format", "json"]
    first = run(*args, "--model", "my.json")
    assert f"my.json has no measured {recipe} memory footprint: measuring it on fake tensors" in first.stderr
    assert "cached in my.memory.json (the preset llama-3-8b has this shape)" in first.stderr
    # The same shape as the preset: the measurement is the preset's (dcp/presets, scripts/measure_memory.py).
    cached = json.loads(footprint_cache_path("my.json").read_text())
    assert list(cached) == [recipe]
    preset = load_model("llama-3-8b").memory[recipe].to_dict()
    assert {k: v for k, v in cached[recipe].items() if k != "how"} == {k: v for k, v in preset.items() if k != "how"}
    # So the plan is the preset's, and a second run reads the cache without measuring.
    again = run(*args, "--model", "my.json")
    assert "measuring" not in again.stderr
    mine, theirs = json.loads(again.stdout), json.loads(run(*args, "--model", "llama-3-8b").stdout)
    assert [s["plan"]["step_time_s"] for s in mine["steps"]] == [s["plan"]["step_time_s"] for s in theirs["steps"]]
    assert mine["steps"][0]["plan"]["groups"] == theirs["steps"][0]["plan"]["groups"]


def test_measure_memory_caches_every_recipe_and_a_changed_shape_is_measured_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    shape_only("tiny-llama", tmp_path, name="mine", hidden=96, heads=6, kv_heads=2)  # no preset has this shape
    with pytest.raises(CostModelError, match="`dcp measure-memory MODEL.json` measures every recipe") as e:
        build_cost_model("my.json", "cpu", 4)
    assert "the preset" not in str(e.value)
    out = run("measure-memory", "my.json").stdout
    assert out.strip() == f"my.json: memory footprints for {', '.join(RECIPES)} in my.memory.json"
    spec = load_model("my.json")
    assert set(spec.memory) == set(RECIPES) and spec.memory["fp32"].shape["hidden"] == 96
    # fp32 holds every activation in 4 bytes, bf16 in 2: the saved bytes per token halve.
    assert spec.memory["bf16"].act_ckpt_bytes_per_token * 2 == spec.memory["fp32"].act_ckpt_bytes_per_token
    assert "measuring" not in run("measure-memory", "my.json").stderr  # cached
    shape_only("tiny-llama", tmp_path, name="mine", hidden=128, heads=8, kv_heads=2)  # edited: the cache is stale
    assert load_model("my.json").memory == {}
    result = run("plan", "--model", "my.json", "--hardware", "cpu", "--gpus", "4", "--workload", "lognormal",
                 "--strategy", "dcp-greedy", "--steps", "1", "--global-batch", "16")
    assert "has no measured bf16 memory footprint: measuring it" in result.stderr
    assert load_model("my.json").memory["bf16"].shape["hidden"] == 128


def test_a_damaged_cache_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    shape_only("tiny-llama", tmp_path)
    (tmp_path / "my.memory.json").write_text("[1, 2]")
    from cli_helpers import run_bad

    line = run_bad("plan", "--model", "my.json", "--steps", "1")
    assert "memory footprint cache my.memory.json: expected a JSON object (delete it to measure again)" in line
