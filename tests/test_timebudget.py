"""The one time budget (`dcp.planner.timebudget`): its windows tile the limit from the table of
shares in `dcp.planner.knobs`, and each stage of a solve stops at its window's end, under a
clock that advances a fixed step per reading (`fakeclock.stepping`: no wall clock, no load)."""

from __future__ import annotations

import itertools

import fakeclock
import pytest

from dcp.data.batches import make_batches
from dcp.planner import IlpOptions, knobs, phases, solve
from dcp.planner.ilp.budget import final_pricing_s
from dcp.planner.timebudget import TimeBudget, explain_budget
from tests.conftest import cost_model, make_batch


@pytest.mark.parametrize("limit_s,samples", [(0.2, 512), (1.0, 512), (1.0, 32_768), (5.0, 2048), (0.05, 100_000)])
def test_windows_tile_the_limit_in_order(limit_s: float, samples: int) -> None:
    pricing_s = final_pricing_s(samples)
    for search, reaching, nested in itertools.product([False, True], repeat=3):
        tb = TimeBudget.divide(limit_s, pricing_s, search=search, reaching=reaching, nested_columns=nested)
        cut = [s for s in tb.stages if s.seconds > 0 or s.name.startswith("single")]
        assert cut[0].start_s == 0 and cut[-1].end_s == pytest.approx(limit_s)
        for a, b in zip(cut, cut[1:], strict=False):
            assert a.end_s == pytest.approx(b.start_s)  # no gap, no overlap
        assert sum(s.seconds for s in tb.stages) == pytest.approx(limit_s)  # the shares add up
        assert all(s.seconds >= 0 for s in tb.stages)
        # By hand from the table: the report keeps min(3 pricings, limit / 4) after a search.
        margin = min(knobs.REPORT_MARGIN_PRICINGS * pricing_s, limit_s / 4)
        assert tb.search_deadline_s == pytest.approx(limit_s - margin)
        share = knobs.REACHING_SHARE if reaching else knobs.PHASE_SHARE
        searched = search and share * limit_s >= knobs.MIN_SEARCH_S
        single = limit_s - (share * limit_s + margin if searched else min(pricing_s, knobs.REPORT_S, limit_s / 4))
        if nested:
            single = min(single, (1 - knobs.NESTED_COLUMNS_SHARE) * limit_s)
        assert tb.single_s == pytest.approx(single)


def test_a_share_set_in_the_knob_module_moves_the_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    before = TimeBudget.divide(1.0, 0.001, search=True, reaching=True)
    monkeypatch.setattr(knobs, "REACHING_SHARE", 0.3)
    after = TimeBudget.divide(1.0, 0.001, search=True, reaching=True)
    assert after.single_s == pytest.approx(before.single_s + 0.2)
    monkeypatch.setattr(knobs, "PHASE_SHARE", 0.15)  # below MIN_SEARCH_S at 1 s: no search window
    assert TimeBudget.divide(1.0, 0.001, search=True).stage("report").start_s == pytest.approx(1.0 - 0.001)


def test_explain_lists_every_case_with_its_seconds() -> None:
    text = explain_budget(1.0, 512)
    assert text.count("single layout") == 4  # no search, search, reaching split, nested columns
    assert "phase search" in text and "nested columns" in text and "report" in text
    assert IlpOptions(time_limit_s=1.0).explain_budget(512) == text
    assert "nested columns" not in explain_budget(0.5, 512)  # 0.35 s: below NESTED_COLUMNS_MIN_S


def test_each_stage_stops_at_its_deadline_under_a_virtual_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The single layout gets `single_s` from the start of the solve and the rest stops by the
    limit: under a clock whose time is only its readings (4 ms each: the solve reads it about a
    hundred times, so the limit cuts it), the single layout's solve ends by its window's end and
    the whole solve by the limit, each within 0.1 s (25 readings: the steps between two checks,
    and HiGHS's interrupt callbacks, whose count follows the real time)."""
    cm = cost_model(gpus=32)
    batch = make_batches("wikipedia", cm, global_batch=256, steps=1)[0]
    ends: list[tuple[float, float]] = []
    real = phases.solve_ilp_against

    def spy(batch_, cm_, options, started, *args, **kwargs):  # noqa: ANN001, ANN202
        out = real(batch_, cm_, options, started, *args, **kwargs)
        ends.append((clock.now - started, options.time_limit_s))
        return out

    monkeypatch.setattr(phases, "solve_ilp_against", spy)
    with fakeclock.stepping(4e-3) as clock:
        started = clock.now
        plan = solve(batch, cm.cluster, cm, IlpOptions(time_limit_s=0.5))
    (single_end, single_s), = ends
    tb = TimeBudget.divide(0.5, final_pricing_s(len(batch)))
    assert single_s == pytest.approx(tb.single_s)
    assert single_end <= single_s + 0.1  # the "limit + 0.1 s", in readings: 25
    assert clock.now - started <= 0.5 + 0.1
    assert "time limit reached" in plan.solver_status  # the virtual time ran out: it says so


def _example() -> tuple:
    """The second batch of `dcp plan --gpus 32 --steps 2`: one sample needs all 32 GPUs, so the
    phase search plans a split."""
    cm = cost_model(gpus=32)
    return cm, make_batches("wikipedia", cm, global_batch=512, steps=2, seed=0, full_only=True)[1]


def _long_tail() -> tuple:
    """60 samples of 300-6,900 tokens and two of 60,000 and 30,000 on 16 GPUs: fewer than four a
    GPU, of few shapes, so the nested column plans run after the single layout."""
    cm = cost_model(gpus=16)
    return cm, make_batch([300 * (1 + (7 * i) % 23) for i in range(60)] + [60_000, 30_000])


@pytest.mark.parametrize("stage,batch", [("_search", _example), ("nested_column_plan", _long_tail)])
def test_the_phase_search_and_nested_columns_stop_at_the_search_deadline(stage: str, batch,  # noqa: ANN001
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The stages after the single layout (the phase search, the nested column plans) end by the
    search deadline (`TimeBudget.search_deadline_s`, the limit less the report's margin), and the
    solve by the limit, each within 0.1 s: 25 readings of the virtual clock (as above)."""
    cm, samples = batch()
    ends: list[float] = []
    real = getattr(phases, stage)

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        out = real(*args, **kwargs)
        ends.append(clock.now - started)
        return out

    monkeypatch.setattr(phases, stage, spy)
    with fakeclock.stepping(4e-3) as clock:
        started = clock.now
        plan = solve(samples, cm.cluster, cm, IlpOptions(time_limit_s=1.0))
    deadline_s = TimeBudget.divide(1.0, final_pricing_s(len(samples))).search_deadline_s
    assert len(ends) == 1 and ends[0] <= deadline_s + 0.1  # the stage ran, and ended by its deadline
    assert clock.now - started <= 1.0 + 0.1
    assert plan.num_phases == 2


def test_dcp_plan_explain_budget_prints_the_division_and_plans_nothing() -> None:
    from click.testing import CliRunner

    from dcp.cli import main

    out = CliRunner().invoke(main, ["plan", "--explain-budget", "--time-limit", "2", "--global-batch", "4096"],
                             catch_exceptions=False)
    assert out.exit_code == 0
    assert out.output.strip() == explain_budget(2.0, 4096)
