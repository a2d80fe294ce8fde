"""The memory footprints a model JSON lacks, measured on fake tensors (what `dcp plan --model
FILE.json` and `dcp measure-memory` run before planning).

A footprint depends on the model's shape and the precision recipe only (dcp.costmodel.memory), so
one measurement per recipe serves every depth, cluster and hardware; `dcp.costmodel.load_model`
reads them back from the cache file beside the JSON (`footprint_cache_path`).
"""

from __future__ import annotations

from collections.abc import Sequence

from dcp.costmodel import HardwareProfile, ModelSpec
from dcp.costmodel.memory import MemoryFootprint, has_footprint


def missing_recipes(spec: ModelSpec, recipes: Sequence[str], hardware: HardwareProfile | None = None) -> list[str]:
    """The recipes of `recipes` in which neither `spec` nor `hardware`'s fit of it has a footprint."""
    fit = hardware.fits.get(spec.name) if hardware is not None else None
    return [r for r in recipes if not has_footprint(spec, r, fit)]


def measure_recipes(spec: ModelSpec, recipes: Sequence[str]) -> dict[str, MemoryFootprint]:
    """`spec`'s reference model measured on fake tensors in each recipe (seconds each, any size:
    no memory is allocated)."""
    from dcp.profiler.memory import reference_footprint

    return {r: reference_footprint(spec, r) for r in recipes}
