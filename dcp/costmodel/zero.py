"""What each rank holds at each ZeRO stage, counted the way dcp.executor.sharding lays it out.

The executor splits the trainable parameters into units: one per transformer layer (in layer
order) and a last one, the root, for everything else (embeddings, final norm, LM head). Each
unit is one flat buffer padded to a multiple of the world size N, so that every rank owns one
equal, contiguous chunk of it: s_u = ceil(n_u / N) * N elements, chunk c_u = s_u / N. Per rank,
with pb, gb the parameter and gradient bytes and o the optimizer bytes per element (master
weights and Adam moments, `PrecisionRecipe`):

    stage 0: pb * S + gb * S + o * S               S = sum of s_u (every buffer whole)
    stage 1: pb * S + gb * S + o * C               C = sum of c_u = S / N (optimizer sharded)
    stage 2: pb * S + gb * C + o * C               (gradients sharded between steps)
    stage 3: pb * C + gb * C + o * C               (parameters sharded too)

as ZeRO (Rajbhandari et al., arXiv 1910.02054) partitions them. That is the state held between
steps (`resident_bytes`). During a step the schedule holds more (`in_step_bytes`):

- stage 2 accumulates each rank's whole local gradient through its micro-batches (its groups
  run different numbers of them, so no collective can shard it earlier without putting every
  group in lockstep): gb * S, freed once the step's reduce-scatters are done;
- stage 3 gathers a unit's parameters only while it runs, prefetching one unit ahead, and
  reduce-scatters a unit's gradient as soon as its backward ends, one reduce-scatter in flight:
  the root's parameters and gradient, two layers' parameters and two layers' gradients, and
  the chunk a reduce-scatter returns before it is added to the rank's gradient shard.

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


def resident_bytes(recipe: PrecisionRecipe, stage: int, units: Sequence[int], world: int) -> float:
    """Bytes per rank of parameters, gradients, master weights and optimizer state between steps."""
    _check(stage, world)
    whole = sum(padded(n, world) for n in units)
    chunk = whole / world
    opt = recipe.master_weight_bytes_per_param + recipe.optimizer_state_bytes_per_param
    params = recipe.param_bytes * (chunk if stage >= 3 else whole)
    grads = recipe.grad_bytes * (chunk if stage >= 2 else whole)
    return float(params + grads + opt * (chunk if stage >= 1 else whole))


def in_step_bytes(recipe: PrecisionRecipe, stage: int, units: Sequence[int], world: int) -> float:
    """Bytes per rank the step's schedule holds on top of `resident_bytes` while micro-batches run."""
    _check(stage, world)
    if stage == 2:
        return float(recipe.grad_bytes * sum(padded(n, world) for n in units))
    if stage == 3:
        root = padded(units[-1], world)
        layer = max((padded(n, world) for n in units[:-1]), default=0)
        chunk = max(root, layer) / world
        return float((recipe.param_bytes + recipe.grad_bytes) * (root + 2 * layer) + recipe.grad_bytes * chunk)
    return 0.0
