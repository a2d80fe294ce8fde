"""The precision recipe (dcp.costmodel.precision) in torch terms, shared by the profiler and the
executor: the torch dtype of each part, the autocast context of the forward, and a check that a
model's parameters are held in the recipe's dtype."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from dcp.costmodel.precision import PrecisionRecipe, get_recipe

TORCH_DTYPES: dict[str, torch.dtype] = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16,
                                         "fp16": torch.float16}


def wide(x: torch.Tensor) -> torch.Tensor:
    """`x` in at least fp32, for the sums that lose small terms in bf16 (norms, losses); float64
    stays float64, so a float64 run is exact in every op (packing-invariant to rounding)."""
    return x if x.dtype == torch.float64 else x.float()


def torch_dtype(name: str) -> torch.dtype:
    """torch dtype of a recipe dtype name (fp32, bf16, fp16)."""
    return TORCH_DTYPES[name]


def param_dtype(recipe: str | PrecisionRecipe) -> torch.dtype:
    """The dtype a model's parameters are held in under `recipe`."""
    return TORCH_DTYPES[get_recipe(recipe).param_dtype]


def forward_autocast(recipe: str | PrecisionRecipe, device_type: str) -> contextlib.AbstractContextManager:
    """torch.autocast in the recipe's compute dtype when it differs from the parameters', else
    nothing. Casts of the weights are cached for the whole block (autocast's default), so a
    forward keeps one low-precision copy of every weight it multiplies."""
    r = get_recipe(recipe)
    if not r.autocast:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=TORCH_DTYPES[r.compute_dtype])


def check_param_dtypes(model: nn.Module, recipe: str | PrecisionRecipe) -> None:
    """A clear error when a trainable parameter is not in the recipe's parameter dtype."""
    r = get_recipe(recipe)
    want = TORCH_DTYPES[r.param_dtype]
    wrong = sorted({f"{name} ({p.dtype})" for name, p in model.named_parameters() if p.requires_grad
                    and p.dtype != want})
    if wrong:
        shown = ", ".join(wrong[:3]) + (f" and {len(wrong) - 3} more" if len(wrong) > 3 else "")
        raise ValueError(f"precision recipe {r.name!r} holds parameters in {r.param_dtype}, but {shown}; "
                         f"build the model with dtype={want} (model.to({want}))")


def recipe_for_model(model: nn.Module, device_type: str) -> PrecisionRecipe:
    """The recipe a model's parameters imply: bf16 parameters -> bf16 (fp32 master weights in the
    optimizer); fp32 parameters -> autocast-bf16 on CUDA, fp32 elsewhere; fp64 -> fp64 throughout
    (exact checks)."""
    dtypes = {p.dtype for p in model.parameters() if p.requires_grad}
    if dtypes == {torch.bfloat16}:
        return get_recipe("bf16")
    if dtypes <= {torch.float32}:
        return get_recipe("autocast-bf16" if device_type == "cuda" else "fp32")
    if dtypes == {torch.float64}:
        return PrecisionRecipe.uniform("fp64")
    raise ValueError(f"the model's parameters are {sorted(str(d) for d in dtypes)}: no precision recipe holds "
                     "them so; pass recipe= and build the model in its parameter dtype")
