"""`dcp show` (a plan file summarized, re-simulated, drawn) and `dcp presets` (what ships, with sources)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import click

from dcp.commands.common import (
    COLUMN_HELP,
    FIGURE_SUFFIXES,
    STEP_COLUMNS,
    check_output,
    count,
    help_parts,
    pct,
    plural,
    secs,
    table,
    write_whole,
)
from dcp.costmodel import CostModel, load_hardware, load_model, preset_names
from dcp.planner.plan import Plan, PlanError
from dcp.planner.report import (
    group_rows,
    kind_shares,
    load_plan_document,
    memory_headroom,
    reprice,
    unused_ranks,
)
from dcp.planner.run import gap, groups_label, simulate_all, step_rows
from dcp.planner.status import program_outcome


@click.command()
@click.argument("plan_file", metavar="PLAN.json", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--step", "step_index", type=int, default=0, show_default=True, help="Which step to detail (0-based).")
@click.option("--gantt", "gantt_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a Gantt chart of every rank's timeline (.png, .svg or .pdf).")
@click.option("--model", default=None,
              help="Re-price the plan for another model preset or JSON (default: the plan's; llama-7b for a bare plan).")
@click.option("--hardware", default=None, help="Re-price the plan on another hardware preset or profile JSON.")
@click.option("--zero-stage", type=click.Choice(["0", "1", "2", "3"]), default=None,
              help="Re-price the plan with another ZeRO stage (see `dcp plan --help`).")
@help_parts(columns=COLUMN_HELP)
def show(plan_file: Path, step_index: int, gantt_path: Path | None, model: str | None, hardware: str | None,
         zero_stage: str | None) -> None:
    """Summarize a plan file from `dcp plan --format json` and draw its timeline.

    Re-simulates the plan on the cost model rebuilt from the file's config: groups,
    micro-batches, checkpointing, predicted times, and each kind's share of the step.
    A multi-phase plan lists each group's phase and start; its groups label shows
    the phases apart by "|", and the Gantt chart boxes each group where it runs.
    With --model, --hardware or --zero-stage the same plan (groups, assignment,
    checkpointed layers) is re-priced on that cost model instead: what the plan
    would cost there, or an error if it no longer fits its memory (or, for a
    multi-phase step at --zero-stage 3, which runs one layout, that it cannot run).

    {columns}

    \b
    Example:
      dcp plan --steps 2 --format json -o plan.json
      dcp show plan.json --step 1 --gantt step1.png
      dcp plan --strategy dcp-greedy --steps 2 --format json -o greedy.json
      dcp show greedy.json --zero-stage 3
    """
    check_output(gantt_path, "--gantt", FIGURE_SUFFIXES)
    try:
        doc = load_plan_document(plan_file)
    except PlanError as e:  # name the file when the error names only what is inside it
        raise e if str(plan_file) in str(e) else PlanError(f"{plan_file}: {e}") from e
    doc.step(step_index)  # an error naming the valid range
    overridden = model is not None or hardware is not None or zero_stage is not None
    cm = doc.cost_model(model, hardware, None if zero_stage is None else int(zero_stage))
    plans = [_reprice(i, p, cm) for i, p in enumerate(doc.plans)] if overridden else doc.plans
    timelines = simulate_all(plans, cm)
    the_plan, tl = plans[step_index], timelines[step_index]
    what = doc.describe() + (f", re-priced on {cm.model.name} x {cm.hardware.name}, zero stage "
                             f"{zero_stage or doc.config.get('zero_stage', 1)}" if overridden else "")
    lines = [f"{plan_file}: {what}"]
    if len(plans) > 1:
        lines.append(table(step_rows(plans, timelines), {
            **STEP_COLUMNS, "gap": ("gap", pct), "idle_fraction": ("idle", pct),
            "comm_fraction": ("comm", pct)}))
    tokens = sum(s.tokens for s in the_plan.samples)
    unused = unused_ranks(the_plan)
    lines += [
        f"step {step_index}: {plural(len(the_plan.samples), 'sample')}, {plural(tokens, 'token')}, groups "
        f"{groups_label(the_plan)}" + (f", {plural(unused, 'rank')} unused" if unused else ""),
        f"predicted {the_plan.step_time_s:.3f} s | lower bound {the_plan.lower_bound_s:.3f} s "
        f"(gap {pct(gap(the_plan))}) | solve {the_plan.solve_time_s:.3f} s ({the_plan.solver_status}) | "
        f"memory headroom {pct(memory_headroom(the_plan))}",
        "share of rank-seconds: " + " | ".join(f"{k} {pct(v)}" for k, v in kind_shares(tl).items()),
        *([f"program: {program_outcome(the_plan)}; " + "; ".join(the_plan.notes)] if the_plan.strategy == "ilp" else []),
        table(group_rows(the_plan), {
            "group": ("group", str),
            **({"phase": ("phase", str), "start_s": ("start (s)", secs)} if the_plan.num_phases > 1 else {}),
            "ranks": ("ranks", str), "sp": ("sp", str), "layout": ("u x c", str),
            "microbatches": ("micro-batches", str), "samples": ("samples", str), "tokens": ("tokens", str),
            "ckpt_min": ("ckpt min", str), "ckpt_max": ("ckpt max", str), "busy_s": ("busy (s)", secs),
            "peak_memory_gb": ("peak GB", "{:.1f}".format)}),
    ]
    click.echo("\n".join(lines))
    if gantt_path is not None:
        from dcp.viz import plan_gantt

        title = (f"{what}: step {step_index}, {tl.step_time_s:.3f} s, idle {pct(tl.idle_fraction)}, "
                 f"comm {pct(tl.comm_fraction)}")
        write_whole(gantt_path, lambda tmp: plan_gantt(the_plan, tl, tmp, title=title))
        click.echo(f"wrote {gantt_path}", err=True)



def _reprice(step_index: int, plan: Plan, cm: CostModel) -> Plan:
    """`reprice`, its error naming the step."""
    try:
        return reprice(plan, cm)
    except PlanError as e:
        raise PlanError(f"step {step_index}: {e}") from e


def _wrap(text: str, indent: str = "      ") -> str:
    return textwrap.fill(text, width=100, initial_indent=indent, subsequent_indent=indent)


@click.command()
@click.argument("name", required=False)
def presets(name: str | None) -> None:
    """List the model and hardware presets with their sources, or show one in full.

    Every shipped number names where it comes from: a model's shape its paper or
    config, a hardware profile each of its numbers (datasheet, published
    measurement, or a dcp estimate marked as such).

    \b
    Example:
      dcp presets
      dcp presets h200-sxm
    """
    models, hardware = preset_names("models"), preset_names("hardware")
    if name is not None and name not in models + hardware:
        raise click.BadParameter(f"unknown preset {name!r}; known: {', '.join(models + hardware)}", param_hint="NAME")
    lines = []
    if name is None or name in models:
        lines.append("models:")
        for n in [name] if name else models:
            m = load_model(n)
            lines.append(f"  {n:22s} {count(m.param_count()):>7s} params, {m.num_layers} layers, {m.attention} attention")
            lines.append(_wrap(f"source: {m.source or 'not given'}"))
    if name is None or name in hardware:
        lines.append("hardware:")
        for n in [name] if name else hardware:
            hw = load_hardware(n)
            lines.append(f"  {n:22s} {hw.device}, {hw.memory_bytes / 1e9:.1f} GB usable, {hw.gpus_per_node} per node")
            if name is None:
                memory = hw.sources.get("memory_capacity_bytes", "not given")
                lines.append(_wrap(f"sources: {len(hw.sources)} numbers, e.g. memory: {memory} (all: dcp presets {n})"))
            else:
                lines.append("      sources:")
                lines += [_wrap(f"{field}: {text}", "        ") for field, text in hw.sources.items()]
    click.echo("\n".join(lines))
