"""The cost model against published measurements: GEMM throughput, attention by kernel, direction
and length, NCCL bus bandwidth by collective, size and node count, and end-to-end training
throughput of a 7B model from 1K to 64K tokens.

Every prediction goes through what the planner uses: the shipped hardware presets, their
collective curves and attention terms, and `CostModel` for whole training steps. A row is
"fitted" when a preset was fitted on that very figure (the row then checks the form reproduces
it), "held out" otherwise. Prints one table per category and the MAPE per category, writes
benchmarks/results/costmodel.json; --docs PATH rewrites this report's section of the results page.

    .venv/bin/python benchmarks/costmodel.py [--docs docs/results.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel_data import ALPHA_BETA, ATTENTION, COLLECTIVES, E2E, GEMM, MPT_7B  # noqa: E402

from dcp.costmodel import (  # noqa: E402
    Cluster,
    CostModel,
    ModelSpec,
    TrainingSetup,
    attention_pairs,
    bus_factor,
    load_hardware,
)
from dcp.costmodel.attention import achieved_flops, fit_attention_rate  # noqa: E402

CATEGORIES = ("gemm", "attention", "collectives", "collective alpha-beta", "end-to-end")
BEGIN, END = "<!-- costmodel.py:begin -->", "<!-- costmodel.py:end -->"


def _row(category: str, what: str, predicted: float, published: float, unit: str, fitted: bool,
         source: str) -> dict[str, Any]:
    return {"category": category, "what": what, "predicted": predicted, "published": published, "unit": unit,
            "ratio": predicted / published, "fitted": fitted, "source": source}


def gemm_rows() -> list[dict[str, Any]]:
    """The presets' one matmul rate (no shape term) against the best shapes' published rates."""
    return [_row("gemm", f"{g.what} vs {g.hardware}", load_hardware(g.hardware).matmul_flops / 1e12, g.tflops,
                 "TFLOP/s", False, g.source) for g in GEMM]


def attention_rows() -> list[dict[str, Any]]:
    """h100-sxm's FlashAttention-2 terms against its figures (fitted on the causal forward and the
    backward, so the full forward is held out); other kernels against the same form fitted to them."""
    hw = load_hardware("h100-sxm")
    rows = []
    for kernel in sorted({a.kernel for a in ATTENTION}):
        for direction in ("fwd", "bwd"):
            mine = [a for a in ATTENTION if a.kernel == kernel and a.direction == direction]
            if not mine:
                continue
            own = fit_attention_rate([(a.length, a.causal, a.tflops * 1e12) for a in mine if a.causal == mine[0].causal])
            for a in mine:
                preset = kernel == hw.attention_backend
                if preset:
                    rate, kappa = ((hw.attention_fwd_flops, hw.attention_fwd_pairs_per_token) if direction == "fwd"
                                   else (hw.attention_bwd_flops, hw.attention_bwd_pairs_per_token))
                    fitted = a.causal == mine[0].causal
                else:
                    (rate, kappa), fitted = own, a.causal == mine[0].causal
                mask = "causal" if a.causal else "full"
                what = f"{kernel} {direction} {mask} {a.length} tokens" + (" (h100-sxm)" if preset else " (own fit)")
                rows.append(_row("attention", what, achieved_flops(a.length, a.causal, rate, kappa) / 1e12, a.tflops,
                                 "TFLOP/s", fitted, a.source))
    return rows


def _size(m: int) -> str:
    return f"{m / 2**30:g} GiB" if m >= 2**30 else f"{m / 2**20:g} MiB" if m >= 2**20 else f"{m / 2**10:g} KiB"


def collective_rows() -> list[dict[str, Any]]:
    """Bus bandwidth the presets price each published point at (the curve the planner reads)."""
    rows = []
    for c in COLLECTIVES:
        hw, n = load_hardware(c.hardware), c.gpus_per_node * c.nodes
        t = hw.collective_time_s(c.op, c.message_bytes, n, c.gpus_per_node)
        what = f"{c.op} {c.gpus_per_node} GPUs x {c.nodes} nodes, {_size(c.message_bytes)} ({c.hardware})"
        rows.append(_row("collectives", what, c.message_bytes * bus_factor(c.op, n) / t / 1e9, c.bus_gbps, "GB/s",
                         c.fitted, c.source))
    return rows


def alpha_beta_rows() -> list[dict[str, Any]]:
    """latency + bytes / bandwidth fitted to each published curve, against its points: how far the
    linear form the micro-batch model uses for all-to-alls is from a real curve."""
    rows = []
    for c in ALPHA_BETA:
        hw, n = load_hardware(c.hardware), c.gpus_per_node * c.nodes
        lat, bw = hw.collective(c.op, n, c.gpus_per_node).alpha_beta()
        bus = c.message_bytes * bus_factor(c.op, n)
        what = f"{c.op} {c.gpus_per_node}x{c.nodes}, {_size(c.message_bytes)}: {lat * 1e6:.0f} us + bytes / {bw / 1e9:.0f} GB/s"
        rows.append(_row("collective alpha-beta", what, bus / (lat + bus / bw) / 1e9, c.bus_gbps, "GB/s", True,
                         c.source))
    return rows


def e2e_rows() -> list[dict[str, Any]]:
    """MPT-7B training on 8 GPUs (FSDP FULL_SHARD = ZeRO-3, fp32 parameters under bf16 autocast) as
    the cost model prices it: grad_accum micro-batches of micro_batch samples, every layer
    checkpointed where the run did, then the step's reduce-scatter; tokens / step / GPU. The cost
    model wants a memory footprint (it plans what fits): dcp's own count on its GELU reference model
    of this shape (dcp.profiler.memory, fake tensors); the times below do not depend on it."""
    from dcp.profiler.memory import reference_footprint

    spec = ModelSpec(**MPT_7B)
    spec = dataclasses.replace(spec, memory={"autocast-bf16": reference_footprint(spec, "autocast-bf16")})
    rows = []
    for e in E2E:
        hw = load_hardware(e.hardware)
        cm = CostModel(spec, hw, Cluster(num_gpus=8, gpus_per_node=8, memory_bytes=hw.memory_bytes),
                       TrainingSetup(precision="autocast-bf16", zero_stage=3))
        tokens = e.micro_batch * e.seq_len
        pairs = e.micro_batch * attention_pairs("causal", e.seq_len)
        r = spec.num_layers if e.checkpointing else 0
        step = e.grad_accum * cm.time_s(tokens, pairs, 1, r) + cm.grad_sync_s()
        what = f"{e.seq_len // 1024}K x {e.micro_batch} x {e.grad_accum}{', ckpt' if e.checkpointing else ''} ({e.hardware})"
        rows.append(_row("end-to-end", what, tokens * e.grad_accum / step, e.tokens_per_gpu_s, "tokens/s/GPU", False,
                         e.source))
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """MAPE per category over all its rows and over the held-out ones."""
    out = {}
    for cat in CATEGORIES:
        mine = [r for r in rows if r["category"] == cat]
        held = [r for r in mine if not r["fitted"]]
        out[cat] = {"rows": len(mine), "held_out": len(held),
                    "mape": sum(abs(r["ratio"] - 1) for r in mine) / len(mine) if mine else None,
                    "mape_held_out": sum(abs(r["ratio"] - 1) for r in held) / len(held) if held else None}
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def render_section(doc: dict[str, Any]) -> str:
    """This report's section of docs/results.md, from the JSON alone."""
    lines = [BEGIN, "## Cost model against published measurements", "",
             f"Generated by `.venv/bin/python benchmarks/costmodel.py --docs docs/results.md` ({doc['date']}); "
             "every row with its source in `benchmarks/results/costmodel.json`. Predictions come from the shipped "
             "presets and `CostModel`, no GPU of ours; \"fitted\" rows are figures a preset was fitted on.", "",
             "| category | rows | held out | MAPE, held out | MAPE, all rows | worst held-out row (ratio) |",
             "|---|--:|--:|--:|--:|---|"]
    for cat, s in doc["summary"].items():
        held = [r for r in doc["rows"] if r["category"] == cat and not r["fitted"]]
        worst = max(held, key=lambda r: abs(r["ratio"] - 1), default=None)
        lines.append(f"| {cat} | {s['rows']} | {s['held_out']} | {_pct(s['mape_held_out'])} | {_pct(s['mape'])} | "
                     + (f"{worst['what']} ({worst['ratio']:.2f}x)" if worst else "-") + " |")
    lines += ["", "Ratio = predicted / published. End-to-end rows price MPT-7B training (llm-foundry's H100 and "
              "A100 tables) from FLOPs and the presets' rates, with no profile: a ratio above 1 is throughput "
              "the datasheet path promises and the run did not reach; `dcp profile` replaces those rates.", END]
    return "\n".join(lines) + "\n"


def write_section(path: Path, section: str) -> None:
    """Replace the section between the markers in `path`, or append it."""
    text = path.read_text() if path.is_file() else ""
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END) + "\n?", re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


def print_tables(rows: list[dict[str, Any]], summ: dict[str, dict[str, Any]]) -> None:
    for cat in CATEGORIES:
        mine = [r for r in rows if r["category"] == cat]
        width = max(len(r["what"]) for r in mine)
        print(f"\n{cat} ({mine[0]['unit']})")
        print(f"  {'':{width}s}  {'predicted':>10s}  {'published':>10s}  {'ratio':>6s}  kind      source")
        for r in mine:
            kind = "fitted" if r["fitted"] else "held out"
            print(f"  {r['what']:{width}s}  {r['predicted']:10.4g}  {r['published']:10.4g}  {r['ratio']:6.3f}  "
                  f"{kind:8s}  {r['source']}")
        s = summ[cat]
        print(f"  MAPE {_pct(s['mape'])} over {s['rows']} rows; held out: {_pct(s['mape_held_out'])} over {s['held_out']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "costmodel.json")
    ap.add_argument("--docs", type=Path, default=None, help="rewrite this report's section of this page")
    args = ap.parse_args(argv)
    rows = gemm_rows() + attention_rows() + collective_rows() + alpha_beta_rows() + e2e_rows()
    summ = summary(rows)
    print_tables(rows, summ)
    doc = {"date": time.strftime("%Y-%m-%d"), "summary": summ, "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nwrote {args.json}")
    if args.docs is not None:
        write_section(args.docs, render_section(doc))
        print(f"wrote {args.docs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
