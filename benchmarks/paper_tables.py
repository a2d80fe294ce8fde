"""The tables and checks of docs/results.md, from the JSON `benchmarks/paper.py` writes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHORT = {"llama-7b": "7B", "llama-13b": "13B", "llama-70b": "70B", "opensora-stdit-1.1b": "STDiT 1.1B"}


def fmt_x(v: float) -> str:
    return f"{v:.2f}x"


def in_range(x: float, bounds: list[float]) -> bool:
    """Whether a speedup lies in the paper's range at the paper's precision (two decimals)."""
    return bounds[0] <= round(x, 2) <= bounds[1]


def ok_cases(doc: dict[str, Any], section: str) -> list[dict[str, Any]]:
    return [c for c in doc["cases"] if c["section"] == section and c["status"] == "ok"]


def case_label(c: dict[str, Any]) -> str:
    return f"{SHORT.get(c['model'], c['model'])} {c['workload'].replace('lognormal:scale=16', 'lognormal x16')}"


def reasons(c: dict[str, Any], paper_range: dict[str, list[float]]) -> list[str]:
    """Why a case's DCP speedups fall outside the paper's range, from its own metrics."""
    s, out = c["strategies"], []
    b, best = s["bucket"], s["bucket-best-static"]
    for name, (lo, hi) in paper_range.items():
        me, x = s[name], s[name]["speedup_vs_bucket"]
        if in_range(x, [lo, hi]):
            continue
        if x > hi:
            why = (f"bucket's one static SP size ({b['sp']}: the smallest that fits the dataset's longest sample, "
                   f"{c['dataset_longest_tokens']:,} tokens, fully checkpointed in {c['memory_gb']:.0f} GB) leaves "
                   f"GPUs idle {b['idle_fraction']:.0%} of the time, its longest micro-batch alone "
                   f"{b['straggler_share']:.0%} of its step; the best static SP ({best['sp']}) already gives "
                   f"{fmt_x(best['speedup_vs_bucket'])}, {name} is {fmt_x(x / best['speedup_vs_bucket'])} over that")
            if name == "dcp-greedy":
                why += (f"; bucket recomputes every layer ({b['recompute_fraction']:.0%} of its GPU time), "
                        f"{name} {me['recompute_fraction']:.0%}")
        elif me["idle_fraction"] > 0.25 and me["straggler_share"] > 0.5:
            why = (f"{name} itself idles {me['idle_fraction']:.0%}: its longest micro-batch alone is "
                   f"{me['straggler_share']:.0%} of its step (a long sample kept at the small SP size its profile "
                   f"chose; bucket idles {b['idle_fraction']:.0%})")
        else:
            why = (f"bucket idles only {b['idle_fraction']:.0%} and communicates {b['comm_fraction']:.0%}, "
                   f"recomputes {b['recompute_fraction']:.0%}: little for {name} to recover "
                   f"(it idles {me['idle_fraction']:.0%}, communicates {me['comm_fraction']:.0%})")
        side = "above" if x > hi else "below"
        out.append(f"**{case_label(c)}**, {name} {fmt_x(x)} is {side} the paper's {lo:.2f}x-{hi:.2f}x: {why}.")
    return out


def main_table(doc: dict[str, Any]) -> str:
    """The 32-GPU table: speedups over bucket (static SP) beside the paper's range."""
    pr = doc["meta"]["paper_range"]
    head = ("| model | workload | batch | static SP | bucket step | bucket, best static | packed | packed, best static "
            "| dcp-greedy-inter | dcp-greedy | ilp | paper: inter / +pyramid | in range | ilp over per-batch bucket |\n"
            "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|\n")
    rows = []
    for c in ok_cases(doc, "paper"):
        s = c["strategies"]
        out = [n for n, b in pr.items() if not in_range(s[n]["speedup_vs_bucket"], b)]
        rows.append(
            f"| {SHORT[c['model']]} | {c['workload']} | {c['global_batch']} | {c['static_sp']} "
            f"| {s['bucket']['mean_step_time_s']:.2f} s | {fmt_x(s['bucket-best-static']['speedup_vs_bucket'])} "
            f"(SP {s['bucket-best-static']['sp']}) | {fmt_x(s['packed']['speedup_vs_bucket'])} "
            f"| {fmt_x(s['packed-best-static']['speedup_vs_bucket'])} (SP {s['packed-best-static']['sp']}) "
            f"| {fmt_x(s['dcp-greedy-inter']['speedup_vs_bucket'])} | {fmt_x(s['dcp-greedy']['speedup_vs_bucket'])} "
            f"| **{fmt_x(s['ilp']['speedup_vs_bucket'])}** | {pr['dcp-greedy-inter'][0]:.2f}-{pr['dcp-greedy-inter'][1]:.2f}x / "
            f"<= {pr['dcp-greedy'][1]:.2f}x | {'yes' if not out else 'no: ' + ', '.join(out)} "
            f"| {fmt_x(s['bucket-per-batch']['mean_step_time_s'] / s['ilp']['mean_step_time_s'])} |")
    return head + "\n".join(rows) + "\n"


def detail_table(doc: dict[str, Any], section: str = "paper") -> str:
    """Per case and strategy: groups, step time, speedup, idle/comm/recompute shares, solve time."""
    rows = ["| case | strategy | groups (step 0) | step | x bucket | idle | comm | recompute | solve mean / max |",
            "|---|---|---|--:|--:|--:|--:|--:|--:|"]
    for c in ok_cases(doc, section):
        for name, m in c["strategies"].items():
            rows.append(f"| {case_label(c)} | {name} | {m['groups']} | {m['mean_step_time_s']:.2f} s "
                        f"| {fmt_x(m['speedup_vs_bucket'])} | {m['idle_fraction']:.0%} | {m['comm_fraction']:.0%} "
                        f"| {m['recompute_fraction']:.0%} | {1e3 * m['mean_solve_time_s']:.0f} / "
                        f"{1e3 * m['max_solve_time_s']:.0f} ms |")
    return "\n".join(rows) + "\n"


def scaling_table(doc: dict[str, Any], section: str) -> str:
    """One row per case of a scaling section (plus the matching 32-GPU 7B rows for the models)."""
    cases = ok_cases(doc, "paper") + ok_cases(doc, section)
    if section == "models":
        cases = [c for c in cases if c["section"] == "models" or c["model"] == "llama-7b"]
        cases.sort(key=lambda c: (c["workload"], c["model"]))
    else:
        cases.sort(key=lambda c: (c["model"], c["workload"], c["gpus"]))
    rows = ["| model | workload | GPUs | batch | longest in batches | static SP | bucket step | bucket, best static "
            "| packed | dcp-greedy-inter | dcp-greedy | ilp | ilp solve mean / max |",
            "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for c in cases:
        s = c["strategies"]
        rows.append(f"| {SHORT[c['model']]} | {c['workload']} | {c['gpus']} | {c['global_batch']} "
                    f"| {c['batch_longest_tokens']:,} | {c['static_sp']} "
                    f"| {s['bucket']['mean_step_time_s']:.2f} s | {fmt_x(s['bucket-best-static']['speedup_vs_bucket'])} "
                    f"(SP {s['bucket-best-static']['sp']}) | {fmt_x(s['packed']['speedup_vs_bucket'])} "
                    f"| {fmt_x(s['dcp-greedy-inter']['speedup_vs_bucket'])} | {fmt_x(s['dcp-greedy']['speedup_vs_bucket'])} "
                    f"| {fmt_x(s['ilp']['speedup_vs_bucket'])} | {1e3 * s['ilp']['mean_solve_time_s']:.0f} / "
                    f"{1e3 * s['ilp']['max_solve_time_s']:.0f} ms |")
    failed = [c for c in doc["cases"] if c["section"] == section and c["status"] != "ok"]
    rows += [""] if failed else []
    rows += [f"- {SHORT[c['model']]} {c['workload']} on {c['gpus']} GPUs: {c['status']}" for c in failed]
    return "\n".join(rows) + "\n"


def ilp_check(doc: dict[str, Any]) -> str:
    """Every global batch where ilp's step is longer than dcp-greedy's (or a statement that none is),
    and every case where another strategy's mean step beats ilp's by more than 1%."""
    ok = [c for c in doc["cases"] if c["status"] == "ok"]
    lost = [(c, x) for c in ok for x in c["ilp_lost_to_greedy"]]
    n = sum(c["steps"] for c in ok)
    if not lost:
        lines = [f"ilp is at least as fast as dcp-greedy (with pyramid checkpointing) on all {n} planned global "
                 f"batches of all {len(ok)} cases."]
    else:
        lines = [f"ilp lost to dcp-greedy on {len(lost)} of {n} global batches:"]
        lines += [f"- {case_label(c)}, {c['gpus']} GPUs, batch {x['step']}: ilp {x['ilp_s']:.4f} s vs dcp-greedy "
                  f"{x['dcp_greedy_s']:.4f} s" for c, x in lost]
    beaten = []
    for c in ok:
        s = c["strategies"]
        best = min(s, key=lambda k: s[k]["mean_step_time_s"])
        if s[best]["mean_step_time_s"] * 1.01 < s["ilp"]["mean_step_time_s"]:
            beaten.append(f"- {case_label(c)}, {c['gpus']} GPUs: {best} {s[best]['mean_step_time_s']:.2f} s "
                          f"(static SP {s[best].get('sp', '-')}) against ilp {s['ilp']['mean_step_time_s']:.2f} s")
    if beaten:
        lines += ["", "Cases where another strategy's mean step beats ilp's by more than 1% (ilp's warm starts are "
                  "dcp-greedy and the per-batch-SP bucket and packed plans, not these):", *beaten]
    return "\n".join(lines) + "\n"


def trend_table(doc: dict[str, Any], section: str) -> str:
    """Geometric-mean speedup over bucket of each strategy, per GPU count or per model."""
    key = "gpus" if section == "gpus" else "model"
    cases = ok_cases(doc, "paper") + ok_cases(doc, section)
    if section == "models":
        cases = [c for c in cases if c["section"] == "models" or c["model"] == "llama-7b"]
    names = ("bucket-best-static", "packed", "packed-best-static", "dcp-greedy-inter", "dcp-greedy", "ilp")
    rows = [f"| {'GPUs' if key == 'gpus' else 'model'} | cases | " + " | ".join(names) + " |",
            "|---|--:|" + "--:|" * len(names)]
    for value in sorted({c[key] for c in cases}, key=lambda v: v if key == "gpus" else list(SHORT).index(v)):
        cs = [c for c in cases if c[key] == value]
        gm = [math.prod(c["strategies"][n]["speedup_vs_bucket"] for c in cs) ** (1 / len(cs)) for n in names]
        rows.append(f"| {value if key == 'gpus' else SHORT[value]} | {len(cs)} | "
                    + " | ".join(fmt_x(g) for g in gm) + " |")
    return "\n".join(rows) + "\n"


def costmodel_section(results_dir: Path = ROOT / "benchmarks" / "results") -> str:
    """benchmarks/costmodel.py's section (the cost model against published figures), if its JSON is there."""
    path = results_dir / "costmodel.json"
    if not path.is_file():
        return ""
    from costmodel import render_section

    return render_section(json.loads(path.read_text()))


def long_context_section(results_dir: Path = ROOT / "benchmarks" / "results") -> str:
    """benchmarks/long_context.py's table (Ulysses alone against Ulysses x ring), if its JSON is there."""
    path = results_dir / "long-context.json"
    if not path.is_file():
        return ""
    from long_context import render_section

    return render_section(json.loads(path.read_text()))


def measured_section(results_dir: Path = ROOT / "benchmarks" / "results") -> str:
    """What benchmarks/gpu/run.sh measured on one H200, if its results are committed."""
    path = results_dir / "gpu-calibration-h200.json"
    if not path.is_file():
        return ("None yet: no single-H200 results from `benchmarks/gpu/run.sh` "
                "(`benchmarks/results/gpu-calibration-h200.json`) are committed, so every number above is "
                "simulated. When they are, this section reports them (fit and validation error, measured "
                "planned-vs-full checkpointing speedup).\n")
    r = json.loads(path.read_text())
    env = r.get("environment", {})
    where = f"{env.get('device_name', r.get('device'))}, torch {env.get('torch')}, CUDA {env.get('cuda')}"
    lines = [f"From `benchmarks/results/{path.name}` ({where}, {env.get('date')}, {r.get('model')}):"]
    if "profile" in r:
        lines.append(f"- profile fit, held-out MAPE: {r['profile']['heldout_mape']:.1%}")
    for key, what in (("validation", "whole micro-batches"), ("checkpointing", "planned vs full checkpointing")):
        part = r.get(key, {})
        if "error" in part:
            lines.append(f"- {what}: failed ({part['error']})")
        elif part.get("truncated"):
            lines.append(f"- {what}: cut short by the time budget after {len(part['rows'])} micro-batches")
    if r.get("validation", {}).get("rows"):
        lines.append(f"- whole micro-batches, prediction MAPE: {r['validation']['mape']:.1%} "
                     f"over {len(r['validation']['rows'])} micro-batches")
    if r.get("checkpointing", {}).get("measured_speedup"):
        ck = r["checkpointing"]
        lines.append(f"- planned vs full checkpointing on Wikipedia lengths: measured {fmt_x(ck['measured_speedup'])}, "
                     f"predicted {fmt_x(ck['predicted_speedup'])}")
    smoke_path = results_dir / "executor-smoke.json"
    if smoke_path.is_file():
        smoke = json.loads(smoke_path.read_text())
        lines.append(f"- executor on the device (`{smoke['command']}`): exit code {smoke['exit_code']}, "
                     f"largest relative gradient difference from fp32 single-process training {smoke['max_grad_diff']}")
    return "\n".join(lines) + "\n"
