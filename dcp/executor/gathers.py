"""ZeRO stage 3 in lockstep slots: each unit's parameters all-gathered just before they run,
released after, its gradient reduce-scattered as soon as its backward is done.

In every slot every rank uses the gathered units in one order:

    position 0: the root (embeddings, final norm, head), gathered for the whole slot
    1..K:       layers 0..K-1 for their forward (layer K-1 stays gathered for its backward)
    K+1..2K-1:  layers K-2..0 again for their backward (and recompute, when checkpointed)

Using position n first waits for its gather, then starts position n+1's (prefetch: the next
unit's gather runs under this one's compute). Positions are driven by forward pre-hooks on the
layers and by hooks on each layer's output gradient (the moment the backward reaches the layer),
and a rank without a micro-batch in the slot walks them in an empty pass, so every rank issues
the same gathers in the same order. Reduce-scatters follow the units' order of completion
(layers K-1..0, root), one in flight: issuing the next first waits for the previous and adds
its chunk into the rank's gradient shard.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

if TYPE_CHECKING:
    from dcp.executor.sharding import ZeroSchedule


class Gathers:
    """Stage 3's gathers, releases and reduce-scatters for one ZeroSchedule."""

    def __init__(self, zero: ZeroSchedule, layers: list[nn.Module]) -> None:
        self.zero, self.units, self.k = zero, zero.units, zero.k
        self.uses = [self.k, *range(self.k), *reversed(range(self.k - 1))]
        self.works: dict[int, Any] = {}
        self.issued: set[int] = set()
        self.cursor = 0
        self.active = False
        self.grads: dict[int, torch.Tensor] = {}
        self.inflight: tuple[int, Any, torch.Tensor] | None = None
        for u in self.units:
            u.keep_shard()
        for li, layer in enumerate(layers):
            layer.register_forward_pre_hook(self._pre_forward(li))
            layer.register_forward_hook(self._post_forward(li))

    # -- positions ---------------------------------------------------------------------------
    def _issue(self, n: int) -> None:
        unit = self.units[self.uses[n]]
        self.issued.add(n)
        unit.allocate()
        if unit.numel:
            self.works[n] = dist.all_gather_single(unit.full, unit.shard, group=self.zero.state.gather_group,
                                                   async_op=True)

    def use(self, n: int) -> None:
        """Make position n's unit usable: every position up to it is waited for (a layer that did
        not run still has its gather joined, keeping the order), and the next one is started."""
        if n < self.cursor:
            raise RuntimeError(f"stage 3: unit {self.uses[n]} is used out of order (position {n} after "
                               f"{self.cursor - 1}); the layers must run once each, in their list order")
        while self.cursor <= n:
            m = self.cursor
            if m not in self.issued:
                self._issue(m)
            work = self.works.pop(m, None)
            if work is not None:
                work.wait()
            self.cursor += 1
            if self.zero.overlap and m + 1 < len(self.uses):
                self._issue(m + 1)

    def backward_position(self, layer: int) -> int:
        """The position of `layer`'s backward use (layers below K-1)."""
        return self.k + 1 + (self.k - 2 - layer)

    # -- a slot -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """A slot with a micro-batch: the root gathered, the layers' hooks active."""
        self.cursor, self.issued = 0, set()
        self.use(0)
        self.active = True
        try:
            yield
            if self.cursor < len(self.uses):  # layers that did not run: their gathers still joined
                self.use(len(self.uses) - 1)
        finally:
            self.active = False
            for u in self.units:
                u.release()

    def empty_slot(self) -> None:
        """A slot without a micro-batch: the same gathers and (zero) reduce-scatters, no compute."""
        self.cursor, self.issued = 0, set()
        self.use(0)
        for layer in range(self.k):
            self.use(1 + layer)
            if layer < self.k - 1:
                self.units[layer].release()
        for layer in reversed(range(self.k)):
            if layer < self.k - 1:
                self.use(self.backward_position(layer))
            self._done(layer)
        self._done(self.k)

    def _done(self, u: int) -> None:
        self.zero.ready[u] = True
        self.zero._reduce_ready()

    # -- hooks ------------------------------------------------------------------------------------
    def _pre_forward(self, layer: int) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            if self.active:
                self.use(1 + layer)
        return hook

    def _post_forward(self, layer: int) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not self.active:
                return
            if layer < self.k - 1:
                self.units[layer].release()
            out = _first_grad_tensor(output)
            if out is not None and layer < self.k - 1:
                out.register_hook(lambda grad: self._pre_backward(layer))
        return hook

    def _pre_backward(self, layer: int) -> None:
        if self.active:
            self.use(self.backward_position(layer))

    # -- gradients ------------------------------------------------------------------------------------
    def unit_grad(self, u: int) -> torch.Tensor:
        """Unit u's whole gradient of this slot (allocated at its first parameter's gradient)."""
        if u not in self.grads:
            unit = self.units[u]
            self.grads[u] = torch.zeros(unit.padded, dtype=self.zero.grad_dtype, device=self.zero.state.device)
        return self.grads[u]

    def reduce_scatter(self, u: int) -> None:
        """Start unit u's reduce-scatter (after the previous one landed); its parameters, no
        longer needed this slot, are released."""
        self.land()
        unit = self.units[u]
        grad = self.grads.pop(u, None)
        unit.release()
        if not unit.numel:
            return
        if grad is None:  # no gradient this slot (an empty pass, or parameters unused)
            grad = torch.zeros(unit.padded, dtype=self.zero.grad_dtype, device=self.zero.state.device)
        out = torch.empty(unit.chunk, dtype=self.zero.grad_dtype, device=self.zero.state.device)
        work = dist.reduce_scatter_single(out, grad, group=self.zero.state.reduce_group, async_op=True)
        self.inflight = (u, work, out)
        if not self.zero.overlap:
            self.land()

    def land(self) -> None:
        """Wait for the reduce-scatter in flight and add its chunk into the gradient shard."""
        if self.inflight is None:
            return
        u, work, out = self.inflight
        self.inflight = None
        work.wait()
        self.zero.shard_grad(u).add_(out)


def _first_grad_tensor(output: Any) -> torch.Tensor | None:
    """The layer's hidden-state output: the tensor itself or the first tensor of a tuple/list."""
    if torch.is_tensor(output):
        return output if output.requires_grad else None
    if isinstance(output, (tuple, list)):
        for item in output:
            if torch.is_tensor(item) and item.requires_grad:
                return item
    return None
