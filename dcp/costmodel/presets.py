"""Shipped presets (dcp/presets/*.json) and profile files."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from dcp.costmodel.hardware import HardwareProfile
from dcp.costmodel.spec import CostModelError, ModelSpec

DEFAULT_MODEL = "llama-7b"
"""The model dcp plans for when none is named."""
MEASURED_H200 = "h200-measured"
"""The H200 profile measured by `benchmarks/gpu/run.sh` and committed by `benchmarks/gpu/adopt.py`."""
DATASHEET_H200 = "h200-sxm"


def _preset_dir(kind: str) -> Any:
    return resources.files("dcp.presets") / kind


DEFAULT_HARDWARE = MEASURED_H200 if (_preset_dir("hardware") / f"{MEASURED_H200}.json").is_file() else DATASHEET_H200
"""The hardware dcp plans for when none is named: the best H200 profile shipped, measured once
one is committed, else the datasheet preset."""


def preset_names(kind: Literal["models", "hardware"]) -> list[str]:
    return sorted(p.name[:-5] for p in _preset_dir(kind).iterdir() if p.name.endswith(".json"))


def _load_json(path: Any, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CostModelError(f"{what} {path}: not valid JSON ({e.msg} at line {e.lineno})") from e


def _read(name_or_path: str, kind: Literal["models", "hardware"], file_what: str) -> Any:
    """The JSON of a preset by name, or of a file when given a path (or a name ending in .json)."""
    if name_or_path.endswith(".json") or Path(name_or_path).is_file():
        path = Path(name_or_path)
        if not path.is_file():
            raise CostModelError(f"{file_what} {name_or_path} does not exist")
        return _load_json(path, file_what)
    what = "model preset" if kind == "models" else "hardware preset"
    known = preset_names(kind)
    if name_or_path not in known:
        raise CostModelError(f"unknown {what} {name_or_path!r}; known: {', '.join(known)}")
    return _load_json(_preset_dir(kind) / f"{name_or_path}.json", what)


def load_model(name_or_path: str) -> ModelSpec:
    """A model preset by name (see `dcp presets`) or a JSON file path."""
    return ModelSpec.from_dict(_read(name_or_path, "models", "model file"))


def load_hardware(name_or_path: str) -> HardwareProfile:
    """A hardware preset by name (see `dcp presets`) or a profile JSON path from `dcp profile`."""
    return HardwareProfile.from_dict(_read(name_or_path, "hardware", "hardware profile"))


def save_hardware(profile: HardwareProfile, path: str | Path) -> None:
    Path(path).write_text(json.dumps(profile.to_dict(), indent=1) + "\n")
