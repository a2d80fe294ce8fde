"""What each rank holds at each ZeRO stage, counted the way FSDP2 (dcp.executor.fsdp) holds it.

The executor shards each transformer layer and then the root (embeddings, final norm, LM head)
with `fully_shard` over F ranks (the shard group: the world, or fewer under HSDP; 1 at stage 0,
which replicates). Units are those modules: s_u = ceil(n_u / F) * F elements padded, chunk
c_u = s_u / F. Between steps (after the optimizer's zero_grad, which frees the gradients)
every stage holds only the sharded state, per rank, with w and o the bytes per element of the
sharded parameters (fp32 master weights when the recipe keeps them, else the parameter dtype)
and of the optimizer state:

    stage 0:     (w + o) * S                    S = sum of s_u (F = 1: nothing sharded)
    stages 1-3:  (w + o) * C                    C = sum of c_u = S / F

(`resident_bytes`). FSDP2 always reduce-scatters, so stage 1 is stage 2. During a step it holds
more (`in_step_bytes`), with pb the gathered parameters' dtype and gb the gradient's:

- stages 0-2: every unit gathered (reshard after forward off) and each rank's whole local
  gradient accumulated through its micro-batches (its groups run different numbers of them):
  (pb + gb) * S; the last backward's reduce-scatters free each unit's whole gradient as its
  shard (gb * c_u, kept until zero_grad) arrives, so the shards add nothing to the peak;
- stage 3: the gradient shards gb * C, accumulated slot by slot, and a unit's parameters
  gathered only while it runs, the next prefetched, its gradient reduce-scattered as soon as
  its backward ends: the root's parameters and gradient, two layers' parameters and two
  layers' gradients, and one reduce-scatter's output chunk.

Never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dcp.costmodel.precision import PrecisionRecipe
from dcp.costmodel.spec import CostModelError, ModelSpec

ZERO_STAGES = (0, 1, 2, 3)


def unit_params(spec: ModelSpec) -> list[int]:
    """Trainable elements per unit: each of the K layers, then the root (the rest)."""
    layer = spec.layer_params()
    return [layer] * spec.num_layers + [spec.param_count() - spec.num_layers * layer]


def padded(elements: int, world: int) -> int:
    """A unit's flat size, padded to a multiple of the world: s_u."""
    return math.ceil(elements / world) * world


def _check(stage: int, world: int) -> None:
    if stage not in ZERO_STAGES:
        raise CostModelError(f"zero_stage must be 0, 1, 2 or 3, got {stage!r}")
    if world < 1:
        raise CostModelError(f"world size must be positive, got {world}")


def shard_ranks(stage: int, world: int, shard_group: int | None = None) -> int:
    """F: the ranks a parameter is sharded over (1 at stage 0, else the shard group or the world)."""
    if stage == 0:
        return 1
    size = world if shard_group is None else shard_group
    if size < 1 or world % size:
        raise CostModelError(f"shard group of {size} ranks does not divide the world of {world}")
    return size


def resident_bytes(recipe: PrecisionRecipe, stage: int, units: Sequence[int], world: int,
                   shard_group: int | None = None) -> float:
    """Bytes per rank of sharded parameters (master weights) and optimizer state between steps."""
    _check(stage, world)
    f = shard_ranks(stage, world, shard_group)
    chunk = sum(padded(n, f) for n in units) / f
    weights = 4 if recipe.master_weights else recipe.param_bytes
    return float((weights + recipe.optimizer_state_bytes_per_param) * chunk)


def in_step_bytes(recipe: PrecisionRecipe, stage: int, units: Sequence[int], world: int,
                  shard_group: int | None = None) -> float:
    """Bytes per rank the step's schedule holds on top of `resident_bytes` while micro-batches run."""
    _check(stage, world)
    f = shard_ranks(stage, world, shard_group)
    if stage <= 2:
        return float((recipe.param_bytes + recipe.grad_bytes) * sum(padded(n, f) for n in units))
    shards = recipe.grad_bytes * sum(padded(n, f) for n in units) / f
    root = padded(units[-1], f)
    layer = max((padded(n, f) for n in units[:-1]), default=0)
    chunk = max(root, layer) / f
    return float(shards + (recipe.param_bytes + recipe.grad_bytes) * (root + 2 * layer) + recipe.grad_bytes * chunk)
