"""Calibrate a machine and fit the cost model: microbenchmarks, least squares, hardware profiles.

Python API (the CLI's `dcp profile` is a thin layer over it; nothing here imports click):

- `profile_model(spec, base, ProfileOptions(...))`: profile a reference model's layer.
- `profile_bench(LayerBench(...), base, opts)`: the same for your own layer and model factories.
- `validate_profile(profile, spec)`: whole micro-batches, predicted vs measured.
- `refit(profile, measurements, spec)`: update a fit from the executor's measured micro-batches.

Names are imported on first use (PEP 562): `import dcp.cli` reaches this package through the
`profile` command and must not pull in torch, which `dcp plan` does without.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Call": "bench", "LayerBench": "bench", "SampleShape": "bench",
    "MAPE_THRESHOLD": "fitting", "FitError": "fitting", "LinearFit": "fitting", "fit_nnls": "fitting",
    "mape": "fitting", "r_squared": "fitting",
    "ProfileOptions": "profile", "fit_of": "profile", "profile_bench": "profile", "profile_model": "profile",
    "MicroBatchMeasurement": "refitting", "refit": "refitting",
    "ValidationReport": "validate", "validate_profile": "validate",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dcp.profiler' has no attribute {name!r}")
    return getattr(importlib.import_module(f"dcp.profiler.{_EXPORTS[name]}"), name)
