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
