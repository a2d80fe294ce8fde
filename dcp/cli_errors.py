"""How a program of dcp ends on a usage, input or environment error: one `Error:` line and a
non-zero exit status, also when torchrun runs it on every rank. Torch-free (the `dcp` CLI and the
training scripts' `dcp.launch.run_main` both end here).

Under torchrun every rank parses the same arguments and sees the same environment, so every rank
fails alike; printing from each would give one line per rank. Instead:

- rank 0 prints the error, writes it to its torchelastic error file (`TORCHELASTIC_ERROR_FILE`,
  the JSON that `torch.distributed.elastic.multiprocessing.errors.ErrorHandler` writes), and exits
  with the status. torchrun's failure summary then shows that one line as rank 0's `traceback`,
  where it would otherwise print "To enable traceback see: ...".
- every other rank prints nothing and waits: once rank 0 has exited, torchrun ends the other
  ranks with SIGTERM, and they exit on it with the same status (their error files say "the same
  error as rank 0", which the summary lists under the other failures). Rank 0 is thus always the first
  failure torchrun sees (its summary's root cause), and is never stopped by torchrun before it has
  printed, as it could be if another rank exited first.
- a rank that rank 0 has not ended within `LEAD_WAIT_S` (rank 0 did not fail, or runs on another
  node, whose ranks torchrun does not end) prints its own error, naming its rank, and exits.

What torchrun itself still prints when a rank fails (its `ChildFailedError` traceback and failure
summary) is the launcher's own and cannot be turned off from a worker; README.md says so.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import NoReturn

LEAD_WAIT_S = 60.0
"""How long a rank other than 0 waits for torchrun to end it after rank 0 has failed alike: enough
for rank 0 to reach the same error on a loaded machine (ranks start within seconds of each other),
short enough that an error on that rank alone is reported within a minute."""


def under_torchrun() -> bool:
    """Whether torchrun (torch.distributed.elastic) started this process."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ


def rank() -> int:
    """This process's global rank under torchrun (0 when alone)."""
    return int(os.environ.get("RANK", "0") or 0)


def write_error_file(line: str) -> None:
    """Write `line` to torchrun's error file for this rank, if torchrun gave one, in the format of
    torch's `ErrorHandler.record_exception` with `line` in place of the Python traceback, so that
    torchrun's summary shows the line. Nothing when torchrun gave no file or it cannot be written."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:
        pass  # the summary then says what it says without a file; the line was printed


def end_job(status: int, line: str, show: Callable[[], None] | None = None) -> NoReturn:
    """Exit with `status` after an error that every rank meets alike. `line` is the `Error: ...`
    line; `show` prints the error (default: `line` on stderr), for example click's usage lines
    followed by the line. Alone: print and exit. Under torchrun: see the module's docstring."""

    def say(prefix: str = "") -> None:
        if show is None or prefix:
            print(line.replace("Error: ", f"Error: {prefix}", 1), file=sys.stderr, flush=True)
        else:
            show()
        sys.stderr.flush()
        sys.stdout.flush()

    if not under_torchrun() or rank() == 0:
        say()
        if under_torchrun():
            write_error_file(line)
        sys.exit(status)

    def ended(signum: int, frame: object) -> None:  # torchrun ends the job after rank 0's exit
        write_error_file("the same error as rank 0 (the root cause)")
        sys.stdout.flush()
        os._exit(status)

    signal.signal(signal.SIGTERM, ended)
    time.sleep(LEAD_WAIT_S)
    say(f"rank {rank()}: ")  # rank 0 did not end the job: this error is this rank's to report
    write_error_file(line.replace("Error: ", f"Error: rank {rank()}: ", 1))
    sys.exit(status)
