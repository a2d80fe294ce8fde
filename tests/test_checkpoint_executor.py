"""Exact resume through dcp.executor.Executor at every ZeRO stage it offers (FSDP2), gloo, float64:
every rank killed after the step-2 save of a 5-step run, the job resumed, parameters and AdamW
state bitwise equal to the uninterrupted run's."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
from checkpoint_helpers import train_executor
from dist_helpers import run_ranks, run_ranks_raw

from dcp.costmodel.zero import ZERO_STAGES

STEPS = 5


@pytest.mark.parametrize("zero_stage", ZERO_STAGES)
def test_executor_resume_is_bitwise_at_every_stage(tmp_path: Path, zero_stage: int) -> None:
    run = partial(train_executor, zero_stage=zero_stage)
    whole = run_ranks(run, 2, str(tmp_path / "a"), STEPS, deadline_s=240)
    died = run_ranks_raw(partial(run, save_every=2, die_after_step=2), 2, str(tmp_path / "b"), STEPS, deadline_s=240)
    assert all(not r.ok and "died" in r.error for r in died)
    resumed = run_ranks(partial(run, resume=True), 2, str(tmp_path / "b"), STEPS, deadline_s=240)
    assert resumed[0]["trained"] == whole[0]["trained"][2:]
    a, b = whole[0]["state"], resumed[0]["state"]
    assert a["model"] and a["optim"]
    for k in a["model"]:
        assert np.array_equal(a["model"][k], b["model"][k]), k
    for f in a["optim"]:
        for n in a["optim"][f]:
            assert np.array_equal(a["optim"][f][n], b["optim"][f][n]), f"{f}.{n}"
