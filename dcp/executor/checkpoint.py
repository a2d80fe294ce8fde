"""Per-layer activation-checkpoint switches, set per micro-batch.

Each layer's `forward` is shadowed by an instance attribute that either calls the original
forward or runs it under non-reentrant `torch.utils.checkpoint` (which, unlike the reentrant
variant, handles keyword and non-tensor arguments and inputs that do not require grad).
Parameters and state-dict keys are unchanged, so this works on any model's layer list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint


class CheckpointSwitches:
    """Switches for `layers`; `set(r)` checkpoints the first r layers, the rest run plainly.

    The first r layers (not any r) because the plan is identical across an SP group and the
    all-to-alls recomputed in backward must line up rank by rank."""

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        self.layers = list(layers)
        self.enabled = [False] * len(self.layers)
        for i, layer in enumerate(self.layers):
            layer.forward = self._switched(i, layer.forward)

    def _switched(self, i: int, forward: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            if self.enabled[i]:
                return checkpoint(forward, *args, use_reentrant=False, **kwargs)
            return forward(*args, **kwargs)

        run.__wrapped__ = forward  # type: ignore[attr-defined]
        return run

    def set(self, ckpt_layers: int) -> None:
        if not 0 <= ckpt_layers <= len(self.layers):
            raise ValueError(f"{ckpt_layers} checkpointed layers outside 0..{len(self.layers)}")
        self.enabled = [i < ckpt_layers for i in range(len(self.layers))]
