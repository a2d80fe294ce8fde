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
import math
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel_data import ALPHA_BETA, ATTENTION, COLLECTIVES, FLEXSP, GEMM, MODELS, RUNS, Run  # noqa: E402

from dcp.costmodel import (  # noqa: E402
    Cluster,
    CostModel,
    HardwareProfile,
    ModelSpec,
    PrecisionRecipe,
    TrainingSetup,
    attention_pairs,
    bus_factor,
    get_recipe,
    load_hardware,
)
from dcp.costmodel.attention import achieved_flops, fit_attention_rate  # noqa: E402
from dcp.costmodel.schedule import GroupShape, MicroBatchShape  # noqa: E402

CATEGORIES = ("gemm", "attention", "collectives", "collective alpha-beta", "end-to-end")
BEGIN, END = "<!-- costmodel.py:begin -->", "<!-- costmodel.py:end -->"


def _row(category: str, what: str, predicted: float, published: float, unit: str, fitted: bool,
         source: str) -> dict[str, Any]:
    return {"category": category, "what": what, "predicted": predicted, "published": published, "unit": unit,
            "ratio": predicted / published, "fitted": fitted, "source": source}


def gemm_rows() -> list[dict[str, Any]]:
    """The presets' one matmul rate (no shape term) against the best shapes' published rates: a
    burst's against `matmul_flops`, a sustained one's against it at `sustained_clock` (fitted on
    the H200's: that ratio is the Hopper presets' clock)."""
    rows = []
    for g in GEMM:
        hw = load_hardware(g.hardware)
        rate = hw.matmul_flops * (hw.sustained_clock if g.sustained else 1.0)
        rows.append(_row("gemm", f"{g.what} vs {g.hardware}", rate / 1e12, g.tflops, "TFLOP/s", g.sustained, g.source))
    return rows


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


PRESET_OF_GPU = {"h100-sxm5-80gb-700w": "h100-sxm", "h100-sxm5-96gb-500w": "h100-sxm-500w",
                 "a100-sxm4-80gb": "a100-80gb"}
"""The preset each published GPU variant is priced on (`GPU_VARIANTS`)."""
KERNEL_OF = {"triton-fa": "triton", "sdpa-flash": None, "flash-attn-2": None}
"""The presets' attention kernel for each run's (None: the preset's default, FlashAttention-2)."""
HELD_OUT_SOURCE = "fms-fsdp"
"""The source kept out of every fit, chosen before any of its rows was priced. The only term
fitted to end-to-end rows is llm-foundry's Triton attention (`FITTED_KERNEL`), which no other
source runs; every other term is derived from the layer's structure or from kernel-level and
hardware measurements."""


def _recipe(run: Run) -> str | PrecisionRecipe:
    """The precision recipe a run's words describe."""
    if run.precision.startswith("amp_bf16"):
        return "autocast-bf16"  # fp32 parameters under bf16 autocast
    if "reduce and buffer dtype bf16" in run.precision or "reduce, and buffer dtype bf16" in run.precision:
        return PrecisionRecipe(name="bf16-reduce-bf16", param_dtype="bf16", grad_dtype="bf16", reduce_dtype="bf16",
                               compute_dtype="bf16", master_weights=True,
                               description="FSDP1 bfSixteen: bf16 parameters, gradients and reduction, fp32 shards")
    return "bf16"  # bf16 parameters, fp32 reduction and master weights


def _ckpt_layers(run: Run, layers: int) -> int:
    """Layers priced as recomputed: every one for full checkpointing; half for torchtitan's
    selective policies (op: every second matmul's output recomputed, attention saved; layer: every
    second block at its default) and fms-fsdp's unstated fraction; none without."""
    return {"none": 0, "full": layers}.get(run.checkpointing, layers // 2)


_FOOTPRINTS: dict[tuple[str, str], Any] = {}


def _spec(model: str, recipe: str | PrecisionRecipe) -> ModelSpec:
    """The run's model shape with dcp's own memory count for its recipe (the cost model plans what
    fits; the times do not depend on it)."""
    from dcp.profiler.memory import reference_footprint

    name = recipe if isinstance(recipe, str) else "bf16"
    spec = ModelSpec(**MODELS[model])
    if (model, name) not in _FOOTPRINTS:
        _FOOTPRINTS[model, name] = reference_footprint(spec, name)
    own = get_recipe(recipe).name  # a recipe of the run's own: the bf16 count under its name
    return dataclasses.replace(spec, memory={own: dataclasses.replace(_FOOTPRINTS[model, name], recipe=own)})


def _step_tokens_per_gpu_s(cm: CostModel, seq_len: int, micro_batch: int, grad_accum: int, ckpt_layers: int) -> float:
    """Tokens per second per GPU of a data-parallel step: every GPU its own group (SP 1) running
    `grad_accum` micro-batches of `micro_batch` samples, priced by the step's schedule at the
    setup's ZeRO stage (lockstep slots at stage 3) with the optimizer's step."""
    tokens = micro_batch * seq_len
    mb = MicroBatchShape(float(tokens), float(micro_batch * attention_pairs("causal", seq_len)), ckpt_layers)
    groups = [GroupShape(1, (mb,) * grad_accum)] * cm.cluster.num_gpus
    return tokens * grad_accum / cm.step_price(groups).step_time_s


def _price_run(run: Run, hw: HardwareProfile) -> float:
    """Training tokens per second per GPU of a published run priced as it ran on `hw`."""
    recipe = _recipe(run)
    spec = _spec(run.model, recipe)
    training = TrainingSetup(precision=recipe, zero_stage=run.zero_stage, shard_group=run.shard_group,
                             kernels="compiled" if run.compiled else "eager", attention=KERNEL_OF[run.attention],
                             loss="fused" if "fused" in run.loss else "upcast",
                             optimizer="fused" if "fused=True" in run.optimizer else "foreach")
    cm = CostModel(spec, hw, Cluster(num_gpus=run.num_gpus, gpus_per_node=run.gpus_per_node,
                                     memory_bytes=hw.memory_bytes), training)
    return _step_tokens_per_gpu_s(cm, run.seq_len, run.micro_batch, run.grad_accum,
                                  _ckpt_layers(run, spec.num_layers))


FITTED_KERNEL = "triton"
"""The one preset term fitted to end-to-end rows: llm-foundry's Triton FlashAttention has no
published benchmark on any GPU, so its rates on each preset are a proxy's (FlashAttention-1 on
H100, OpenAI Triton's kernel on A100; their sources say which) scaled by one factor per GPU, fitted
to llm-foundry's rows on that GPU (`fit_kernel_scale`). Those rows are in-sample; no other
source runs the kernel."""


def _scaled_kernel(hw: HardwareProfile, name: str, scale: float) -> HardwareProfile:
    k = hw.attention_kernels[name]
    causal = k.bwd_causal_flops * scale if k.bwd_causal_flops else None
    scaled = dataclasses.replace(k, fwd_flops=k.fwd_flops * scale, bwd_flops=k.bwd_flops * scale,
                                 bwd_causal_flops=causal)
    return dataclasses.replace(hw, attention_kernels={**hw.attention_kernels, name: scaled})


def fit_kernel_scale(preset: str) -> float:
    """The factor on `FITTED_KERNEL`'s long-sequence rates (both directions) that minimizes the
    squared log ratios of the runs that used it on `preset`: golden-section search on [0.5, 3]
    (the loss is unimodal in the factor: every row's time falls as the kernel speeds up)."""
    runs = [r for r in RUNS if KERNEL_OF[r.attention] == FITTED_KERNEL and PRESET_OF_GPU[r.gpu] == preset]
    hw = load_hardware(preset)

    def loss(scale: float) -> float:
        priced = _scaled_kernel(hw, FITTED_KERNEL, scale)
        return sum(math.log(_price_run(r, priced) / r.tokens_per_gpu_s) ** 2 for r in runs)

    lo, hi, g = 0.5, 3.0, (math.sqrt(5) - 1) / 2
    while hi - lo > 1e-4:
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        lo, hi = (lo, b) if loss(a) < loss(b) else (a, hi)
    return (lo + hi) / 2


def e2e_rows() -> list[dict[str, Any]]:
    """Every published run of `RUNS` priced as it ran, through `CostModel` and its step price: the
    run's model shape, GPU variant's preset, attention kernel, eager or compiled, precision, ZeRO
    stage and shard group, checkpointing, loss kernel and optimizer. Rows whose kernel is
    `FITTED_KERNEL` are marked fitted. Then FlexSP's published cost fit against the same cost
    model on its cluster's preset."""
    rows = []
    for run in RUNS:
        hw = load_hardware(PRESET_OF_GPU[run.gpu])
        what = (f"{run.model} {run.seq_len // 1024}K x {run.micro_batch} x {run.grad_accum}, {run.num_gpus} GPUs, "
                f"{run.checkpointing} AC, {run.attention}, {'compiled' if run.compiled else 'eager'} ({hw.name})")
        row = _row("end-to-end", what, _price_run(run, hw), run.tokens_per_gpu_s, "tokens/s/GPU",
                   KERNEL_OF[run.attention] == FITTED_KERNEL, run.source)
        rows.append({**row, "run_source": run.source_id})
    rows += flexsp_rows()
    return rows


def flexsp_rows() -> list[dict[str, Any]]:
    """FlexSP's published per-sample compute fit (a1 L^2 + a2 L ms on one GPU, GPT-7B) against
    the cost model's micro-batch of one sample of L tokens on one GPU of its cluster's preset
    (a100-80gb-flexsp: FlashAttention-2, eager, bf16), its 12 of 32 MLP-checkpointed layers priced
    as none (an MLP's recompute is not a layer's). The fit is the source's own model, not a
    measured table: its rows check shape and scale, at lengths from 2K to 32K, as tokens per second."""
    fit = FLEXSP["gpt-7b-flexsp"]
    spec = _spec("gpt-7b-flexsp", "bf16")
    hw = load_hardware("a100-80gb-flexsp")
    cm = CostModel(spec, hw, Cluster(num_gpus=64, gpus_per_node=8, memory_bytes=hw.memory_bytes),
                   TrainingSetup(precision="bf16", zero_stage=3, kernels="eager"))
    rows = []
    for length in (2048, 4096, 8192, 16384, 32768):
        predicted = cm.time_s(length, attention_pairs("causal", length), 1, 0)
        row = _row("end-to-end", f"gpt-7b-flexsp one {length // 1024}K sample on one GPU (a100-80gb-flexsp, fa2, eager)",
                   length / predicted, length / (fit.compute_ms(length) / 1e3), "tokens/s/GPU", False, fit.source)
        rows.append({**row, "run_source": "flexsp-fit"})
    return rows


def by_source(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """End-to-end MAPE and worst row per source; the held-out source marked."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["category"] != "end-to-end":
            continue
        s = out.setdefault(r["run_source"], {"rows": 0, "errors": [], "held_out": r["run_source"] == HELD_OUT_SOURCE,
                                             "fitted": False})
        s["rows"] += 1
        s["fitted"] = s["fitted"] or r["fitted"]
        s["errors"].append(abs(r["ratio"] - 1))
    for s in out.values():
        errors = s.pop("errors")
        s["mape"], s["worst"] = sum(errors) / len(errors), max(errors)
    return out


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
    lines += ["", "End-to-end by source. One term is fitted to end-to-end rows: llm-foundry's Triton attention, "
              "which has no published kernel benchmark, is its proxy's rate times one factor per GPU fitted to "
              "llm-foundry's rows on that GPU (those rows are in-sample). Every other term is derived from the "
              "layer's structure or from kernel and hardware measurements; fms-fsdp stays out of every fit:", "",
              "| source | rows | MAPE | worst row | |", "|---|--:|--:|--:|---|"]
    for name, s in doc.get("sources", {}).items():
        kind = "held out" if s["held_out"] else "in-sample (Triton rate)" if s.get("fitted") else "out of sample"
        lines.append(f"| {name} | {s['rows']} | {_pct(s['mape'])} | {_pct(s['worst'])} | {kind} |")
    lines += ["", "Ratio = predicted / published (throughput: above 1, the model is too fast). End-to-end rows price "
              "each published run of `benchmarks/costmodel_data.py` as it ran (model shape, GPU variant's preset, "
              "attention kernel, eager or compiled, precision recipe, ZeRO stage and shard group, checkpointing, loss "
              "kernel, optimizer) from FLOPs, the elementwise bytes counted from the layer's structure (norm kind, "
              "positions, fused q/k/v, biases), the loss and optimizer bytes and the presets' rates at the clock a "
              "step sustains (`sustained_clock`), the step's schedule with compute beside a collective in flight "
              "18.9% slower (`overlap_slowdown`, a published average), with no profile. Approximations: "
              "torchtitan's selective "
              "checkpointing (per op or every second layer) and fms-fsdp's unstated fraction are priced as half the "
              "layers recomputed; the H100 500 W part's rates from its published bounds and the 700 W part's "
              "sustained clock; collectives beyond the measured node counts on the nearest measured curve. FlexSP's "
              "rows compare its published per-sample compute fit (GPT-7B, A100) with one sample on one GPU.", END]
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
    sources = by_source(rows)
    print("\nend-to-end by source (MAPE, worst row):")
    for name, s in sources.items():
        print(f"  {name:18s} {s['rows']:2d} rows  MAPE {_pct(s['mape'])}  worst {_pct(s['worst'])}"
              + ("  (held out)" if s["held_out"] else ""))
    doc = {"date": time.strftime("%Y-%m-%d"), "summary": summ, "sources": sources, "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nwrote {args.json}")
    if args.docs is not None:
        write_section(args.docs, render_section(doc))
        print(f"wrote {args.docs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
