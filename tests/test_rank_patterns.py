"""The rank-pattern bound (`benchmarks/rank_patterns.py`, offline: not in the solve path): against brute force over every
multi-phase plan of tiny batches (random ones in tests/test_phases.py; its knapsacks,
`colgen.knapsack`, against enumeration in tests/test_columns.py), and on two videos a GPU above
the pooled bound and below the best plan found."""

from __future__ import annotations

import fakeclock
import pytest

from benchmarks.rank_patterns import rank_pattern_bound, rank_pattern_busy
from dcp.data.batches import make_batches
from dcp.planner.bounds import multi_phase_bound, multi_phase_busy
from dcp.planner.feasibility import allowed_sp_sizes
from dcp.planner.ilp.costs import batch_costs
from dcp.planner.nested_columns import nested_column_plan
from dcp.planner.pricing import BatchArrays
from tests.brute_helpers import brute_force_phases, tiny_cm
from tests.conftest import cost_model, make_batch

TINY = [  # (lengths, GPUs, GPUs per node, tokens one GPU holds, raised above the pooled bound)
    ([1100, 100, 100, 100, 100, 100], 2, 2, 600, True),
    ([1000, 60, 60, 60, 60], 4, 2, 300, True),
    ([700, 100, 100, 100], 2, 2, 600, False),
    ([50, 80, 120, 500, 900], 4, 2, 600, False),
]


@pytest.mark.parametrize("lengths,gpus,per_node,cap,raised", TINY)
def test_bound_against_brute_force_over_every_multi_phase_plan(lengths: list[int], gpus: int, per_node: int,
                                                                cap: int, raised: bool) -> None:
    """Never above the best multi-phase plan's busy time (brute force, its sync taken off), and
    above `multi_phase_busy` where a rank cannot fill its time: one 1,100-token sample on SP 2
    leaves 0.07 s of ranks that five short samples fill only in part (2.768 s against the pooled
    2.701 s; the optimum 2.795 s)."""
    cm = tiny_cm(gpus, per_node, cap)
    batch = make_batch(lengths)
    pooled, best = multi_phase_busy(batch, cm), brute_force_phases(batch, cm) - cm.grad_sync_s()
    bound = rank_pattern_busy(batch, cm)
    assert pooled <= bound <= best * (1 + 1e-9)
    assert (bound > pooled * (1 + 1e-3)) == raised


def test_two_videos_a_gpu_raise_the_bound_below_the_nested_plan(unhurried) -> None:  # noqa: ANN001
    """Open-Sora's batch 4 of 128 videos on 64 GPUs: 1.2% above `multi_phase_busy` (0.846 s
    against 0.836 s), below the busy time of the nested plan (0.853 s), whose gap it shows to be
    0.8% where the pooled bound said 2.0%. (On the counted cost model batches 0-3, 5 and 7 rise
    0.5-0.75%, under the 0.8% asserted; batch 0 is where this was written.) Unhurried: what the
    search proves, not how far a loaded machine gets in 60 s."""
    cm = cost_model(model="opensora-stdit-1.1b", gpus=64)
    batch = make_batches("opensora", cm, global_batch=128, steps=1, seed=4)[0]
    sizes = allowed_sp_sizes(cm)
    pooled = multi_phase_busy(batch, cm, sizes)
    bound = rank_pattern_busy(batch, cm, sizes, time_limit_s=60)
    arrays = BatchArrays.of(batch)
    plan = nested_column_plan(batch, cm, sizes, pooled, arrays, None, batch_costs(arrays, cm, sizes))
    assert plan is not None
    # ratchet: rank patterns raise the bound 0.8% over pooled (0.846 s against 0.836 s, docstring); a margin under what this case gave when written (`pytest tests/test_rank_patterns.py::test_two_videos_a_gpu_raise_the_bound_below_the_nested_plan`)
    assert pooled * 1.008 < bound < plan.busy_s()
    assert multi_phase_bound(batch, cm, sizes) < rank_pattern_bound(batch, cm, sizes, time_limit_s=60) < plan.step_time_s
    # Anytime: with half a second it stops within it (on a clock that moves 1 ms a reading: the
    # deadline's checks, not this machine's speed), with what it proved by then.
    with fakeclock.stepping(1e-3) as clock:
        quick = rank_pattern_busy(batch, cm, sizes, time_limit_s=0.5)
    assert clock.elapsed <= 0.5 + 0.2 and pooled <= quick <= bound


def test_an_empty_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="the batch is empty"):
        rank_pattern_busy([], cost_model(gpus=8))


def test_busy_times_past_the_grid_of_the_least_fixed_time_are_not_searched(monkeypatch) -> None:  # noqa: ANN001
    """64 samples of up to a million tokens on 64 GPUs: a busy time of 657 s, whose thousandth is
    past llama-7b's 31 ms fixed time (a slice could then be shorter than a unit of the rank
    knapsack, which charges it one): the pooled bound, at once (no column built, no pricing)."""
    import benchmarks.rank_patterns as rank_patterns

    def searched(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("the rank-pattern search ran")

    cm = cost_model(gpus=64)
    batch = make_batches("lognormal:scale=128", cm, global_batch=64, steps=1, seed=0)[0]
    monkeypatch.setattr(rank_patterns, "_single_class_columns", searched)
    monkeypatch.setattr(rank_patterns, "_proven", searched)
    assert rank_pattern_busy(batch, cm, time_limit_s=10) == multi_phase_busy(batch, cm)
