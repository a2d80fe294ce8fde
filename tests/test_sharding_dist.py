"""ZeRO stages 0-3 on FSDP2, 4 and 8 gloo ranks, with and without HSDP: random plans whose groups
run 1-4 micro-batches, mixed SP sizes (Ulysses, and Ulysses x ring), idle ranks and checkpointing
give single-process float64 gradients, and single-process parameters after an AdamW step, within
1e-12; a plan or model a stage cannot run fails on every rank."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from dist_helpers import Case, llama_spec, random_case, run_ranks

from dcp.costmodel import ModelSpec, attention_pairs
from dcp.planner import Sample

TOLERANCE = 1e-12
"""Gradients and parameters after every AdamW step, relative to single-process training (fp64)."""
ADAMW = {"lr": 1e-2, "weight_decay": 0.1, "eps": 1e-2}
"""lr = eps, so AdamW cannot amplify the gradients' round-off past 1e-12. Its update is
u = lr * m / (sqrt(v) + eps); at the first step m = g and v = g^2, so u = lr * g / (|g| + eps) and
|du/dg| = lr * eps / (|g| + eps)^2 <= lr / eps, the bound reached at g = 0. A gradient entry that
differs from single-process training by round-off d (packing, SP and reduce-scatter sum in
another order: seen below 1.3e-15 relative) moves its parameter by up to lr / eps * d per step.
At lr = 1e-2, eps = 1e-6 (1e4) that is 1e-11 after a step or two, for reasons that have nothing
to do with sharding, and the next gradients are taken at parameters that far apart (measured at
stage 3 on 4 ranks: parameters 1.3e-11, step-3 gradients 2.1e-12). At lr / eps = 1 three steps
stay within 3 * d, about 4e-15: measured, parameters at most 4.1e-16 and gradients 1.3e-15 at
every step, stage and HSDP mesh (docs/design.md)."""
# (first rank, SP size[, ring degree]) per group on 4 ranks; with one idle rank in the first, a
# ring of 2 (1 x 2) in the second; on 8 ranks a 2 x 2 Ulysses x ring group in the first.
LAYOUTS_4 = [[(0, 2), (2, 1)], [(0, 1), (1, 1), (2, 2, 2)], [(0, 2), (2, 1), (3, 1)]]
LAYOUTS_8 = [[(0, 4, 2), (4, 2), (6, 1), (7, 1)], [(0, 2), (2, 2), (4, 1), (5, 1), (6, 2)]]


def cases(spec: ModelSpec, layouts: list[list[tuple[int, ...]]], world: int, seed: int) -> list[Case]:
    """One random plan per layout, each group with 1-4 micro-batches (different counts per plan)."""
    rng = random.Random(seed)
    out = []
    for i, layout in enumerate(layouts):
        counts = [rng.randint(1, 4) for _ in layout]
        counts[0], counts[-1] = 1, 4  # always uneven: one group runs 1, another 4
        out.append(random_case(spec, 10 * seed + i, layout, world, microbatches=counts, gpus_per_node=4))
    return out


def compare_steps(executor: object, reference: torch.nn.Module | None, steps: list[Case], spec: ModelSpec,
                  adamw: dict | None = None) -> list[tuple[float, float, float]]:
    """AdamW on the executor and on `reference` (None: this rank keeps none), one `compare_step`
    per case (fp64 samples of `spec` seeded by the step): (grad diff, param diff, loss) per step."""
    from dcp.executor import executor_optimizer
    from dcp.executor.reference import compare_step
    from dcp.models import lm_loss, sample_tensors

    adamw = adamw or ADAMW
    executor_optimizer(executor, **adamw)
    ref_opt = torch.optim.AdamW(reference.parameters(), **adamw) if reference is not None else None

    def loss_fn(o, b):  # noqa: ANN001, ANN202
        return lm_loss(o, b["labels"])

    out = []
    for step, (plan, batch) in enumerate(steps):
        tensors = {s.id: sample_tensors(spec, s, seed=step, dtype=torch.float64) for s in batch}
        out.append(compare_step(executor, reference, ref_opt, plan, batch, tensors, loss_fn))
    return out


def sharded_worker(rank: int, world: int, stage: int, steps: list[Case], shard_group: int | None = None,
                   adamw: dict | None = None) -> list[tuple[float, float, list[int]]]:
    """Train `steps` at `stage` with AdamW; rank 0 compares gradients and parameters after every
    step with single-process training (fp64). Returns (grad diff, param diff, slots run) per step."""
    from dcp.executor import Executor, ParallelState
    from dcp.models import build_model

    state = ParallelState.create(gpus_per_node=4, timeout_s=30)
    model = build_model(llama_spec(), dtype=torch.float64, seed=0)
    ref = copy.deepcopy(model) if rank == 0 else None
    executor = Executor(model, state, zero_stage=stage, shard_group=shard_group)
    diffs = compare_steps(executor, ref, steps, llama_spec(), adamw)
    return [(g, p, [len(grp.microbatches) for grp in plan.groups]) for (g, p, _), (plan, _) in zip(diffs, steps, strict=True)]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_sharded_training_equals_single_process_on_4_ranks(stage: int) -> None:
    steps = cases(llama_spec(), LAYOUTS_4, 4, seed=stage)
    results = run_ranks(sharded_worker, 4, stage, steps, deadline_s=120)
    print(f"stage {stage}, 4 ranks: grads {[f'{r[0]:.1e}' for r in results[0]]}, params {[f'{r[1]:.1e}' for r in results[0]]}")
    for grad_diff, param_diff, counts in results[0]:
        assert len(set(counts)) > 1, counts  # groups ran different numbers of micro-batches
        assert max(grad_diff, param_diff) <= TOLERANCE, (stage, grad_diff, param_diff)


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_sharded_training_equals_single_process_on_8_ranks(stage: int) -> None:
    steps = cases(llama_spec(), LAYOUTS_8, 8, seed=10 + stage)
    results = run_ranks(sharded_worker, 8, stage, steps, deadline_s=150)
    print(f"stage {stage}, 8 ranks: grads {[f'{r[0]:.1e}' for r in results[0]]}, params {[f'{r[1]:.1e}' for r in results[0]]}")
    for grad_diff, param_diff, _ in results[0]:
        assert max(grad_diff, param_diff) <= TOLERANCE, (stage, grad_diff, param_diff)


@pytest.mark.parametrize(("world", "shard_group", "stage"), [(4, 2, 2), (4, 2, 3), (8, 4, 2)])
def test_hsdp_training_equals_single_process(world: int, shard_group: int, stage: int) -> None:
    """HSDP: shard over `shard_group` consecutive ranks, replicate across (2 x 2 and 2 x 4)."""
    layouts = LAYOUTS_4 if world == 4 else LAYOUTS_8
    steps = cases(llama_spec(), layouts[:2], world, seed=20 + world + stage)
    results = run_ranks(sharded_worker, world, stage, steps, shard_group, deadline_s=150)
    print(f"HSDP {world // shard_group} x {shard_group} stage {stage}: grads {[f'{r[0]:.1e}' for r in results[0]]}, "
          f"params {[f'{r[1]:.1e}' for r in results[0]]}")
    for grad_diff, param_diff, _ in results[0]:
        assert max(grad_diff, param_diff) <= TOLERANCE, (world, shard_group, grad_diff, param_diff)


def bad_inputs_worker(rank: int, world: int) -> list[str]:
    """Stage 3: a plan priced for stage 1 and layers that are not the model's fail on every rank
    with one error, before any collective; the next good step still runs (nothing left half-issued)."""
    from dcp.executor import Executor, ExecutorError, ParallelState
    from dcp.executor.reference import manual_plan
    from dcp.models import build_model, lm_loss, sample_tensors

    state = ParallelState.create(timeout_s=10)
    spec = llama_spec()
    errors = []
    try:
        Executor(build_model(spec, seed=0), state, layers=list(build_model(spec, seed=1).layers), zero_stage=3)
    except ValueError as e:
        errors.append(str(e))
    executor = Executor(build_model(spec, seed=0), state, zero_stage=3)
    batch = [Sample(i, n, attention_pairs("causal", n)) for i, n in enumerate([5, 8, 3, 6])]
    tensors = {s.id: sample_tensors(spec, s) for s in batch}
    good = manual_plan(batch, 4, spec.num_layers, [(0, 2, [([0, 1], 1)]), (2, 1, [([2], 0), ([3], 2)])])
    stage1 = copy.deepcopy(good)
    stage1.zero_stage = 1
    try:
        executor.step(stage1, tensors, lambda o, b: lm_loss(o, b["labels"]))
    except ExecutorError as e:
        errors.append(str(e))
    stats = executor.step(good, tensors, lambda o, b: lm_loss(o, b["labels"]))
    errors.append(f"loss {stats.loss:.6f}")
    return errors


def test_bad_plans_and_models_fail_on_every_rank_before_any_collective() -> None:
    results = run_ranks(bad_inputs_worker, 4, deadline_s=90, pg_timeout_s=10)
    for errors in results:
        assert "layer 0 is not a module of the model" in errors[0]
        assert "plan was made for ZeRO stage 1" in errors[1] and "the executor runs stage 3" in errors[1]
        assert errors[1].startswith("cannot run the step; every rank:")
    assert len({errors[2] for errors in results}) == 1  # the good step after them: one loss everywhere


def narrow(name: str) -> ModelSpec:
    """`name`'s layer structure (layers, heads, KV heads) at head size 2: small enough for a CPU."""
    from dataclasses import replace

    from dcp.costmodel import load_model

    spec = load_model(name)
    hidden = 2 * spec.heads
    return replace(spec, name=f"{name}-narrow", hidden=hidden, ffn_hidden=2 * hidden, vocab=256, memory={})


def large_structure_worker(rank: int, world: int, name: str, steps: list[Case]) -> tuple[list[float], float, float]:
    """Three AdamW steps at stage 3; returns (losses, parameter bytes this rank holds / the model's,
    rank 0's largest relative gradient or parameter difference from single-process training)."""
    from dcp.executor import Executor, ParallelState
    from dcp.models import build_model

    state = ParallelState.create(timeout_s=60)
    model = build_model(narrow(name), dtype=torch.float64, seed=0)
    ref = copy.deepcopy(model) if rank == 0 else None
    total_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    executor = Executor(model, state, zero_stage=3)
    held = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    diffs = compare_steps(executor, ref, steps, narrow(name))
    return [loss for _, _, loss in diffs], held / total_bytes, max(max(g, p) for g, p, _ in diffs)


def test_llama_13b_and_70b_layer_structures_train_at_stage_3() -> None:
    """40 layers of 40 heads (13B) and 80 layers of 64 heads over 8 KV heads (70B), narrowed: three
    steps each at stage 3 on 4 ranks, groups of 1 or 2 micro-batches, equal to single-process
    training (fp64), each rank keeping a quarter of the parameters."""
    structures = {"llama-13b": (40, 40, 40), "llama-70b": (80, 64, 8)}
    for name, shape in structures.items():
        spec = narrow(name)
        assert (spec.num_layers, spec.heads, spec.kv_heads) == shape
        # SP 1 here (mixed SP sizes are the random plans' business): the per-layer gathers are the point.
        steps = [random_case(spec, 50 + i, [(0, 1), (1, 1), (2, 1), (3, 1)], 4, microbatches=[1, 2, 1, 2])
                 for i in range(3)]
        results = run_ranks(large_structure_worker, 4, name, steps, deadline_s=300, pg_timeout_s=60)
        losses, _, diff = results[0]
        print(f"{name}: grads and params {diff:.1e}")
        assert all(r[0] == losses for r in results)  # one global loss on every rank
        assert all(abs(r[1] - 0.25) < 0.01 for r in results)  # each rank keeps a quarter of the parameters
        assert diff <= TOLERANCE, (name, diff)


def user_wrapped_worker(rank: int, world: int, stage: int,
                        steps: list[Case]) -> tuple[list[float], list[str], list[str]]:
    """The test wraps the reference Llama with fully_shard itself (each layer, then the root, on
    its own mesh) before dcp sees it; three AdamW steps; each rank's largest gradient or parameter
    difference from single-process training after each. Then three wrappings dcp cannot run (a layer left unwrapped,
    the root left unwrapped, a mesh of 2 ranks in a world of 4), each refused on every rank: first
    on the last rank alone while its peers wait in a barrier (a collective inside the refusal would
    pair with nothing there, or with the barrier, and fail or hang instead of raising), then on
    every rank at once. Returns (differences, the errors alone, the errors together)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from dcp.executor import Executor, ParallelState
    from dcp.models import build_model

    state = ParallelState.create(gpus_per_node=4, timeout_s=30)
    spec = llama_spec()
    mesh = init_device_mesh("cpu", (world,))

    def wrapped(skip_layer: bool = False, skip_root: bool = False, on: object = None) -> torch.nn.Module:
        model = build_model(spec, dtype=torch.float64, seed=0)
        for i, layer in enumerate(model.layers):
            if not (skip_layer and i == 0):
                fully_shard(layer, mesh=on or mesh)
        if not skip_root:
            fully_shard(model, mesh=on or mesh)
        return model

    ref = build_model(spec, dtype=torch.float64, seed=0)
    model = wrapped()
    executor = Executor(model, state, zero_stage=stage)
    assert executor.mesh is mesh
    diffs = [max(g, p) for g, p, _ in compare_steps(executor, ref, steps, spec)]  # every rank compares
    pairs = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("replicate", "pair"))["pair"]
    bad_models = [wrapped(skip_layer=True), wrapped(skip_root=True), wrapped(on=pairs)]  # collectives: all ranks

    def refusal(model: torch.nn.Module) -> str:
        try:
            Executor(model, state, zero_stage=stage)
            return "no error"
        except ValueError as e:
            return str(e)

    alone = [refusal(m) for m in bad_models] if rank == world - 1 else []
    torch.distributed.barrier()
    together = [refusal(m) for m in bad_models]
    return diffs, alone, together


@pytest.mark.parametrize("stage", [2, 3])
def test_a_model_the_user_wrapped_with_fully_shard_trains_as_it_is(stage: int) -> None:
    steps = cases(llama_spec(), LAYOUTS_4, 4, seed=30 + stage)
    results = run_ranks(user_wrapped_worker, 4, stage, steps, deadline_s=150)
    print(f"user-wrapped stage {stage}: grads and params {[f'{d:.1e}' for d in results[0][0]]}")
    for rank, (diffs, alone, together) in enumerate(results):
        assert len(diffs) == 3 and max(diffs) <= TOLERANCE, diffs
        # The last rank was refused alone, its peers in a barrier; then every rank the same way.
        assert alone == (together if rank == 3 else []) and together == results[0][2], (rank, alone, together)
        assert all(e.startswith("cannot run this fully_shard wrapping: ") for e in together), (rank, together)
        assert "layer 0 is not wrapped with fully_shard" in together[0]
        assert "the root is not: call fully_shard(model) last" in together[1]
        assert "sharded over a mesh of 2 ranks, but the plan's world has 4" in together[2]
