"""Plan invariants: validate() catches each broken one; JSON round-trip; a stable digest."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
from conftest import cost_model, make_batch

from dcp.planner import Group, MicroBatch, Plan, PlanError
from dcp.planner.baselines import solve_packed
from dcp.planner.greedy import solve_greedy
from dcp.planner.sample import Sample


def tiny_plan() -> Plan:
    """Two groups on 4 GPUs (2 per node): SP 2 at ranks 0-1, SP 1 at rank 2; rank 3 idle."""
    samples = [Sample(0, 10, 55), Sample(1, 20, 210), Sample(2, 5, 15)]
    groups = [Group([0, 1], 2, [MicroBatch([1], 0, 1.0, 10.0)]),
              Group([2], 1, [MicroBatch([0, 2], 1, 0.5, 20.0)])]
    return Plan(strategy="hand", num_gpus=4, gpus_per_node=2, memory_limit_bytes=100.0, num_layers=2,
                samples=samples, groups=groups, step_time_s=1.25, lower_bound_s=1.0, grad_sync_s=0.25)


def test_tiny_plan_is_valid() -> None:
    plan = tiny_plan().validate()
    assert plan.busy_s() == 1.0
    assert plan.groups_of_rank(2) == [plan.groups[1]] and plan.groups_of_rank(3) == []


def _set(path: str, value: object) -> Callable[[Plan], None]:
    def mutate(plan: Plan) -> None:
        *head, last = path.split(".")
        target: object = plan
        for part in head:
            target = target[int(part)] if part.isdigit() else getattr(target, part)
        if last.isdigit():
            target[int(last)] = value  # type: ignore[index]
        else:
            setattr(target, last, value)
    return mutate


BROKEN = [
    ("duplicate sample in batch", lambda p: p.samples.append(Sample(0, 10, 55)), "lists sample 0 more than once"),
    ("sample missing", _set("groups.1.microbatches.0.samples", [0]), "sample 2 is in no micro-batch"),
    ("sample twice", _set("groups.1.microbatches.0.samples", [0, 2, 1]), "sample 1 runs 2 times"),
    ("unknown sample", _set("groups.1.microbatches.0.samples", [0, 2, 9]), "runs sample 9, which is not"),
    ("SP not a power of two", lambda p: setattr(p.groups[0], "sp", 3), "SP size 3 is not a power of two"),
    ("ranks not consecutive", _set("groups.0.ranks", [0, 3]), "are not 2 consecutive ranks"),
    ("misaligned", lambda p: (setattr(p.groups[0], "ranks", [1, 2]), setattr(p.groups[1], "ranks", [0])),
     "do not start at a multiple of 2"),
    ("outside the cluster", _set("groups.1.ranks", [4]), "outside the 4 GPUs"),
    ("crosses a node", lambda p: (setattr(p, "gpus_per_node", 3), setattr(p.groups[0], "ranks", [2, 3]),
                                  setattr(p.groups[1], "ranks", [0])), "cross a node boundary"),
    ("overlapping groups", _set("groups.1.ranks", [1]), "rank 1 is in two groups"),
    ("empty micro-batch", lambda p: p.groups[0].microbatches.append(MicroBatch([], 0, 0.0, 0.0)),
     "micro-batch 1 is empty"),
    ("ckpt out of range", _set("groups.0.microbatches.0.ckpt_layers", 3), "3 checkpointed layers outside 0..2"),
    ("out of memory", _set("groups.0.microbatches.0.memory_bytes", 101.0), "more than the"),
    ("step time wrong", _set("step_time_s", 2.0), "step_time_s 2.0 != slowest group"),
    ("below the bound", _set("lower_bound_s", 1.5), "below the lower bound"),
    ("gap not a fraction", _set("gap", 1.5), "gap 1.5 is not a fraction"),
    ("no GPUs", _set("num_gpus", 0), "plan cluster is invalid"),
    ("a 0-token sample", _set("samples.2", Sample(2, 0, 0)), "sample 2 has 0 tokens"),
    ("frames that do not split the tokens", _set("samples.1", Sample(1, 20, 210, 3)),
     "sample 1: 20 tokens do not split into 3 equal frames"),
    ("no layers", _set("num_layers", 0), "a model of 0 layers"),
]


@pytest.mark.parametrize(("what", "mutate", "message"), BROKEN, ids=[b[0] for b in BROKEN])
def test_validate_catches(what: str, mutate: Callable[[Plan], None], message: str) -> None:
    plan = tiny_plan()
    mutate(plan)
    with pytest.raises(PlanError, match=message):
        plan.validate()


def test_json_round_trip(wiki_batches) -> None:
    cm = cost_model()
    for plan in (tiny_plan(), solve_greedy(wiki_batches[0], cm)):
        back = Plan.from_json(plan.to_json(indent=1))
        assert back == plan
        assert back.digest() == plan.digest()
        back.validate()


@pytest.mark.parametrize(("text", "message"), [
    ("{oops", "not valid JSON"),
    ("[]", "must be a JSON object"),
    ('{"schema_version": 7}', "schema_version 7"),
    ('{"schema_version": 1, "strategy": "x"}', "malformed plan"),
])
def test_from_json_rejects(text: str, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        Plan.from_json(text)


def test_digest_is_stable_and_ignores_timings() -> None:
    plan = tiny_plan()
    # ratchet: tiny_plan()'s digest as Plan.digest() gave it when written (`pytest
    # tests/test_plan.py::test_digest_is_stable_and_ignores_timings`): ranks must agree on it across
    # machines and versions; change it knowingly.
    assert plan.digest() == GOLDEN_DIGEST
    timed = copy.deepcopy(plan)
    timed.groups[0].microbatches[0].time_s = 7.0
    timed.solve_time_s = 3.0
    assert timed.digest() == plan.digest()
    ckpt = copy.deepcopy(plan)
    ckpt.groups[1].microbatches[0].ckpt_layers = 2
    assert ckpt.digest() != plan.digest()
    moved = copy.deepcopy(plan)
    moved.groups[1].microbatches[0].samples = [2, 0]
    assert moved.digest() != plan.digest()
    # Frames shape the attention the ranks run: plans that differ only there must not agree.
    framed = copy.deepcopy(plan)
    framed.samples[1] = Sample(1, 20, 210, 2)
    assert framed.digest() != plan.digest()
    deeper = copy.deepcopy(plan)
    deeper.num_layers = 3
    assert deeper.digest() != plan.digest()


GOLDEN_DIGEST = "e6b0d8d53b04f0dc7102972cff2f86f83c7250baa55b29cc7ef270e6a19d26f2"


def test_same_inputs_same_plan() -> None:
    cm = cost_model(gpus=8)
    batch = make_batch([100, 5000, 70000, 300, 300, 12000, 1, 45000])
    assert solve_packed(batch, cm).digest() == solve_packed(list(batch), cm).digest()
    assert solve_greedy(batch, cm).digest() == solve_greedy(list(batch), cm).digest()


def test_to_frame(wiki_batches) -> None:
    plan = solve_greedy(wiki_batches[0], cost_model())
    frame = plan.to_frame()
    assert len(frame) == sum(len(g.microbatches) for g in plan.groups)
    assert frame["samples"].sum() == len(plan.samples)
    assert frame["tokens"].sum() == sum(s.tokens for s in plan.samples)
    assert {"group", "first_rank", "sp", "ckpt_layers", "time_s", "memory_gb"} <= set(frame.columns)
