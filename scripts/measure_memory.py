"""Measure every model preset's memory footprint in every precision recipe and write it into the
preset (dcp/presets/models/*.json, key "memory"), or check that the presets hold what a fresh
measurement gives.

    .venv/bin/python scripts/measure_memory.py            # rewrite the presets' "memory"
    .venv/bin/python scripts/measure_memory.py --check    # exit 1 if any preset is stale

Runs on any CPU in about a second per model and recipe: dcp.profiler.memory counts the
reference model (dcp.models) on fake tensors at the preset's real shape.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dcp.costmodel import RECIPES, ModelSpec  # noqa: E402
from dcp.costmodel.memory import MemoryFootprint  # noqa: E402
from dcp.profiler.memory import reference_footprint  # noqa: E402

NUMBERS = [f for f in MemoryFootprint.__dataclass_fields__ if f.endswith("_bytes") or f.endswith("_per_token")
           or f.endswith("_per_layer") or f.endswith("_outside")]
"""The footprint's numeric fields (compared by --check)."""
TOLERANCE = 0.005


def stale(stored: dict, fresh: MemoryFootprint) -> list[str]:
    """The numeric fields of a stored footprint that differ from a fresh one by more than 0.5%."""
    out = []
    for f in NUMBERS:
        a, b = float(stored.get(f, -1.0)), getattr(fresh, f)
        if abs(a - b) > TOLERANCE * max(abs(b), 1.0):
            out.append(f"{f} {a:.6g} != {b:.6g}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 when stale")
    args = ap.parse_args(argv)
    folder = Path(str(resources.files("dcp.presets") / "models"))
    problems = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        spec = ModelSpec.from_dict({k: v for k, v in data.items() if k != "memory"})
        memory = {}
        for recipe in RECIPES:
            fresh = reference_footprint(spec, recipe)
            memory[recipe] = fresh.to_dict()
            if args.check:
                diff = stale(data.get("memory", {}).get(recipe, {}), fresh)
                problems += [f"{path.name} {recipe}: {d}" for d in diff]
            print(f"{spec.name:22s} {recipe:14s} act_full {fresh.act_full_bytes_per_token / spec.hidden:7.3f} h  "
                  f"act_ckpt {fresh.act_ckpt_bytes_per_token / spec.hidden:5.2f} h  working "
                  f"{fresh.working_bytes_per_token / 1e3:8.1f} kB/token  fixed {fresh.working_fixed_bytes / 1e6:7.1f} MB  "
                  f"weight copies {fresh.weight_copy_bytes(spec.num_layers) / 1e9:6.2f} GB")
        if not args.check:
            path.write_text(json.dumps({**data, "memory": memory}, indent=1) + "\n")
    for p in problems:
        print(f"stale: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
