"""A bad plan on one rank stops all ranks (4 gloo ranks): every rank raises the same clear error,
instead of waiting in a collective until the timeout (which would raise gloo's timeout error, not
this one) or running different steps (the good step after each bad one runs on every rank)."""

from __future__ import annotations

import copy
import dataclasses

from dist_helpers import run_ranks

from dcp.costmodel import attention_pairs, load_model
from dcp.planner import Sample

WORLD = 4
PG_TIMEOUT_S = 20


def cross_rank_worker(rank: int, world: int) -> list[str]:
    """The error per bad case; then a good step must still run."""
    from dcp.executor import Executor, ExecutorError, ParallelState
    from dcp.executor.reference import manual_plan
    from dcp.models import build_model, lm_loss, mse_loss, sample_tensors

    state = ParallelState.create(timeout_s=PG_TIMEOUT_S)
    results = []

    def attempt(executor: Executor, plan, tensors, loss_fn) -> None:  # noqa: ANN001
        try:
            executor.step(plan, tensors, loss_fn)
            results.append("no error")
        except ExecutorError as e:
            results.append(str(e))

    # Text model: a plan that fails validation on rank 1 only, and a 0-token sample everywhere.
    spec = load_model("tiny-llama")
    text = Executor(build_model(spec, seed=0), state)
    batch = [Sample(i, n, attention_pairs("causal", n)) for i, n in enumerate([5, 8, 3, 6])]
    tensors = {s.id: sample_tensors(spec, s) for s in batch}
    good = manual_plan(batch, 4, 2, [(0, 2, [([0, 1], 1)]), (2, 1, [([2], 0)]), (3, 1, [([3], 2)])])

    def lm(o, b):  # noqa: ANN001, ANN202
        return lm_loss(o, b["labels"])

    broken_here = copy.deepcopy(good)
    broken_here.groups[1].microbatches[0].samples = [2, 3]  # sample 3 now runs twice
    attempt(text, broken_here if rank == 1 else good, tensors, lm)
    empty = copy.deepcopy(good)
    empty.samples[3] = Sample(3, 0, 0)
    attempt(text, empty, tensors, lm)
    text.step(good, tensors, lm)  # the ranks are still in step

    # Video model: plans that differ only in one sample's frames, and frames that do not split.
    vspec = load_model("tiny-stdit")
    video = Executor(build_model(vspec, seed=0), state)
    shape = [(1, 4), (3, 4), (2, 3), (2, 5)]  # (frames, tokens per frame)
    vbatch = [Sample(i, f * s, attention_pairs("spatial_temporal", f * s, f), f) for i, (f, s) in enumerate(shape)]
    vtensors = {s.id: sample_tensors(vspec, s) for s in vbatch}
    vgood = manual_plan(vbatch, 4, vspec.num_layers, [(0, 2, [([0, 1], 0)]), (2, 1, [([2], 1)]), (3, 1, [([3], 0)])])

    def mse(o, b):  # noqa: ANN001, ANN202
        return mse_loss(o, b["target"], b.valid)

    other_frames = copy.deepcopy(vgood)  # sample 1: 12 tokens as 3 frames of 4 or 2 frames of 6
    other_frames.samples[1] = dataclasses.replace(vbatch[1], frames=2,
                                                  attn_pairs=attention_pairs("spatial_temporal", 12, 2))
    attempt(video, other_frames if rank == 2 else vgood, vtensors, mse)
    uneven = copy.deepcopy(vgood)
    uneven.samples[2] = dataclasses.replace(vbatch[2], frames=4)  # 6 tokens are not 4 equal frames
    attempt(video, uneven, vtensors, mse)
    video.step(vgood, vtensors, mse)
    return results


EXPECTED = [
    "cannot run the step; rank 1: plan does not validate: sample 3 runs 2 times",
    "cannot run the step; every rank: plan does not validate: sample 3 has 0 tokens; a sample needs at least 1",
    "ranks disagree on the plan: rank(s) [2] hold a plan whose digest differs from rank 0's",
    "cannot run the step; every rank: plan does not validate: sample 2: 6 tokens do not split into 4 equal frames",
]


def test_a_bad_plan_on_any_rank_stops_every_rank_with_the_same_error() -> None:
    results = run_ranks(cross_rank_worker, WORLD, deadline_s=120, pg_timeout_s=PG_TIMEOUT_S)
    for case, want in enumerate(EXPECTED):
        errors = {rank_results[case] for rank_results in results}
        assert len(errors) == 1, (want, errors)  # the same error on every rank
        assert want in errors.pop(), want
