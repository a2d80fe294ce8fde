"""Beyond the head limit: Ulysses alone against Ulysses x ring on the longest samples.

    .venv/bin/python benchmarks/long_context.py      # benchmarks/results/long-context.json + the table

Ulysses shards attention heads, so alone its SP size must divide the KV heads: 8 for Llama-3-8B
and Llama-70B, whatever the cluster. With a ring over the rest (`dcp.costmodel.ring`), an SP group
can span the cluster. Here: samples of 128K to 2M tokens, the Llama-3-8B and Llama-70B shapes
(ZeRO-3 for 70B, whose states overflow a GPU at stage 1), 64 to 512 H200s in nodes of 8, one
sample per 64 GPUs in every global batch (weak scaling: the tokens per GPU stay those of one
sample on 64 GPUs). Each case is planned by the ILP twice, on the Ulysses-only sizes (dividing the
heads and the KV heads, dcp before rings) and on every size, and simulated on the cost model;
nothing here runs on a GPU. `benchmarks/paper.py` runs it too and puts the table in its page.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dcp.costmodel import DEFAULT_HARDWARE, CostModelError, attention_pairs  # noqa: E402
from dcp.planner import IlpOptions, Sample, solve  # noqa: E402
from dcp.planner.feasibility import allowed_sp_sizes  # noqa: E402
from dcp.planner.plan import InfeasibleError  # noqa: E402
from dcp.planner.run import build_cost_model, groups_label  # noqa: E402
from dcp.planner.simulate import simulate  # noqa: E402

MODELS = {"llama-3-8b": 1, "llama-70b": 3}
"""Model preset -> ZeRO stage."""
TOKENS = (131_072, 262_144, 524_288, 1_048_576, 2_097_152)
GPUS = (64, 128, 256, 512)
GPUS_PER_SAMPLE = 64
GPUS_PER_NODE = 8
JSON_PATH = ROOT / "benchmarks" / "results" / "long-context.json"


@dataclass(frozen=True)
class LongCase:
    model: str
    tokens: int
    gpus: int

    @property
    def samples(self) -> int:
        return max(1, self.gpus // GPUS_PER_SAMPLE)


def _plan(case: LongCase, hardware: str, hybrid: bool, time_limit_s: float) -> dict[str, Any]:
    cm = build_cost_model(case.model, hardware, case.gpus, GPUS_PER_NODE, zero_stage=MODELS[case.model])
    sizes = allowed_sp_sizes(cm)
    m = cm.model
    if not hybrid:  # dcp before rings: Ulysses alone, its size dividing the heads and the KV heads
        sizes = [p for p in sizes if m.heads % p == 0 and m.kv_heads % p == 0]
    batch = [Sample(i, case.tokens, attention_pairs(m.attention, case.tokens)) for i in range(case.samples)]
    try:
        plan = solve(batch, cm.cluster, cm, IlpOptions(sp_sizes=tuple(sizes), time_limit_s=time_limit_s))
    except (InfeasibleError, CostModelError) as e:
        return {"status": "cannot plan", "reason": str(e)}
    tl = simulate(plan, cm)
    ring_s = sum(e.duration_s for rank in tl.events for e in rank if e.kind == "ring") / (case.gpus * tl.step_time_s)
    return {"status": "ok", "step_time_s": plan.step_time_s, "lower_bound_s": plan.lower_bound_s,
            "idle_fraction": tl.idle_fraction, "comm_fraction": tl.comm_fraction, "ring_fraction": ring_s,
            "groups": groups_label(plan), "max_sp": max(g.sp for g in plan.groups),
            "ckpt_layers": max(mb.ckpt_layers for g in plan.groups for mb in g.microbatches),
            "tokens_per_s": case.tokens * case.samples / plan.step_time_s, "solve_time_s": plan.solve_time_s}


def run(hardware: str = DEFAULT_HARDWARE, time_limit_s: float = 1.0, progress: bool = True) -> dict[str, Any]:
    """Every case with both size sets; the document `render_section` reads."""
    started, rows = time.perf_counter(), []
    cases = [LongCase(m, t, g) for m in MODELS for g in GPUS for t in TOKENS]
    for i, case in enumerate(cases):
        row = {**asdict(case), "samples": case.samples, "zero_stage": MODELS[case.model],
               "ulysses": _plan(case, hardware, False, time_limit_s),
               "hybrid": _plan(case, hardware, True, time_limit_s)}
        u, h = row["ulysses"], row["hybrid"]
        if u["status"] == h["status"] == "ok":
            row["speedup"] = u["step_time_s"] / h["step_time_s"]
        rows.append(row)
        if progress:
            print(f"[{i + 1}/{len(cases)}] {case.model} {case.tokens:,} tokens x {case.samples} on {case.gpus} GPUs: "
                  f"ulysses {u.get('step_time_s', u['status'])} | hybrid {h.get('step_time_s', h['status'])}",
                  flush=True)
    return {"meta": {"hardware": hardware, "ilp_time_limit_s": time_limit_s, "gpus_per_node": GPUS_PER_NODE,
                     "gpus_per_sample": GPUS_PER_SAMPLE, "zero_stage": MODELS,
                     "date": time.strftime("%Y-%m-%d %H:%M:%S"), "wall_s": time.perf_counter() - started},
            "cases": rows}


def _cell(r: dict[str, Any]) -> str:
    if r["status"] != "ok":
        return "cannot plan"
    return f"{r['step_time_s']:.2f} s, {r['groups']}, idle {r['idle_fraction']:.0%}"


def render_section(doc: dict[str, Any]) -> str:
    """The page's long-context section: one row per case, Ulysses alone against hybrid."""
    m = doc["meta"]
    lines = [
        "## Beyond the head limit: Ulysses x ring on long samples", "",
        f"Samples of 128K to 2M tokens, one per {m['gpus_per_sample']} GPUs in each global batch, on "
        f"`{m['hardware']}` in nodes of {m['gpus_per_node']}; the ILP ({m['ilp_time_limit_s']:g} s) on the "
        "Ulysses-only SP sizes (dividing heads and KV heads: at most 8 for both models) against every size, "
        "Ulysses over the node and a ring across (`u x c`). Groups \"1x(8x8)\" are one group of 64 GPUs as "
        "Ulysses 8 x ring 8. Simulated on the cost model (`benchmarks/long_context.py`, "
        "`benchmarks/results/long-context.json`).", "",
        "| model | sample tokens | GPUs | samples | Ulysses only | hybrid Ulysses x ring | speedup |",
        "|---|--:|--:|--:|---|---|--:|",
    ]
    for c in doc["cases"]:
        speed = f"{c['speedup']:.1f}x" if "speedup" in c else ("plans only hybrid" if c["hybrid"]["status"] == "ok"
                                                               else "-")
        lines.append(f"| {c['model']} | {c['tokens']:,} | {c['gpus']} | {c['samples']} | {_cell(c['ulysses'])} "
                     f"| {_cell(c['hybrid'])} | {speed} |")
    refused = [c for c in doc["cases"] if c["hybrid"]["status"] != "ok"]
    if refused:
        lines += ["", "Cases no plan fits, with the reason the planner gives:"]
        lines += [f"- {c['model']}, {c['tokens']:,} tokens on {c['gpus']} GPUs: {c['hybrid']['reason']}" for c in refused]
    return "\n".join(lines) + "\n"


def main() -> int:
    doc = run()
    JSON_PATH.parent.mkdir(parents=True, exist_ok=True)
    JSON_PATH.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {JSON_PATH}")
    print(render_section(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
