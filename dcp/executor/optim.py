"""The optimizer of a precision recipe, its state sharded over the world (ZeRO-1) or not, holding
exactly what `TrainingSetup.static_bytes` prices.

    optimizer = executor_optimizer(executor, zero_stage=1, lr=3e-4)
    executor.step(plan, samples, loss_fn); optimizer.step(); optimizer.zero_grad()

`FlatShardOptimizer` keeps every parameter in one flat buffer (parameters become views of it),
and rank i steps the i-th of N equal slices of it against the same slice of the executor's
reduced gradient buffer, then broadcasts its slice (ZeRO stage 1: Rajbhandari et al.,
arXiv 1910.02054). Under the bf16 recipe it steps an fp32 master copy of its slice and writes
the bf16 rounding back (mixed precision with master weights: Micikevicius et al.,
arXiv 1710.03740); otherwise the slice is stepped in place. The inner optimizer sees one flat
parameter: elementwise optimizers (Adam, AdamW, SGD) step exactly as on the separate tensors,
in one parameter group.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

if TYPE_CHECKING:
    from dcp.executor.executor import Executor


def sharded_optimizer(params: Iterable[torch.nn.Parameter], optimizer_class: type[torch.optim.Optimizer]
                      = torch.optim.AdamW, **kwargs: Any) -> torch.optim.Optimizer:
    """torch's ZeroRedundancyOptimizer: each rank keeps the state of whole parameters making up
    about 1/N of them, steps them, and broadcasts the updated values. Needs identical gradients on
    every rank, which the executor's all-reduce provides. (`executor_optimizer` shards evenly.)"""
    # Imported here: torch.distributed.optim pulls in FSDP and costs every rank ~1 s at startup.
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(list(params), optimizer_class=optimizer_class, **kwargs)


def _flatten(params: list[nn.Parameter]) -> torch.Tensor:
    """One buffer holding every parameter, which become views of it (values unchanged)."""
    dtypes = {p.dtype for p in params}
    if len(dtypes) != 1:
        raise ValueError(f"a flat optimizer needs parameters of one dtype, got {sorted(map(str, dtypes))}")
    flat = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            flat[offset:offset + n].copy_(p.reshape(-1))
            p.data = flat[offset:offset + n].view_as(p)
            offset += n
    return flat


class FlatShardOptimizer:
    """ZeRO-1 over the executor's flat buffers (one slice of parameters and optimizer state per
    rank), with fp32 master weights when the recipe keeps them; `shard=False` keeps everything on
    every rank (ZeRO stage 0)."""

    def __init__(self, executor: Executor, *, shard: bool = True,
                 optimizer_class: type[torch.optim.Optimizer] = torch.optim.AdamW, **kwargs: Any) -> None:
        self.grads = executor.grads
        self.params = self.grads.params
        self.recipe = executor.recipe
        if self.grads.dtype != torch.float32 and self.recipe.master_weights:
            raise ValueError("fp32 master weights need fp32 gradients")
        self.flat = _flatten(self.params)
        world = dist.get_world_size() if shard and dist.is_initialized() else 1
        rank = dist.get_rank() if world > 1 else 0
        n, per = self.flat.numel(), -(-self.flat.numel() // world)
        self.ranges = [(min(i * per, n), min((i + 1) * per, n)) for i in range(world)]
        self.start, self.end = self.ranges[rank]
        local = self.flat[self.start:self.end]
        # The master: an fp32 copy of this rank's slice, or the slice itself (already fp32).
        self.master = nn.Parameter(local.detach().float().clone() if self.recipe.master_weights else local)
        self.inner = optimizer_class([self.master], **kwargs)
        if self.recipe.master_weights:
            self.grads.param_grads = False  # the optimizer reads the fp32 buffer; no bf16 .grad copies

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The inner optimizer's (one) parameter group: set the learning rate here."""
        return self.inner.param_groups

    def step(self) -> None:
        """Step this rank's slice against the reduced gradients, then share every slice."""
        self.master.grad = self.grads.grads[self.start:self.end].to(self.master.dtype)
        self.inner.step()
        self.master.grad = None
        with torch.no_grad():
            if self.recipe.master_weights:
                self.flat[self.start:self.end].copy_(self.master)
            if len(self.ranges) > 1:
                for src, (a, b) in enumerate(self.ranges):
                    if b > a:
                        dist.broadcast(self.flat[a:b], src=src)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the parameters' `.grad` (the executor zeroes its buffer at the next step)."""
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def state_tensors(self) -> list[torch.Tensor]:
        """What this optimizer holds besides the parameters: master slice, optimizer state."""
        out = [self.master] if self.recipe.master_weights else []
        return out + [t for st in self.inner.state.values() for t in st.values() if torch.is_tensor(t)]


def executor_optimizer(executor: Executor, *, zero_stage: int = 1,
                       optimizer_class: type[torch.optim.Optimizer] = torch.optim.AdamW,
                       **kwargs: Any) -> FlatShardOptimizer:
    """The optimizer of the executor's recipe at ZeRO stage 0 or 1 (the stages the executor runs;
    2 and 3 shard gradients and parameters, which it does not do yet)."""
    if zero_stage not in (0, 1):
        raise ValueError(f"the executor runs ZeRO stages 0 and 1, not {zero_stage}")
    return FlatShardOptimizer(executor, shard=zero_stage == 1, optimizer_class=optimizer_class, **kwargs)


def held_bytes(model: nn.Module, executor: Executor, optimizer: Any) -> int:
    """Bytes of the training state a rank holds: parameters and buffers, gradients (the
    executor's flat buffer and any `.grad` outside it), the optimizer's state, each storage once."""
    tensors = list(model.parameters()) + list(model.buffers())
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    if executor.grads.flat is not None:
        tensors.append(executor.grads.flat)
    if isinstance(optimizer, FlatShardOptimizer):
        tensors += optimizer.state_tensors()
    else:
        inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps its local one there
        tensors += [t for st in inner.state.values() for t in st.values() if torch.is_tensor(t)]
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())
