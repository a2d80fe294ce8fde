"""The single-process reference the executor must equal, and hand-built plans to test it with.

`reference_step` is plain per-sample gradient accumulation on one process: each sample alone
(no packing, no padding, no SP), loss summed, gradients divided by the global loss-token count.
`manual_plan` assembles a valid Plan from a layout you choose (no solving), for tests,
benchmarks and scripted runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from dcp.executor.batch import SampleTensors, pack_microbatch
from dcp.executor.executor import ForwardFn, LossFn
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
    """Largest, over parameters, of max|g - g_ref| / max(max|g_ref|, floor * largest |g_ref| of the
    model); a parameter without a gradient counts as zeros.

    Per-tensor scale, so small parameters are judged at their own size; the floor keeps gradients
    that are zero in exact arithmetic (a key bias: softmax ignores a shift shared by all scores)
    from turning round-off on both sides into a huge ratio."""
    grads = [(p.grad if p.grad is not None else torch.zeros_like(p),
              r.grad if r.grad is not None else torch.zeros_like(r)) for p, r in zip(params, reference, strict=True)]
    overall = max((gr.abs().max().item() for _, gr in grads), default=0.0)
    worst = 0.0
    for g, gr in grads:
        scale = max(gr.abs().max().item(), floor * overall)
        diff = (g.double() - gr.double()).abs().max().item()
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


def manual_plan(batch: Sequence[Sample], num_gpus: int, num_layers: int,
                groups: Sequence[tuple[int, int, Sequence[tuple[Sequence[int], int]]]], *,
                gpus_per_node: int | None = None, time_s: Callable[[Sequence[int], int, int], float] | None = None,
                strategy: str = "manual") -> Plan:
    """A validated Plan from (first rank, SP size, [(sample ids, checkpointed layers), ...]) per
    group. Times default to the group's tokens / SP size (consistent, not a prediction)."""
    tokens = {s.id: s.tokens for s in batch}
    time_s = time_s or (lambda ids, sp, _r: sum(tokens[i] for i in ids) / sp * 1e-6)
    plan_groups = [
        Group(list(range(start, start + sp)), sp,
              [MicroBatch(list(ids), r, time_s(ids, sp, r), 0.0) for ids, r in mbs])
        for start, sp, mbs in groups
    ]
    busy = max((g.busy_s for g in plan_groups), default=0.0)
    return Plan(strategy=strategy, num_gpus=num_gpus, gpus_per_node=gpus_per_node or num_gpus,
                memory_limit_bytes=1e18, num_layers=num_layers, samples=list(batch), groups=plan_groups,
                step_time_s=busy, lower_bound_s=0.0).validate()
