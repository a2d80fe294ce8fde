"""Running `dcp` commands in-process with click's CliRunner, shared by the CLI tests."""

from __future__ import annotations

from click.testing import CliRunner, Result

from dcp.cli import main

FAST = ["--steps", "2", "--global-batch", "128"]


def run(*args: str, ok: bool = True) -> Result:
    # catch_exceptions=False: an error that escapes as a traceback fails the test outright.
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    if ok:
        assert result.exit_code == 0, result.output
    return result


def run_bad(*args: str) -> str:
    """Run a command that must fail with one clear error line; return that line."""
    result = run(*args, ok=False)
    assert result.exit_code in (1, 2), result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    return errors[0]


def check_validation_status(result: Result) -> None:
    """`dcp profile --validate` fails (exit 1) exactly when the held-out error it printed is above
    the threshold, which a loaded machine can cause: the verdict is that the status says what it printed."""
    import re

    from dcp.profiler.fitting import MAPE_THRESHOLD

    mape = float(re.search(r"held-out MAPE (\d+\.\d)%", result.output).group(1))
    assert result.exit_code == (1 if mape > 100 * MAPE_THRESHOLD else 0), result.output
