"""Every command the README shows and every `--help` example runs (at short sizes) and does what
it says. The commands are parsed from the README and the help texts, so new ones are covered."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run

from dcp.cli import main

ROOT = Path(__file__).resolve().parents[1]
NOT_RUN = {"scripts/test.sh": "runs this test suite itself"}
"""Commands shown but not run here, and why."""


def readme_commands() -> list[str]:
    """Each line of the README's ```bash blocks, comments stripped."""
    text = (ROOT / "README.md").read_text()
    lines = [line.split(" #")[0].strip() for block in re.findall(r"```bash\n(.*?)```", text, re.S)
             for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def help_examples() -> list[str]:
    """The indented lines under `Example:` in the help of `dcp` and each of its commands."""
    out = []
    for name in ["", *main.commands]:
        text = run(*([name] if name else []), "--help").output
        example = text.split("Example:", 1)[1].split("\n\n")[0] if "Example:" in text else ""
        out += [line.strip() for line in example.splitlines() if line.strip()]
    return out


def short(args: list[str]) -> list[str]:
    """Short sizes: `dcp plan`/`compare` plan at most 2 steps with a 0.2 s ILP limit."""
    args = list(args)
    if args and args[0] in ("plan", "compare"):
        if "--steps" in args:
            i = args.index("--steps") + 1
            args[i] = str(min(int(args[i]), 2))
        else:
            args += ["--steps", "2"]
        if "--time-limit" not in args:
            args += ["--time-limit", "0.2"]
    return args


def written(args: list[str]) -> list[str]:
    """The files a command says it writes (-o, --gantt, --plot)."""
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-o", "--output", "--gantt", "--plot")]


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def run_dcp(args: list[str], where: Path) -> None:
    """Run `dcp ARGS` in-process; check its exit status and what it wrote or printed."""
    if "--device" in args and args[args.index("--device") + 1] == "cuda" and not cuda_available():
        # A GPU example on a machine without one: one clear line, before any work.
        result = run(*args, ok=False)
        assert result.exit_code == 2 and "no CUDA device is visible" in result.output, result.output
        return
    result = run(*short(args))
    for name in written(args):
        assert (where / name).stat().st_size > 0, (args, name)
    if not written(args):
        assert result.output.strip(), args  # (`dcp profile` reports on stderr)
    if args[0] == "profile" and "--validate" in args:
        assert "MAPE" in result.output, result.output
    if args[0] == "plan" and "--format" not in args:
        assert " on " in result.stdout.splitlines()[0] and "mean step" in result.stdout, result.stdout
    if args[0] == "compare" and "--format" not in args:
        assert "vs bucket" in result.stdout and "1.00x" in result.stdout, result.stdout
    if args[0] == "presets":
        assert "source" in result.stdout


def run_shell(line: str, where: Path) -> None:
    """A script or torchrun line, at short sizes."""
    words = shlex.split(line)
    if words[0].endswith("torchrun"):
        words = [sys.executable, "-m", "torch.distributed.run", *words[1:]]
        if "--steps" in words:
            words[words.index("--steps") + 1] = "1"
        cwd = ROOT
    else:
        words = ["bash", str(ROOT / words[0]), *words[1:], "--steps", "1", "--time-limit", "0.2"]
        cwd = where  # relative paths in the arguments are the caller's
    proc = subprocess.run(words, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (line, proc.stdout[-2000:], proc.stderr[-4000:])
    if "--check-grads" in words:
        assert "max_grad_diff=" in proc.stdout
    if "examples/train" in line:
        assert "step   0 loss" in proc.stdout
    for name in written(words):
        assert (where / name).stat().st_size > 0, (line, name)


def example_inputs(where: Path) -> None:
    """The files the examples name as the user's own: a model JSON of nine fields."""
    import json

    spec = json.loads((ROOT / "dcp" / "presets" / "models" / "tiny-llama.json").read_text())
    fields = ("name", "num_layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "attention", "mlp")
    (where / "my-model.json").write_text(json.dumps({k: spec[k] for k in fields}))


def test_the_commands_are_found() -> None:
    readme, examples = readme_commands(), help_examples()
    assert "dcp presets" in readme and any(c.startswith("dcp profile") for c in readme)
    assert any(c.startswith("scripts/demo.sh") for c in readme)
    assert {c.split()[1] for c in examples if c.startswith("dcp ")} >= set(main.commands)


def test_every_documented_command_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    example_inputs(tmp_path)
    seen: set[str] = set()
    for line in [*readme_commands(), *help_examples()]:
        if line in seen or line.split()[0] in NOT_RUN:
            continue
        seen.add(line)
        words = shlex.split(line)
        if words[0] == "dcp":
            run_dcp(words[1:], tmp_path)
        elif words[0] == "torchrun" and "-m" in words and words[words.index("-m") + 1] == "dcp.cli":
            run_dcp(words[words.index("-m") + 2:], tmp_path)  # the same command; torchrun adds ranks
        else:
            run_shell(line, tmp_path)
    assert len(seen) >= 15
