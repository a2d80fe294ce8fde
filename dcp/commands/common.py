"""What the `dcp` commands share: output paths checked before any work and written whole,
progress on a terminal, number formats and text tables. Imports click, never torch."""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

FIGURE_SUFFIXES = (".png", ".svg", ".pdf")
"""What --plot and --gantt draw, chosen by the file's extension."""


def check_output(path: Path | None, flag: str, suffixes: tuple[str, ...] | None = None) -> None:
    """Fail now, before any planning or profiling, if `path` cannot be written: its folder must
    exist, it must not be a folder itself, and a figure needs a known extension."""
    if path is None:
        return
    if path.is_dir():
        raise click.BadParameter(f"{path} is a directory, not a file", param_hint=flag)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise click.BadParameter(f"folder {parent} of {path} does not exist", param_hint=flag)
    if not os.access(parent, os.W_OK):
        raise click.BadParameter(f"folder {parent} of {path} is not writable", param_hint=flag)
    if suffixes is not None and path.suffix.lower() not in suffixes:
        raise click.BadParameter(f"{path}: the extension must be one of {', '.join(suffixes)}", param_hint=flag)


def write_whole(path: Path, write: Callable[[Path], None]) -> None:
    """Let `write(tmp)` write a file next to `path`, then rename it into place: a failure (or an
    interrupt) never leaves a half-written `path` behind. The file gets the mode a plain `open`
    would give it (0666 less the umask), not the private 0600 of a temporary file."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent if str(path.parent) else ".")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def current_umask() -> int:
    """The process's umask (reading it means setting it: set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


FORMAT_SUFFIXES = {".json": "json", ".csv": "csv"}
"""Output files whose extension names their format."""


def output_format(fmt: str | None, output: Path | None) -> str:
    """The output format: --format if given, else the one -o's extension names (.json, .csv),
    else the text table. A --format that contradicts the extension is refused, before any work."""
    implied = FORMAT_SUFFIXES.get(output.suffix.lower()) if output is not None else None
    if fmt is None:
        return implied or "table"
    if implied is not None and fmt != implied:
        raise click.BadParameter(f"{fmt} contradicts -o {output} (a .{implied} file): drop --format or "
                                 f"name the file for {fmt}", param_hint="--format")
    return fmt


def measure_missing_memory(model: str, recipes: list[str], hardware: str | None = None) -> None:
    """For a model JSON without a measured footprint in some of `recipes` (and no hardware fit that
    carries one): measure them on fake tensors, add them to the cache file beside the JSON and say
    so on stderr. Presets carry every recipe, so this is a no-op for them."""
    import json

    from dcp.costmodel import load_hardware, load_model
    from dcp.costmodel.presets import footprint_cache_path, presets_of_shape, read_footprint_cache
    from dcp.profiler.model_memory import measure_recipes, missing_recipes

    spec = load_model(model)
    missing = missing_recipes(spec, recipes, load_hardware(hardware) if hardware else None)
    if not missing:
        return
    cache = footprint_cache_path(model)
    check_output(cache, "--model")  # its folder takes the cache: say so before measuring
    same = presets_of_shape(spec)
    click.echo(f"note: {model} has no measured {'/'.join(missing)} memory footprint: measuring it on fake tensors "
               f"(about 5 s a recipe), cached in {cache}"
               + (f" (the preset {' and '.join(same)} has this shape)" if same else ""), err=True)
    doc = {r: f.to_dict() for r, f in read_footprint_cache(cache).items()}
    doc.update({r: f.to_dict() for r, f in measure_recipes(spec, missing).items()})
    write_whole(cache, lambda tmp: tmp.write_text(json.dumps(doc, indent=1) + "\n"))


def emit(text: str, output: Path | None) -> None:
    """Print `text`, or write it (whole) to `output` and say so on stderr."""
    if output is None:
        click.echo(text.rstrip("\n"))
        return
    body = text if text.endswith("\n") else text + "\n"
    write_whole(output, lambda tmp: tmp.write_text(body))
    click.echo(f"wrote {output}", err=True)


def finite(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """Click callback: a float option must be a finite number (click's FloatRange lets inf through)."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number")
    return value


def stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


class StepProgress:
    """`progress(what, done, total)` for dcp.planner.run: one updating line per strategy on
    stderr, only when stderr is a terminal (pipes and logs stay clean)."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = stderr_is_terminal() if enabled is None else enabled
        self.started = time.perf_counter()

    def __call__(self, what: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if done == 0:
            self.started = time.perf_counter()
        line = f"\rplanning {what}: {done}/{total} global batches, {time.perf_counter() - self.started:.0f} s"
        click.echo(line, err=True, nl=done == total)


def help_parts(**parts: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Fill `{name}` lines of a command's docstring (its help) with shared text, indented as the
    placeholder is. Apply under `@click.command()`."""

    def fill(f: Callable[..., Any]) -> Callable[..., Any]:
        lines = []
        for line in (f.__doc__ or "").splitlines():
            key = line.strip()
            if key.startswith("{") and key.endswith("}") and key[1:-1] in parts:
                indent = line[: len(line) - len(line.lstrip())]
                lines += [indent + text if text else "" for text in parts[key[1:-1]].splitlines()]
            else:
                lines.append(line)
        f.__doc__ = "\n".join(lines)
        return f

    return fill


def plural(n: int, noun: str, many: str | None = None) -> str:
    """`1 sample`, `2 samples` (thousands separated)."""
    return f"{n:,} {noun if n == 1 else many or noun + 's'}"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def count(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(int(n))


def secs(x: float) -> str:
    return f"{x:.3f}"


def table(frame: Any, columns: dict[str, tuple[str, Callable[[Any], str]]]) -> str:
    """Right-aligned text table of the given columns: {column: (header, formatter)}."""
    cells = [[fmt(v) for v in frame[c]] for c, (_, fmt) in columns.items()]
    headers = [h for h, _ in columns.values()]
    widths = [max([len(h), *map(len, col)]) for h, col in zip(headers, cells, strict=True)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    for row in zip(*cells, strict=True):
        lines.append("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))
    return "\n".join(lines)


STEP_COLUMNS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "step": ("step", str), "samples": ("samples", str), "tokens": ("tokens", str),
    "groups": ("groups (n x sp)", str), "microbatches": ("micro-batches", str),
    "step_time_s": ("step (s)", secs),
}
"""The per-step columns `plan` and `show` both print (then each adds its own)."""

COLUMN_HELP = """\b
Columns: step (s) is the predicted step time; bound (s) a proven lower bound on
it (no plan of this batch can be faster); gap = (step - bound) / step, how much
a better plan could still gain at most; idle is the share of all rank-seconds
spent waiting for the slowest group; comm the share in all-to-alls, ring
transfers, parameter gathers and the gradient all-reduce; groups "4x2 1x8" are
four SP groups of 2 GPUs and one of 8 (Ulysses), "1x(8x4)" one group of 32 as
Ulysses over 8 x a ring of 4 (beyond the heads). For the ilp strategy, program says whether its integer program
ran to the end ("complete"), was cut short by --time-limit ("cut short"), was
not needed (the warm start met the bound) or got no time ("not run"); limit hit
"2/5" counts the steps cut short or not run."""
