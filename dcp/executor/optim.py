"""The optimizer of a precision recipe, stepping this rank's part of the ZeRO schedule's units
and holding exactly what `dcp.costmodel.zero.resident_bytes` prices.

    executor = Executor(model, state, zero_stage=2)
    optimizer = executor_optimizer(executor, lr=3e-4)
    executor.step(plan, samples, loss_fn); optimizer.step(); optimizer.zero_grad()

Rank i steps the i-th equal chunk of every unit (dcp.executor.units) against the same chunk of
the reduced gradient, at stage 0 the whole units (ZeRO: Rajbhandari et al., arXiv 1910.02054).
At stages 1 and 2 the updated chunks are then all-gathered into every rank's whole units; at
stage 3 the chunk is all a rank keeps. Under the bf16 recipe it steps an fp32 master copy of its
chunks and writes their bf16 rounding back (mixed precision with master weights: Micikevicius et
al., arXiv 1710.03740); otherwise the chunks are stepped in place. The inner optimizer sees one
tensor per unit: elementwise optimizers (Adam, AdamW, SGD) step exactly as on the separate
parameters, in one parameter group.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
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


class FlatShardOptimizer:
    """An optimizer over this rank's chunks of the executor's units (its whole units at stage 0),
    with fp32 master weights when the recipe keeps them."""

    def __init__(self, executor: Executor, *, optimizer_class: type[torch.optim.Optimizer] = torch.optim.AdamW,
                 **kwargs: Any) -> None:
        self.zero = executor.zero
        self.recipe = executor.recipe
        if self.zero.grad_dtype != torch.float32 and self.recipe.master_weights:
            raise ValueError("fp32 master weights need fp32 gradients")
        self.local = self.zero.local()
        # The master: an fp32 copy of each chunk, or the chunk itself (already in its dtype).
        self.master = [nn.Parameter(p.detach().float().clone() if self.recipe.master_weights else p)
                       for p, _ in self.local]
        self.inner = optimizer_class(self.master, **kwargs)
        if self.recipe.master_weights:
            self.zero.param_grads = False  # the optimizer reads the fp32 buffer; no bf16 .grad copies

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The inner optimizer's (one) parameter group: set the learning rate here."""
        return self.inner.param_groups

    def step(self) -> None:
        """Step this rank's chunks against the reduced gradients, then share them (stages 1, 2)."""
        for master, (_, grad) in zip(self.master, self.local, strict=True):
            master.grad = grad if grad.dtype == master.dtype else grad.to(master.dtype)
        self.inner.step()
        with torch.no_grad():
            for master, (param, _) in zip(self.master, self.local, strict=True):
                master.grad = None
                if self.recipe.master_weights:
                    param.copy_(master)
        self.zero.share_updated()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the parameters' `.grad` (the executor zeroes its buffers at the next step)."""
        for p in self.zero.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def state_tensors(self) -> list[torch.Tensor]:
        """What this optimizer holds besides the parameters: master chunks, optimizer state."""
        out = list(self.master) if self.recipe.master_weights else []
        return out + [t for st in self.inner.state.values() for t in st.values() if torch.is_tensor(t)]


def executor_optimizer(executor: Executor, *, zero_stage: int | None = None,
                       optimizer_class: type[torch.optim.Optimizer] = torch.optim.AdamW,
                       **kwargs: Any) -> FlatShardOptimizer:
    """The optimizer of the executor's recipe and ZeRO stage (`zero_stage`, when given, must be the
    executor's: the stage decides what the executor's step reduces and keeps)."""
    if zero_stage is not None and zero_stage != executor.zero_stage:
        raise ValueError(f"optimizer for ZeRO stage {zero_stage}, but the executor runs stage {executor.zero_stage}: "
                         "pass zero_stage to Executor")
    return FlatShardOptimizer(executor, optimizer_class=optimizer_class, **kwargs)


def held_bytes(model: nn.Module, executor: Executor, optimizer: Any) -> int:
    """Bytes of the training state a rank holds: parameters and buffers, gradients (the
    executor's buffers and any `.grad` outside them), the optimizer's state, each storage once
    (a stage-3 unit between uses holds none)."""
    tensors = list(model.parameters()) + list(model.buffers()) + executor.zero.state_tensors()
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
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
