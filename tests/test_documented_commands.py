"""What the README and the `--help` texts tell a new user to type works as written.

The README's ```bash blocks run as one script in a fresh bash (no .venv on PATH: the README says
to activate it), from a folder that holds the repository's scripts and examples, as typed; then
every `--help` example runs as written. The figures the README and docs/design.md quote are
recomputed. Commands are parsed from the texts, so new ones are covered."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from cli_helpers import check_validation_status, run

from dcp.cli import main

ROOT = Path(__file__).resolve().parents[1]
NOT_RUN = {"scripts/test.sh": "runs this test suite itself",
           "scripts/setup_env.sh": "installs an extra into the checkout's .venv: the suite runs with the test "
                                   "extra, which holds every other extra's packages (transformers, pyarrow)"}
"""Commands shown but not run here, and why."""


def readme_blocks() -> list[str]:
    """The README's ```bash blocks, as written."""
    return re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def readme_commands() -> list[str]:
    """Each line of the README's ```bash blocks, comments stripped."""
    lines = [line.split(" #")[0].strip() for block in readme_blocks() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def readme_script() -> str:
    """The blocks as one script, a line typed twice run once (the README says so), NOT_RUN left out."""
    seen: set[str] = set()
    out = []
    for block in readme_blocks():
        for line in block.splitlines():
            key = line.split(" #")[0].strip()
            if key.split(" ")[0] in NOT_RUN or (key.startswith(("dcp ", "torchrun ")) and key in seen):
                continue
            seen.add(key)
            out.append(line)
    return "\n".join(out) + "\n"


def fresh_shell_env() -> dict[str, str]:
    """A login shell's environment: no virtual environment active, nothing of .venv on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = ":".join(p for p in env.get("PATH", "/usr/bin:/bin").split(":") if ".venv" not in p)
    return env


def help_examples() -> list[str]:
    """The indented lines under `Example:` in the help of `dcp` and each of its commands."""
    out = []
    for name in ["", *main.commands]:
        text = run(*([name] if name else []), "--help").output
        example = text.split("Example:", 1)[1].split("\n\n")[0] if "Example:" in text else ""
        out += [line.strip() for line in example.splitlines() if line.strip()]
    return out


def written(args: list[str]) -> list[str]:
    """The files a command says it writes (-o, --gantt, --plot)."""
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-o", "--output", "--gantt", "--plot")]


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def run_dcp(args: list[str], where: Path) -> None:
    """Run `dcp ARGS` in-process, as written; check its exit status and what it wrote or printed."""
    if "--device" in args and args[args.index("--device") + 1] == "cuda" and not cuda_available():
        # A GPU example on a machine without one: one clear line, before any work.
        result = run(*args, ok=False)
        assert result.exit_code == 2 and "no CUDA device is visible" in result.output, result.output
        return
    result = run(*args, ok=False)
    if args[0] == "profile" and "--validate" in args:
        check_validation_status(result)
        return
    assert result.exit_code == 0, (args, result.output)
    for name in written(args):
        assert (where / name).stat().st_size > 0, (args, name)
    if not written(args):
        assert result.output.strip(), args
    if args[0] == "plan" and "--format" not in args and not written(args):
        assert " on " in result.stdout.splitlines()[0] and "mean step" in result.stdout, result.stdout
    if args[0] == "compare" and "--format" not in args and not written(args):
        assert "vs bucket" in result.stdout and "1.00x" in result.stdout, result.stdout
    if args[0] == "presets":
        assert "source" in result.stdout


def test_the_commands_are_found() -> None:
    readme, examples = readme_commands(), help_examples()
    assert "dcp presets" in readme and any(c.startswith("dcp profile") for c in readme)
    assert readme[0].startswith("scripts/demo.sh") and readme[1] == "source .venv/bin/activate"
    assert {c.split()[1] for c in examples if c.startswith("dcp ")} >= set(main.commands)


def test_the_readme_and_every_help_example_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The README's commands run from the repository's root; here a folder that looks like it, so
    # what they write stays out of the checkout. The install is the README's first step: done
    # here in the checkout itself, so the script finds it done (demo.sh returns at once then).
    setup = subprocess.run(["bash", str(ROOT / "scripts" / "setup_env.sh")], capture_output=True, text=True,
                           timeout=900, cwd=ROOT)
    assert setup.returncode == 0, setup.stderr[-3000:]
    for name in ("scripts", "examples", ".venv"):
        (tmp_path / name).symlink_to(ROOT / name)
    script = readme_script()
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=fresh_shell_env(),
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:])
    assert "dcp: command not found" not in proc.stderr
    doc = json.loads((tmp_path / "plan.json").read_text())  # -o plan.json: JSON by its extension
    assert doc["config"]["strategy"] == "ilp" and len(doc["steps"]) == 2
    assert (tmp_path / "step0.png").read_bytes()[:4] == b"\x89PNG"
    assert "my.json has no measured bf16 memory footprint: measuring it" in proc.stderr
    assert set(json.loads((tmp_path / "my.memory.json").read_text())) == {"bf16"}
    assert "predictions priced by hardware profile p.json" in proc.stdout and "fitted for tiny-llama" in proc.stdout
    assert proc.stdout.count("max_grad_diff=") == 3 and "step   4 loss" in proc.stdout  # train_hf.py's too

    monkeypatch.chdir(tmp_path)
    seen = set(readme_commands())
    examples = [line for line in help_examples() if line not in seen]
    for line in dict.fromkeys(examples):
        words = shlex.split(line)
        if words[0] == "dcp":
            run_dcp(words[1:], tmp_path)
        elif words[0] == "torchrun" and "-m" in words and words[words.index("-m") + 1] == "dcp.cli":
            run_dcp(words[words.index("-m") + 2:], tmp_path)  # the same command; torchrun adds ranks
        else:
            raise AssertionError(f"a help example that is not a dcp command: {line}")
    assert len(examples) >= 10


# -- advice in error messages ---------------------------------------------------------------------------

ADVICE_SOURCES = ["dcp/executor/hf.py", "dcp/data/lengths.py", "examples/train_hf.py", "README.md"]


@pytest.mark.parametrize("path", ADVICE_SOURCES)
def test_extras_advice_is_a_command_that_works_from_a_fresh_shell(path: str) -> None:
    """Every install advice names the repository's script or .venv's pip, for an extra that
    pyproject.toml defines, never a bare `pip` (the system's, which refuses or installs elsewhere)."""
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    text = (ROOT / path).read_text()
    assert not re.search(r"(?<![/\w])pip install", text), path
    named = re.findall(r"scripts/setup_env\.sh (\w+)", text) + re.findall(r"\.venv/bin/pip install -e '\.\[(\w+)\]'",
                                                                        text)
    assert named and set(named) - {"EXTRA"} <= extras, (path, named)
    setup = (ROOT / "scripts" / "setup_env.sh").read_text()
    assert 'pip_quiet -e ".${extras:+[$extras]}"' in setup  # the script installs the extra it is given


# -- figures the README and docs quote ------------------------------------------------------------------


def test_the_quoted_figures_are_what_the_commands_print(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    readme, design = (ROOT / "README.md").read_text(), (ROOT / "docs" / "design.md").read_text()
    doc = json.loads(run("plan", "--gpus", "32", "--steps", "2", "--format", "json").stdout)
    second = doc["steps"][1]["plan"]
    bound = f"{second['lower_bound_s']:.3f}"
    longest = max(s[1] for s in second["samples"])
    assert f"`dcp plan --gpus 32 --steps 2` (bound {bound} s" in readme
    assert f"{longest:,}-token sample" in readme and f"{len(second['samples']) - 1} samples" in readme
    assert f"168,456 tokens; bound {bound} s)" in design and longest == 168_456
    (tmp_path / "one-512k-sample.txt").write_text("524288\n")
    long = json.loads(run("plan", "--model", "llama-3-8b", "--gpus", "64", "--global-batch", "1", "--workload",
                          "one-512k-sample.txt", "--format", "json").stdout)["steps"][0]["plan"]
    assert f"plans at {long['step_time_s']:.3f} s on 8 x 8" in readme
    # That plan is at its bound (one sample on the whole cluster), so the figure does not move with
    # load: above it only by what its backward loses beside the reductions it hides
    # (`overlap_slowdown`), which the bound leaves out (a plan's last micro-batch may be short).
    assert long["lower_bound_s"] <= long["step_time_s"] <= 1.005 * long["lower_bound_s"]
