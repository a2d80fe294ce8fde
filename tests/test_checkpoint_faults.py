"""Fault tests with deadlines (gloo, float64, FSDP2 model): one rank SIGKILLed in the middle of a
step, or inside an async save (after writing its shard, or at the commit), and the job restarted
with resume: it continues from the last complete checkpoint, nothing lost or repeated (the end
state bitwise equal to the run never interrupted)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
from checkpoint_helpers import train
from dist_helpers import run_ranks, run_ranks_raw

from dcp.executor import run_checkpoint_files as files

STEPS = 7


def _bitwise(a: dict, b: dict) -> None:
    for k in a["model"]:
        assert np.array_equal(a["model"][k], b["model"][k]), k
    for f in a["optim"]:
        for n in a["optim"][f]:
            assert np.array_equal(a["optim"][f][n], b["optim"][f][n]), f"{f}.{n}"


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return run_ranks(train, 2, str(tmp_path_factory.mktemp("whole")), STEPS, deadline_s=240)


@pytest.mark.parametrize(("fault", "last_good"), [
    ({"kill_mid_step": (1, 6)}, 4),                   # rank 1 dies in step 6; the others wait, time out
    ({"kill_in_save": ("write", 1, 4), "async_save": True}, 2),   # rank 1 dies after writing its shard
    ({"kill_in_save": ("commit", 0, 4), "async_save": True}, 2),  # rank 0 dies between .metadata and rename
], ids=["mid-step", "async-save-write", "async-save-commit"])
def test_restart_continues_from_the_last_complete_checkpoint(tmp_path: Path, whole: list[dict], fault: dict,
                                                             last_good: int) -> None:
    crashed = run_ranks_raw(partial(train, save_every=2, **fault), 2, str(tmp_path), STEPS, deadline_s=120,
                            pg_timeout_s=10)
    assert not all(r.ok for r in crashed), "the job crashed"
    assert files.committed_steps(tmp_path)[-1] == last_good
    resumed = run_ranks(partial(train, resume=True, save_every=2), 2, str(tmp_path), STEPS, deadline_s=240)
    assert resumed[0]["trained"] == whole[0]["trained"][last_good:], "continues after the last good step"
    _bitwise(whole[0]["state"], resumed[0]["state"])
    assert files.partial_steps(tmp_path) == [], "the restarted job cleared the crashed save's leftovers"
