"""Figures of docs/results.md from the JSON `benchmarks/paper.py` writes (Agg canvas, no pyplot)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paper_tables import SHORT, case_label, ok_cases

from dcp.planner.simulate import KIND_COLORS
from dcp.viz import STRATEGY_COLORS, _figure

SHOWN = ("bucket-best-static", "packed", "packed-best-static", "dcp-greedy-inter", "dcp-greedy", "ilp")
COLORS = {**STRATEGY_COLORS, "bucket-best-static": "#937860", "packed-best-static": "#da8bc3",
          "bucket-per-batch": "#8c8c8c"}


def speedup_bars(doc: dict[str, Any], path: Path) -> None:
    cases, pr = ok_cases(doc, "paper"), doc["meta"]["paper_range"]
    fig = _figure(12, 4.6)
    ax = fig.add_subplot()
    width = 0.8 / len(SHOWN)
    ax.axhspan(*pr["dcp-greedy-inter"], color="#55a868", alpha=0.12, label="paper: DCP-inter range")
    ax.axhline(pr["dcp-greedy"][1], color="#55a868", linestyle="--", linewidth=1, label="paper: best with pyramid")
    ax.axhline(1.0, color="#c44e52", linewidth=1, label="bucket (static SP)")
    for j, name in enumerate(SHOWN):
        ax.bar([i + (j - (len(SHOWN) - 1) / 2) * width for i in range(len(cases))],
               [c["strategies"][name]["speedup_vs_bucket"] for c in cases], width, label=name, color=COLORS[name])
    ax.set_xticks(range(len(cases)), [case_label(c) for c in cases], rotation=15, ha="right", fontsize=8)
    ax.set_ylabel("speedup over bucket (mean step time)")
    ax.set_title(f"{cases[0]['gpus']} GPUs, simulated on {doc['meta']['hardware']}", fontsize=10)
    ax.legend(fontsize=7, ncol=3)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


def breakdown(doc: dict[str, Any], path: Path) -> None:
    cases = ok_cases(doc, "paper")
    names = ("bucket", "bucket-best-static", "packed", "dcp-greedy-inter", "dcp-greedy", "ilp")
    kinds = (("compute", ("forward", "backward", "contention")), ("recompute", ("recompute",)),
             ("all_to_all", ("all_to_all",)),
             ("allreduce", ("allreduce",)), ("idle", ("idle",)))
    fig = _figure(13, 6.4)
    for i, c in enumerate(cases):
        ax = fig.add_subplot(2, (len(cases) + 1) // 2, i + 1)
        ref = c["strategies"]["bucket"]["mean_step_time_s"]
        bottom = [0.0] * len(names)
        for label, parts in kinds:
            vals = [sum(c["strategies"][n]["shares"][k] for k in parts) * c["strategies"][n]["mean_step_time_s"] / ref
                    for n in names]
            ax.bar(range(len(names)), vals, bottom=bottom, color=KIND_COLORS["forward" if label == "compute" else label],
                   label=label)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.set_xticks(range(len(names)), [n.replace("-static", "").replace("dcp-greedy", "dcp") for n in names],
                      rotation=45, ha="right", fontsize=7)
        ax.set_title(case_label(c), fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
    fig.axes[0].set_ylabel("GPU time per step / bucket's step")
    fig.axes[0].legend(fontsize=6)
    fig.suptitle("Where each strategy's step goes (mean over batches, per GPU, normalized to bucket)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)


def scaling(doc: dict[str, Any], section: str, path: Path) -> None:
    both = ok_cases(doc, "paper") + ok_cases(doc, section)
    if section == "models":
        both = [c for c in both if c["section"] == "models" or c["model"] == "llama-7b"]
        key, xs_of = "workload", (lambda c: list(SHORT).index(c["model"]))
    else:
        key, xs_of = "case", (lambda c: c["gpus"])
    panels: dict[str, list[dict[str, Any]]] = {}
    for c in both:
        panels.setdefault(c["workload"] if key == "workload" else case_label(c), []).append(c)
    cols = 4 if len(panels) > 5 else min(3, len(panels))
    fig = _figure(3.3 * cols, 3.0 * ((len(panels) + cols - 1) // cols) + 0.5)
    for i, (title, cs) in enumerate(panels.items()):
        ax = fig.add_subplot((len(panels) + cols - 1) // cols, cols, i + 1)
        cs.sort(key=xs_of)
        for name in ("bucket-best-static", "packed", "dcp-greedy-inter", "dcp-greedy", "ilp"):
            ax.plot([xs_of(c) for c in cs], [c["strategies"][name]["speedup_vs_bucket"] for c in cs], marker="o",
                    label=name, color=COLORS[name])
        ax.axhline(1.0, color="#c44e52", linewidth=0.8)
        if section == "models":
            ax.set_xticks(sorted({xs_of(c) for c in cs}), [SHORT[c["model"]] for c in cs], fontsize=8)
        else:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("GPUs", fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    fig.axes[0].set_ylabel("speedup over bucket")
    fig.axes[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path)
