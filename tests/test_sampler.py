"""The global-batch sampler: exactly-once epochs, exact resume, planning ahead, failures, glue."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import fakeclock
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcp.costmodel import Cluster, CostModel, attention_pairs, load_hardware, load_model
from dcp.data import (
    GlobalBatchSampler,
    PlannedBatch,
    PlanningError,
    fetch_items,
    local_samples,
    lognormal,
)
from dcp.planner import Sample
from dcp.planner.plan import Group, InfeasibleError, MicroBatch, Plan

CLUSTER = Cluster(num_gpus=4, gpus_per_node=4, memory_bytes=1e9)


@pytest.fixture(scope="module")
def cm() -> CostModel:
    return CostModel(load_model("tiny-llama"), load_hardware("cpu"), CLUSTER)


def _cm() -> CostModel:
    return CostModel(load_model("tiny-llama"), load_hardware("cpu"), CLUSTER)


def one_group_plan(batch: list[Sample]) -> Plan:
    """A stand-in planner: the whole batch in one micro-batch on rank 0 (fast, picklable)."""
    mb = MicroBatch([s.id for s in batch], 0, 0.0, 0.0)
    return Plan(strategy="one-group", num_gpus=4, gpus_per_node=4, memory_limit_bytes=1e9,
                num_layers=2, samples=list(batch), groups=[Group([0], 1, [mb])],
                step_time_s=0.0, lower_bound_s=0.0)


@dataclass(frozen=True)
class SlowPlanner:
    """Sleeps, then plans like `one_group_plan`; fails on batches holding `fail_on`."""

    delay_s: float
    fail_on: int | None = None

    def __call__(self, batch: list[Sample]) -> Plan:
        time.sleep(self.delay_s)
        if self.fail_on is not None and any(s.id == self.fail_on for s in batch):
            raise ValueError(f"planner cannot handle sample {self.fail_on}")
        return one_group_plan(batch)


def take(sampler: GlobalBatchSampler, n: int) -> list[PlannedBatch]:
    """The next n steps, crossing epochs, stopping mid-epoch as a job killed at step n would."""
    out: list[PlannedBatch] = []
    while len(out) < n:
        for b in sampler:
            out.append(b)
            if len(out) == n:
                break
    return out


def key(b: PlannedBatch) -> tuple:
    return b.epoch, b.step, tuple(b.sample_ids), b.plan.digest()


batching = st.one_of(
    st.integers(1, 17).map(lambda n: {"batch_size": n}),
    st.integers(1, 60_000).map(lambda n: {"token_budget": n}),
)
datasets = st.lists(st.integers(1, 30_000), min_size=1, max_size=60)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=datasets, batch=batching, seed=st.integers(0, 2**31), epochs=st.integers(1, 3))
def test_every_sample_trains_exactly_once_per_epoch(cm, lengths, batch, seed, epochs):
    s = GlobalBatchSampler(lengths, cm, planner=one_group_plan, workers=0, seed=seed, **batch)
    for epoch in range(epochs):
        s.set_epoch(epoch)
        steps = list(s)
        ids = [i for b in steps for i in b.sample_ids]
        assert sorted(ids) == list(range(len(lengths)))  # the last partial batch included
        assert [b.step for b in steps] == list(range(len(steps))) and {b.epoch for b in steps} == {epoch}
        for b in steps:
            assert [x.id for x in b.plan.samples] == b.sample_ids
            if "token_budget" in batch and len(b.sample_ids) > 1:
                assert sum(lengths[i] for i in b.sample_ids) <= batch["token_budget"]
    assert s.epoch == epochs and s.step == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=datasets, batch=batching, seed=st.integers(0, 1000), cut=st.floats(0, 1))
def test_resume_continues_with_the_same_batches(cm, lengths, batch, seed, cut):
    def fresh() -> GlobalBatchSampler:
        return GlobalBatchSampler(lengths, cm, planner=one_group_plan, workers=0, seed=seed, **batch)

    ref = fresh()
    total = sum(len(ref.batches(e)) for e in range(3))
    full = [key(b) for b in take(ref, total)]
    k = int(cut * total)
    first = fresh()
    before = take(first, k)
    state = first.state_dict()
    if before:
        assert first.state_dict_after(before[-1]) == state
    restarted = fresh()
    restarted.load_state_dict(state)
    restarted.set_epoch(state["epoch"])  # the usual loop calls set_epoch after loading: a no-op
    after = take(restarted, total - k)
    assert [key(b) for b in before + after] == full


def test_resume_with_real_planner_in_workers_gives_identical_plans(cm):
    lengths = lognormal(mean=2000, max_tokens=60_000, size=120, seed=1).tokens
    kw = dict(batch_size=16, strategy="dcp-greedy", seed=7, workers=1, plan_ahead=2)
    with GlobalBatchSampler(lengths, cm, **kw) as a, GlobalBatchSampler(lengths, cm, **kw) as other_rank:
        total = 2 * len(a)
        full = [key(b) for b in take(a, total)]
        assert [key(b) for b in take(other_rank, total)] == full  # every rank agrees
    with GlobalBatchSampler(lengths, cm, **kw) as first:
        before = take(first, 5)
        state = first.state_dict()
    assert state["epoch"] == 0 and state["step"] == 5
    with GlobalBatchSampler(lengths, cm, **kw) as restarted:
        restarted.load_state_dict(state)
        after = take(restarted, total - 5)
    assert [key(b) for b in before + after] == full
    assert all(b.plan.strategy == "dcp-greedy" for b in before + after)


@dataclass(frozen=True)
class MarkingPlanner:
    """Sleeps `delay_s`, plans like `one_group_plan`, then leaves a file named by the batch's
    sample ids in `folder`: a sign, across processes, that the batch is planned."""

    folder: str
    delay_s: float = 0.0

    def __call__(self, batch: list[Sample]) -> Plan:
        time.sleep(self.delay_s)
        plan = one_group_plan(batch)
        (Path(self.folder) / _mark([s.id for s in batch])).touch()
        return plan


def _mark(ids) -> str:  # noqa: ANN001
    return "planned-" + "-".join(map(str, sorted(ids)))


def test_the_next_steps_are_planned_while_a_step_runs(cm, tmp_path):
    """Each training step here ends only once the next step's plan exists, which only planning
    ahead (in the workers, while the step runs) provides: without it the loop would wait forever
    (a 120 s guard on the real clock turns that into a failure). The first plan has nothing to
    hide behind, and says so: its wait is at least the planner's sleep."""
    plan_s, steps = 0.3, 6
    with GlobalBatchSampler([1000] * (steps * 4), cm, batch_size=4, planner=MarkingPlanner(str(tmp_path), plan_s),
                            workers=2, plan_ahead=2) as s:
        batches, waits = s.batches(), []
        for b in s:
            waits.append(b.plan_wait_s)
            if b.step + 1 < steps:  # the training step
                mark, give_up = tmp_path / _mark(batches[b.step + 1].tolist()), fakeclock.REAL["monotonic"]() + 120
                while not mark.exists():
                    assert fakeclock.REAL["monotonic"]() < give_up, f"step {b.step + 1} was not planned during step {b.step}"
                    time.sleep(0.01)
    assert len(waits) == steps
    assert waits[0] >= plan_s  # a real sleep, timed on a clock no slower than the real one


def test_late_plans_are_waited_for_and_reported(cm):
    with GlobalBatchSampler([500] * 8, cm, batch_size=2, planner=SlowPlanner(0.15), workers=1,
                            plan_ahead=1) as s:
        waits = [b.plan_wait_s for b in s]
    assert len(waits) == 4 and sum(waits) > 0.5 * 4 * 0.15  # steps take no time: planning shows


def test_planner_failure_reraises_with_step_and_never_hangs(cm):
    lengths = [100 + i for i in range(20)]
    s = GlobalBatchSampler(lengths, cm, batch_size=4, planner=SlowPlanner(0.0, fail_on=13),
                           workers=1, seed=3)
    bad_step = next(k for k, b in enumerate(s.batches()) if 13 in b.tolist())
    seen = []
    with s, pytest.raises(PlanningError, match=f"step {bad_step}") as info:
        for b in s:
            seen.append(b.step)
    assert seen == list(range(bad_step))
    assert info.value.step == bad_step and info.value.epoch == 0
    assert "cannot handle sample 13" in str(info.value)


def test_hung_planner_times_out(cm):
    # The error itself shows the timeout fired: the planner would return a plan after 60 s.
    with GlobalBatchSampler([100] * 4, cm, batch_size=2, planner=SlowPlanner(60.0), workers=1,
                            plan_timeout_s=1.0) as s, pytest.raises(PlanningError, match="longer than"):
        next(iter(s))


@dataclass(frozen=True)
class DyingPlanner:
    """Plans like `one_group_plan`, but its process exits at once on a batch holding `die_on`."""

    die_on: int

    def __call__(self, batch: list[Sample]) -> Plan:
        if any(s.id == self.die_on for s in batch):
            os._exit(3)
        return one_group_plan(batch)


def test_a_planner_worker_dying_mid_epoch_names_the_step_and_the_run_resumes_there(cm):
    """The worker planning step k of epoch 0 dies (its process exits): the steps before k arrive,
    step k raises a PlanningError naming it (no hang), and a sampler restarted from the state
    before step k, with a working planner, plans the very batches from k on."""
    lengths = [100 + i for i in range(20)]
    s = GlobalBatchSampler(lengths, cm, batch_size=4, planner=DyingPlanner(die_on=13), workers=1, seed=3,
                           plan_ahead=2)
    bad_step = next(k for k, b in enumerate(s.batches()) if 13 in b.tolist())
    assert bad_step > 0  # mid-epoch: steps before it exist
    seen, state = [], None
    with s, pytest.raises(PlanningError, match=f"epoch 0 step {bad_step}") as info:
        for b in s:
            seen.append(b.step)
            state = s.state_dict_after(b)
    assert seen == list(range(bad_step))
    assert (info.value.epoch, info.value.step) == (0, bad_step) and "BrokenProcessPool" in str(info.value)
    ref = GlobalBatchSampler(lengths, cm, batch_size=4, planner=one_group_plan, workers=0, seed=3)
    restarted = GlobalBatchSampler(lengths, cm, batch_size=4, planner=one_group_plan, workers=0, seed=3)
    restarted.load_state_dict(state)
    assert [key(b) for b in restarted] == [key(b) for b in list(ref)[bad_step:]]


def test_a_step_submitted_after_the_pool_broke_leaves_the_error_to_the_step_that_broke_it(cm):
    """A worker dies planning step 0 while step 1 is being submitted: the pool refuses step 1
    (BrokenProcessPool from submit) before step 0's result is read. The error still names step 0,
    the step whose planning failed, whichever of the two the pool saw first."""
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    from dcp.data.prefetch import PlanAhead

    class BrokenPool:
        def __init__(self) -> None:
            self.submitted = 0

        def submit(self, *args: object) -> Future:
            self.submitted += 1
            if self.submitted > 1:
                raise BrokenProcessPool("a child process terminated abruptly")
            dead: Future = Future()
            dead.set_exception(BrokenProcessPool("a child process terminated abruptly"))
            return dead

        def shutdown(self, wait: bool, cancel_futures: bool) -> None:
            pass

    ahead = PlanAhead(one_group_plan, workers=1, depth=2)
    ahead._pool = BrokenPool()
    batches = [((0, k), [Sample(k, 100, attention_pairs("causal", 100))]) for k in range(3)]
    with pytest.raises(PlanningError, match="epoch 0 step 0") as info:
        list(ahead.plans(batches))
    assert (info.value.epoch, info.value.step) == (0, 0) and "BrokenProcessPool" in str(info.value)


def test_each_epoch_reshuffles_with_its_own_seed(cm):
    """Epoch e trains the permutation of seed + e, cut into consecutive batches: every sample once
    per epoch, a new order each epoch, the same order for a sampler restarted at that epoch."""
    lengths = [100 + 7 * i for i in range(40)]

    def fresh() -> GlobalBatchSampler:
        return GlobalBatchSampler(lengths, cm, batch_size=8, planner=one_group_plan, workers=0, seed=5)

    s = fresh()
    steps = take(s, 15)  # three epochs of 5 steps
    order = {e: [i for b in steps if b.epoch == e for i in b.sample_ids] for e in range(3)}
    for e in range(3):
        assert order[e] == np.random.default_rng(5 + e).permutation(40).tolist()
        assert [len(b.sample_ids) for b in steps if b.epoch == e] == [8] * 5
    assert order[0] != order[1] != order[2]
    restarted = fresh()
    restarted.set_epoch(2)
    assert [i for b in restarted for i in b.sample_ids] == order[2]


def test_unfittable_samples_refuse_to_start_or_are_skipped(cm, caplog):
    too_long = cm.max_tokens(4, cm.model.num_layers) + 1
    lengths = [1000] * 10
    lengths[3] = lengths[7] = too_long
    with pytest.raises(InfeasibleError, match="ids 3, 7") as info:
        GlobalBatchSampler(lengths, cm, batch_size=3, workers=0)
    assert info.value.sample_ids == [3, 7]
    with caplog.at_level(logging.WARNING, logger="dcp.data.sampler"):
        s = GlobalBatchSampler(lengths, cm, batch_size=3, planner=one_group_plan, workers=0,
                               skip_unfittable=True)
    assert [r.getMessage().split()[2] for r in caplog.records] == ["3", "7"]
    assert s.skipped_ids == [3, 7]
    assert sorted(i for b in s for i in b.sample_ids) == [0, 1, 2, 4, 5, 6, 8, 9]


def test_local_samples_cover_the_batch_once(cm):
    lengths = lognormal(mean=4000, max_tokens=200_000, size=64, seed=2).tokens
    s = GlobalBatchSampler(lengths, cm, batch_size=32, strategy="dcp-greedy", workers=0)
    dataset = [{"id": i, "tokens": int(t)} for i, t in enumerate(lengths)]
    for b in s:
        per_group = {}
        for rank in range(CLUSTER.num_gpus):
            group = next(iter(b.plan.groups_of_rank(rank)), None)
            ids = local_samples(b.plan, rank)
            if group is None:
                assert ids == []
                continue
            per_group.setdefault(group.ranks[0], ids)
            assert per_group[group.ranks[0]] == ids == b.local_samples(rank)  # same for the group
            items = fetch_items(dataset, ids)
            assert list(items) == ids and all(items[i]["id"] == i for i in ids)
        assert sorted(i for ids in per_group.values() for i in ids) == sorted(b.sample_ids)


def test_lengths_from_a_column_a_function_and_video_frames():
    rows = [{"tokens": 10 * (i + 1)} for i in range(12)]
    cm = _cm()
    by_col = GlobalBatchSampler("tokens", cm, dataset=rows, batch_size=5, workers=0)
    by_fn = GlobalBatchSampler(lambda i: rows[i]["tokens"], cm, dataset=rows, batch_size=5, workers=0)
    assert by_col.tokens.tolist() == by_fn.tokens.tolist() == [r["tokens"] for r in rows]
    video = CostModel(load_model("tiny-stdit"), load_hardware("cpu"), CLUSTER)
    frames = [1, 2, 3, 4]
    v = GlobalBatchSampler([16 * f for f in frames], video, frames=frames, batch_size=2, workers=0)
    for smp in v.samples(range(4)):
        assert smp.attn_pairs == attention_pairs("spatial_temporal", smp.tokens, smp.frames)
    with pytest.raises(ValueError, match="not 2 equal frames"):
        GlobalBatchSampler([17], video, frames=[2], batch_size=1, workers=0)
    with pytest.raises(ValueError, match="'tokens': no such lengths file"):
        GlobalBatchSampler("tokens", cm, batch_size=5)


def test_state_from_other_data_is_refused(cm):
    a = GlobalBatchSampler([5, 6, 7], cm, batch_size=2, planner=one_group_plan, workers=0)
    b = GlobalBatchSampler([5, 6, 8], cm, batch_size=2, planner=one_group_plan, workers=0)
    with pytest.raises(ValueError, match="different lengths"):
        b.load_state_dict(a.state_dict())


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_yields_each_ranks_items_with_the_plan(cm, num_workers):
    pytest.importorskip("torch")
    from dcp.data.loader import planned_loader

    lengths = lognormal(mean=3000, max_tokens=100_000, size=40, seed=4).tokens
    dataset = [{"id": i} for i in range(len(lengths))]
    for rank in (0, 2):
        s = GlobalBatchSampler(lengths, cm, batch_size=8, workers=0)  # one per rank, same seed
        steps = []
        for local in planned_loader(dataset, s, rank=rank, num_workers=num_workers):
            assert list(local.items) == local_samples(local.plan, rank)
            assert all(item["id"] == i for i, item in local.items.items())
            steps.append((local.step, local.plan.digest()))
            if local.step == 1:
                state = s.state_dict_after(local)  # the loader may have drawn further ahead
        assert [k for k, _ in steps] == list(range(len(s.batches(0))))
        resumed = GlobalBatchSampler(lengths, cm, batch_size=8, workers=0)
        resumed.load_state_dict(state)
        again = [(b.step, b.plan.digest()) for b in planned_loader(dataset, resumed, rank=rank)]
        assert again == steps[2:]


def test_dcp_data_imports_without_torch():
    code = "import sys, dcp.data, dcp.planner; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def _rank_main(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """One gloo rank: builds its own sampler, plans every step itself, gathers all ranks' digests."""
    import json

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        lengths = lognormal(mean=3000, max_tokens=100_000, size=48, seed=5).tokens
        with GlobalBatchSampler(lengths, _cm(), batch_size=12, workers=1, seed=11) as s:
            mine = [b.plan.digest() for b in s]
        everyone: list = [None] * world
        dist.all_gather_object(everyone, mine)
        with open(f"{out_dir}/{rank}.json", "w") as f:
            json.dump(everyone, f)
    finally:
        dist.destroy_process_group()


def test_ranks_plan_identical_steps(tmp_path):
    pytest.importorskip("torch")
    import json
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(r, 2, str(tmp_path / "init"), str(tmp_path)))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        if p.is_alive():
            p.kill()
        assert p.exitcode == 0
    gathered = json.loads((tmp_path / "0.json").read_text())
    assert len(gathered) == 2 and gathered[0] == gathered[1] and len(gathered[0]) == 4
