"""From measured points to a `LayerFit`: the cost model's per-layer and per-micro-batch terms.

Per layer at SP size 1 (docs/design.md, "The cost model"), each of forward, backward and recompute:

    t(T, A) = fixed + per_token * T + per_pair * A         T tokens, A attention pairs

fitted by non-negative least squares on the grid points. Recompute is the extra time a
checkpointed layer costs over a plain one: ckpt_s - (fwd_s + bwd_s) of each point, measured (its
forward runs without saving; its backward re-runs the forward first). Outside the layers, the
model with no layers gives the embedding/head/loss cost and the micro-batch's fixed cost:
M = fixed + per_token * T.

Every component's fit must explain at least `R2_THRESHOLD` of its points' variance; the profiler
re-measures a component below it on a denser grid with more repeats (dcp.profiler.profile), and
`LayerFitReport.below_threshold` names what still fails.

The fit is judged on held-out micro-batches (random mixed packings never fitted on), both
plain and checkpointed: `heldout_mape` is the mean relative error of the predicted layer
time (fwd + bwd, + recompute when checkpointed) against the measured one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dcp.costmodel import LayerFit
from dcp.profiler.compute import LayerPoint, ModelPoint
from dcp.profiler.fitting import R2_THRESHOLD, FitError, LinearFit, fit_nnls, mape

TERMS = ("fixed", "per_token", "per_pair")
COMPONENTS = ("forward", "backward", "recompute", "head+loss")
"""The fitted components, as the profile names them (the head's fit holds the micro-batch's
fixed cost: its intercept)."""
LAYER_COMPONENTS = COMPONENTS[:3]
"""Fitted on the layer grid (re-measuring one re-measures the grid); the head on the model
without layers."""


def _features(points: Sequence[LayerPoint]) -> np.ndarray:
    return np.array([[1.0, p.tokens, p.attn_pairs] for p in points])


@dataclass(frozen=True)
class LayerFitReport:
    """A fitted `LayerFit` and the evidence for it (stored in the profile's meta)."""

    fit: LayerFit
    fwd: LinearFit
    bwd: LinearFit
    rec: LinearFit
    head: LinearFit | None
    heldout: list[dict[str, float]]
    """Held-out micro-batches: tokens, pairs, ckpt (0/1), predicted_s, measured_s."""
    heldout_mape: float
    diagnostics: dict[str, float]
    """Not part of the fit: see `per_sample_diagnostic`."""

    def components(self) -> dict[str, LinearFit | None]:
        return dict(zip(COMPONENTS, (self.fwd, self.bwd, self.rec, self.head), strict=True))

    def below_threshold(self, threshold: float = R2_THRESHOLD) -> dict[str, float]:
        """Component -> R^2 of every fitted component whose R^2 is below `threshold` (a NaN
        fails too); a component not measured (no model: no head) is not judged."""
        return {name: f.r2 for name, f in self.components().items() if f is not None and not f.r2 >= threshold}

    def to_meta(self, points: Sequence[LayerPoint], model_points: Sequence[ModelPoint]) -> dict[str, Any]:
        """Raw points, coefficients, R^2 and errors, JSON-ready."""
        def lin(f: LinearFit | None) -> dict[str, Any] | None:
            return None if f is None else {"coef": f.as_dict(), "r2": f.r2, "fit_mape": f.mape, "points": f.n_points}

        return {
            "fwd": lin(self.fwd), "bwd": lin(self.bwd), "recompute": lin(self.rec), "head": lin(self.head),
            "heldout_mape": self.heldout_mape, "heldout": self.heldout, "diagnostics": self.diagnostics,
            "points": [asdict(p) for p in points], "model_points": [asdict(p) for p in model_points],
        }


def fit_compute(points: Sequence[LayerPoint]) -> tuple[LinearFit, LinearFit, LinearFit]:
    """Forward, backward and recompute coefficients [fixed, per_token, per_pair]."""
    x = _features(points)
    fwd = fit_nnls(x, [p.fwd_s for p in points], TERMS)
    bwd = fit_nnls(x, [p.bwd_s for p in points], TERMS)
    # The recompute target is each point's measured difference (not the residual of the two
    # fits, which would carry their shape errors into it) and may dip below zero on a noisy
    # point; weight by the checkpointed time itself, so the error is still relative.
    ckpt = np.array([p.ckpt_s for p in points])
    rec = fit_nnls(x, [p.ckpt_s - p.fwd_s - p.bwd_s for p in points], TERMS, weights=1.0 / ckpt)
    return fwd, bwd, rec


def fit_head(model_points: Sequence[ModelPoint]) -> LinearFit | None:
    """Embedding/head/loss time M(T) = fixed + per_token * T, from the model without layers;
    `fixed` is the micro-batch's fixed cost outside its layers. None without such points."""
    rows = [p for p in model_points if p.layers == 0]
    if len(rows) < 3:
        return None
    return fit_nnls([[1.0, p.tokens] for p in rows], [p.seconds for p in rows], ("fixed", "per_token"))


def activation_bytes(points: Sequence[LayerPoint]) -> tuple[float, float]:
    """(act_full, act_ckpt) bytes per token: the largest per-token value over the upper half of
    the token grid. Memory is a hard limit (an underestimate means out-of-memory), so we take the
    maximum rather than a fit; the small points are left out because fixed buffers (RoPE tables,
    segment ids) inflate their per-token figure."""
    median = float(np.median([p.tokens for p in points]))
    upper = [p for p in points if p.tokens >= median]
    return (max(p.act_bytes / p.tokens for p in upper), max(p.ckpt_act_bytes / p.tokens for p in upper))


def head_bytes(model_points: Sequence[ModelPoint], act_full: float) -> float:
    """Bytes per token of the 1-layer model beyond its one layer's activations (logits, loss)."""
    ones = [p for p in model_points if p.layers == 1]
    if not ones:
        return 0.0
    median = float(np.median([p.tokens for p in ones]))
    return max(0.0, max(p.act_bytes / p.tokens - act_full for p in ones if p.tokens >= median))


def predict_layer(fit: LayerFit, tokens: float, pairs: float, ckpt: bool) -> float:
    """One layer's time at SP 1: fwd + bwd, plus the recompute when checkpointed."""
    fwd = fit.fwd_fixed_s + fit.fwd_per_token_s * tokens + fit.fwd_per_pair_s * pairs
    bwd = fit.bwd_fixed_s + fit.bwd_per_token_s * tokens + fit.bwd_per_pair_s * pairs
    if not ckpt:
        return fwd + bwd
    rec_fixed, rec_tok, rec_pair = fit.recompute_coefficients()
    return fwd + bwd + rec_fixed + rec_tok * tokens + rec_pair * pairs


def heldout_rows(fit: LayerFit, heldout: Sequence[LayerPoint]) -> list[dict[str, float]]:
    """Predicted vs measured layer time of every held-out point, plain and checkpointed."""
    rows = []
    for p in heldout:
        for ckpt, measured in ((0, p.train_s), (1, p.ckpt_s)):
            rows.append({"tokens": p.tokens, "attn_pairs": p.attn_pairs, "samples": p.num_samples,
                         "ckpt": ckpt, "predicted_s": predict_layer(fit, p.tokens, p.attn_pairs, bool(ckpt)),
                         "measured_s": measured})
    return rows


def per_sample_diagnostic(points: Sequence[LayerPoint], heldout: Sequence[LayerPoint]) -> dict[str, float]:
    """What a per-sample term would add: the cost model prices (T, A) only, yet a layer that
    loops over samples (per-sample attention calls) pays for each one. Fits fwd+bwd on
    [1, T, A, samples] and reports that coefficient and the held-out MAPE with and without it;
    a large gap says the layer is not linear in (T, A) alone. Recorded, not used."""
    names = (*TERMS, "per_sample")
    if len(points) < len(names) or not heldout:
        return {}
    def x(pts: Sequence[LayerPoint]) -> np.ndarray:
        return np.array([[1.0, p.tokens, p.attn_pairs, p.num_samples] for p in pts])

    y, y_held = [p.train_s for p in points], [p.train_s for p in heldout]
    with_s = fit_nnls(x(points), y, names)
    without = fit_nnls(x(points)[:, :3], y, TERMS)
    return {"per_sample_s": with_s.coef[3],
            "heldout_train_mape_with_per_sample": mape(y_held, with_s.predict(x(heldout))),
            "heldout_train_mape_without": mape(y_held, without.predict(x(heldout)[:, :3]))}


def fit_layer(points: Sequence[LayerPoint], model_points: Sequence[ModelPoint],
              heldout: Sequence[LayerPoint]) -> LayerFitReport:
    """Fit every coefficient of a `LayerFit` and score it on the held-out points."""
    if len(points) < 4:
        raise FitError(f"{len(points)} layer points are too few to fit 3 coefficients and judge them")
    fwd, bwd, rec = fit_compute(points)
    head = fit_head(model_points)
    act_full, act_ckpt = activation_bytes(points)
    f, b, r = fwd.coef, bwd.coef, rec.coef
    fit = LayerFit(
        fwd_fixed_s=f[0], fwd_per_token_s=f[1], fwd_per_pair_s=f[2],
        bwd_fixed_s=b[0], bwd_per_token_s=b[1], bwd_per_pair_s=b[2],
        rec_fixed_s=r[0], rec_per_token_s=r[1], rec_per_pair_s=r[2],
        act_full_bytes_per_token=act_full, act_ckpt_bytes_per_token=act_ckpt,
        head_per_token_s=head.coef[1] if head else 0.0,
        microbatch_fixed_s=head.coef[0] if head else 0.0,
        head_bytes_per_token=head_bytes(model_points, act_full),
        max_fitted_tokens=max(p.tokens for p in points),
    )
    rows = heldout_rows(fit, heldout)
    err = mape([r["measured_s"] for r in rows], [r["predicted_s"] for r in rows]) if rows else float("nan")
    fit = LayerFit(**{**asdict(fit), "heldout_mape": err})
    return LayerFitReport(fit, fwd, bwd, rec, head, rows, err, per_sample_diagnostic(points, heldout))
