"""The single-process reference the executor must equal, and hand-built plans to test it with.

`reference_step` is plain per-sample gradient accumulation on one process: each sample alone
(no packing, no padding, no SP), loss summed, gradients divided by the global loss-token count.
`manual_plan` assembles a valid Plan from a layout you choose (no solving), for tests,
benchmarks and scripted runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from dcp.executor.batch import SampleTensors, pack_microbatch
from dcp.executor.executor import Executor, ForwardFn, LossFn, default_forward
from dcp.executor.fsdp import full_tensor
from dcp.planner.plan import Group, MicroBatch, Plan
from dcp.planner.sample import Sample


def reference_step(model: nn.Module, batch: Sequence[Sample], samples: Mapping[int, SampleTensors],
                   loss_fn: LossFn, forward_fn: ForwardFn, device: torch.device | str = "cpu") -> float:
    """Accumulate into `.grad` the gradient of (sum of per-token losses) / (loss tokens) over the
    batch, one sample at a time; returns the mean loss. Gradients are zeroed first."""
    model.zero_grad(set_to_none=True)
    specs = {s.id: s for s in batch}
    total_loss, total_tokens = 0.0, 0.0
    for s in batch:
        packed = pack_microbatch([s.id], specs, samples, sp_size=1, sp_rank=0, device=torch.device(device))
        loss, tokens = loss_fn(forward_fn(model, packed), packed)
        loss.backward()
        total_loss += loss.item()
        total_tokens += float(tokens)
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(total_tokens)
    return total_loss / total_tokens


def relative_grad_diff(params: Sequence[nn.Parameter], reference: Sequence[nn.Parameter],
                       floor: float = 1e-2) -> float:
    """`relative_diff` of the parameters' gradients; a parameter without one counts as zeros."""
    return relative_diff([p.grad if p.grad is not None else torch.zeros_like(p) for p in params],
                         [r.grad if r.grad is not None else torch.zeros_like(r) for r in reference], floor)


def relative_diff(tensors: Sequence[torch.Tensor], reference: Sequence[torch.Tensor], floor: float = 1e-2) -> float:
    """Largest, over tensors, of max|t - t_ref| / max(max|t_ref|, floor * largest |t_ref| of all).

    Per-tensor scale, so small tensors are judged at their own size; the floor keeps gradients
    that are zero in exact arithmetic (a key bias: softmax ignores a shift shared by all scores)
    from turning round-off on both sides into a huge ratio. DTensors are compared whole (a
    collective over their mesh: on several ranks compare `executor.full_grads()` instead)."""
    pairs = [(full_tensor(t), full_tensor(r)) for t, r in zip(tensors, reference, strict=True)]
    overall = max((r.abs().max().item() for _, r in pairs if r.numel()), default=0.0)
    worst = 0.0
    for t, r in pairs:
        if not r.numel():
            continue
        scale = max(r.abs().max().item(), floor * overall)
        diff = (t.double() - r.double()).abs().max().item()
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


def trainable(reference: nn.Module) -> list[nn.Parameter]:
    """`reference`'s trainable parameters in `model.parameters()` order: the order of
    `executor.full_grads()` and `full_params()`."""
    return [p for p in reference.parameters() if p.requires_grad]


def manual_plan(batch: Sequence[Sample], num_gpus: int, num_layers: int,
                groups: Sequence[tuple[Any, ...]], *,
                gpus_per_node: int | None = None, time_s: Callable[[Sequence[int], int, int], float] | None = None,
                strategy: str = "manual") -> Plan:
    """A validated Plan from (first rank, SP size, [(sample ids, checkpointed layers), ...][, ring
    degree[, phase]]) per group (ring degree 1, Ulysses only, and phase 0 when left out; groups in
    phase order). Times default to the group's tokens / SP size (consistent, not a prediction)."""
    tokens = {s.id: s.tokens for s in batch}
    time_s = time_s or (lambda ids, sp, _r: sum(tokens[i] for i in ids) / sp * 1e-6)
    plan_groups = [
        Group(list(range(g[0], g[0] + g[1])), g[1],
              [MicroBatch(list(ids), r, time_s(ids, g[1], r), 0.0) for ids, r in g[2]],
              ring=g[3] if len(g) > 3 else 1, phase=g[4] if len(g) > 4 else 0)
        for g in groups
    ]
    plan = Plan(strategy=strategy, num_gpus=num_gpus, gpus_per_node=gpus_per_node or num_gpus,
                memory_limit_bytes=1e18, num_layers=num_layers, samples=list(batch), groups=plan_groups,
                step_time_s=0.0, lower_bound_s=0.0)
    plan.step_time_s = plan.busy_s()
    return plan.validate()


def compare_step(executor: Executor, reference: nn.Module | None, ref_optimizer: torch.optim.Optimizer | None,
                 plan: Plan, batch: Sequence[Sample], samples: Mapping[int, SampleTensors], loss_fn: LossFn,
                 forward_fn: ForwardFn = default_forward) -> tuple[float, float, float]:
    """One training step of `plan` through the executor and its optimizer (`executor.optimizer`),
    and of the same batch on `reference` (single process, `reference_step`) with `ref_optimizer`;
    returns `relative_diff` of the reduced gradients and of the parameters after the optimizer
    step (0.0 each where `reference` is None) and the step's global loss. Collectives: every rank
    calls it."""
    assert executor.optimizer is not None, "executor_optimizer(executor) first"
    loss = executor.step(plan, samples, loss_fn).loss
    grads = executor.full_grads()
    executor.optimizer.step()
    executor.optimizer.zero_grad()
    params = executor.full_params()
    if reference is None or ref_optimizer is None:
        return 0.0, 0.0, loss
    reference_step(reference, batch, samples, loss_fn, forward_fn)
    grad_diff = relative_diff(grads, [p.grad if p.grad is not None else torch.zeros_like(p) for p in trainable(reference)])
    ref_optimizer.step()
    return grad_diff, relative_diff(params, [p.detach() for p in trainable(reference)]), loss


def load_reference(executor: Executor, model: nn.Module, reference: nn.Module | None) -> None:
    """Give `reference` (a copy of `model` made before the executor took it) the executor's current
    parameters. A collective: every rank calls it, with None where it keeps no
    reference."""
    values = executor.full_params()
    if reference is not None:
        with torch.no_grad():
            for r, v in zip(trainable(reference), values, strict=True):
                r.copy_(v)


def reference_grad_diff(executor: Executor, model: nn.Module, reference: nn.Module | None) -> float:
    """`relative_diff` of the executor's reduced gradients against `reference`'s (0.0 where it is
    None). A collective: every rank calls it."""
    grads = executor.full_grads()
    if reference is None:
        return 0.0
    want = [r.grad if r.grad is not None else torch.zeros_like(r) for r in trainable(reference)]
    return relative_diff(grads, want)
