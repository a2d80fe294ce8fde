"""`dcp plan` and `dcp compare`: parse the shared planning options, call dcp.planner.run, print."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from dcp.commands.advice import check_model_states
from dcp.commands.common import (
    COLUMN_HELP,
    FIGURE_SUFFIXES,
    STEP_COLUMNS,
    StepProgress,
    check_output,
    emit,
    finite,
    help_parts,
    measure_missing_memory,
    output_format,
    pct,
    plural,
    secs,
    table,
    write_whole,
)
from dcp.costmodel import (
    DEFAULT_HARDWARE,
    DEFAULT_MODEL,
    RECIPES,
    CostModel,
    load_hardware,
    load_model,
)
from dcp.costmodel.presets import check_fitted_for
from dcp.data.batches import make_batches
from dcp.data.workloads import WorkloadError, load_workload
from dcp.planner import STRATEGIES, STRATEGY_HELP, Sample
from dcp.planner.options import IlpOptions
from dcp.planner.report import stored_path
from dcp.planner.run import (
    build_cost_model,
    compare,
    default_model,
    plan_steps,
    simulate_all,
    step_rows,
    summarize,
)

STRATEGY_NAMES = ", ".join(STRATEGIES)
STRATEGY_LIST = "\b\nStrategies:\n" + "\n".join(f"  {name:18s} {text}" for name, text in STRATEGY_HELP.items())


def planning_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The options `plan` and `compare` share: workload, model, cluster, batches, output."""
    options = [
        click.option("--workload", default="wikipedia", show_default=True,
                     help="wikipedia, lognormal[:mean=1024,sigma=1.5,min=128,max=8192,scale=1], "
                          "opensora[:short|balanced|long] or a lengths file (.txt, .txt.gz, .csv, .parquet, .jsonl)."),
        click.option("--model", default=None,
                     help=f"Model preset or JSON file (see `dcp presets`). Default: {DEFAULT_MODEL}, "
                          "opensora-stdit-1.1b for opensora workloads."),
        click.option("--hardware", default=DEFAULT_HARDWARE, show_default=True,
                     help="Hardware preset or a profile JSON from `dcp profile`."),
        click.option("--gpus", type=click.IntRange(min=1), default=32, show_default=True, help="GPUs in the job."),
        click.option("--gpus-per-node", type=click.IntRange(min=1), default=None,
                     help="GPUs per node, at most --gpus. Default: the hardware profile's (8 for the GPU presets)."),
        click.option("--memory-gb", type=click.FloatRange(min=0, min_open=True), default=None, callback=finite,
                     help="Usable memory per GPU in GB (1e9 bytes). Default: the hardware profile's."),
        click.option("--zero-stage", type=click.Choice(["0", "1", "2", "3"]), default="1", show_default=True,
                     help="ZeRO sharding of the model states (FSDP2): 0 none, 1 and 2 (the same) parameters, "
                          "gradients and optimizer state sharded, gathered for the whole step, 3 parameters "
                          "gathered per layer, every rank in lockstep slots."),
        click.option("--shard-group", type=click.IntRange(min=1), default=None,
                     help="Shard over groups of this many consecutive GPUs (e.g. a node) and replicate across "
                          "them (HSDP). Default: shard over all GPUs."),
        click.option("--precision", type=click.Choice(list(RECIPES)), default="bf16", show_default=True,
                     help="Precision recipe the training runs (as the executor's): bf16 parameters with fp32 "
                          "master weights, fp32 parameters under bf16 autocast, or fp32."),
        click.option("--global-batch", type=click.IntRange(min=1), default=None,
                     help="Samples per global batch (default 512 unless --global-tokens is given)."),
        click.option("--global-tokens", type=click.IntRange(min=1), default=None,
                     help="Tokens per global batch instead of a sample count (at least the longest sample)."),
        click.option("--steps", type=click.IntRange(min=1), default=10, show_default=True,
                     help="Global batches to plan (only full ones; given explicitly, the workload must hold them)."),
        click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), default=IlpOptions().time_limit_s,
                     show_default=True, callback=finite, help="ILP limit per global batch, in wall-clock seconds: it bounds the search (every "
                          "solver call, loop and phase stops by it). What always runs in full, so that the plan "
                          "is never worse than dcp-greedy, bucket or packed, is not cut: the input checks and cost table, "
                          "those baselines, the first backfill target and the final assembly; on a quiet "
                          "machine the whole solve ends within the limit, on a loaded one it can end later."),
        click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Workload and shuffle seed."),
        click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default=None,
                     help="Output format. Default: what -o's extension names (.json, .csv), else table."),
        click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Write to this file instead of stdout."),
    ]
    return functools.reduce(lambda g, opt: opt(g), reversed(options), f)


@dataclass
class Setup:
    """What the shared options resolve to."""

    cm: CostModel
    batches: list[list[Sample]]
    config: dict[str, Any]
    """The resolved options, as `dcp plan --format json` stores them (`dcp show` reads them back)."""
    longest_tokens: int
    """The workload's longest sample: the static baselines' SP size fits it."""


def setup(o: dict[str, Any]) -> Setup:
    """Check the options, then build the cost model and the global batches."""
    ctx = click.get_current_context()
    check_output(o["output"], "-o")
    o["fmt"] = output_format(o["fmt"], o["output"])
    if o["gpus_per_node"] is not None and o["gpus_per_node"] > o["gpus"]:
        raise click.BadParameter(f"{o['gpus_per_node']} is more than --gpus {o['gpus']}", param_hint="--gpus-per-node")
    config = dict(o, model=o["model"] or default_model(o["workload"]), zero_stage=int(o["zero_stage"]))
    config.pop("fmt")
    output = config.pop("output")
    check_fitted_for(load_hardware(config["hardware"]), load_model(config["model"]), config["hardware"],
                     config["model"])
    measure_missing_memory(config["model"], [config["precision"]], config["hardware"])
    cm = build_cost_model(config["model"], config["hardware"], config["gpus"], config["gpus_per_node"],
                          config["memory_gb"], config["zero_stage"], config["precision"], config["shard_group"])
    config["gpus_per_node"] = cm.cluster.gpus_per_node
    check_model_states(cm, config)
    for note in cm.notes():
        click.echo(f"note: {note}", err=True)
    for key in ("model", "hardware"):
        config[key] = stored_path(config[key], output)
    workload = load_workload(o["workload"], seed=o["seed"])
    try:
        batches = make_batches(workload, cm, global_batch=o["global_batch"], global_tokens=o["global_tokens"],
                               steps=o["steps"], seed=o["seed"], full_only=True)
    except WorkloadError as e:  # the batch size does not suit the workload
        flag = "--global-tokens" if o["global_tokens"] else "--global-batch"
        given = o["global_tokens"] or o["global_batch"]
        raise click.BadParameter(str(e) + ("" if given else f" (the default; give {flag} N)"), param_hint=flag) from e
    if len(batches) < o["steps"]:
        size = plural(o["global_tokens"], "token") if o["global_tokens"] else plural(o["global_batch"] or 512, "sample")
        why = (f"{workload.name}'s {plural(len(workload), 'sample')} make {plural(len(batches), 'full global batch', 'full global batches')}"
               f" of {size}")
        if ctx.get_parameter_source("steps") != ParameterSource.DEFAULT:
            raise click.BadParameter(f"{plural(o['steps'], 'step')} asked for, but {why}", param_hint="--steps")
        click.echo(f"note: planning {plural(len(batches), 'step')}: {why}", err=True)
    config["steps"] = len(batches)
    return Setup(cm, batches, config, int(workload.tokens.max()))


@click.command()
@planning_options
@click.option("--strategy", default="ilp", show_default=True, help=f"One of: {STRATEGY_NAMES}.")
@click.option("--explain-budget", is_flag=True,
              help="Print how --time-limit is divided among the ILP's stages for --global-batch samples, and exit.")
@help_parts(strategies=STRATEGY_LIST, columns=COLUMN_HELP)
def plan(strategy: str, explain_budget: bool, **o: Any) -> None:
    """Plan global batches and print each step's schedule and predicted time.

    {strategies}

    {columns}

    \b
    In JSON, each plan's `samples` are [id, tokens, attn_pairs, frames] lists
    (named by its `sample_fields`).

    \b
    Example:
      dcp plan --workload wikipedia --gpus 32 --steps 2 --strategy dcp-greedy
      dcp plan --steps 2 --format json -o plan.json
    """
    if explain_budget:
        click.echo(IlpOptions(time_limit_s=o["time_limit"]).explain_budget(o["global_batch"] or 512))
        return
    s = setup(o)
    fmt, output = o["fmt"], o["output"]
    plans = plan_steps(s.batches, s.cm, strategy, o["time_limit"], dataset_longest_tokens=s.longest_tokens,
                       progress=StepProgress())
    timelines = simulate_all(plans, s.cm)
    summary = summarize(plans, timelines)
    if fmt == "json":
        steps = [{"step": i, "plan": p.to_dict(), "simulation": t.stats()}
                 for i, (p, t) in enumerate(zip(plans, timelines, strict=True))]
        text = json.dumps({"config": dict(s.config, strategy=strategy), "steps": steps, "summary": summary}, indent=1)
    elif fmt == "csv":
        import pandas as pd

        frame = pd.concat([p.to_frame().assign(step=i) for i, p in enumerate(plans)], ignore_index=True)
        text = frame[["step", *[c for c in frame.columns if c != "step"]]].to_csv(index=False)
    else:
        rows = table(step_rows(plans, timelines), {
            **STEP_COLUMNS, "lower_bound_s": ("bound (s)", secs), "gap": ("gap", pct),
            "solve_time_s": ("solve (s)", secs), "program": ("program", str)})
        text = (f"{strategy} on {s.cm.cluster.num_gpus} x {s.cm.hardware.name}, {s.cm.model.name}, "
                f"{o['workload']}\n{rows}\n"
                f"mean step {summary['mean_step_time_s']:.3f} s | "
                f"{summary['throughput_tokens_per_s']:,.0f} tokens/s | idle {pct(summary['idle_fraction'])} | "
                f"comm {pct(summary['comm_fraction'])}")
    emit(text, output)


def parse_strategies(text: str | None) -> list[str]:
    """--strategies: a comma-separated list of known names, each once; None: all of them."""
    if text is None:
        return list(STRATEGIES)
    names = [s.strip() for s in text.split(",")]
    if not any(names):
        raise click.BadParameter("no strategy given", param_hint="--strategies")
    if not all(names):
        raise click.BadParameter(f"an empty name in {text!r}", param_hint="--strategies")
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown:
        raise click.BadParameter(f"unknown strategy {unknown[0]!r}; known: {STRATEGY_NAMES}", param_hint="--strategies")
    twice = [n for n in names if names.count(n) > 1]
    if twice:
        raise click.BadParameter(f"{twice[0]!r} is listed twice", param_hint="--strategies")
    return names


@click.command(name="compare")
@planning_options
@click.option("--strategies", default=None, help=f"Comma-separated, each once, from: {STRATEGY_NAMES}. Default: all.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also draw bars per strategy, the lower bound marked (.png, .svg or .pdf).")
@click.option("--plot-metric", type=click.Choice(["step-time", "throughput"]), default="step-time",
              show_default=True, help="What the --plot bars show.")
@help_parts(strategies=STRATEGY_LIST, columns=COLUMN_HELP)
def compare_cmd(strategies: str | None, plot: Path | None, plot_metric: str, **o: Any) -> None:
    """Run the same global batches through several strategies and compare them.

    "vs bucket" is the `bucket` strategy's mean step time over each strategy's:
    bucket parallel with one SP size for the whole training, the smallest that
    fits the workload's longest sample (the DCP paper's baseline;
    `bucket-per-batch` re-sizes it for every batch).

    {strategies}

    {columns}

    \b
    Example:
      dcp compare --workload opensora --gpus 32 --steps 2
      dcp compare --strategies bucket,dcp-greedy --steps 2 --format csv -o compare.csv
      dcp compare --steps 2 --plot compare.png
    """
    names = parse_strategies(strategies)
    check_output(plot, "--plot", FIGURE_SUFFIXES)
    s = setup(o)
    fmt, output = o["fmt"], o["output"]
    frame = compare(s.batches, s.cm, names, o["time_limit"], dataset_longest_tokens=s.longest_tokens,
                    progress=StepProgress())
    if fmt == "json":
        text = json.dumps({"config": dict(s.config, strategies=names), "results": frame.to_dict("records")}, indent=1)
    elif fmt == "csv":
        text = frame.to_csv(index=False)
    else:
        rows = table(frame, {
            "strategy": ("strategy", str), "mean_step_time_s": ("step (s)", secs),
            "speedup_vs_bucket": ("vs bucket", lambda x: "-" if x != x else f"{x:.2f}x"), "idle_fraction": ("idle", pct),
            "comm_fraction": ("comm", pct), "gap_to_lower_bound": ("gap to bound", pct),
            "mean_solve_time_s": ("solve (s)", secs), "time_limited": ("limit hit", str)})
        text = (f"{plural(len(s.batches), 'step')} of {o['workload']} on {s.cm.cluster.num_gpus} x {s.cm.hardware.name}, "
                f"{s.cm.model.name}\n{rows}")
    if plot is not None:
        from dcp.viz import compare_figure

        title = (f"{len(s.batches)} step{'s' * (len(s.batches) > 1)} of {o['workload']} on "
                 f"{s.cm.cluster.num_gpus} x {s.cm.hardware.name}, {s.cm.model.name}")
        write_whole(plot, lambda tmp: compare_figure(frame, tmp, metric=plot_metric.replace("-", "_"), title=title))
        click.echo(f"wrote {plot}", err=True)
    emit(text, output)

