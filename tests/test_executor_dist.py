"""Multi-process gloo tests on CPU (4 and 8 ranks): any plan gives single-process gradients; bad
inputs and dead ranks end in clear errors, never hangs."""

from __future__ import annotations

import copy
import dataclasses
import os
import random
from collections.abc import Sequence

import torch
from dist_helpers import (
    Case,
    check_grads,
    llama_spec,
    random_case,
    random_groups,
    run_ranks,
    run_ranks_raw,
)

from dcp.costmodel import ModelSpec, attention_pairs, load_model
from dcp.planner import Sample

# (first rank, SP size) per group; every step of a test draws a different one. Together they
# mix SP sizes 1, 2 and 4 (4 uses all four ranks) and leave a rank idle in one.
LAYOUTS = [
    [(0, 2), (2, 1), (3, 1)],
    [(0, 4)],
    [(0, 1), (1, 1), (2, 2)],
    [(0, 2), (2, 1)],
    [(0, 2), (2, 2)],
]
# SP 4, 2, 1 and 1 in one step on 8 ranks (two nodes of 4), with 3, 2, 1 and 2 micro-batches.
EIGHT_RANKS = [(0, 4), (4, 2), (6, 1), (7, 1)]
EIGHT_RANKS_MICROBATCHES = [3, 2, 1, 2]
TOLERANCE = 1e-5
# Multi-phase plans: (first rank, SP size[, ring degree]) per group, per phase. On 4 ranks: SP 4
# then mixed sizes; three phases that re-partition every rank each time; ranks idle in some
# phases. On 8 ranks (two nodes of 4): three phases of SP 4, 2 and 1 in changing places. Some
# phases hold Ulysses x ring groups (2 x 2, 1 x 2, 1 x 4) beside Ulysses-only ones.
PHASED_FOUR = [
    [[(0, 4, 2)], [(0, 2, 2), (2, 1), (3, 1)]],
    [[(0, 2), (2, 2)], [(0, 1), (1, 1), (2, 2)], [(0, 4)]],
    [[(0, 1), (1, 1), (2, 2)], [(0, 4)]],
    [[(0, 2), (2, 1)], [(0, 1), (2, 2)], [(1, 1), (2, 1), (3, 1)]],
    [[(0, 2), (2, 2)], [(0, 1)]],  # rank 1 ends in a group rank 0 goes on from; ranks 2-3 end early
]
PHASED_EIGHT = [
    [[(0, 4), (4, 4)], [(0, 2), (2, 2), (4, 1), (5, 1), (6, 2)], [(0, 4), (4, 2), (6, 1), (7, 1)]],
    [[(0, 1), (1, 1), (2, 2), (4, 4, 4)], [(0, 4), (4, 2, 2), (6, 2)]],
]
PHASED_TOLERANCE = 1e-12

def random_phased_case(spec: ModelSpec, seed: int, phases: Sequence[Sequence[tuple[int, int]]],
                       num_gpus: int = 4, *, gpus_per_node: int | None = None) -> Case:
    """A random multi-phase plan: each phase a layout of `phases`, the batch's samples spread
    over the phases at random (at least one per group), 1-3 micro-batches per group, random
    checkpointed layers; the phases' micro-batch counts differ (uneven accumulation)."""
    from dcp.executor.reference import manual_plan

    rng = random.Random(1000 + seed)
    least = sum(len(layout) for layout in phases)
    batch = [Sample(100 * seed + i, t, attention_pairs(spec.attention, t))
             for i, t in enumerate(rng.randint(1, 23) for _ in range(rng.randint(least + 2, least + 8)))]
    ids = [s.id for s in batch]
    rng.shuffle(ids)
    per_phase = [ids[sum(map(len, phases[:k])):sum(map(len, phases[:k + 1]))] for k in range(len(phases))]
    for i in ids[least:]:
        per_phase[rng.randrange(len(phases))].append(i)
    groups = [(*g[:3], g[3] if len(g) > 3 else 1, k) for k, (layout, mine) in enumerate(zip(phases, per_phase, strict=True))
              for g in random_groups(rng, mine, layout, spec.num_layers)]
    plan = manual_plan(batch, num_gpus, spec.num_layers, groups, gpus_per_node=gpus_per_node)
    return plan, batch


def grads_worker(rank: int, world: int, cases: list[tuple[ModelSpec, list[Case]]],
                 gpus_per_node: int | None = None) -> list[tuple[str, int, float, float]]:
    """Run each spec's cases, one per step; rank 0 compares every step with single-process training."""
    from dcp.executor import Executor, ParallelState, default_forward
    from dcp.executor.reference import reference_step, relative_diff, trainable
    from dcp.models import build_model, lm_loss, mse_loss, reference_attention, sample_tensors

    state = ParallelState.create(gpus_per_node=gpus_per_node, timeout_s=30)
    out = []
    for spec, spec_cases in cases:
        model = build_model(spec, dtype=torch.float64, seed=0)
        ref = copy.deepcopy(model)  # the plain attention path, one sample at a time, one process
        for m in ref.modules():
            if hasattr(m, "attn_fn"):
                m.attn_fn = reference_attention
        executor = Executor(model, state, gather_stats=True)
        if spec.attention == "spatial_temporal":
            def loss_fn(o, b):  # noqa: ANN001, ANN202
                return mse_loss(o, b["target"], b.valid)
        else:
            def loss_fn(o, b):  # noqa: ANN001, ANN202
                return lm_loss(o, b["labels"])
        for step, (plan, batch) in enumerate(spec_cases):
            tensors = {s.id: sample_tensors(spec, s, seed=step, dtype=torch.float64) for s in batch}
            stats = executor.step(plan, tensors, loss_fn)
            assert len(stats.microbatches) == sum(len(g.microbatches) for g in plan.groups)
            grads = executor.full_grads()  # a collective: every rank joins
            diff = 0.0
            if rank == 0:
                ref_loss = reference_step(ref, batch, tensors, loss_fn, default_forward)
                diff = relative_diff(grads, [p.grad for p in trainable(ref)])
                assert abs(stats.loss - ref_loss) <= TOLERANCE * abs(ref_loss), (stats.loss, ref_loss)
            out.append((spec.name + ("+cross" if spec.cross_attention else ""), step, diff, stats.loss))
    return out


def four_rank_cases(spec: ModelSpec, steps: int = 5) -> tuple[ModelSpec, list[Case]]:
    return spec, [random_case(spec, step, LAYOUTS[step % len(LAYOUTS)]) for step in range(steps)]


def test_llama_gradients_equal_single_process_for_random_plans() -> None:
    check_grads(run_ranks(grads_worker, 4, [four_rank_cases(llama_spec())], deadline_s=150), TOLERANCE)


def test_stdit_gradients_equal_single_process_for_random_plans() -> None:
    stdit = load_model("tiny-stdit")
    cases = [four_rank_cases(stdit), four_rank_cases(dataclasses.replace(stdit, cross_attention=True))]
    check_grads(run_ranks(grads_worker, 4, cases, deadline_s=150), TOLERANCE)


def test_sp_4_2_and_1_in_one_step_on_8_ranks_equal_single_process() -> None:
    """The issue's setting in a single step: SP 4, 2, 1 and 1 side by side, both reference models."""
    cases = []
    for spec in [llama_spec(), load_model("tiny-stdit")]:
        plan, batch = random_case(spec, 8, EIGHT_RANKS, 8, microbatches=EIGHT_RANKS_MICROBATCHES,
                                  gpus_per_node=4)
        # What the case is meant to cover, checked rather than hoped for.
        assert sorted(g.sp for g in plan.groups) == [1, 1, 2, 4]
        assert [len(g.microbatches) for g in plan.groups] == EIGHT_RANKS_MICROBATCHES
        mbs = [(g.sp, mb) for g in plan.groups for mb in g.microbatches]
        tokens = plan.sample_map()
        assert len({mb.ckpt_layers for _, mb in mbs}) > 1, "checkpointing is not mixed"
        assert any(len(mb.samples) > 1 for _, mb in mbs), "no packed micro-batch"
        assert {sp for sp, mb in mbs if sum(tokens[i].tokens for i in mb.samples) % sp} == {2, 4}, \
            "SP 2 and SP 4 should both need padding"
        cases.append((spec, [(plan, batch)]))
    check_grads(run_ranks(grads_worker, 8, cases, 4, deadline_s=120), TOLERANCE)


def test_multi_phase_plans_give_single_process_gradients_on_4_ranks() -> None:
    """Random multi-phase plans (2-3 phases, mixed SP sizes, uneven micro-batches): the ranks
    change groups between phases, gradients accumulate across them, one all-reduce at the end."""
    spec = llama_spec()
    cases = [random_phased_case(spec, step, PHASED_FOUR[step % len(PHASED_FOUR)]) for step in range(6)]
    for plan, _ in cases:  # what the cases cover, checked
        assert 2 <= plan.num_phases <= 3
        assert len({len(g.microbatches) for g in plan.groups}) > 1
    assert {p.num_phases for p, _ in cases} == {2, 3}
    assert {g.ring for p, _ in cases for g in p.groups} == {1, 2}
    # Both ways of ending a step: reductions under a group's last backward (every member ends
    # there), and an empty pass after it (a member goes on to a later phase).
    assert {closes for p, _ in cases for closes in p.closing_groups().values()} == {True, False}
    assert any(p.groups[gi].phase < p.num_phases - 1 for p, _ in cases for gi, c in p.closing_groups().items() if c)
    check_grads(run_ranks(grads_worker, 4, [(spec, cases)], deadline_s=150), PHASED_TOLERANCE)


def test_multi_phase_plans_give_single_process_gradients_on_8_ranks() -> None:
    spec = llama_spec()
    cases = [random_phased_case(spec, step, PHASED_EIGHT[step % len(PHASED_EIGHT)], 8, gpus_per_node=4)
             for step in range(2)]
    assert [p.num_phases for p, _ in cases] == [3, 2]
    assert {g.ring for p, _ in cases for g in p.groups} == {1, 2, 4}
    check_grads(run_ranks(grads_worker, 8, [(spec, cases)], 4, deadline_s=150), PHASED_TOLERANCE)


def bad_inputs_worker(rank: int, world: int) -> list[str]:
    """Each bad step must raise the same clear error on every rank; the last, good step must run."""
    from dcp.executor import Executor, ExecutorError, ParallelState, broadcast_plan
    from dcp.executor.reference import manual_plan
    from dcp.models import build_model, lm_loss, sample_tensors

    state = ParallelState.create(timeout_s=10)
    # 2 heads: Ulysses over 4 ranks is impossible (a ring could take the rest: 2 x 2 would run)
    spec = dataclasses.replace(load_model("tiny-llama"), heads=2, kv_heads=1)
    executor = Executor(build_model(spec, seed=0), state)
    batch = [Sample(i, n, attention_pairs("causal", n)) for i, n in enumerate([5, 8, 3, 6])]
    tensors = {s.id: sample_tensors(spec, s) for s in batch}

    def loss_fn(o, b):  # noqa: ANN001, ANN202
        return lm_loss(o, b["labels"])

    good = manual_plan(batch, 4, 2, [(0, 2, [([0, 1], 1)]), (2, 1, [([2], 0)]), (3, 1, [([3], 2)])])
    sp4 = manual_plan(batch, 4, 2, [(0, 4, [([0, 1, 2, 3], 0)])])
    two_gpus = manual_plan(batch, 2, 2, [(0, 2, [([0, 1, 2, 3], 0)])])
    invalid = copy.deepcopy(good)
    invalid.groups[1].microbatches[0].samples = [2, 3]
    other = copy.deepcopy(good)
    other.groups[0].microbatches[0].ckpt_layers = 0
    mine = {s: t for s, t in tensors.items() if not (rank == 2 and s == 2)}
    cases = [(sp4, tensors), (two_gpus, tensors), (invalid, tensors), (good, mine),
             (other if rank == 1 else good, tensors)]
    errors = []
    for plan, data in cases:
        try:
            executor.step(plan, data, loss_fn)
            errors.append("no error")
        except ExecutorError as e:
            errors.append(str(e))
    executor.step(good, tensors, loss_fn)
    shared = broadcast_plan(good if rank == 0 else None, state)  # rank 0 plans, everyone follows
    assert shared.digest() == good.digest()
    return errors


def test_bad_inputs_give_clear_errors_on_every_rank() -> None:
    results = run_ranks(bad_inputs_worker, 4, deadline_s=90, pg_timeout_s=10)
    expected = ["SP size 4 as Ulysses 4 x ring 1: Ulysses degree 4 does not divide the model's 2 heads",
                "plan is for 2 GPUs but this job has 4 ranks",
                "plan does not validate: sample 3 runs 2 times",
                "rank 2: sample 2 is in the plan but missing from `samples`",
                "ranks disagree on the plan: rank(s) [1]"]
    for rank, errors in enumerate(results):
        for want, got in zip(expected, errors, strict=True):
            assert want in got, (rank, want, got)


def dying_worker(rank: int, world: int) -> None:
    """Rank 1 dies inside an SP micro-batch; rank 0 must fail rather than wait forever."""
    from dcp.executor import Executor, ParallelState
    from dcp.executor.reference import manual_plan
    from dcp.models import build_model, lm_loss, sample_tensors

    state = ParallelState.create(timeout_s=10)
    spec = load_model("tiny-llama")
    model = build_model(spec, seed=0)
    executor = Executor(model, state)
    if rank == 1:
        model.layers[1].register_forward_pre_hook(lambda *_: os._exit(7))
    batch = [Sample(0, 9, attention_pairs("causal", 9))]
    plan = manual_plan(batch, 2, 2, [(0, 2, [([0], 0)])])
    executor.step(plan, {0: sample_tensors(spec, batch[0])}, lambda o, b: lm_loss(o, b["labels"]))


def test_a_dead_rank_ends_the_job_instead_of_hanging() -> None:
    results = run_ranks_raw(dying_worker, 2, deadline_s=60, pg_timeout_s=10)
    assert results[1].error == "died (exit code 7)"
    assert not results[0].ok  # an error from the collective (peer gone or timed out), not a hang
