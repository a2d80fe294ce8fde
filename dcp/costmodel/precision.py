"""The precision recipe: in which dtype training holds each piece of state and does its work.

One recipe is shared by the executor (which maps it to torch dtypes: dcp.executor.precision),
the profiler (which measures a model's memory in it) and `TrainingSetup` (which prices it), so
the planner's memory and traffic are those of the run. Recipes:

- ``bf16``: bf16 parameters, fp32 gradient accumulation and all-reduce, fp32 master weights and
  Adam moments held by the optimizer (ZeRO-1 shards both): the mixed-precision training of
  Micikevicius et al. (arXiv 1710.03740) with bf16, 2 + 4 + 12 bytes per parameter as in ZeRO
  (Rajbhandari et al., arXiv 1910.02054, with fp32 rather than 16-bit gradients).
- ``autocast-bf16``: fp32 parameters under torch.autocast(bf16): matmuls run in bf16 on bf16
  copies of the weights, which autocast keeps for backward; fp32 gradients, all-reduce and
  Adam moments; no separate master copy (the parameters are fp32). What torch AMP gives.
- ``fp32``: everything fp32 (CPU runs, gradient checks).

Never imports torch: dtypes are names here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dcp.costmodel.spec import CostModelError

DtypeName = Literal["fp32", "bf16", "fp16"]
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True, kw_only=True)
class PrecisionRecipe:
    """Which dtype holds parameters, gradients, the gradient reduction, activations and the
    optimizer state, and whether the optimizer keeps fp32 master weights."""

    name: str
    """The recipe's name (a key of `RECIPES`)."""
    param_dtype: DtypeName
    """The model's parameters as the forward reads them."""
    grad_dtype: DtypeName
    """The gradient accumulation buffer (accumulated over a step's micro-batches)."""
    reduce_dtype: DtypeName
    """The step's gradient all-reduce (or reduce-scatter)."""
    compute_dtype: DtypeName
    """Activations and matmul inputs; differs from param_dtype under autocast."""
    optimizer_state_dtype: DtypeName = "fp32"
    """Adam's moments."""
    optimizer_states: int = 2
    """Tensors of optimizer state per parameter (Adam: first and second moment)."""
    master_weights: bool = False
    """The optimizer keeps an fp32 copy of parameters held in a lower precision and steps it."""
    description: str = ""

    def __post_init__(self) -> None:
        for f in ("param_dtype", "grad_dtype", "reduce_dtype", "compute_dtype", "optimizer_state_dtype"):
            if getattr(self, f) not in DTYPE_BYTES:
                raise CostModelError(f"recipe {self.name!r}: {f} must be one of {sorted(DTYPE_BYTES)}, "
                                     f"got {getattr(self, f)!r}")
        if self.optimizer_states < 0:
            raise CostModelError(f"recipe {self.name!r}: optimizer_states must be >= 0, got {self.optimizer_states}")
        if self.master_weights and self.param_dtype == "fp32":
            raise CostModelError(f"recipe {self.name!r}: fp32 parameters need no fp32 master copy")

    @property
    def param_bytes(self) -> int:
        """Bytes per parameter element."""
        return DTYPE_BYTES[self.param_dtype]

    @property
    def grad_bytes(self) -> int:
        """Bytes per gradient element in the accumulation buffer."""
        return DTYPE_BYTES[self.grad_dtype]

    @property
    def reduce_bytes(self) -> int:
        """Bytes per gradient element the all-reduce / reduce-scatter moves."""
        return DTYPE_BYTES[self.reduce_dtype]

    @property
    def compute_bytes(self) -> int:
        """Bytes per activation element (and per element of the all-to-alls)."""
        return DTYPE_BYTES[self.compute_dtype]

    @property
    def optimizer_state_bytes_per_param(self) -> int:
        """Optimizer state per parameter, master weights not included (Adam fp32: 8)."""
        return self.optimizer_states * DTYPE_BYTES[self.optimizer_state_dtype]

    @property
    def master_weight_bytes_per_param(self) -> int:
        """The fp32 master copy per parameter; 0 when the parameters are themselves fp32."""
        return 4 if self.master_weights else 0

    @property
    def autocast(self) -> bool:
        """The forward computes in a dtype other than the parameters', so it casts weights."""
        return self.compute_dtype != self.param_dtype


RECIPES: dict[str, PrecisionRecipe] = {r.name: r for r in (
    PrecisionRecipe(name="bf16", param_dtype="bf16", grad_dtype="fp32", reduce_dtype="fp32", compute_dtype="bf16",
                    master_weights=True,
                    description="bf16 parameters; fp32 gradients, all-reduce, master weights and Adam moments"),
    PrecisionRecipe(name="autocast-bf16", param_dtype="fp32", grad_dtype="fp32", reduce_dtype="fp32",
                    compute_dtype="bf16",
                    description="fp32 parameters under torch.autocast(bf16); fp32 gradients, all-reduce and Adam"),
    PrecisionRecipe(name="fp32", param_dtype="fp32", grad_dtype="fp32", reduce_dtype="fp32", compute_dtype="fp32",
                    description="fp32 everywhere"),
)}


def get_recipe(recipe: str | PrecisionRecipe) -> PrecisionRecipe:
    """The recipe of that name (or the recipe itself), with a clear error for an unknown name."""
    if isinstance(recipe, PrecisionRecipe):
        return recipe
    if recipe not in RECIPES:
        raise CostModelError(f"unknown precision recipe {recipe!r}; known: {', '.join(RECIPES)}")
    return RECIPES[recipe]
