"""The run state a checkpoint keeps beside the tensors: the digest of what plans depend on, and a
process's RNG states (dcp.executor.run_checkpoint)."""

from __future__ import annotations

import hashlib
import io
import json
import random
from typing import Any

import numpy as np
import torch

from dcp.costmodel.precision import get_recipe


def _short_hash(doc: Any) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:12]


def run_digest(*, model: Any = None, hardware: Any = None, zero_stage: int | None = None,
               recipe: Any = None) -> dict[str, str]:
    """What plans depend on, one entry per part, each '<name>@<hash of its fields>': the model
    spec (a ModelSpec), the hardware profile (a HardwareProfile; its `meta` and `sources`, which
    an online refit extends, are left out), the ZeRO stage and the precision recipe (a name or
    PrecisionRecipe). Parts given as None are not recorded and not compared."""
    out: dict[str, str] = {}
    if model is not None:
        out["model spec"] = f"{model.name}@{_short_hash(model.to_dict())}"
    if hardware is not None:
        d = {k: v for k, v in hardware.to_dict().items() if k not in ("meta", "sources")}
        out["hardware profile"] = f"{hardware.name}@{_short_hash(d)}"
    if zero_stage is not None:
        out["ZeRO stage"] = str(zero_stage)
    if recipe is not None:
        r = get_recipe(recipe)
        out["precision recipe"] = f"{r.name}@{_short_hash(r.__dict__)}"
    return out


def rng_state() -> bytes:
    """This process's RNG states (torch, CUDA, numpy, python), serialized with torch.save."""
    np_state = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "numpy": (np_state[0], np_state[1].tolist(), *np_state[2:]),
             "python": random.getstate(),
             "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def set_rng_state(raw: bytes) -> None:
    """Restore what `rng_state` serialized (loaded with weights_only: tensors and plain data)."""
    state = torch.load(io.BytesIO(raw), weights_only=True)
    torch.set_rng_state(state["torch"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_all(seed: int) -> None:
    """Seed torch, numpy and python alike (a rank the checkpoint has no RNG state for)."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)
