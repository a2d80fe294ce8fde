"""Refit a profile's compute coefficients from micro-batch times the executor measured.

A training run measures whole micro-batches (K layers, r recomputed, head, all-to-alls), not
separate forwards and backwards, so fwd, bwd and recompute cannot be told apart from them.
What can be learned is how far each *term* is off: the profile's prediction of a micro-batch

    time = fixed(r) + per_token(r) * T/p + per_pair(r) * A/p + comm(T, p)

has three compute parts, and we fit one scale factor per part (NNLS, relative error) to the
measured times minus the predicted communication. Every coefficient of a part is multiplied by
its factor, which keeps the profiled fwd : bwd : recompute ratios and moves the totals to what
the executor saw. A part no measurement exercises (e.g. no attention pairs) keeps factor 1.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace

import numpy as np

from dcp.costmodel import Cluster, CostModel, HardwareProfile, LayerFit, ModelSpec, load_model
from dcp.profiler.fitting import FitError, fit_nnls, mape

MIN_MEASUREMENTS = 3


@dataclass(frozen=True)
class MicroBatchMeasurement:
    """One executed micro-batch, as the executor reports it (map its StepStats to these)."""

    tokens: int
    """Tokens of the whole micro-batch (all SP ranks together)."""
    attn_pairs: int
    """Attention pairs of its samples (dcp.costmodel.attention_pairs, summed)."""
    sp: int
    """SP group size it ran on."""
    ckpt_layers: int
    measured_s: float
    """Wall time of its forward and backward on its group."""

    def __post_init__(self) -> None:
        if self.tokens <= 0 or self.attn_pairs < 0 or self.sp < 1 or self.ckpt_layers < 0:
            raise ValueError(f"invalid micro-batch measurement {self}")
        if not self.measured_s > 0:
            raise ValueError(f"measured time must be positive, got {self.measured_s}")


def _parts(cm: CostModel, m: MicroBatchMeasurement) -> tuple[np.ndarray, float]:
    """(compute parts [fixed, per-token, per-pair] in seconds, communication seconds) predicted."""
    f, k, r, p = cm.fit, cm.model.num_layers, m.ckpt_layers, m.sp
    rf, rt, rp = f.recompute_coefficients()
    fixed = k * (f.fwd_fixed_s + f.bwd_fixed_s) + r * rf + f.microbatch_fixed_s
    per_tok = (k * (f.fwd_per_token_s + f.bwd_per_token_s) + r * rt + f.head_per_token_s) * m.tokens / p
    per_pair = (k * (f.fwd_per_pair_s + f.bwd_per_pair_s) + r * rp) * m.attn_pairs / p
    # Each layer's forward and backward all-to-alls, plus the recompute's forward ones again.
    comm = (2 * k + r) * cm.layer_times(m.tokens, m.attn_pairs, p).comm_s
    return np.array([fixed, per_tok, per_pair]), comm


def _scaled(fit: LayerFit, s: np.ndarray) -> LayerFit:
    """Every coefficient of the fixed / per-token / per-pair part times its factor."""
    rf, rt, rp = fit.recompute_coefficients()
    return replace(
        fit,
        fwd_fixed_s=fit.fwd_fixed_s * s[0], bwd_fixed_s=fit.bwd_fixed_s * s[0], rec_fixed_s=rf * s[0],
        microbatch_fixed_s=fit.microbatch_fixed_s * s[0],
        fwd_per_token_s=fit.fwd_per_token_s * s[1], bwd_per_token_s=fit.bwd_per_token_s * s[1],
        rec_per_token_s=rt * s[1], head_per_token_s=fit.head_per_token_s * s[1],
        fwd_per_pair_s=fit.fwd_per_pair_s * s[2], bwd_per_pair_s=fit.bwd_per_pair_s * s[2], rec_per_pair_s=rp * s[2],
    )


def _model_of(profile: HardwareProfile, model: ModelSpec | str | None) -> ModelSpec:
    """The spec to refit: given, or the one `dcp profile` stored with the (only) fit."""
    if isinstance(model, ModelSpec):
        return model
    name = model
    if name is None:
        if len(profile.fits) != 1:
            raise FitError(f"profile {profile.name!r} has fits for {sorted(profile.fits)}: say which model to refit")
        name = next(iter(profile.fits))
    stored = profile.meta.get("fits", {}).get(name, {}).get("model")
    return ModelSpec.from_dict(stored) if stored else load_model(name)


def refit(profile: HardwareProfile, step_stats: Iterable[MicroBatchMeasurement],
          model: ModelSpec | str | None = None) -> HardwareProfile:
    """A copy of `profile` whose fit for `model` matches the measured micro-batches.

    `model` defaults to the profile's only fitted model (its spec as `dcp profile` stored it).
    The model's fit must exist (profile first); the MAPE before and after, the factors and the
    measurements are recorded in meta["refits"]."""
    stats = list(step_stats)
    model = _model_of(profile, model)
    if len(stats) < MIN_MEASUREMENTS:
        raise FitError(f"refit needs at least {MIN_MEASUREMENTS} micro-batch measurements, got {len(stats)}")
    if model.name not in profile.fits:
        raise FitError(f"profile {profile.name!r} has no fit for {model.name!r} to refit; profile it first")
    # Only the node size matters here (it decides intra- vs inter-node all-to-all bandwidth).
    cluster = Cluster(num_gpus=max(m.sp for m in stats), gpus_per_node=profile.gpus_per_node,
                      memory_bytes=profile.memory_bytes)
    cm = CostModel(model, profile, cluster)
    rows = [_parts(cm, m) for m in stats]
    x = np.array([r[0] for r in rows])
    comm = np.array([r[1] for r in rows])
    y = np.array([m.measured_s for m in stats])
    before = mape(y, x.sum(axis=1) + comm)
    # Relative weights by the measured time; the target (time minus predicted comm) may be small.
    factors = np.array(fit_nnls(x, y - comm, ("fixed", "per_token", "per_pair"), weights=1.0 / y).coef)
    unused = ~np.any(x > 0, axis=0)
    factors[unused] = 1.0
    new_fit = _scaled(cm.fit, factors)
    after = mape(y, x @ factors + comm)
    new_fit = replace(new_fit, heldout_mape=after)
    record = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "model": model.name,
              "factors": dict(zip(("fixed", "per_token", "per_pair"), factors.tolist(), strict=True)),
              "mape_before": before, "mape_after": after, "measurements": [asdict(m) for m in stats]}
    meta = {**profile.meta, "refits": [*profile.meta.get("refits", []), record]}
    sources = {**profile.sources, f"fits.{model.name}": f"refitted {record['date']} on {len(stats)} executor "
               f"micro-batches (in-sample MAPE {before:.1%} -> {after:.1%})"}
    return replace(profile, fits={**profile.fits, model.name: new_fit}, meta=meta, sources=sources)
