"""The precision recipe as the executor runs it on FSDP2 (MixedPrecisionPolicy): fp32 gradients,
fp32 master weights as the sharded parameters, and the checks that keep model, executor and cost
model on one recipe."""

from __future__ import annotations

import copy

import pytest
import torch
from dist_helpers import run_ranks

from dcp.costmodel import load_model
from dcp.executor import Executor, ParallelState, executor_optimizer
from dcp.executor.reference import manual_plan
from dcp.launch import RunOptions
from dcp.models import build_model, lm_loss, sample_tensors
from dcp.models.precision import param_dtype, recipe_for_model
from dcp.planner import Sample

SPEC = load_model("tiny-llama")


def batch(world: int, seed: int) -> tuple[list[Sample], dict]:
    gen = torch.Generator().manual_seed(seed)
    samples = [Sample(i, int(torch.randint(8, 40, (1,), generator=gen)), 0) for i in range(2 * world)]
    return samples, {s.id: sample_tensors(SPEC, s, seed=seed) for s in samples}


def loss_fn(out, b):  # noqa: ANN001, ANN201
    return lm_loss(out, b["labels"])


def train(rank: int, world: int, recipe: str, zero_stage: int, steps: int = 3) -> list[float]:
    """A few steps of the tiny Llama; returns the parameters (flat, as fp32) every rank ends with."""
    state = ParallelState.create(timeout_s=30)
    model = build_model(SPEC, seed=0, dtype=param_dtype(recipe))
    executor = Executor(model, state, recipe=recipe, zero_stage=zero_stage)
    # SGD: linear in the gradients, so round-off in them stays round-off (Adam's normalization
    # would blow a 1e-9 difference in a tiny gradient up to a step of lr).
    optimizer = executor_optimizer(executor, optimizer_class=torch.optim.SGD, lr=0.5)
    for step in range(steps):
        samples, tensors = batch(2, step)  # the same global batch of 4 samples, whatever the world
        groups = [(0, 1, [([0, 1, 2, 3], 1)])] if world == 1 else [(0, 1, [([0, 1], 1)]), (1, 1, [([2, 3], 0)])]
        executor.step(manual_plan(samples, world, SPEC.num_layers, groups), tensors, loss_fn)
        optimizer.step()
        optimizer.zero_grad()
    return torch.cat([p.float().reshape(-1) for p in executor.full_params()]).tolist()


@pytest.mark.parametrize("recipe", ["bf16", "fp32"])
def test_zero1_over_two_ranks_equals_one_rank(recipe: str) -> None:
    ranks = run_ranks(train, 2, recipe, 1)
    alone = torch.tensor(run_ranks(train, 1, recipe, 0)[0])
    assert ranks[0] == ranks[1]  # every rank ends with the same parameters (each gathered its slices)
    # Same global batch: gradients agree to round-off, and bf16 parameters to their rounding.
    tol = 1e-2 if recipe == "bf16" else 1e-6
    assert torch.allclose(torch.tensor(ranks[0]), alone, rtol=tol, atol=tol)


def test_adamw_over_dtensors_steps_as_adamw_on_the_tensors(state: ParallelState) -> None:
    model = build_model(SPEC, seed=0)
    plain = copy.deepcopy(model)
    executor = Executor(model, state, recipe="fp32", zero_stage=0)
    optimizer = executor_optimizer(executor, lr=1e-2, weight_decay=0.1)
    reference = torch.optim.AdamW(plain.parameters(), lr=1e-2, weight_decay=0.1)
    samples, tensors = batch(1, 0)
    executor.step(manual_plan(samples, 1, SPEC.num_layers, [(0, 1, [([0, 1], 0)])]), tensors, loss_fn)
    for p, g in zip(plain.parameters(), executor.full_grads(), strict=True):
        p.grad = g
    optimizer.step()
    reference.step()
    for p, q in zip(plain.parameters(), executor.full_params(), strict=True):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-7)


def test_bf16_parameters_accumulate_fp32_gradients(state: ParallelState) -> None:
    model = build_model(SPEC, seed=0, dtype=torch.bfloat16)
    wide = build_model(SPEC, seed=0, dtype=torch.float64)
    executor = Executor(model, state)  # bf16 parameters: the bf16 recipe
    assert executor.recipe.name == "bf16"
    # The sharded parameters are the fp32 master weights (the bf16 values, widened exactly);
    # FSDP2 gathers them in bf16 for the forward.
    assert all(p.dtype == torch.float32 for p in model.parameters())
    samples, tensors = batch(1, 1)
    three = manual_plan(samples, 1, SPEC.num_layers, [(0, 1, [([0], 0), ([1], 1)])])  # two micro-batches
    executor.step(three, tensors, loss_fn)
    ref = Executor(wide, state)
    ref.step(three, {i: dict(t) for i, t in tensors.items()}, loss_fn)
    got, want = torch.cat([g.double().reshape(-1) for g in executor.full_grads()]), \
        torch.cat([g.reshape(-1) for g in ref.full_grads()])
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())  # accumulated and reduced in fp32
    assert torch.linalg.norm(got - want) / torch.linalg.norm(want) < 0.02  # bf16 forward, fp32 sums


def test_recipe_mismatches_are_clear_errors(state: ParallelState) -> None:
    model = build_model(SPEC, seed=0)
    with pytest.raises(ValueError, match=r"recipe 'bf16' holds parameters in bf16, but .*torch.float32"):
        Executor(model, state, recipe="bf16")
    assert recipe_for_model(model, "cuda").name == "autocast-bf16"
    assert recipe_for_model(model, "cpu").name == "fp32"
    with pytest.raises(ValueError, match="ZeRO stage must be 0, 1, 2 or 3, got 4"):
        Executor(model, state, recipe="fp32", zero_stage=4)
    with pytest.raises(ValueError, match="optimizer for ZeRO stage 2, but the executor runs stage 1"):
        executor_optimizer(Executor(model, state, recipe="fp32"), zero_stage=2)
    with pytest.raises(ValueError, match="unknown precision recipe 'fp8'"):
        RunOptions(precision="fp8")
    assert RunOptions().recipe(cuda=True).name == "autocast-bf16"
    assert RunOptions(precision="bf16", check_grads=True).recipe(cuda=True).name == "fp32"
