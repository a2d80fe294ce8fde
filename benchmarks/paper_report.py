"""docs/results.md and its figures from the JSON `benchmarks/paper.py` writes: every number in the
page comes from that JSON, the hardware profile, or the GPU results under benchmarks/results/."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from paper_tables import (
    SHORT,
    case_label,
    costmodel_section,
    detail_table,
    fmt_x,
    ilp_check,
    long_context_section,
    main_table,
    measured_section,
    ok_cases,
    reasons,
    scaling_table,
    trend_table,
)

from dcp.costmodel import HardwareProfile, load_hardware


def _span(cases: list[dict[str, Any]], fn: Any) -> str:
    vals = [fn(c) for c in cases]
    return f"{fmt_x(min(vals))} to {fmt_x(max(vals))}" if vals else "n/a"


def _setting(doc: dict[str, Any], hw: HardwareProfile) -> str:
    m, paper = doc["meta"], ok_cases(doc, "paper")
    rows = ["| model | workload | samples per GPU | global batch (32 GPUs) | mean tokens per batch "
            "| longest sample, dataset / batches | static SP (bucket, packed) | model states per GPU |",
            "|---|---|--:|--:|--:|--:|--:|--:|"]
    rows += [f"| {SHORT[c['model']]} | {c['workload']} | {m['samples_per_gpu'][c['workload']]} | {c['global_batch']} "
             f"| {c['batch_tokens']:,.0f} | {c['dataset_longest_tokens']:,} / {c['batch_longest_tokens']:,} "
             f"| {c['static_sp']} | {c['static_gb']:.1f} GB of {c['memory_gb']:.1f} |" for c in paper]
    g = m["gpus_per_node"]
    a2a = ", ".join(f"{p}: {hw.collective('all_to_all', p, g).alpha_beta()[1] / 1e9:.0f}" for p in (2, 4, 8, 16, 32))
    world = hw.collective("all_reduce", 32, g)
    kind = "measured profile (`dcp profile`)" if m["hardware_kind"] == "measured" else "preset, not a measurement of ours"
    return f"""- Hardware profile **`{m['hardware']}`** ({kind}): {hw.device}, {hw.memory_bytes / 1e9:.1f} GB usable,
  matmul {hw.matmul_flops / 1e12:.0f} TFLOP/s, attention ({hw.attention_backend}) forward
  {hw.attention_fwd_flops / 1e12:.0f} / backward {hw.attention_bwd_flops / 1e12:.0f} TFLOP/s{_sustained(hw)}, all-to-all bus
  bandwidth by group size (GB/s) {a2a}, all-reduce over 32 GPUs up to {world.bus_bw(1e12) / 1e9:.0f} GB/s bus
  bandwidth (by message size). Sources, as the profile states them: matmul: {hw.sources.get('matmul_flops', '?')};
  attention: {hw.sources.get('attention_fwd_flops', '?')}; all-to-all: {hw.collective('all_to_all', 8, g).source} /
  {hw.collective('all_to_all', 32, g).source}; all-reduce: {world.source}.
- {m['gpus_per_node']} GPUs per node; ZeRO stage 1 (optimizer states sharded, as the paper trained) except
  {', '.join(f'{k}: stage {v}' for k, v in m['zero_stage'].items())}; bf16 with fp32 gradients and Adam.
- {m['steps']} global batches per 32-GPU case, {m['scaling_steps']} per scaling case (the first batches of a
  seeded shuffle, seed 0, the same batches for every strategy); ILP time limit {m['ilp_time_limit_s']:g} s per batch.
  The ILP stops on wall-clock time, so its plans (and speedups) can differ between runs on a loaded
  machine; every other strategy is deterministic.
- Global batch = samples per GPU x GPUs (it grows with the cluster, as the paper's runtime gives every rank
  micro-batches each step):

{chr(10).join(rows)}
"""


KEPT = ("hsdp_scale", "selfcheck")
"""Sections of docs/results.md this page carries over as they stand, each between
`<!-- NAME.py:begin -->` and `<!-- NAME.py:end -->`: written by `benchmarks/NAME.py`'s runs and by
hand from them (hsdp_scale.py prices a fixed step; selfcheck.py measures a CPU, which this page
cannot re-run), so regenerating the page keeps them instead of dropping them."""


def kept_sections(path: Path) -> dict[str, str]:
    """Each `KEPT` section of the page at `path` (markers included), where it has one."""
    text = path.read_text() if path.is_file() else ""
    kept = {}
    for name in KEPT:
        begin, end = f"<!-- {name}.py:begin -->", f"<!-- {name}.py:end -->"
        if begin in text and end in text:
            start = text.index(begin)
            kept[name] = text[start:text.index(end, start) + len(end)] + "\n\n"
    return kept


def _sustained(hw: HardwareProfile) -> str:
    """The rates a training step runs at, where the profile's are bursts (`sustained_clock` < 1)."""
    if hw.sustained_clock == 1.0:
        return ""
    c = hw.sustained_clock
    return (f" as kernel benchmarks time them; a step sustains {c:g} of each (matmul {hw.matmul_flops * c / 1e12:.0f}, "
            f"attention {hw.attention_fwd_flops * c / 1e12:.0f} / {hw.attention_bwd_flops * c / 1e12:.0f} TFLOP/s)")


def render(doc: dict[str, Any], hw: HardwareProfile, wall_s: float, kept: dict[str, str] | None = None) -> str:
    """The whole of docs/results.md; `kept`: the `KEPT` sections to carry over, by name."""
    kept = kept or {}
    m, paper = doc["meta"], ok_cases(doc, "paper")
    pr = m["paper_range"]
    notes = [r for c in paper for r in reasons(c, pr)]
    ilp_vs = lambda c: c["strategies"]["bucket-per-batch"]["mean_step_time_s"] / c["strategies"]["ilp"]["mean_step_time_s"]  # noqa: E731
    sp_gain = lambda c: c["strategies"]["bucket-best-static"]["speedup_vs_bucket"]  # noqa: E731
    rest = lambda c: c["strategies"]["ilp"]["speedup_vs_bucket"] / sp_gain(c)  # noqa: E731
    inter_stuck = sum(1 for c in paper if c["strategies"]["dcp-greedy-inter"]["idle_fraction"] > 0.25
                      and c["strategies"]["dcp-greedy-inter"]["straggler_share"] > 0.5)
    per_batch = "; ".join(f"{case_label(c)} {c['strategies']['bucket-per-batch']['groups']}" for c in paper)
    gantt = " ".join(f"![{g}](figures/{g})" for g in m.get("gantt", []))
    scaling = "" if m["quick"] else f"""
## Scaling: cluster size

The 32-GPU cases on 8, 64, 128 and 256 GPUs (global batch scaled with the GPUs).

![speedup against cluster size](figures/scaling-gpus.png)

Geometric mean over the cases, speedup over bucket:

{trend_table(doc, "gpus")}
The global batch grows with the cluster, and with it the longest sample a batch holds; bucket's
static SP does not, so its straggler grows too (column "longest in batches").

{scaling_table(doc, "gpus")}
## Scaling: model size

The text model's five workloads on 32 GPUs with 13B- and 70B-like Llamas (70B with ZeRO stage 3: its parameters
gathered layer by layer for every pass, all ranks in lockstep slots; Llama-13B's 40 and Llama-70B's 8 KV heads cap Ulysses SP at 8).

![speedup against model size](figures/scaling-models.png)

Geometric mean over the cases each model could plan, speedup over bucket:

{trend_table(doc, "models")}
Larger models need larger static SP sizes for the same samples (less memory per GPU is left for
activations), so bucket's groups are already larger and its straggler smaller. With ZeRO stage 3 every
rank joins every micro-batch slot's gathers (each layer's parameters, forward and backward), so a group
with more micro-batches than the others holds them all up: the greedy strategies, which do not plan for
that, fall behind bucket on several 70B cases, while ilp prices the lockstep slots and keeps its lead.

{scaling_table(doc, "models")}"""
    return f"""# dcp against the DCP paper

Generated by `.venv/bin/python benchmarks/paper.py --out docs/` in {wall_s:.0f} s on {m['cpus']} CPUs
({m['date']}); raw numbers in `benchmarks/results/paper.json`. Do not edit by hand.

**Simulated, not measured.** Every step time, speedup, idle and communication share on this page is
dcp's cost model replaying each strategy's plans (`dcp.planner.simulate`) on the hardware profile
`{m['hardware']}`; none was measured on a GPU cluster. Planner solve times are measured wall-clock on
this machine ({m['cpus']} CPUs shared with other jobs). What was measured on hardware is listed at the end.

The paper (NUS, "Training Variable Long Sequences With Data-centric Parallel"): 32 H200 (8 per node),
a 1D and a 2D model on short, balanced and long datasets; DCP-inter {pr['dcp-greedy-inter'][0]:.2f}x to
{pr['dcp-greedy-inter'][1]:.2f}x over bucket parallel, up to {pr['dcp-greedy'][1]:.2f}x with pyramid checkpointing.
Its per-case numbers are not in our references, so each case is compared with that range.

## Setting

{_setting(doc, hw)}
Strategies (speedups are bucket's mean step time over the strategy's, on the same batches):
- `bucket`: the paper's bucket parallel: ONE SP size for the whole training, the smallest that fits the
  dataset's longest sample fully checkpointed; per length bucket as many samples per micro-batch as fit;
  every layer checkpointed; micro-batches dealt round-robin to the groups, no balancing.
- `bucket-best-static`, `packed-best-static`: the static SP size (at least bucket's) with the best mean
  step time on these batches: how much of a gain is just choosing the right static SP.
- `bucket-per-batch`: bucket with the smallest SP that fits each batch's longest sample (`dcp compare` runs both).
- `packed`: the same static SP, samples packed first-fit-decreasing to a token budget, LPT over groups.
- `dcp-greedy-inter`: the paper's runtime (per-bucket SP and batch size, balanced accumulation), every
  layer checkpointed. `dcp-greedy`: the same with pyramid checkpointing (DCP-intra).
- `ilp`: dcp's integer program (warm-started from the greedy and baseline plans).

## The 32-GPU table

![speedups on 32 GPUs](figures/speedup-32gpu.png)

{main_table(doc)}
Over the best static SP, ilp's speedup is {_span(paper, rest)}; choosing the static SP well alone gives
{_span(paper, sp_gain)} over bucket.

### Cases outside the paper's range

{chr(10).join("- " + n for n in notes) if notes else "None: every case's DCP speedups lie in the paper's range."}

### ilp against dcp-greedy

{ilp_check(doc)}
## Where the time goes

![time breakdown](figures/breakdown-32gpu.png)

First global batch of the 2D model on opensora:balanced, every rank: {gantt}

{detail_table(doc)}
## Why an earlier run saw 8-14x

`bucket-per-batch` (once dcp's default `bucket`) re-chooses its SP size for every global batch: the smallest that fits that
batch's longest sample. On an H200 that is often SP 1 for text, so one long sample runs on one GPU while
the others wait (groups of its first batch here: {per_batch}). Against that baseline ilp is
{_span(paper, ilp_vs)} faster here (last column of the table). The paper's bucket parallel fixes one SP size for the whole training from the dataset's longest
sample, which this page uses; the best-static columns show how much of the rest a better static choice recovers.
{scaling}
{kept.get("hsdp_scale", "")}{long_context_section()}
## Differences from the paper's setup

- **Hardware numbers.** `{m['hardware']}` is {"a profile measured with `dcp profile`" if m['hardware_kind'] == 'measured'
  else "a preset: memory bandwidth measured on one borrowed H200, matmul the H200's published burst rate run at its published sustained clock, attention from FlashAttention-2's published H100 curves, collectives from published nccl-tests curves of an H100 cluster with the same NVLink and 8x400G network (all-to-all across nodes at an ideal-fabric estimate)"},
  not the paper's cluster. A congested fabric (FlexSP measured 5-10 GB/s across nodes) would make large SP
  groups dearer than here, which would hurt the best-static baselines and DCP's SP choices alike.
- **Memory and the static SP.** The static SP follows from dcp's memory model (Korthikanti et al.
  activations, flash attention, full checkpointing keeps each layer's input) on the usable memory above.
  Where it lets the dataset's longest sample fit on few GPUs, bucket runs every long sample there and
  stragglers dominate its step; the paper's implementation may have needed a larger SP (more activation
  memory, allocator fragmentation), which would shrink bucket's idle time and the speedups.
- **Bucket parallel's batch sizes.** Per length bucket, as many samples per micro-batch as fit fully
  checkpointed (at most the bucket's share per group), dealt round-robin; the paper tunes Open-Sora's
  per-bucket batch sizes "for balance", which we do not model beyond that cap.
- **ZeRO.** Stage 1 over all GPUs (stage 3 for 70B): model states per GPU as in the setting table.
- **Global batch.** Ours is a fixed number of samples per GPU per step; the paper's runtime fills a
  batch until memory-bound micro-batches are ready for every rank. Fewer samples per GPU mean fewer
  micro-batches to balance and larger straggler effects for the static baselines.
- **Communication model.** Ulysses all-to-alls (four per attention, each way) priced linearly in tokens
  from the all-to-all curve of the group's shape, never overlapped with compute; per step each layer's
  gradient reduction in the recipe's reduce dtype, started under the last micro-batch's backward (only
  what it does not hide is exposed), and ZeRO-1's all-gathers of the updated parameters (ZeRO-3:
  per-layer gathers, one prefetched ahead, and reduce-scatters, in lockstep slots), priced at their
  message sizes as the executor issues them; no pipeline or tensor parallelism.
- **DCP's runtime.** `dcp-greedy` prices the paper's profiling with the cost model instead of timed runs,
  and its straggler and rebalancing steps are our reading of the paper, not its code. Its profile keeps,
  per length bucket, the SP size with the most samples per GPU-second; for long samples that is a small
  SP size, and with every layer checkpointed (`dcp-greedy-inter`) the step then often waits on one long
  micro-batch ({inter_stuck} of the {len(paper)} 32-GPU cases idle over 25% behind a micro-batch that is most
  of the step). The paper's measured profile and runtime may split such samples differently.

## Measured on hardware

{measured_section()}
{kept.get("selfcheck", "")}{costmodel_section()}"""


def write_report(doc: dict[str, Any], out_dir: Path, started: float) -> Path:
    """docs/results.md plus docs/figures/*.png; `started` is the command's start (perf_counter)."""
    figures = out_dir / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    from paper_figures import breakdown, scaling, speedup_bars

    speedup_bars(doc, figures / "speedup-32gpu.png")
    breakdown(doc, figures / "breakdown-32gpu.png")
    if not doc["meta"]["quick"]:
        scaling(doc, "gpus", figures / "scaling-gpus.png")
        scaling(doc, "models", figures / "scaling-models.png")
    path = out_dir / "results.md"
    hw = load_hardware(doc["meta"]["hardware"])
    path.write_text(render(doc, hw, time.perf_counter() - started, kept_sections(path)))
    return path
