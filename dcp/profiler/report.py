"""Rich tables of a profile's fit and of a validation, for the CLI and the GPU script."""

from __future__ import annotations

from rich.panel import Panel
from rich.table import Table

from dcp.costmodel import HardwareProfile
from dcp.profiler.fitting import MAPE_THRESHOLD
from dcp.profiler.validate import ValidationReport


def _si(x: float, unit: str) -> str:
    for scale, prefix in ((1e-12, "p"), (1e-9, "n"), (1e-6, "u"), (1e-3, "m"), (1.0, "")):
        if abs(x) < scale * 1000:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def fit_table(profile: HardwareProfile, model: str) -> Table:
    """Coefficients, R^2 and fit error of each term of one model's fit."""
    meta = profile.meta.get("fits", {}).get(model, {})
    table = Table(title=f"{model} on {profile.device}: per layer at SP 1")
    for col in ("term", "fixed", "per token", "per pair", "R^2", "fit MAPE"):
        table.add_column(col, justify="right" if col != "term" else "left")
    for key, label in (("fwd", "forward"), ("bwd", "backward"), ("recompute", "recompute"), ("head", "head+loss")):
        part = meta.get(key)
        if not part:
            continue
        c = part["coef"]
        table.add_row(label, _si(c.get("fixed", 0.0), "s"), _si(c.get("per_token", 0.0), "s"),
                      _si(c.get("per_pair", 0.0), "s") if "per_pair" in c else "-",
                      f"{part['r2']:.3f}", f"{part['fit_mape']:.1%}" if part["fit_mape"] == part["fit_mape"] else "-")
    fit = profile.fits[model]
    table.caption = (f"activations {fit.act_full_bytes_per_token:,.0f} B/token per layer "
                     f"({fit.act_ckpt_bytes_per_token:,.0f} checkpointed), head {fit.head_bytes_per_token:,.0f} B/token; "
                     f"fitted up to {fit.max_fitted_tokens:,} tokens")
    return table


def mape_panel(what: str, value: float | None) -> Panel:
    """A green line when the error is under the threshold, a loud red box when it is not."""
    if value is None or value != value:
        return Panel(f"{what}: no held-out points", style="yellow")
    if value <= MAPE_THRESHOLD:
        return Panel(f"{what}: held-out MAPE {value:.1%} (threshold {MAPE_THRESHOLD:.0%})", style="green")
    return Panel(f"{what}: held-out MAPE {value:.1%} EXCEEDS {MAPE_THRESHOLD:.0%}.\n"
                 "The planner will misjudge plans by this much. Re-run on an idle machine, with more repeats "
                 "(drop --quick), or check that the layer's time is linear in tokens and attention pairs.",
                 title="FIT ERROR", style="bold red")


def validation_table(report: ValidationReport) -> Table:
    """Predicted vs measured time of every validation micro-batch."""
    at = (f"; measured at the profile's speed, the machine {report.machine_speed:.3f}x as slow now (reference kernel)"
          if report.machine_speed else "")
    table = Table(title=f"{report.model}: predicted vs measured micro-batch time (SP 1){at}")
    for col in ("tokens", "samples", "layers", "ckpt", "predicted", "measured", "error"):
        table.add_column(col, justify="right")
    for r in report.rows:
        table.add_row(f"{r.tokens:,}", str(r.samples), str(r.layers), str(r.ckpt_layers), _si(r.predicted_s, "s"),
                      _si(r.measured_s, "s"), f"{r.error:+.1%}")
    return table
