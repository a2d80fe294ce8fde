"""The `dcp` command line: parse options, call dcp.planner.run, print. No logic lives here.

Other commands register themselves at the end of this file with `main.add_command(...)`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from dcp.costmodel import (
    DEFAULT_HARDWARE,
    DEFAULT_MODEL,
    CostModel,
    CostModelError,
    load_hardware,
    load_model,
    preset_names,
)
from dcp.data.batches import make_batches
from dcp.data.workloads import WorkloadError
from dcp.planner import STRATEGIES, Sample
from dcp.planner.plan import InfeasibleError, PlanError
from dcp.planner.report import (
    group_rows,
    kind_shares,
    load_plan_document,
    memory_headroom,
    unused_ranks,
)
from dcp.planner.run import (
    build_cost_model,
    compare,
    default_model,
    gap,
    groups_label,
    plan_steps,
    simulate_all,
    step_rows,
    summarize,
)
from dcp.planner.status import program_outcome

# Errors that mean "bad input", reported as one line, never a traceback. OSError covers an
# output path that cannot be written.
USER_ERRORS = (CostModelError, WorkloadError, InfeasibleError, PlanError, ValueError, OSError)


class DcpGroup(click.Group):
    """A click group that turns library errors of any subcommand into `Error: ...`, exit 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except USER_ERRORS as e:
            raise click.ClickException(str(e)) from e


@click.group(cls=DcpGroup)
@click.version_option(package_name="dcp")
def main() -> None:
    """dcp: plan sequence parallelism, micro-batches and checkpointing per global batch."""


def planning_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The options `plan` and `compare` share: workload, model, cluster, batches, output."""
    options = [
        click.option("--workload", default="wikipedia", show_default=True,
                     help="wikipedia, lognormal[:mean=1024,...], opensora[:short|balanced|long] or a lengths "
                          "file (.txt, .txt.gz, .csv, .parquet, .jsonl)."),
        click.option("--model", default=None,
                     help="Model preset or JSON file (see `dcp presets`). Default: " + DEFAULT_MODEL + ", "
                          "opensora-stdit-1.1b for opensora workloads."),
        click.option("--hardware", default=DEFAULT_HARDWARE, show_default=True,
                     help="Hardware preset or a profile JSON from `dcp profile`."),
        click.option("--gpus", type=click.IntRange(min=1), default=32, show_default=True, help="GPUs in the job."),
        click.option("--gpus-per-node", type=click.IntRange(min=1), default=None,
                     help="Default: the hardware profile's (8 for the presets)."),
        click.option("--memory-gb", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="Usable memory per GPU in GB (1e9), overriding the profile's."),
        click.option("--zero-stage", type=click.Choice(["0", "1", "2", "3"]), default="1", show_default=True),
        click.option("--global-batch", type=click.IntRange(min=1), default=None,
                     help="Samples per global batch (default 512 unless --global-tokens is given)."),
        click.option("--global-tokens", type=click.IntRange(min=1), default=None,
                     help="Tokens per global batch instead of a sample count."),
        click.option("--steps", type=click.IntRange(min=1), default=10, show_default=True,
                     help="Global batches to plan."),
        click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="ILP solver limit per step in seconds."),
        click.option("--seed", type=int, default=0, show_default=True, help="Workload and shuffle seed."),
        click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table",
                     show_default=True),
        click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Write to this file instead of stdout."),
    ]
    return functools.reduce(lambda g, opt: opt(g), reversed(options), f)


def _setup(o: dict[str, Any]) -> tuple[CostModel, list[list[Sample]], dict[str, Any]]:
    """Cost model, batches and the resolved configuration from the shared options."""
    config = dict(o, model=o["model"] or default_model(o["workload"]), zero_stage=int(o["zero_stage"]))
    config.pop("fmt")
    config.pop("output")
    cm = build_cost_model(config["model"], config["hardware"], config["gpus"], config["gpus_per_node"],
                          config["memory_gb"], config["zero_stage"])
    config["gpus_per_node"] = cm.cluster.gpus_per_node
    batches = make_batches(config["workload"], cm, global_batch=config["global_batch"],
                           global_tokens=config["global_tokens"], steps=config["steps"], seed=config["seed"])
    return cm, batches, config


def _emit(text: str, output: Path | None) -> None:
    if output is None:
        click.echo(text.rstrip("\n"))
    else:
        output.write_text(text if text.endswith("\n") else text + "\n")
        click.echo(f"wrote {output}", err=True)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _count(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(int(n))


def _secs(x: float) -> str:
    return f"{x:.3f}"


def _table(frame: Any, columns: dict[str, tuple[str, Callable[[Any], str]]]) -> str:
    """Right-aligned text table of the given columns: {column: (header, formatter)}."""
    cells = [[fmt(v) for v in frame[c]] for c, (_, fmt) in columns.items()]
    headers = [h for h, _ in columns.values()]
    widths = [max([len(h), *map(len, col)]) for h, col in zip(headers, cells, strict=True)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    for row in zip(*cells, strict=True):
        lines.append("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))
    return "\n".join(lines)


# The per-step columns `plan` and `show` both print (then each adds its own).
_STEP_COLUMNS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "step": ("step", str), "samples": ("samples", str), "tokens": ("tokens", str),
    "groups": ("groups (n x sp)", str), "microbatches": ("micro-batches", str),
    "step_time_s": ("step (s)", _secs),
}


@main.command()
@planning_options
@click.option("--strategy", default="ilp", show_default=True,
              help="ilp, dcp-greedy, dcp-greedy-inter, bucket or packed.")
def plan(strategy: str, **o: Any) -> None:
    """Plan global batches and print each step's schedule and predicted time.

    \b
    Example:
      dcp plan --workload wikipedia --gpus 32 --steps 2 --strategy dcp-greedy
      dcp plan --format json -o plan.json
    """
    fmt, output = o["fmt"], o["output"]
    cm, batches, config = _setup(o)
    plans = plan_steps(batches, cm, strategy, config["time_limit"])
    timelines = simulate_all(plans, cm)
    summary = summarize(plans, timelines)
    if fmt == "json":
        steps = [{"step": i, "plan": p.to_dict(), "simulation": t.stats()}
                 for i, (p, t) in enumerate(zip(plans, timelines, strict=True))]
        text = json.dumps({"config": dict(config, strategy=strategy), "steps": steps, "summary": summary}, indent=1)
    elif fmt == "csv":
        import pandas as pd

        frames = [p.to_frame().assign(step=i) for i, p in enumerate(plans)]
        frame = pd.concat(frames, ignore_index=True)
        text = frame[["step", *[c for c in frame.columns if c != "step"]]].to_csv(index=False)
    else:
        table = _table(step_rows(plans, timelines), {
            **_STEP_COLUMNS, "lower_bound_s": ("bound (s)", _secs), "gap": ("gap", _pct),
            "solve_time_s": ("solve (s)", _secs), "program": ("program", str)})
        text = (f"{strategy} on {cm.cluster.num_gpus} x {cm.hardware.name}, {cm.model.name}, "
                f"{config['workload']}\n{table}\n"
                f"mean step {summary['mean_step_time_s']:.3f} s | "
                f"{summary['throughput_tokens_per_s']:,.0f} tokens/s | idle {_pct(summary['idle_fraction'])} | "
                f"comm {_pct(summary['comm_fraction'])}")
    _emit(text, output)


@main.command(name="compare")
@planning_options
@click.option("--strategies", default=None,
              help="Comma-separated strategies. Default: all of them.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also draw bars per strategy, the lower bound marked (PNG, SVG or PDF by extension).")
@click.option("--plot-metric", type=click.Choice(["step-time", "throughput"]), default="step-time",
              show_default=True, help="What the --plot bars show.")
def compare_cmd(strategies: str | None, plot: Path | None, plot_metric: str, **o: Any) -> None:
    """Run the same global batches through several strategies and compare them.

    \b
    Example:
      dcp compare --workload opensora --gpus 32 --steps 2
      dcp compare --strategies bucket,dcp-greedy --format csv -o compare.csv
      dcp compare --steps 2 --plot compare.png
    """
    fmt, output = o["fmt"], o["output"]
    names = [s.strip() for s in strategies.split(",") if s.strip()] if strategies else list(STRATEGIES)
    if not names:
        raise click.BadParameter("no strategy given", param_hint="--strategies")
    cm, batches, config = _setup(o)
    frame = compare(batches, cm, names, config["time_limit"])
    if fmt == "json":
        text = json.dumps({"config": dict(config, strategies=names), "results": frame.to_dict("records")}, indent=1)
    elif fmt == "csv":
        text = frame.to_csv(index=False)
    else:
        table = _table(frame, {
            "strategy": ("strategy", str), "mean_step_time_s": ("step (s)", _secs),
            "speedup_vs_bucket": ("vs bucket", lambda x: "-" if x != x else f"{x:.2f}x"), "idle_fraction": ("idle", _pct),
            "comm_fraction": ("comm", _pct), "gap_to_lower_bound": ("gap to bound", _pct),
            "mean_solve_time_s": ("solve (s)", _secs), "time_limited": ("limit hit", str)})
        text = (f"{len(batches)} steps of {config['workload']} on {cm.cluster.num_gpus} x {cm.hardware.name}, "
                f"{cm.model.name}\n{table}")
    if plot is not None:
        from dcp.viz import compare_figure

        compare_figure(frame, plot, metric=plot_metric.replace("-", "_"),
                       title=f"{len(batches)} step{'s' * (len(batches) > 1)} of {config['workload']} on "
                             f"{cm.cluster.num_gpus} x {cm.hardware.name}, {cm.model.name}")
        click.echo(f"wrote {plot}", err=True)
    _emit(text, output)


@main.command()
def presets() -> None:
    """List the model and hardware presets.

    \b
    Example:
      dcp presets
    """
    click.echo("models:")
    for name in preset_names("models"):
        m = load_model(name)
        click.echo(f"  {name:22s} {_count(m.param_count()):>7s} params, {m.num_layers} layers, "
                   f"{m.attention} attention")
    click.echo("hardware:")
    for name in preset_names("hardware"):
        hw = load_hardware(name)
        click.echo(f"  {name:22s} {hw.device}, {hw.memory_bytes / 1e9:.1f} GB usable, "
                   f"{hw.gpus_per_node} per node")


@main.command()
@click.argument("plan_file", metavar="PLAN.json", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--step", "step_index", type=int, default=0, show_default=True, help="Which step to detail (0-based).")
@click.option("--gantt", "gantt_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a Gantt chart of every rank's timeline (PNG, SVG or PDF by extension).")
@click.option("--model", default=None, help="Override the model the plan was made for (needed for a bare plan).")
@click.option("--hardware", default=None, help="Override the hardware preset or profile.")
@click.option("--zero-stage", type=click.Choice(["0", "1", "2", "3"]), default=None, help="Override the ZeRO stage.")
def show(plan_file: Path, step_index: int, gantt_path: Path | None, model: str | None, hardware: str | None,
         zero_stage: str | None) -> None:
    """Summarize a plan file from `dcp plan --format json` and draw its timeline.

    Re-simulates the plan on the cost model rebuilt from the file's config: groups,
    micro-batches, checkpointing, predicted times, and each kind's share of the step.

    \b
    Example:
      dcp plan --steps 2 --format json -o plan.json
      dcp show plan.json --step 1 --gantt step1.png
    """
    doc = load_plan_document(plan_file)
    the_plan = doc.step(step_index)
    cm = doc.cost_model(model, hardware, None if zero_stage is None else int(zero_stage))
    timelines = simulate_all(doc.plans, cm)
    lines = [f"{plan_file}: {doc.describe()}"]
    if len(doc.plans) > 1:
        lines.append(_table(step_rows(doc.plans, timelines), {
            **_STEP_COLUMNS, "gap": ("gap", _pct), "idle_fraction": ("idle", _pct),
            "comm_fraction": ("comm", _pct)}))
    tl = timelines[step_index]
    tokens = sum(s.tokens for s in the_plan.samples)
    unused = unused_ranks(the_plan)
    lines += [
        f"step {step_index}: {len(the_plan.samples)} samples, {tokens:,} tokens, groups {groups_label(the_plan)}"
        + (f", {unused} ranks unused" if unused else ""),
        f"predicted {the_plan.step_time_s:.3f} s | lower bound {the_plan.lower_bound_s:.3f} s "
        f"(gap {_pct(gap(the_plan))}) | solve {the_plan.solve_time_s:.3f} s ({the_plan.solver_status}) | "
        f"memory headroom {_pct(memory_headroom(the_plan))}",
        "share of rank-seconds: " + " | ".join(f"{k} {_pct(v)}" for k, v in kind_shares(tl).items()),
        *([f"program: {program_outcome(the_plan)}; " + "; ".join(the_plan.notes)] if the_plan.strategy == "ilp" else []),
        _table(group_rows(the_plan), {
            "group": ("group", str), "ranks": ("ranks", str), "sp": ("sp", str),
            "microbatches": ("micro-batches", str), "samples": ("samples", str), "tokens": ("tokens", str),
            "ckpt_min": ("ckpt min", str), "ckpt_max": ("ckpt max", str), "busy_s": ("busy (s)", _secs),
            "peak_memory_gb": ("peak GB", "{:.1f}".format)}),
    ]
    click.echo("\n".join(lines))
    if gantt_path is not None:
        from dcp.viz import plan_gantt

        plan_gantt(the_plan, tl, gantt_path, title=f"{doc.describe()}: step {step_index}, {tl.step_time_s:.3f} s, "
                                                  f"idle {_pct(tl.idle_fraction)}, comm {_pct(tl.comm_fraction)}")
        click.echo(f"wrote {gantt_path}", err=True)


# Further commands (e.g. `dcp profile`) register here: main.add_command(...)
from dcp.profiler.command import profile  # noqa: E402

main.add_command(profile)


if __name__ == "__main__":
    main()
