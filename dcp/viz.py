"""Pictures of plans, comparisons, sweeps and calibrations, for `dcp show`, `dcp compare --plot`
and the notebooks.

Every function returns a matplotlib Figure built without pyplot (an Agg canvas, no global
backend switch: headless in the CLI, the notebook's own backend untouched) and saves it when
given a path. matplotlib is imported inside the functions so that `import dcp.viz` stays light.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dcp.planner.plan import Plan
from dcp.planner.simulate import Timeline, gantt

STRATEGY_COLORS = {"ilp": "#4c72b0", "dcp-greedy": "#55a868", "dcp-greedy-inter": "#8fbc8f",
                   "bucket": "#c44e52", "bucket-per-batch": "#e39a9c", "packed": "#dd8452",
                   "packed-per-batch": "#efc19f"}
LABELS = {"mean_step_time_s": "step time (s)", "throughput_tokens_per_s": "throughput (tokens/s)",
          "speedup_vs_bucket": "speedup over bucket", "speedup_vs_packed": "speedup over packed",
          "mean_solve_time_s": "planner solve time (s)", "memory_headroom": "memory headroom (free fraction)",
          "idle_fraction": "idle share", "comm_fraction": "communication share",
          "gap_to_lower_bound": "gap to lower bound", "checkpoint_share": "checkpointed layer share",
          "gpus": "GPUs", "max_sample_tokens": "longest sample (tokens)", "model": "model",
          "workload": "length distribution"}
DPI = 110


def _figure(width_in: float, height_in: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: str | Path | None) -> Any:
    if path is not None:
        fig.savefig(path, dpi=DPI)
    return fig


def plan_gantt(plan: Plan, timeline: Timeline, path: str | Path | None = None, title: str = "") -> Any:
    """Every rank's step (dcp.planner.simulate.gantt), with the plan drawn over it: a line
    between SP groups, a white tick where a micro-batch ends, and each group's SP size,
    micro-batch count and checkpointed layers on the right where there is room."""
    n = len(timeline.events)
    if n != plan.num_gpus:
        raise ValueError(f"timeline has {n} ranks, the plan {plan.num_gpus}")
    fig = gantt(timeline, title=title)
    height = min(16.0, max(3.0, 1.6 + 0.2 * n))
    fig.set_size_inches(11, height)
    ax = fig.axes[0]
    # The legend sits between title and chart, a fixed distance whatever the number of ranks.
    legend = ax.get_legend()
    if legend is not None:
        handles = legend.legend_handles
        legend.remove()
        ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(handles),
                  fontsize="small", frameon=False)
        ax.set_title(ax.get_title(), pad=22)
    row_pt = 72 * height * 0.8 / n  # points per rank row, roughly (the axes take ~80% of the height)
    for g in plan.groups:
        top, bottom = g.ranks[0] - 0.5, g.ranks[-1] + 0.5
        if g.sp > 1:  # a line around each multi-rank group; single ranks need none
            ax.hlines([top, bottom], 0, timeline.step_time_s, colors="black", linewidth=0.6 if row_pt > 3 else 0.4)
        t = 0.0
        for mb in g.microbatches[:-1]:
            t += mb.time_s
            ax.vlines(t, top + 0.1, bottom - 0.1, colors="white", linewidth=1.2)
        if len(g.ranks) * row_pt >= 9 and g.microbatches:
            ckpt = sorted({mb.ckpt_layers for mb in g.microbatches})
            ckpt_text = f"{ckpt[0]}" if len(ckpt) == 1 else f"{ckpt[0]}-{ckpt[-1]}"
            ax.annotate(f"sp {g.layout}, {len(g.microbatches)} mb, ckpt {ckpt_text}/{plan.num_layers}",
                        xy=(1.005, (top + bottom) / 2), xycoords=("axes fraction", "data"),
                        va="center", ha="left", fontsize=7 if row_pt * len(g.ranks) < 14 else 8)
    fig.tight_layout()
    return _save(fig, path)


def compare_figure(frame: Any, path: str | Path | None = None, metric: str = "step_time", title: str = "") -> Any:
    """Bars per strategy of `dcp compare`'s mean step time (or throughput), the lower bound marked.

    The bound drawn is the tightest strategy's `mean_lower_bound_s` (the ILP proves tighter
    bounds than the analytic one); for throughput it becomes an upper bound on tokens/s."""
    if metric not in ("step_time", "throughput"):
        raise ValueError(f"metric must be step_time or throughput, got {metric!r}")
    names = list(frame["strategy"])
    step = frame["mean_step_time_s"].to_numpy()
    bound = float(frame["mean_lower_bound_s"].max())
    if metric == "throughput":
        values = frame["throughput_tokens_per_s"].to_numpy()
        line, ylabel = float((values * step).max() / bound), "throughput (tokens/s)"
    else:
        values, line, ylabel = step, bound, "mean step time (s)"
    fig = _figure(max(6.0, 1.1 * len(names) + 2), 4)
    ax = fig.add_subplot()
    bars = ax.bar(names, values, color=[STRATEGY_COLORS.get(s, "#777777") for s in names])
    ax.axhline(line, color="black", linestyle="--", linewidth=1)
    ax.annotate("lower bound" if metric == "step_time" else "upper bound", xy=(1.0, line),
                xycoords=("axes fraction", "data"), xytext=(-4, 3), textcoords="offset points",
                ha="right", va="bottom", fontsize=8)
    speedups = frame["speedup_vs_bucket"] if "speedup_vs_bucket" in frame else [math.nan] * len(names)
    for bar, value, s in zip(bars, values, speedups, strict=True):
        label = (f"{value:.3g} s" if metric == "step_time" else f"{value:,.0f}") + (
            "" if math.isnan(s) else f"\n{s:.2f}x bucket")
        ax.annotate(label, xy=(bar.get_x() + bar.get_width() / 2, value), xytext=(0, 2),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8,
                    bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})
    ax.set_ylim(0, max(max(values), line) * 1.22)
    ax.set_ylabel(ylabel)
    ax.set_title(title or f"{ylabel} per strategy")
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    return _save(fig, path)


def sweep_figure(frame: Any, x: str, metrics: Sequence[str], strategies: Sequence[str] | None = None,
                 path: str | Path | None = None, title: str = "", log_y: Sequence[str] = ()) -> Any:
    """One panel per metric of a `dcp.whatif.sweep` frame against column `x`, a line per
    strategy. A numeric x spanning 8x or more is drawn on a log2 axis; a text x (model, workload)
    as categories in sweep order. Scenarios a strategy could not plan are gaps, noted below."""
    shown = list(strategies) if strategies is not None else list(dict.fromkeys(frame["strategy"]))
    numeric = frame[x].dtype.kind in "if"
    cats = list(dict.fromkeys(frame[x]))
    fig = _figure(4.2 * len(metrics) + 0.6, 3.6)
    for i, metric in enumerate(metrics):
        ax = fig.add_subplot(1, len(metrics), i + 1)
        for s in shown:
            rows = frame[frame["strategy"] == s]
            xs = rows[x] if numeric else [cats.index(v) for v in rows[x]]
            ax.plot(xs, rows[metric], marker="o", label=s, color=STRATEGY_COLORS.get(s))
        if metric.startswith("speedup_vs_"):
            ax.axhline(1.0, color="gray", linewidth=0.8, linestyle=":")
        if numeric and frame[x].min() > 0 and frame[x].max() / frame[x].min() >= 8:
            ax.set_xscale("log", base=2)
        if not numeric:
            ax.set_xticks(range(len(cats)), [str(c) for c in cats], rotation=20, ha="right", fontsize=8)
        if metric in log_y:
            ax.set_yscale("log")
        ax.set_xlabel(LABELS.get(x, x))
        ax.set_ylabel(LABELS.get(metric, metric))
        ax.grid(alpha=0.3)
    fig.axes[0].legend(fontsize=8)
    failed = frame[(frame["status"] != "ok") & frame["strategy"].isin(shown)]
    note = "; ".join(sorted({f"{x}={v}" for v in failed[x]}))
    fig.suptitle(title + (f"  (cannot plan: {note})" if note else ""), fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def calibration_figure(points: Any, path: str | Path | None = None, title: str = "") -> Any:
    """Predicted against measured time, one panel per prediction (dcp.calibration.PREDICTIONS),
    a marker per phase, on log axes with the y = x line and a +-15% band (the profiler's
    held-out threshold). `points` is a frame of dcp.calibration.layer_points / model_points."""
    from dcp.calibration import PREDICTIONS

    markers = "osD^vP*X"
    values = points[["measured_s", *(f"{k}_s" for k in PREDICTIONS)]].to_numpy()
    lo, hi = values[values > 0].min() / 1.3, values.max() * 1.3
    fig = _figure(5 * len(PREDICTIONS), 4.6)
    for i, kind in enumerate(PREDICTIONS):
        ax = fig.add_subplot(1, len(PREDICTIONS), i + 1)
        ax.fill_between([lo, hi], [lo / 1.15, hi / 1.15], [lo * 1.15, hi * 1.15], color="0.9", label="+-15%")
        ax.plot([lo, hi], [lo, hi], color="gray", linewidth=0.8)
        for j, ((s, phase), g) in enumerate(points.groupby(["set", "phase"], sort=False)):
            ax.scatter(g["measured_s"], g[f"{kind}_s"], s=18, marker=markers[j % len(markers)],
                       label=phase if s == "model" else f"{phase} ({s})", alpha=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("measured (s)")
        ax.set_ylabel(f"{kind} prediction (s)")
        ax.set_title(f"{kind} cost model")
        ax.grid(alpha=0.3, which="both")
    fig.axes[0].legend(fontsize=7, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, path)
