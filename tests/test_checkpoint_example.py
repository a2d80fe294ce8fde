"""The training example under torchrun survives a crash: one rank SIGKILLed while the job trains
(after the step-3 checkpoint), the job restarted with --resume, and its step-6 checkpoint is
bitwise the one an uninterrupted run writes (nothing lost, nothing trained twice), its log the
same losses. Deadlines on every launch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import fakeclock
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

ROOT = Path(__file__).resolve().parents[1]
# Hang guards, not verdicts: seconds of the real clock (fakeclock.REAL; subprocess's timeouts read
# the real clock too), so --clock-speed N (tests/fakeclock) does not shorten them.
DEADLINE_S = 300
_now = fakeclock.REAL["monotonic"]


def _torchrun(ckdir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "examples/train_reference.py",
            "--steps", "6", "--global-batch", "8", "--checkpoint-dir", str(ckdir), "--save-every", "3", *extra]


def _rank_pid(parent: int, rank: int) -> int | None:
    """The pid of the worker with RANK=rank among `parent`'s descendants (torchrun's workers)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"TORCHELASTIC_RUN_ID" in b"".join(env) and \
                int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            return int(pid)
    return None


def _losses(out: str) -> dict[int, str]:
    return {int(line.split()[1]): line.split()[3] for line in out.splitlines() if line.startswith("step ")}


def _state(path: Path, out: Path) -> dict:
    dcp_to_torch_save(path, out)
    state = torch.load(out, weights_only=False)
    return {k: v for k, v in state.items() if k in ("model", "optim")}


def _equal(a: object, b: object) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


def test_killed_rank_and_resume_give_the_uninterrupted_run(tmp_path: Path) -> None:
    whole = subprocess.run(_torchrun(tmp_path / "a"), cwd=ROOT, capture_output=True, text=True, timeout=DEADLINE_S)
    assert whole.returncode == 0, whole.stderr[-3000:]

    job = subprocess.Popen(_torchrun(tmp_path / "b"), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    end, seen = _now() + DEADLINE_S, []
    try:
        for line in job.stdout:  # kill rank 1 once the step-3 save is committed and step 3 logged
            seen.append(line)
            if line.startswith("step   3 loss"):
                victim = _rank_pid(job.pid, 1)
                assert victim is not None, "rank 1's process"
                os.kill(victim, signal.SIGKILL)
                break
            assert _now() < end, "deadline"
        rest, _ = job.communicate(timeout=DEADLINE_S)
    finally:
        if job.poll() is None:
            job.kill()
    crashed = "".join(seen) + rest
    assert job.returncode != 0 and "step   5 loss" not in crashed, crashed[-3000:]
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["step-000000003"]

    resumed = subprocess.run(_torchrun(tmp_path / "b", "--resume"), cwd=ROOT, capture_output=True, text=True,
                             timeout=DEADLINE_S)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "at step 3" in resumed.stdout
    assert _losses(resumed.stdout) == {k: v for k, v in _losses(whole.stdout).items() if k >= 3}
    a = _state(tmp_path / "a" / "step-000000006", tmp_path / "a.pt")
    b = _state(tmp_path / "b" / "step-000000006", tmp_path / "b.pt")
    assert a["model"] and _equal(a, b), "the resumed run's step-6 state is the uninterrupted run's, bit for bit"
