"""Shipped presets (dcp/presets/*.json) and profile files."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from dcp.costmodel.hardware import HardwareProfile
from dcp.costmodel.spec import CostModelError, ModelSpec


def _preset_dir(kind: str) -> Any:
    return resources.files("dcp.presets") / kind


def preset_names(kind: Literal["models", "hardware"]) -> list[str]:
    return sorted(p.name[:-5] for p in _preset_dir(kind).iterdir() if p.name.endswith(".json"))


def _load_json(path: Any, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CostModelError(f"{what} {path}: not valid JSON ({e.msg} at line {e.lineno})") from e


def load_model(name_or_path: str) -> ModelSpec:
    """A model preset by name (see `dcp presets`) or a JSON file path."""
    if name_or_path.endswith(".json") or Path(name_or_path).is_file():
        path = Path(name_or_path)
        if not path.is_file():
            raise CostModelError(f"model file {name_or_path} does not exist")
        return ModelSpec.from_dict(_load_json(path, "model file"))
    if name_or_path not in preset_names("models"):
        raise CostModelError(f"unknown model preset {name_or_path!r}; known: {', '.join(preset_names('models'))}")
    return ModelSpec.from_dict(_load_json(_preset_dir("models") / f"{name_or_path}.json", "model preset"))


def load_hardware(name_or_path: str) -> HardwareProfile:
    """A hardware preset by name (see `dcp presets`) or a profile JSON path from `dcp profile`."""
    if name_or_path.endswith(".json") or Path(name_or_path).is_file():
        path = Path(name_or_path)
        if not path.is_file():
            raise CostModelError(f"hardware profile {name_or_path} does not exist")
        return HardwareProfile.from_dict(_load_json(path, "hardware profile"))
    if name_or_path not in preset_names("hardware"):
        raise CostModelError(
            f"unknown hardware preset {name_or_path!r}; known: {', '.join(preset_names('hardware'))}"
        )
    return HardwareProfile.from_dict(_load_json(_preset_dir("hardware") / f"{name_or_path}.json", "hardware preset"))


def save_hardware(profile: HardwareProfile, path: str | Path) -> None:
    Path(path).write_text(json.dumps(profile.to_dict(), indent=1) + "\n")
