"""simulate(): a timeline consistent with the plan's predicted times, shares, frame and Gantt chart."""

from __future__ import annotations

import copy

import pytest
from conftest import cost_model, make_batch
from hypothesis import given
from hypothesis import strategies as st

from dcp.planner import BucketOptions, GreedyOptions, PackedOptions, PlanError, solve
from dcp.planner.baselines import solve_bucket
from dcp.planner.common import assemble
from dcp.planner.greedy import solve_greedy
from dcp.planner.simulate import EVENT_KINDS, gantt, microbatch_phases, simulate

OPTIONS = [BucketOptions(), PackedOptions(), GreedyOptions(), GreedyOptions(pyramid=False)]


def check_timeline(plan, cm) -> None:
    tl = simulate(plan, cm)
    assert tl.step_time_s == pytest.approx(plan.step_time_s, rel=1e-9)
    assert len(tl.events) == plan.num_gpus
    for rank, events in enumerate(tl.events):
        # Events tile [0, step] without gaps or overlaps.
        assert events[0].start_s == 0.0
        assert events[-1].end_s == pytest.approx(tl.step_time_s, rel=1e-9)
        for a, b in zip(events, events[1:], strict=False):
            assert a.end_s == pytest.approx(b.start_s, rel=1e-12, abs=1e-12)
            assert a.duration_s >= 0
        g = next(iter(plan.groups_of_rank(rank)), None)
        assert tl.busy_s[rank] == pytest.approx(g.busy_s if g else 0.0, rel=1e-9)
        # Each micro-batch's phases add up to its predicted time.
        for mi, mb in enumerate(g.microbatches if g else []):
            assert sum(e.duration_s for e in events if e.microbatch == mi) == pytest.approx(mb.time_s, rel=1e-9)
            has_recompute = any(e.kind == "recompute" and e.microbatch == mi for e in events)
            assert has_recompute == (mb.ckpt_layers > 0)
    kinds = tl.seconds_by_kind()
    total = plan.num_gpus * tl.step_time_s
    assert sum(kinds.values()) == pytest.approx(total, rel=1e-9)
    assert tl.idle_fraction == pytest.approx(kinds["idle"] / total)
    assert tl.comm_fraction == pytest.approx((kinds["all_to_all"] + kinds["param_gather"] + kinds["allreduce"]) / total)
    # The schedule adds at least the least any plan's sync adds (what bounds count on).
    assert plan.grad_sync_s >= cm.grad_sync_s() * (1 - 1e-9)
    assert plan.step_time_s == pytest.approx(plan.busy_s() + plan.grad_sync_s, rel=1e-12)


@given(lengths=st.lists(st.integers(1, 200_000), min_size=1, max_size=40),
       gpus=st.sampled_from([1, 4, 8, 16]), option=st.sampled_from(OPTIONS))
def test_simulation_matches_plan(lengths: list[int], gpus: int, option) -> None:
    cm = cost_model(gpus=gpus)
    batch = make_batch(lengths)
    if any(cm.min_ckpt_layers(t, gpus) is None for t in lengths):
        return  # infeasible batches are test_baselines' business
    check_timeline(solve(batch, cm.cluster, cm, option), cm)


def test_simulation_of_wikipedia_and_opensora(wiki_batches) -> None:
    cm = cost_model()
    for batch in wiki_batches[:2]:
        for option in OPTIONS:
            check_timeline(solve(batch, cm.cluster, cm, option), cm)
    from dcp.data.batches import make_batches

    video = cost_model(model="opensora-stdit-1.1b")
    batch = make_batches("opensora", video, global_batch=256, steps=1)[0]
    check_timeline(solve_greedy(batch, video), video)


def test_phases_follow_the_cost_model() -> None:
    cm = cost_model()
    t, a, p, r = 50_000, 50_000 * 50_001 // 2, 8, 12
    phases = microbatch_phases(cm, t, a, p, r)
    # ZeRO's collectives belong to the step's schedule, not to a micro-batch.
    assert [k for k, _ in phases] == ["forward", "all_to_all", "recompute", "all_to_all", "backward", "all_to_all"]
    assert microbatch_phases(cost_model(zero_stage=3), t, a, p, r) == phases
    assert sum(s for _, s in phases) == pytest.approx(cm.time_s(t, a, p, r), rel=1e-12)
    lt = cm.layer_times(t, a, p)
    assert dict(phases)["recompute"] == pytest.approx(r * lt.fwd_compute_s)
    assert dict(phases)["backward"] == pytest.approx(32 * lt.bwd_compute_s)
    assert all(k != "all_to_all" for k, _ in microbatch_phases(cm, t, a, 1, 0))  # no SP, no all-to-all


def test_zero3_slots_run_in_lockstep() -> None:
    """Stage 3: two groups of 1 and 3 micro-batches; the one-micro-batch group waits in the others'
    slots (its empty passes join every gather), and every rank gathers parameters in every slot."""
    cm = cost_model(gpus=8, zero_stage=3)
    plan = assemble("hand", make_batch([20_000, 3_000, 4_000, 5_000]), cm, [(0, 4, [[0]]), (4, 4, [[1], [2], [3]])])
    assert [len(g.microbatches) for g in plan.groups] == [1, 3]
    times = [mb.time_s for mb in plan.groups[1].microbatches]
    assert times == sorted(times, reverse=True)  # longest first: balanced slots
    tl = simulate(plan, cm)
    check_timeline(plan, cm)
    # Lockstep: the step is at least the sum over slots of the slowest micro-batch in each.
    slots = [max(plan.groups[0].microbatches[0].time_s, times[0]), times[1], times[2]]
    assert tl.step_time_s >= sum(slots)
    assert tl.step_time_s > max(g.busy_s for g in plan.groups)  # more than independent groups would take
    for rank in (0, 4):
        assert sum(e.kind == "param_gather" for e in tl.events[rank]) >= 1
    computed = max(e.end_s for e in tl.events[0] if e.microbatch is not None)
    after = {e.kind for e in tl.events[0] if e.start_s >= computed}
    assert after and after <= {"idle", "param_gather", "allreduce"}  # then empty passes: no compute


def test_idle_ranks_and_waiting() -> None:
    cm = cost_model(gpus=8)
    # SP 2 on ranks 0-1, SP 1 on rank 2, ranks 3-7 in no group.
    plan = assemble("hand", make_batch([100_000, 50, 60]), cm, [(0, 2, [[0]]), (2, 1, [[1], [2]])])
    tl = simulate(plan, cm)
    # The optimizer's step ends the step on every rank, after the last collective; the timeline has
    # no kind for it, so it shows as the last idle stretch: foreach AdamW over the rank's 1/8 of
    # 7B's 6.74e9 parameters (bf16 recipe: 82 bytes a parameter) at 4.3 TB/s.
    adam = 82 * 6_738_415_616 / 8 / 4.3e12
    for rank in range(3, 8):  # outside every group: idle until the others' reductions start, then those
        kinds = [e.kind for e in tl.events[rank]]
        assert kinds[0] == "idle" and kinds[-2] == "allreduce" and set(kinds) == {"idle", "allreduce"}
        assert kinds[-1] == "idle" and tl.events[rank][-1].duration_s == pytest.approx(adam)
    # The first reduction starts once every group is in its last micro-batch's backward.
    slow = max(plan.groups, key=lambda g: g.busy_s)
    assert tl.events[3][0].end_s >= slow.busy_s - slow.microbatches[-1].time_s
    assert all(e.kind != "idle" for e in tl.events[slow.ranks[0]] if e.end_s <= slow.busy_s)
    assert 0 < tl.idle_fraction < 1


def test_plan_from_another_cost_model_is_refused(wiki_batches) -> None:
    cm = cost_model()
    plan = solve_bucket(wiki_batches[0], cm)
    wrong = copy.deepcopy(plan)
    wrong.groups[0].microbatches[0].time_s *= 1.01
    with pytest.raises(PlanError, match="cost model prices it"):
        simulate(wrong, cm)
    with pytest.raises(PlanError, match="plan is for 32 GPUs"):
        simulate(plan, cost_model(gpus=16))


def test_frame_and_gantt(tmp_path, wiki_batches) -> None:
    cm = cost_model()
    tl = simulate(solve_greedy(wiki_batches[0], cm), cm)
    frame = tl.to_frame()
    assert list(frame.columns) == ["rank", "start_s", "end_s", "duration_s", "kind", "microbatch", "phase"]
    assert len(frame) == sum(len(e) for e in tl.events)
    assert set(frame["kind"]) <= set(EVENT_KINDS)
    assert frame.groupby("rank")["duration_s"].sum().to_numpy() == pytest.approx(tl.step_time_s)
    path = tmp_path / "gantt.png"
    fig = gantt(tl)
    fig.savefig(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert fig.axes[0].get_legend() is not None
