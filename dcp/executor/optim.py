"""Optimizer state sharded over the world (ZeRO stage 1), as the cost model's memory assumes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def sharded_optimizer(params: Iterable[torch.nn.Parameter], optimizer_class: type[torch.optim.Optimizer]
                      = torch.optim.AdamW, **kwargs: Any) -> torch.optim.Optimizer:
    """torch's ZeroRedundancyOptimizer: each rank keeps the state of 1/N of the parameters, steps
    them, and broadcasts the updated values. Needs identical gradients on every rank, which the
    executor's all-reduce provides."""
    # Imported here: torch.distributed.optim pulls in FSDP and costs every rank ~1 s at startup.
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(list(params), optimizer_class=optimizer_class, **kwargs)
