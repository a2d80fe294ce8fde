"""What one micro-batch of a model holds beyond the training state, measured from the model itself.

A `MemoryFootprint` is the measured answer for one model shape in one precision recipe
(dcp.profiler.memory counts it: the tensors autograd saves for backward, and the peak of live
tensors over a whole forward and backward, on fake tensors at real shapes). Per GPU, for a
micro-batch of T tokens at SP size p with r of the model's K layers checkpointed:

    memory = training state (TrainingSetup.static_bytes)
             + weight copies (autocast's low-precision copies of the weights, held through the forward)
             + working_fixed
             + ((K - r) * act_full + r * act_ckpt + working) * T / p

`working` is what the peak adds per token on top of the layers' saved activations: the larger
of the logits/loss peak and one layer's backward (with its recompute when checkpointed).

Never imports torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from dcp.costmodel.precision import PrecisionRecipe
from dcp.costmodel.spec import CostModelError, ModelSpec, _from_dict

if TYPE_CHECKING:
    from dcp.costmodel.hardware import LayerFit

SHAPE_FIELDS = ("hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "attention", "mlp", "cross_attention",
                "tied_embeddings")
"""ModelSpec fields a footprint depends on (the depth does not: its figures are per layer)."""


def shape_of(spec: ModelSpec) -> dict[str, Any]:
    """The part of a model's shape its footprint depends on."""
    return {f: getattr(spec, f) for f in SHAPE_FIELDS}


@dataclass(frozen=True, kw_only=True)
class MemoryFootprint:
    """Measured memory of one model shape in one precision recipe (bytes; per token per GPU)."""

    recipe: str
    """The precision recipe it was measured in (dcp.costmodel.precision.RECIPES)."""
    act_full_bytes_per_token: float
    """Saved for backward by one non-checkpointed layer, per token (weight copies excluded)."""
    act_ckpt_bytes_per_token: float
    """Kept by one checkpointed layer, per token: its input, for the recompute."""
    working_bytes_per_token: float
    """Peak beyond the saved activations, per token: max of `head_bytes_per_token` and
    `layer_working_bytes_per_token`."""
    working_fixed_bytes: float = 0.0
    """The token-independent part of that peak (a weight's gradient before it is accumulated,
    position tables): per micro-batch, per GPU."""
    head_bytes_per_token: float = 0.0
    """Logits/loss peak per token (embedding, final norm, LM head, loss, forward and backward)."""
    layer_working_bytes_per_token: float = 0.0
    """One layer's backward working set (its recompute included when checkpointed), per token."""
    weight_copy_bytes_per_layer: float = 0.0
    """Autocast's low-precision copies of one layer's weights, kept from the forward for the
    backward (0 when the recipe does not autocast)."""
    weight_copy_bytes_outside: float = 0.0
    """The same for the weights outside the layers (LM head, projections)."""
    shape: dict[str, Any] = field(default_factory=dict)
    """The model shape it was measured on (`shape_of`); empty: not checked."""
    how: str = ""
    """How it was obtained (tool, attention kernel stand-in, token counts, torch version)."""

    def __post_init__(self) -> None:
        for f in ("act_full_bytes_per_token", "act_ckpt_bytes_per_token", "working_bytes_per_token",
                  "working_fixed_bytes", "head_bytes_per_token", "layer_working_bytes_per_token",
                  "weight_copy_bytes_per_layer", "weight_copy_bytes_outside"):
            if not getattr(self, f) >= 0:
                raise CostModelError(f"memory footprint ({self.recipe}): {f} must be >= 0, got {getattr(self, f)}")

    def weight_copy_bytes(self, num_layers: int) -> float:
        """Weight copies of a model of `num_layers` layers (all held at the end of the forward)."""
        return num_layers * self.weight_copy_bytes_per_layer + self.weight_copy_bytes_outside

    def check_shape(self, spec: ModelSpec) -> None:
        """A clear error when this footprint was measured on a different shape than `spec`."""
        if not self.shape:
            return
        want = shape_of(spec)
        diff = {k: (self.shape.get(k), v) for k, v in want.items() if k in self.shape and self.shape[k] != v}
        if diff:
            shown = ", ".join(f"{k} {a!r} (spec has {b!r})" for k, (a, b) in diff.items())
            raise CostModelError(f"model {spec.name!r}: its {self.recipe} memory footprint was measured on another "
                                 f"shape: {shown}; re-measure it (dcp.profiler.memory)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryFootprint:
        return _from_dict(cls, d, "memory footprint")


def has_footprint(spec: ModelSpec, recipe: str, fit: LayerFit | None = None) -> bool:
    """Whether `footprint_for` finds a measured footprint of `spec` in `recipe` (its shape unchecked)."""
    return (fit is not None and fit.memory is not None and fit.memory.recipe == recipe) or recipe in spec.memory


def footprint_for(spec: ModelSpec, recipe: PrecisionRecipe, fit: LayerFit | None = None) -> MemoryFootprint:
    """The measured footprint of `spec` in `recipe`: the one a profile's fit carries (measured with
    it), else the spec's own (presets carry one per recipe); a clear error when neither exists."""
    fp = fit.memory if fit is not None and fit.memory is not None and fit.memory.recipe == recipe.name else None
    fp = fp or spec.memory.get(recipe.name)
    if fp is None:
        from dcp.costmodel.presets import presets_of_shape

        have = ", ".join(spec.memory) or "none"
        same = presets_of_shape(spec)
        raise CostModelError(
            f"model {spec.name!r} has no measured memory footprint for precision recipe {recipe.name!r} (it has: "
            f"{have}); for a model JSON, `dcp measure-memory MODEL.json` measures every recipe (dcp plan, compare "
            "and profile do it themselves); in Python, dcp.profiler.memory.reference_footprint(spec, "
            f"{recipe.name!r}) (a transformers model: dcp.executor.hf_memory.measured_model_spec)"
            + (f"; the preset {' and '.join(same)} has this shape and its footprints" if same else ""))
    fp.check_shape(spec)
    return fp
