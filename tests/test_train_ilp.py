"""The training scripts' `--strategy ilp` path on 2 gloo ranks: every rank plans its batch with the
ILP (`dcp.launch.planned_batches`), the ranks' plans may differ (time-limited), so rank 0's is
broadcast (`broadcast_plan`) and every rank runs it."""

from __future__ import annotations

import copy

import torch
from dist_helpers import run_ranks


def ilp_training_worker(rank: int, world: int) -> dict:
    """Two steps of examples/train_reference.py's loop with `--strategy ilp`, where rank 1 holds
    another plan of the same batch (dcp-greedy's: a time-limited ILP can give one too)."""
    from dcp.costmodel import load_model
    from dcp.executor import Executor, ExecutorError, ParallelState, broadcast_plan, default_forward
    from dcp.executor.reference import reference_step, relative_diff, trainable
    from dcp.launch import RunOptions, planned_batches
    from dcp.models import build_model, lm_loss, reference_attention, sample_tensors
    from dcp.planner import GreedyOptions, solve

    spec = load_model("tiny-llama")
    state = ParallelState.create(timeout_s=30)
    options = RunOptions(strategy="ilp", global_batch=8, steps=2, memory_gb=0.05)
    model = build_model(spec, dtype=torch.float64, seed=0)
    ref = copy.deepcopy(model)
    for m in ref.modules():
        if hasattr(m, "attn_fn"):
            m.attn_fn = reference_attention
    executor = Executor(model, state)

    def loss_fn(o, b):  # noqa: ANN001, ANN202
        return lm_loss(o, b["labels"])

    out = {"strategies": [], "refused": [], "same": [], "diff": []}
    with planned_batches(spec, state, options) as sampler:
        for step, planned in zip(range(options.steps), sampler, strict=False):
            mine = planned.plan
            if rank == 1:
                cm = sampler.cost_model
                mine = solve(mine.samples, cm.cluster, cm, GreedyOptions())
            out["strategies"].append(mine.strategy)
            tensors = {i: sample_tensors(spec, s, seed=step, dtype=torch.float64) for i, s in mine.sample_map().items()}
            try:
                executor.step(mine, tensors, loss_fn)
                out["refused"].append("")
            except ExecutorError as e:
                out["refused"].append(str(e))
            plan = broadcast_plan(mine, state)
            out["same"].append(plan.digest() == mine.digest())  # rank 1 now runs rank 0's plan
            executor.step(plan, tensors, loss_fn)
            grads = executor.full_grads()  # a collective: every rank joins
            diff = 0.0
            if rank == 0:
                reference_step(ref, plan.samples, tensors, loss_fn, default_forward)
                diff = relative_diff(grads, [p.grad for p in trainable(ref)])
            out["diff"].append(diff)
    return out


def test_ranks_with_different_plans_run_rank_0s_ilp_plan() -> None:
    results = run_ranks(ilp_training_worker, 2, deadline_s=180)
    zero, one = results
    assert zero["strategies"] == ["ilp", "ilp"] and one["strategies"] == ["dcp-greedy", "dcp-greedy"]
    for rank in results:  # every rank refuses the plans that differ, then runs rank 0's
        assert all("ranks disagree on the plan: rank(s) [1]" in e for e in rank["refused"])
    assert zero["same"] == [True, True] and one["same"] == [False, False]
    assert max(zero["diff"]) <= 1e-10
