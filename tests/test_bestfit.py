"""Best fit by SP size (`dcp.planner.ilp.bestfit`): the packings it returns place every sample
once within the cluster and the level, and filling the larger groups' room is what makes them
tight at a couple of samples per GPU."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp.planner.bounds import capacity_busy
from dcp.planner.feasibility import allowed_sp_sizes
from dcp.planner.ilp import bestfit
from dcp.planner.ilp.bestfit import best_fit
from dcp.planner.ilp.costs import cost_table
from dcp.planner.ilp.heuristic import heuristic
from dcp.planner.ilp.pack import estimate, to_layout
from dcp.planner.pricing import BatchArrays, Pricer, price_layout
from tests.conftest import cost_model, make_batch


def _table(batch, cm):  # noqa: ANN001, ANN202
    sizes = allowed_sp_sizes(cm)
    arrays = BatchArrays.of(batch)
    pricer = Pricer(cm, sizes)
    return arrays, pricer, cost_table(arrays, cm, sizes, pricer)


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(200, 120_000), min_size=1, max_size=40),
       gpus=st.sampled_from([8, 16, 32]), slack=st.floats(1.0, 1.6))
def test_every_packing_places_each_sample_once_within_the_cluster_and_its_level(lengths: list[int], gpus: int,
                                                                               slack: float) -> None:
    cm = cost_model(gpus=gpus)
    batch = make_batch(lengths)
    _, _, table = _table(batch, cm)
    floor = capacity_busy(batch, cm)
    found = best_fit(table, gpus, floor, floor * slack)
    least_alone = float(table.solo.min(axis=1).max())  # the longest sample at its fastest size
    if floor * slack < least_alone:
        assert found == []  # some sample runs alone within the level at no size
    levels = [estimate(groups, table) for groups in found]
    for groups, level in zip(found, levels, strict=True):
        assert sorted(i for _, ids in groups for i in ids) == list(range(len(batch)))
        assert sum(table.sizes[j] for j, _ in groups) <= gpus
        assert level <= floor * slack * (1 + 1e-9)
        assert all(ids for _, ids in groups)


def test_filling_the_larger_groups_room_packs_a_couple_of_samples_per_gpu_tightly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Wikipedia, 512 samples on 256 GPUs (batch 1): the long samples' groups (SP 2-256) idle
    much of the level unless short samples fill them. Best fit ends 24% below the warm start's
    heuristic by estimate (0.534 s against 0.705 s) and below it when priced exactly; with the
    fill left out, its least level is 19% higher (0.636 s). (Batch 4, where this was written,
    finds no level at all without the fill on the counted cost model, so it no longer measures
    what the fill is worth.)"""
    from dcp.data.batches import make_batches

    cm = cost_model(gpus=256)
    batch = make_batches("wikipedia", cm, global_batch=512, steps=1, seed=1)[0]
    arrays, pricer, table = _table(batch, cm)
    floor = capacity_busy(batch, cm)
    first = heuristic(table, 256, floor)
    found = best_fit(table, 256, floor, estimate(first, table))
    assert found
    best = found[-1]
    # ratchet: best fit's estimate 15% under first fit's (0.534 s against 0.705 s, docstring); a margin under what this case gave when written (`pytest tests/test_bestfit.py::test_filling_the_larger_groups_room_packs_a_couple_of_samples_per_gpu_tightly`)
    assert estimate(best, table) < 0.85 * estimate(first, table)

    def busy(groups) -> float:  # noqa: ANN001
        return price_layout(to_layout(groups, cm, table, None), arrays, pricer).makespan_s

    # ratchet: best fit's busy time 10% under first fit's; a margin under what this case gave when written (`pytest tests/test_bestfit.py::test_filling_the_larger_groups_room_packs_a_couple_of_samples_per_gpu_tightly`)
    assert busy(best) < 0.9 * busy(first)
    monkeypatch.setattr(bestfit._Bins, "fill", lambda self, candidates: np.zeros(0, dtype=np.int64))
    unfilled = best_fit(table, 256, floor, estimate(first, table))
    # ratchet: the fill is worth 10% (0.636 s unfilled, docstring); a margin under what this case gave when written (`pytest tests/test_bestfit.py::test_filling_the_larger_groups_room_packs_a_couple_of_samples_per_gpu_tightly`)
    assert unfilled and estimate(unfilled[-1], table) > 1.1 * estimate(best, table)
