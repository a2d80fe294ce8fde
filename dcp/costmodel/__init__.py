"""The cost model: time and memory of one micro-batch, the contract between profiler and planner.

spec.py         ModelSpec, attention_pairs: what is priced
precision.py    PrecisionRecipe, RECIPES: the dtypes training holds and computes in
hardware.py     HardwareProfile, LayerFit, TrainingSetup, Cluster: what it runs on
collectives.py  CollectiveCurve: collectives priced from bus bandwidth against message size
schema.py       profile schema versions and the migration of older profiles
traffic.py      per-micro-batch weight traffic: autocast casts, gradient accumulation
ring.py         SP layouts (Ulysses x ring) and ring attention's terms: steps, transfers, memory
model.py        CostModel: time and memory of a micro-batch (the formulas, derived)
presets.py      shipped presets and profile files

Never imports torch.
"""

from dcp.costmodel.collectives import COLLECTIVES, CollectiveCurve, bus_factor, group_shape
from dcp.costmodel.hardware import (
    PROFILE_SCHEMA_VERSION,
    Cluster,
    HardwareProfile,
    LayerFit,
    TrainingSetup,
)
from dcp.costmodel.model import CostModel, LayerTimes, LinearCost
from dcp.costmodel.precision import DTYPE_BYTES, RECIPES, PrecisionRecipe, get_recipe
from dcp.costmodel.presets import (
    DATASHEET_H200,
    DEFAULT_HARDWARE,
    DEFAULT_MODEL,
    MEASURED_H200,
    load_hardware,
    load_model,
    preset_names,
    save_hardware,
)
from dcp.costmodel.ring import SPLayout, sp_layouts
from dcp.costmodel.spec import (
    ATTENTION_KINDS,
    AttentionKind,
    CostModelError,
    ModelSpec,
    attention_pairs,
)

__all__ = [
    "ATTENTION_KINDS", "COLLECTIVES", "DATASHEET_H200", "DTYPE_BYTES", "RECIPES", "DEFAULT_HARDWARE", "DEFAULT_MODEL",
    "MEASURED_H200", "PROFILE_SCHEMA_VERSION",
    "AttentionKind", "Cluster", "CollectiveCurve", "CostModel", "CostModelError",
    "HardwareProfile", "LayerFit", "LayerTimes", "LinearCost", "ModelSpec", "PrecisionRecipe", "SPLayout",
    "TrainingSetup",
    "attention_pairs", "bus_factor", "get_recipe", "group_shape", "load_hardware", "load_model", "preset_names",
    "save_hardware", "sp_layouts",
]
