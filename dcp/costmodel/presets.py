"""Shipped presets (dcp/presets/*.json) and profile files."""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from dcp.costmodel.hardware import HardwareProfile
from dcp.costmodel.memory import MemoryFootprint, shape_of
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
    except UnicodeDecodeError:
        raise CostModelError(f"{what} {path}: not a text file (not UTF-8 JSON)") from None
    except OSError as e:
        raise CostModelError(f"{what} {path}: cannot read ({e.strerror or e})") from e


def _read(name_or_path: str, kind: Literal["models", "hardware"], file_what: str) -> Any:
    """The JSON of a preset by name, or of a file when given a path (or a name ending in .json)."""
    if _is_file(name_or_path):
        path = Path(name_or_path)
        if path.is_dir():
            raise CostModelError(f"{file_what} {name_or_path} is a directory")
        if not path.is_file():
            raise CostModelError(f"{file_what} {name_or_path} does not exist")
        return _check_kind(_load_json(path, file_what), kind, f"{file_what} {name_or_path}")
    what = "model preset" if kind == "models" else "hardware preset"
    known = preset_names(kind)
    if name_or_path not in known:
        raise CostModelError(f"unknown {what} {name_or_path!r}; known: {', '.join(known)}")
    return _load_json(_preset_dir(kind) / f"{name_or_path}.json", what)


def _check_kind(doc: Any, kind: str, what: str) -> Any:
    """A hardware profile given as a model (or a model as hardware) is named as such, not
    reported as a list of unknown fields."""
    is_profile = isinstance(doc, dict) and doc.get("kind") == "dcp-hardware-profile"
    if kind == "models" and is_profile:
        raise CostModelError(f"{what} is a hardware profile, not a model spec: pass it as --hardware")
    if kind == "hardware" and isinstance(doc, dict) and not is_profile and "num_layers" in doc:
        raise CostModelError(f"{what} is a model spec, not a hardware profile: pass it as --model")
    return doc


def _parse(parse: Any, doc: Any, name_or_path: str) -> Any:
    """`parse(doc)`, with a file's path in front of its error (the name inside may differ)."""
    try:
        return parse(doc)
    except CostModelError as e:
        if _is_file(name_or_path):
            raise CostModelError(f"{name_or_path}: {e}") from e
        raise


def load_model(name_or_path: str) -> ModelSpec:
    """A model preset by name (see `dcp presets`) or a JSON file path. A file's missing memory
    footprints come from its cache beside it (`footprint_cache_path`), where measured for its shape."""
    spec = _parse(ModelSpec.from_dict, _read(name_or_path, "models", "model file"), name_or_path)
    if not _is_file(name_or_path):
        return spec
    cached = read_footprint_cache(footprint_cache_path(name_or_path))
    extra = {r: f for r, f in cached.items() if r not in spec.memory and f.shape == shape_of(spec)}
    return dataclasses.replace(spec, memory={**spec.memory, **extra}) if extra else spec


def _is_file(name_or_path: str) -> bool:
    return name_or_path.endswith(".json") or Path(name_or_path).is_file()


def footprint_cache_path(model_path: str | Path) -> Path:
    """Where the footprints measured for a model JSON are kept: beside it, `NAME.memory.json`."""
    path = Path(model_path)
    return path.with_name(f"{path.name.removesuffix('.json')}.memory.json")


def read_footprint_cache(path: Path) -> dict[str, MemoryFootprint]:
    """The footprints in a cache file by recipe; none if there is no file. A damaged cache is an
    error naming it (delete it to measure again)."""
    if not path.is_file():
        return {}
    doc = _load_json(path, "memory footprint cache")
    if not isinstance(doc, dict):
        raise CostModelError(f"memory footprint cache {path}: expected a JSON object (delete it to measure again)")
    try:
        return {r: MemoryFootprint.from_dict(f) for r, f in doc.items()}
    except CostModelError as e:
        raise CostModelError(f"memory footprint cache {path}: {e} (delete it to measure again)") from e


def presets_of_shape(spec: ModelSpec) -> list[str]:
    """The model presets whose footprint shape equals `spec`'s (their measured memory fits it)."""
    want = shape_of(spec)
    return [n for n in preset_names("models") if shape_of(load_model(n)) == want]


def load_hardware(name_or_path: str) -> HardwareProfile:
    """A hardware preset by name (see `dcp presets`) or a profile JSON path from `dcp profile`."""
    return _parse(HardwareProfile.from_dict, _read(name_or_path, "hardware", "hardware profile"), name_or_path)


def check_fitted_for(hw: HardwareProfile, spec: ModelSpec, hardware: str, model: str) -> None:
    """A measured profile (one with fits) prices only the models it was fitted for; any other would
    be priced from FLOPs on the profiled device's rates, in silence. Datasheet presets have no fits
    and price every model that way by design."""
    if hw.fits and spec.name not in hw.fits:
        raise CostModelError(
            f"hardware profile {hardware} was fitted for {', '.join(sorted(hw.fits))}, not {spec.name}: add a fit "
            f"with `dcp profile --model {model} --base {hardware} -o {hardware}` (it keeps the others), or plan on "
            "a preset (`dcp presets`)")


def save_hardware(profile: HardwareProfile, path: str | Path) -> None:
    Path(path).write_text(json.dumps(profile.to_dict(), indent=1) + "\n")
