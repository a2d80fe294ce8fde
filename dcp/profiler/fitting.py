"""Least-squares fitting of the cost model's linear terms, and the error measures reported with it.

Every cost-model term is linear in its coefficients (docs/design.md, "The cost model"):
time = c0 + c_tok * T + c_attn * A, all-to-all = lat + bytes / bw, and so on. We fit them
with non-negative least squares (scipy.optimize.nnls) because a negative per-token or
per-pair cost is physically meaningless and would let the planner exploit a fitting artefact.

Rows are weighted by 1/y, so the fit minimizes *relative* error: measured times span three
orders of magnitude (a 128-token micro-batch to a 128K one), and an unweighted fit would
spend all its freedom on the largest points while the planner cares about every size alike.

Pure numpy/scipy: never imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

MAPE_THRESHOLD = 0.15
"""A held-out MAPE above this is reported loudly: the planner's choices start to be wrong
when its time estimates are off by more than the gaps between candidate plans (DCP's
per-bucket decisions differ by 10-30% in step time, paper Fig. 9)."""


R2_THRESHOLD = 0.9
"""Every fitted component of a profile (forward, backward, recompute, head+loss) must explain
this share of its points' variance, or be re-measured and, still below, named in the profile
(docs/tuning-log.md)."""


class FitError(ValueError):
    """Too few or degenerate points to fit."""


@dataclass(frozen=True)
class LinearFit:
    """y ~ sum_i coef[i] * x[i], fitted on `n_points` points."""

    names: tuple[str, ...]
    coef: tuple[float, ...]
    r2: float
    """Coefficient of determination on the fitted points (unweighted)."""
    mape: float
    """Mean absolute percentage error on the fitted points, as a fraction."""
    n_points: int

    def predict(self, x: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
        """Predictions for rows of features in the order of `names`."""
        return np.asarray(x, dtype=float) @ np.asarray(self.coef)

    def as_dict(self) -> dict[str, float]:
        return dict(zip(self.names, self.coef, strict=True))


def r_squared(y: np.ndarray, y_hat: np.ndarray) -> float:
    """1 - SS_res / SS_tot; 1.0 when y is constant and matched exactly."""
    y, y_hat = np.asarray(y, float), np.asarray(y_hat, float)
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    ss_res = float(np.sum((y - y_hat) ** 2))
    if ss_tot == 0.0:
        return 1.0 if ss_res == 0.0 else 0.0
    return 1.0 - ss_res / ss_tot


def mape(y: np.ndarray, y_hat: np.ndarray) -> float:
    """Mean absolute percentage error as a fraction (0.05 = 5%)."""
    y, y_hat = np.asarray(y, float), np.asarray(y_hat, float)
    if len(y) == 0:
        raise FitError("MAPE of no points")
    if np.any(y <= 0):
        raise FitError("MAPE needs positive measurements")
    return float(np.mean(np.abs(y_hat - y) / y))


def fit_nnls(x: np.ndarray | Sequence[Sequence[float]], y: np.ndarray | Sequence[float],
             names: Sequence[str], *, weights: np.ndarray | Sequence[float] | None = None) -> LinearFit:
    """Non-negative least squares of y on the columns of x, minimizing relative error.

    `weights` defaults to 1/y (relative error); pass explicit weights when y may be zero or
    negative (a difference of two measurements). Columns that are zero on every row carry
    no information and get coefficient 0. Columns are scaled to unit norm before solving so
    that a per-pair coefficient (~1e-12 s) and a fixed one (~1e-4 s) are equally resolvable.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.ndim != 2 or x.shape[1] != len(names):
        raise FitError(f"features have shape {x.shape}, expected (n, {len(names)})")
    if x.shape[0] != y.shape[0]:
        raise FitError(f"{x.shape[0]} feature rows but {y.shape[0]} measurements")
    if x.shape[0] < x.shape[1]:
        raise FitError(f"{x.shape[0]} points cannot determine {x.shape[1]} coefficients ({', '.join(names)})")
    if weights is None:
        if np.any(y <= 0):
            raise FitError("relative weighting needs positive measurements; pass weights")
        w = 1.0 / y
    else:
        w = np.asarray(weights, dtype=float)
    xw, yw = x * w[:, None], y * w
    scale = np.linalg.norm(xw, axis=0)
    used = scale > 0
    coef = np.zeros(x.shape[1])
    if used.any():
        sol, _ = nnls(xw[:, used] / scale[used], yw)
        coef[used] = sol / scale[used]
    y_hat = x @ coef
    return LinearFit(
        names=tuple(names), coef=tuple(float(c) for c in coef), r2=r_squared(y, y_hat),
        mape=mape(y, y_hat) if np.all(y > 0) else float("nan"), n_points=int(x.shape[0]),
    )


def geometric_grid(lo: int, hi: int, factor: float = 2.0) -> list[int]:
    """lo, lo*factor, ... up to and including hi (hi is always the last point)."""
    if lo <= 0 or hi < lo or factor <= 1:
        raise FitError(f"bad grid {lo}..{hi} x{factor}")
    out, v = [], float(lo)
    while v < hi * (1 - 1e-9):
        out.append(int(round(v)))
        v *= factor
    out.append(int(hi))
    return sorted(set(out))
