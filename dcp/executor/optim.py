"""The optimizer of an executor: a plain torch optimizer over the model's DTensor parameters.

    executor = Executor(model, state, zero_stage=2)
    optimizer = executor_optimizer(executor, lr=3e-4)      # also executor.optimizer
    executor.step(plan, samples, loss_fn); optimizer.step(); optimizer.zero_grad()

FSDP2 holds each rank's shard of every parameter (the whole parameter at stage 0) as a DTensor
whose local tensor is the shard, and leaves the reduced gradient's shard in `.grad`; an
elementwise optimizer (AdamW, SGD) steps the shards exactly as it would the whole parameters,
and keeps its state sharded alike (ZeRO: Rajbhandari et al., arXiv 1910.02054). Under the bf16
recipe the sharded parameters are the fp32 master weights (dcp.executor.fsdp).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

if TYPE_CHECKING:
    from dcp.executor.executor import Executor


def executor_optimizer(executor: Executor, *, zero_stage: int | None = None,
                       optimizer_class: type[torch.optim.Optimizer] = torch.optim.AdamW,
                       **kwargs: Any) -> torch.optim.Optimizer:
    """`optimizer_class` (AdamW) over the executor's trainable parameters, kept as
    `executor.optimizer`. `zero_stage`, when given, must be the executor's."""
    if zero_stage is not None and zero_stage != executor.zero_stage:
        raise ValueError(f"optimizer for ZeRO stage {zero_stage}, but the executor runs stage {executor.zero_stage}: "
                         "pass zero_stage to Executor")
    executor.optimizer = optimizer_class([p for p in executor.model.parameters() if p.requires_grad], **kwargs)
    return executor.optimizer


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """Bytes of the training state a rank holds: parameters and buffers (their shards' storage,
    padding included), gradients and the optimizer's state, each storage once."""
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    if optimizer is not None:
        tensors += [t for st in optimizer.state.values() for t in st.values() if torch.is_tensor(t)]
    seen: dict[int, int] = {}
    for t in tensors:
        storage = _local(t).untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())
