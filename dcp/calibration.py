"""The cost model against the measurements a profile stores, term by term.

A profile from `dcp profile` keeps, besides its fitted `LayerFit`, the raw points it was fitted
on (`meta["fits"][model]`: layer grid points, 1- and 2-layer model points, held-out points).
Here each measurement is set beside two predictions made through the public `CostModel`:

- fitted:  the profile's least-squares coefficients (what the planner uses);
- derived: the coefficients `CostModel` derives from FLOPs and bytes when no fit exists
  (docs/design.md, "The cost model"), priced with the profile's own device numbers
  (matmul and attention FLOP/s, memory bandwidth, kernel overhead and launch cost).

The gap between the two is how far first principles get on this machine; the gap between fitted
and measured is the error the planner lives with. Reads JSON only: never imports torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dcp.costmodel import (
    Cluster,
    CostModel,
    CostModelError,
    HardwareProfile,
    LayerFit,
    ModelSpec,
    load_model,
    preset_names,
)
from dcp.profiler.fitting import mape, r_squared

PREDICTIONS = ("fitted", "derived")

# How CostModel derives each LayerFit term without a measurement (CostModel._derive_fit).
DERIVATIONS: dict[str, str] = {
    "fwd_fixed_s": "kernel_overhead_s + the layer's weight casts (autocast) over memory bandwidth + its matmuls "
                   "over matmul_tokens_offset tokens (small-M GEMMs)",
    "fwd_per_token_s": "2 x matmul weights / matmul FLOP/s + the layer's elementwise bytes (counted op by op, "
                       "eager or compiled: dcp.costmodel.elementwise) / memory bandwidth + attention's "
                       "short-sequence pairs per token",
    "fwd_per_pair_s": "4 h FLOPs (QK^T and PV) / attention forward FLOP/s",
    "bwd_fixed_s": "2 x kernel_overhead_s + gradient casts and accumulation over memory bandwidth + 2 x the "
                   "forward's small-M GEMM offset",
    "bwd_per_token_s": "2 x forward matmul (grad of input and of weight) + the backward's counted elementwise "
                       "bytes / memory bandwidth + attention's backward short-sequence term",
    "bwd_per_pair_s": "2.5 x 4 h FLOPs / attention backward FLOP/s (FlashAttention-2 backward; the causal "
                      "backward's rate for a causal model where the profile has one)",
    "rec_fixed_s": "kernel_overhead_s + the weight casts and the GEMM offset again",
    "rec_per_token_s": "= forward",
    "rec_per_pair_s": "= forward",
    "act_full_bytes_per_token": "measured: saved-tensor accounting of the model (its memory footprint)",
    "act_ckpt_bytes_per_token": "measured: the checkpointed layer's input (its memory footprint)",
    "head_per_token_s": "6 h vocab / matmul FLOP/s (LM head forward + backward) + the loss's bytes over the "
                        "vocabulary (logits upcast to fp32, or a fused kernel) / memory bandwidth",
    "head_bytes_per_token": "measured: the peak's working memory per token (its memory footprint)",
    "microbatch_fixed_s": "embedding, LM head and final norm weight traffic (casts, accumulation) + the LM "
                          "head's small-M GEMM offset",
}


def fit_meta(profile: HardwareProfile, model: str) -> dict[str, Any]:
    """The raw measurements stored for `model`, with a clear error when there are none."""
    meta = profile.meta.get("fits", {}).get(model)
    if not meta or not meta.get("points"):
        raise CostModelError(f"profile {profile.name!r} stores no measurements of {model!r}; "
                             f"run `dcp profile --model {model}` to make one")
    return meta


def model_spec(profile: HardwareProfile, model: str) -> ModelSpec:
    """The model spec the profile measured (stored with its fit), else the preset of that name."""
    stored = fit_meta(profile, model).get("model")
    if not stored:
        return load_model(model)
    spec = ModelSpec.from_dict(stored)
    if not spec.memory and spec.name in preset_names("models"):
        # Profiles older than measured footprints: the preset's, checked against the shape where used.
        spec = dataclasses.replace(spec, memory=load_model(spec.name).memory)
    return spec


def cost_models(profile: HardwareProfile, model: str, num_layers: int | None = None) -> dict[str, CostModel]:
    """{"fitted", "derived"} cost models of `model` on one GPU of the profile's device.

    `num_layers` overrides the depth (the profile measured 1- and 2-layer models)."""
    if model not in profile.fits:
        raise CostModelError(f"profile {profile.name!r} has no fit for {model!r}")
    spec = model_spec(profile, model)
    if num_layers is not None:
        spec = dataclasses.replace(spec, num_layers=num_layers)
    cluster = Cluster(num_gpus=1, gpus_per_node=1, memory_bytes=profile.memory_bytes)
    unfitted = dataclasses.replace(profile, fits={k: v for k, v in profile.fits.items() if k != model})
    return {"fitted": CostModel(spec, profile, cluster), "derived": CostModel(spec, unfitted, cluster)}


def terms(profile: HardwareProfile, model: str) -> Any:
    """One row per LayerFit term (pandas DataFrame): derived value, fitted value, their ratio,
    and how the derived one is computed."""
    import pandas as pd

    cms = cost_models(profile, model)
    fitted, derived = cms["fitted"].fit, cms["derived"].fit
    rows = []
    for name, how in DERIVATIONS.items():
        f, d = _term(fitted, name), _term(derived, name)
        rows.append({"term": name, "derived": d, "fitted": f, "fitted / derived": f / d if d else float("nan"),
                     "derivation": how})
    return pd.DataFrame(rows)


def _term(fit: LayerFit, name: str) -> float:
    if name.startswith("rec_"):  # None in a fit means "same as the forward"
        return dict(zip(("rec_fixed_s", "rec_per_token_s", "rec_per_pair_s"), fit.recompute_coefficients(),
                        strict=True))[name]
    return float(getattr(fit, name))


def layer_points(profile: HardwareProfile, model: str) -> Any:
    """Every measured layer time beside both predictions (pandas DataFrame).

    Columns: set (grid: fitted on; heldout: never fitted on), phase (forward, backward,
    checkpointed = forward without saving + recompute + backward, train = forward + backward),
    tokens, attn_pairs, measured_s, fitted_s, derived_s."""
    import pandas as pd

    meta, cms = fit_meta(profile, model), cost_models(profile, model)
    rows = []
    for p in meta["points"]:
        phases = {"forward": p["fwd_s"], "backward": p["bwd_s"], "checkpointed": p["ckpt_s"]}
        for phase, measured in phases.items():
            rows.append({"set": "grid", "phase": phase, "tokens": p["tokens"], "attn_pairs": p["attn_pairs"],
                         "measured_s": measured,
                         **{f"{k}_s": _layer_s(cm, phase, p["tokens"], p["attn_pairs"]) for k, cm in cms.items()}})
    for h in meta.get("heldout", []):
        phase = "checkpointed" if h["ckpt"] else "train"
        rows.append({"set": "heldout", "phase": phase, "tokens": h["tokens"], "attn_pairs": h["attn_pairs"],
                     "measured_s": h["measured_s"],
                     **{f"{k}_s": _layer_s(cm, phase, h["tokens"], h["attn_pairs"]) for k, cm in cms.items()}})
    return pd.DataFrame(rows)


def _layer_s(cm: CostModel, phase: str, tokens: int, pairs: int) -> float:
    """One layer's time at SP size 1 as the cost model splits it (CostModel.layer_times)."""
    lt = cm.layer_times(tokens, pairs, 1)
    return {"forward": lt.fwd_compute_s, "backward": lt.bwd_compute_s, "train": lt.fwd_compute_s + lt.bwd_compute_s,
            "checkpointed": lt.fwd_compute_s + lt.rec_compute_s + lt.bwd_compute_s}[phase]


def model_points(profile: HardwareProfile, model: str) -> Any:
    """Whole 1- and 2-layer models (embedding, head and loss included): measured beside
    `CostModel.time_s` of a model that deep (pandas DataFrame, like `layer_points`). The model
    without layers, which the head is fitted on, is left out (a model spec has a layer)."""
    import pandas as pd

    rows = []
    for p in fit_meta(profile, model).get("model_points", []):
        if p["layers"] == 0:
            continue
        cms = cost_models(profile, model, num_layers=p["layers"])
        rows.append({"set": "model", "phase": f"{p['layers']}-layer model", "tokens": p["tokens"],
                     "attn_pairs": p["attn_pairs"], "measured_s": p["seconds"],
                     **{f"{k}_s": cm.time_s(p["tokens"], p["attn_pairs"], 1, p["ckpt_layers"]) for k, cm in cms.items()}})
    return pd.DataFrame(rows)


def memory_points(profile: HardwareProfile, model: str) -> Any:
    """Activation bytes per token a layer keeps, measured beside both fits, plain and checkpointed."""
    import pandas as pd

    fits = {k: cm.fit for k, cm in cost_models(profile, model).items()}
    rows = []
    for p in fit_meta(profile, model)["points"]:
        for kind, measured, attr in (("full", p["act_bytes"], "act_full_bytes_per_token"),
                                     ("checkpointed", p["ckpt_act_bytes"], "act_ckpt_bytes_per_token")):
            rows.append({"kind": kind, "tokens": p["tokens"], "measured_bytes_per_token": measured / p["tokens"],
                         **{f"{k}_bytes_per_token": getattr(f, attr) for k, f in fits.items()}})
    return pd.DataFrame(rows)


def error_table(points: Any) -> Any:
    """Per (set, phase): points, MAPE and R^2 of each prediction, worst relative error (DataFrame)."""
    import pandas as pd

    rows = []
    for (s, phase), g in points.groupby(["set", "phase"], sort=False):
        row: dict[str, Any] = {"set": s, "phase": phase, "points": len(g)}
        for k in PREDICTIONS:
            row[f"{k} MAPE"] = mape(g["measured_s"], g[f"{k}_s"])
            row[f"{k} R^2"] = r_squared(g["measured_s"], g[f"{k}_s"])
        row["fitted worst error"] = float(((g["fitted_s"] - g["measured_s"]) / g["measured_s"]).abs().max())
        rows.append(row)
    return pd.DataFrame(rows)
