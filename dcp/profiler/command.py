"""`dcp profile`: the click command (thin: parse, call dcp.profiler, print).

Registered in dcp/cli.py with `main.add_command(profile)`; dcp.profiler itself never imports click.
Importing this module must not import torch (`dcp plan` runs on machines without it), so the
profiler is imported inside the command.
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dcp import costmodel
from dcp.commands.common import check_output, write_whole
from dcp.costmodel import load_hardware, load_model, save_hardware

DEFAULT_MODEL = {"cpu": "tiny-llama", "cuda": costmodel.DEFAULT_MODEL}
DEFAULT_BASE = {"cpu": "cpu", "cuda": costmodel.DEFAULT_HARDWARE}


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("{task.description:32s}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=False)


@click.command("profile")
@click.option("--model", default=None, help="Model preset or JSON (default: tiny-llama on cpu, llama-7b on cuda).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default=None,
              help="Default: bf16 on cuda, fp32 on cpu.")
@click.option("--quick", is_flag=True, help="Smaller grid, fewer repeats.")
@click.option("--base", default=None, help="Preset or profile JSON for the numbers not measured "
              f"(default: cpu / {costmodel.DEFAULT_HARDWARE}). A previous profile keeps its other models' fits.")
@click.option("--min-tokens", type=click.IntRange(min=16), default=None,
              help="Smallest micro-batch of the grid, in tokens (default 256 on cpu, 1024 on cuda).")
@click.option("--max-tokens", type=click.IntRange(min=16), default=None,
              help="Largest micro-batch of the grid, in tokens (default on cpu 8192, 4096 with --quick; on cuda "
                   "131072, 32768 with --quick). The profile prices micro-batches up to "
                   "4x this many tokens per GPU: raise it to plan longer samples.")
@click.option("--heldout", type=click.IntRange(min=0), default=None,
              help="Random mixed micro-batches measured but never fitted on; their error is the profile's "
                   "held-out MAPE (default 10, 8 with --quick).")
@click.option("--threads", type=click.IntRange(min=0), default=None, help="CPU: torch threads (default 1; 0: torch's).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the held-out packings.")
@click.option("--name", default=None, help="Profile name (default: <base>-profiled).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write the profile JSON.")
@click.option("--validate", "validate_path", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, help="Re-measure held-out micro-batches against this profile instead.")
@click.option("--layers", type=click.IntRange(min=1), default=None, help="--validate: model depth (default min(K, 4)).")
def profile(model: str | None, device: str, dtype: str | None, quick: bool, base: str | None,
            min_tokens: int | None, max_tokens: int | None, heldout: int | None, threads: int | None, seed: int,
            name: str | None, output: Path | None, validate_path: Path | None, layers: int | None) -> None:
    """Measure this machine and fit the cost model; write a hardware profile.

    Times one layer of the model's reference implementation over a geometric grid of
    micro-batch sizes and packings (forward, backward, recompute, activation memory), the
    embedding/head and the micro-batch's fixed cost on the model without layers, and, under
    torchrun, all-to-all per group size. Each point keeps the median over passes of its fastest
    repeat in each; on CPU every reading is taken against a reference kernel timed beside it, so
    a slow or fast spell of the machine moves both alike (`meta.reference`). Fits by
    non-negative least squares; a component with R^2 below 0.9 is measured again on a denser
    grid, and if still below, named (the profile is written, flagged). Reports the held-out error.

    On CPU the default model is tiny-llama (a 64-wide layer whose attention already dominates
    at 4K tokens) timed on one thread; on CUDA, llama-7b.

    \b
    Example:
      dcp profile --device cpu --quick -o p.json
      dcp profile --validate p.json --device cpu
      dcp plan --hardware p.json --model tiny-llama --workload lognormal --gpus 8 --steps 2
      torchrun --nproc-per-node 8 -m dcp.cli profile --device cuda -o h200.json
    """
    from dcp.profiler import comm
    from dcp.profiler.fitting import MAPE_THRESHOLD, R2_THRESHOLD
    from dcp.profiler.profile import ProfileOptions, profile_model
    from dcp.profiler.report import fit_table, mape_panel, validation_table
    from dcp.profiler.validate import validate_profile

    console = Console(stderr=True)
    _check_device(device)
    if validate_path is not None:
        prof = load_hardware(str(validate_path))
        spec = load_model(model or _only_model(prof.fits))
        with _progress(console) as progress:
            report = validate_profile(prof, spec, device=device, dtype=dtype, layers=layers, seed=seed + 7,
                                      quick=quick, progress=progress)
        console.print(validation_table(report))
        console.print(mape_panel(f"validation of {validate_path}", report.mape))
        if not report.mape <= MAPE_THRESHOLD:  # a NaN (no rows) fails too
            raise click.ClickException(f"validation of {validate_path} failed: held-out MAPE {report.mape:.1%} "
                                       f"is above {MAPE_THRESHOLD:.0%}; re-profile this machine (dcp profile -o ...)")
        return
    if output is None:
        raise click.UsageError("give -o/--output for the profile (or --validate PROFILE)")
    check_output(output, "-o")  # before minutes of measuring, not after
    spec = load_model(model or DEFAULT_MODEL[device])
    base_profile = load_hardware(base or DEFAULT_BASE[device])
    opts = ProfileOptions(device=device, dtype=dtype, quick=quick, min_tokens=min_tokens, max_tokens=max_tokens,
                          heldout=heldout, threads=threads, seed=seed, name=name)
    grid = opts.resolved()
    if grid.min_tokens > grid.max_tokens:  # type: ignore[operator]
        given = "--min-tokens" if min_tokens is not None else f"the default --min-tokens for {device}"
        raise click.BadParameter(f"{grid.max_tokens} is below {given} ({grid.min_tokens})", param_hint="--max-tokens")
    distributed = comm.init_from_torchrun(device)
    with _progress(console) as progress:
        prof = profile_model(spec, base_profile, opts, progress=progress)
    if distributed and comm.dist.get_rank() != 0:
        return
    write_whole(output, lambda tmp: save_hardware(prof, tmp))
    console.print(fit_table(prof, spec.name))
    for name, r2 in prof.meta["fits"][spec.name].get("r2_below", {}).items():
        console.print(f"[bold red]{spec.name}: {name} fit R^2 {r2:.3f} is below {R2_THRESHOLD} after re-measuring it "
                      "on a denser grid with twice the repeats; the profile is written, flagged (meta.fits."
                      f"{spec.name}.r2_below)[/bold red]")
    if not prof.meta.get("comm", {}).get("measured"):
        console.print(f"[yellow]{prof.meta['comm']['why']}[/yellow]")
    console.print(mape_panel(spec.name, prof.fits[spec.name].heldout_mape))
    click.echo(f"wrote {output}")


def _check_device(device: str) -> None:
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise click.BadParameter("no CUDA device is visible to torch (use --device cpu)", param_hint="--device")


def _only_model(fits: dict[str, object]) -> str:
    if len(fits) != 1:
        raise click.UsageError(f"the profile has fits for {sorted(fits) or 'no model'}: pick one with --model")
    return next(iter(fits))
