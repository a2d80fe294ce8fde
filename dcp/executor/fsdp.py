"""The model on torch FSDP2 (`fully_shard`): each transformer layer and then the root sharded over
a DeviceMesh, in the settings each ZeRO stage needs, and the passes a rank runs in a step.

    mesh = shard_model(model, layers, state, recipe, stage)    # or a model the user wrapped
    for p in passes(plan, rank, stage): ...                     # micro-batches and empty passes

Stages map to FSDP2 as follows (docs/design.md, "ZeRO stages 0-3"):

- 0: replicated: a 2-D mesh of (world x 1), so FSDP2 all-reduces each layer's gradient over the
  replicas in the last backward and shards nothing;
- 1, 2: `reshard_after_forward=False`; on every micro-batch of a rank but its last, gradient sync
  and reshard-after-backward are off (parameters stay gathered, the whole local gradient
  accumulates); on the last both are on, so each layer's reduce-scatter runs under the backward
  of the layers below. FSDP2 always reduce-scatters, so stage 1 is stage 2 (an alias);
- 3: `reshard_after_forward=True` in lockstep slots: slot j is every group's j-th micro-batch,
  gradient sync in every slot.

A rank with fewer passes than the schedule needs runs empty ones (a one-token micro-batch whose
loss is multiplied by zero), so every rank issues the same collectives in the same order. With
`shard_group` < world the mesh is 2-D (HSDP): shard over `shard_group` consecutive ranks (a node
by default), replicate across the groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from dcp.costmodel.precision import PrecisionRecipe
from dcp.costmodel.zero import shard_ranks
from dcp.executor.comm import broadcast_params
from dcp.executor.parallel_state import ParallelState
from dcp.models.precision import torch_dtype
from dcp.planner.plan import Group, MicroBatch, Plan


def device_mesh(state: ParallelState, stage: int, shard_group: int | None = None) -> DeviceMesh:
    """The mesh of `stage`: 1-D over the world, or (replicate, shard) when a shard group is
    smaller than the world (stage 0: shards of one rank). Created on every rank (a collective)."""
    shard = shard_ranks(stage, state.world_size, shard_group)
    if shard == state.world_size:
        return init_device_mesh(state.device.type, (shard,), mesh_dim_names=("shard",))
    return init_device_mesh(state.device.type, (state.world_size // shard, shard),
                            mesh_dim_names=("replicate", "shard"))


def mp_policy(recipe: PrecisionRecipe) -> MixedPrecisionPolicy:
    """The recipe as FSDP2's policy: with master weights (bf16) the sharded parameters are fp32
    and gathered in the parameter dtype; gradients are reduced in the reduce dtype. Inputs are not
    cast (a layer's arrive in the compute dtype from the one before; the layout is no tensor)."""
    return MixedPrecisionPolicy(param_dtype=torch_dtype(recipe.param_dtype) if recipe.master_weights else None,
                                reduce_dtype=torch_dtype(recipe.reduce_dtype), cast_forward_inputs=False)


def wrapping_error(model: nn.Module, layers: list[nn.Module], world: int) -> str | None:
    """Why dcp cannot run a model the user wrapped with `fully_shard`, or None if it can: every
    layer and the root wrapped, every trainable parameter a DTensor on one mesh of the world."""
    unwrapped = [i for i, layer in enumerate(layers) if not isinstance(layer, FSDPModule)]
    if unwrapped:
        return (f"layer {unwrapped[0]} is not wrapped with fully_shard (wrap every layer, then the root, "
                "or pass the model unwrapped and let dcp shard it)")
    if not isinstance(model, FSDPModule):
        return "the layers are wrapped with fully_shard but the root is not: call fully_shard(model) last"
    meshes = {p.device_mesh for p in model.parameters() if isinstance(p, DTensor)}
    plain = [n for n, p in model.named_parameters() if p.requires_grad and not isinstance(p, DTensor)]
    if plain:
        return f"parameter {plain[0]} is not sharded by fully_shard"
    if len(meshes) != 1:
        return f"the model's parameters live on {len(meshes)} different meshes; dcp runs one"
    mesh = meshes.pop()
    if mesh.size() != world:
        return f"the model is sharded over a mesh of {mesh.size()} ranks, but the plan's world has {world}"
    return None


def is_wrapped(model: nn.Module) -> bool:
    """Whether the user wrapped (part of) the model with fully_shard already."""
    return any(isinstance(m, FSDPModule) for m in model.modules())


def check_model(model: nn.Module, layers: list[nn.Module], world: int) -> None:
    """ValueError, on every rank alike and before any collective, for layers that are not the
    model's or a fully_shard wrapping dcp cannot run."""
    known = {id(m) for m in model.modules()}
    foreign = [i for i, layer in enumerate(layers) if id(layer) not in known]
    if foreign:
        raise ValueError(f"layer {foreign[0]} is not a module of the model: pass the model's own layers")
    if is_wrapped(model):
        error = wrapping_error(model, layers, world)
        if error:
            raise ValueError(f"cannot run this fully_shard wrapping: {error}")


def shard_model(model: nn.Module, layers: list[nn.Module], state: ParallelState, recipe: PrecisionRecipe,
                stage: int, shard_group: int | None = None, sync_params: bool = False) -> DeviceMesh:
    """Shard `model` for `stage` (each layer, then the root) and return its mesh; a model already
    wrapped with fully_shard keeps its wrapping and mesh (ValueError, raised on every rank alike
    before any collective, when dcp cannot run it). `sync_params`: an unwrapped model first takes
    rank 0's values on every rank, whatever each rank's seed. Gradients are summed, never
    averaged: the executor divides them by the global loss-token count alone."""
    check_model(model, layers, state.world_size)
    if sync_params and not is_wrapped(model):
        broadcast_params([*model.parameters(), *model.buffers()])
    if is_wrapped(model):
        mesh = next(p.device_mesh for p in model.parameters() if isinstance(p, DTensor))
        modules = [*layers, model]
    else:
        if recipe.master_weights:  # the sharded parameters are the fp32 master weights
            for p in model.parameters():
                if p.requires_grad:
                    p.data = p.data.float()
        mesh = device_mesh(state, stage, shard_group)
        modules = [*layers, model]
        for m in modules:
            fully_shard(m, mesh=mesh, reshard_after_forward=stage == 3, mp_policy=mp_policy(recipe))
    for m in modules:
        m.set_reshard_after_forward(stage == 3, recurse=False)
        m.set_gradient_divide_factor(1.0)
        m.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL_SUM), no division
    return mesh


@dataclass(frozen=True)
class Pass:
    """One forward and backward of a step on this rank: a micro-batch of `group`, or an empty pass
    (`microbatch` None) that only joins the collectives; `sync` reduces the gradients after it."""

    group: Group | None
    microbatch: MicroBatch | None
    sync: bool
    group_index: int = -1
    index: int = 0


def passes(plan: Plan, rank: int, stage: int) -> list[Pass]:
    """The passes `rank` runs: stages 0-2 its groups' micro-batches in phase order (then an empty
    pass when it has none, or `Plan.closing_groups` says so), sync on the last only; stage 3 one
    pass per slot of the plan, sync on all."""
    mine = [(gi, g) for gi, g in enumerate(plan.groups) if rank in g.ranks]
    if stage == 3:
        slots = max((len(g.microbatches) for g in plan.groups), default=0)
        gi, group = mine[0] if mine else (-1, None)
        mbs = group.microbatches if group else []
        return [Pass(group, mbs[j] if j < len(mbs) else None, True, gi, j) for j in range(slots)]
    out = [Pass(g, mb, False, gi, j) for gi, g in mine for j, mb in enumerate(g.microbatches)]
    if not out or not plan.closing_groups()[out[-1].group_index]:
        # A member of its last group goes on to a later phase: reductions issued under the last
        # backward could wait on that member while it waits in the group's all-to-all, so an
        # empty pass (no group) right after reduces instead.
        out.append(Pass(None, None, False))
    last = out[-1]
    out[-1] = Pass(last.group, last.microbatch, True, last.group_index, last.index)
    return out


def gather_all(model: nn.Module) -> None:
    """All-gather every FSDP module's parameters now (each module's, in module order, on every
    rank), before a multi-phase plan's micro-batches: gathers issued lazily by the first forward
    could interleave with one phase's all-to-alls on one rank and another's on its peers."""
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.unshard()


def set_sync(model: nn.Module, sync: bool) -> None:
    """Before a pass: reduce the gradients and reshard after its backward (sync), or keep the
    parameters gathered and accumulate the whole local gradient (no sync)."""
    assert isinstance(model, FSDPModule)
    model.set_requires_gradient_sync(sync)
    model.set_reshard_after_backward(sync)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (a collective over its mesh), or the tensor itself."""
    return t.full_tensor() if isinstance(t, DTensor) else t
