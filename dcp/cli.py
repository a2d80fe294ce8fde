"""The `dcp` command line: parse options, call the library, print. No logic lives here.

Each command lives beside what it drives: `plan` and `compare` in dcp.commands.planning, `show`
and `presets` in dcp.commands.show, `profile` in dcp.profiler.command; they register below with
`main.add_command(...)`, and every one of them reports library errors as one `Error:` line.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from dcp.cli_errors import end_job
from dcp.commands.measure import measure_memory
from dcp.commands.planning import compare_cmd, plan
from dcp.commands.show import presets, show
from dcp.costmodel import CostModelError
from dcp.data.workloads import WorkloadError
from dcp.planner.plan import InfeasibleError, PlanError

# Errors that mean "bad input", reported as one line, never a traceback. OSError covers an
# output path that cannot be written.
USER_ERRORS = (CostModelError, WorkloadError, InfeasibleError, PlanError, ValueError, OSError)


INTERRUPTED_EXIT = 130
"""Exit status after Ctrl-C: 128 + SIGINT, as shells report a process the signal ended."""


class DcpGroup(click.Group):
    """A click group that turns library errors of any subcommand into `Error: ...`, exit 1, and
    Ctrl-C into one line and exit 130 (click's own `Aborted!` exits 1)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except USER_ERRORS as e:
            raise click.ClickException(_one_line(e)) from e
        except KeyboardInterrupt:
            # Outputs are written whole (dcp.commands.common.write_whole): nothing half-written is left.
            click.echo("Error: interrupted (Ctrl-C); no output file was written", err=True)
            ctx.exit(INTERRUPTED_EXIT)


    def main(self, args: Any = None, prog_name: str | None = None, **extra: Any) -> Any:
        """click's main, except that under torchrun only rank 0 prints a usage or input error (every
        rank parses the same arguments, so they all fail alike) and every rank exits with its
        status (`dcp.cli_errors.end_job`)."""
        extra.pop("standalone_mode", None)
        try:
            status = super().main(args, prog_name, standalone_mode=False, **extra)
        except click.ClickException as e:  # under torchrun: rank 0 prints it (dcp.cli_errors)
            end_job(e.exit_code, f"Error: {e.format_message()}", e.show)
        except click.Abort:  # end of input at a prompt
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(status if isinstance(status, int) else 0)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, OSError) and e.filename is not None and str(e.filename) not in text:
        text = f"{e.filename}: {text}"
    return text


@click.group(cls=DcpGroup)
@click.version_option(package_name="dcp")
def main() -> None:
    """dcp: plan sequence parallelism, micro-batches and checkpointing per global batch.

    \b
    Example:
      dcp presets
      dcp plan --workload wikipedia --gpus 32 --steps 2
      dcp compare --workload opensora --gpus 32 --steps 2
    """


for command in (plan, compare_cmd, show, presets, measure_memory):
    main.add_command(command)

# Further commands register here: main.add_command(...)
from dcp.profiler.command import profile  # noqa: E402

main.add_command(profile)


if __name__ == "__main__":
    main()
