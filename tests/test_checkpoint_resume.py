"""Exact resume through run checkpoints on an FSDP2 (`fully_shard`) model, gloo, float64: a run
killed after a save and resumed ends bitwise equal to the run never interrupted; on another world
size (8 -> 4, 4 -> 8) within 1e-12 relative, every sample of the epoch trained exactly once."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
from checkpoint_helpers import LENGTHS, train
from dist_helpers import run_ranks, run_ranks_raw

STEPS = 7
"""One epoch (6 global batches of 4) and the first step of the next."""


def _assert_states(a: dict, b: dict, rel: float = 0.0) -> None:
    assert set(a["model"]) == set(b["model"]) and set(a["optim"]) == set(b["optim"])
    pairs = [(k, a["model"][k], b["model"][k]) for k in a["model"]]
    pairs += [(f"{f}.{n}", a["optim"][f][n], b["optim"][f][n]) for f in a["optim"] for n in a["optim"][f]]
    for name, x, y in pairs:
        if rel == 0.0:
            assert np.array_equal(x, y), f"{name} differs"
        else:
            scale = max(float(np.abs(x).max()), 1e-300)
            assert float(np.abs(x - y).max()) <= rel * scale, f"{name}: {np.abs(x - y).max() / scale:.2e} relative"


@pytest.mark.parametrize(("reshard", "async_save"), [(False, True)], ids=["kept-gathered-async"])
def test_killed_run_resumes_bitwise(tmp_path: Path, reshard: bool, async_save: bool) -> None:
    """Async saves and RNG streams; every ZeRO stage of the executor: test_checkpoint_executor.py."""
    whole = run_ranks(partial(train, reshard_after_forward=reshard), 2, str(tmp_path / "a"), STEPS, deadline_s=240)
    died = run_ranks_raw(partial(train, save_every=3, die_after_step=3, reshard_after_forward=reshard,
                                 async_save=async_save), 2, str(tmp_path / "b"), STEPS, deadline_s=240)
    assert all(not r.ok and "died" in r.error for r in died), "every rank is killed after the step-3 save"
    resumed = run_ranks(partial(train, resume=True, reshard_after_forward=reshard), 2, str(tmp_path / "b"), STEPS,
                        deadline_s=240)
    _assert_states(whole[0]["state"], resumed[0]["state"])
    assert resumed[0]["trained"] == whole[0]["trained"][3:], "the resumed run trains the batches after step 3"
    for rank in range(2):  # each rank's RNG stream continues where the saved run left it
        assert resumed[rank]["rng"] == whole[rank]["rng"][3:]


@pytest.mark.parametrize(("before", "after"), [(8, 4), (4, 8)])
def test_resume_on_another_world_size(tmp_path: Path, before: int, after: int) -> None:
    whole = run_ranks(train, after, str(tmp_path / "a"), 6, deadline_s=300)
    first = run_ranks(partial(train, save_every=2), before, str(tmp_path / "b"), 2, deadline_s=300)
    rest = run_ranks(partial(train, resume=True), after, str(tmp_path / "b"), 6, deadline_s=300)
    _assert_states(whole[0]["state"], rest[0]["state"], rel=1e-12)
    trained = first[0]["trained"] + rest[0]["trained"]
    assert [(e, s) for e, s, _, _ in trained] == [(0, s) for s in range(6)], "the epoch's steps, each once"
    assert [n for *_, n in trained] == [before] * 2 + [after] * 4, "the rest re-planned for the new cluster"
    ids = sorted(i for _, _, batch, _ in trained for i in batch)
    assert ids == list(range(len(LENGTHS))), "every sample of the epoch trained exactly once"
    assert {len(r["trained"]) for r in rest} == {4}
