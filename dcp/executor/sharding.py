"""The ZeRO schedule of a step: gradient buffers, reductions overlapped with the last backward,
and at stage 3 per-layer parameter gathers in lockstep slots (dcp.costmodel.schedule prices
exactly this; docs/design.md says why this schedule).

    zero = ZeroSchedule(model, layers, state, recipe, stage)
    zero.begin_step()
    for j in range(zero.slots(plan, group)):          # stage 3: every rank runs every slot
        if j >= len(microbatches): zero.empty_pass(); continue
        with zero.microbatch(last=j == len(microbatches) - 1): ...forward, backward...
    loss, tokens = zero.finish(loss_sum, loss_tokens)  # gradients reduced and divided by tokens

Collectives run on the two world groups of `ParallelState.zero_groups`, gathers on one and
reductions on the other, each in one fixed order on every rank: reductions of units K-1, ...,
0, root (once per step at stages 0-2, once per slot at stage 3), then the loss all-reduce;
gathers (stage 3) in each slot's use order (`Gathers`). Ranks that run fewer micro-batches, or
none, issue the same collectives (empty passes), so nothing is ever mismatched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dcp.costmodel.precision import PrecisionRecipe
from dcp.costmodel.zero import ZERO_STAGES
from dcp.executor.gathers import Gathers
from dcp.executor.parallel_state import ParallelState
from dcp.executor.units import Unit, build_units
from dcp.models.precision import torch_dtype
from dcp.planner.plan import Group, Plan


class ZeroSchedule:
    """One rank's training state at a ZeRO stage and the collectives of its steps."""

    def __init__(self, model: nn.Module, layers: list[nn.Module], state: ParallelState, recipe: PrecisionRecipe,
                 stage: int, *, overlap: bool = True, sync_params: bool = True) -> None:
        """`overlap`: start each unit's reduction as soon as its gradient is final in the last
        micro-batch (and at stage 3 prefetch the next gather); False waits for the end.
        `sync_params`: every rank starts from rank 0's values (one broadcast per unit). A model
        the schedule cannot hold raises ValueError here, before any collective."""
        if stage not in ZERO_STAGES:
            raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}")
        self.state, self.stage, self.overlap = state, stage, overlap
        self.world, self.rank = state.world_size, state.rank
        self.grad_dtype = torch_dtype(recipe.grad_dtype)
        self.units: list[Unit] = build_units(model, layers, self.world, self.rank, state.device)
        self.params = [p for u in self.units for p in u.params]
        self.k = len(layers)
        self.order = [*reversed(range(self.k)), self.k]
        """Units in the order their gradients become final in a backward: layers K-1..0, root."""
        self.offsets = [sum(u.padded for u in self.units[:i]) for i in range(len(self.units))]
        self.chunk_offsets = [sum(u.chunk for u in self.units[:i]) for i in range(len(self.units))]
        self.flat: torch.Tensor | None = None
        """Stages 0-2: every unit's whole gradient, one buffer (stage 2: only during a step)."""
        self.views: list[list[torch.Tensor]] = []
        self.shard = (torch.zeros(sum(u.chunk for u in self.units), dtype=self.grad_dtype, device=state.device)
                      if stage >= 2 else None)
        """Stages 2, 3: this rank's chunk of every unit's reduced gradient."""
        self.as_view = {id(p): p.dtype == self.grad_dtype and stage <= 2 for p in self.params}
        self.where = {id(p): (u.index, j) for u in self.units for j, p in enumerate(u.params)}
        self.param_grads = True
        """Stages 0, 1: after the step give parameters held in another dtype (bf16 under the bf16
        recipe) a `.grad` copy; an optimizer that reads the buffer itself turns it off."""
        if sync_params and self.world > 1:
            for u in self.units:
                if u.numel:
                    dist.broadcast(u.full, src=0)
        self.gathers = Gathers(self, layers) if stage == 3 else None
        if stage <= 1:  # the whole gradient buffer lives as long as the model (stage 2: a step)
            self._allocate_flat()
        self._step_state()
        for p in self.params:
            p._dcp_zero = self  # type: ignore[attr-defined]  # the schedule whose hook serves it (the latest)
            p.register_post_accumulate_grad_hook(self._on_grad)

    # -- views of the state -------------------------------------------------------------------
    def unit_grad(self, u: int) -> torch.Tensor:
        """Stages 0-2: unit u's whole gradient (a slice of the flat buffer)."""
        assert self.flat is not None
        return self.flat[self.offsets[u]:self.offsets[u] + self.units[u].padded]

    def shard_grad(self, u: int) -> torch.Tensor:
        """Stages 2, 3: this rank's chunk of unit u's reduced gradient."""
        assert self.shard is not None
        return self.shard[self.chunk_offsets[u]:self.chunk_offsets[u] + self.units[u].chunk]

    @property
    def grads(self) -> torch.Tensor:
        """Stages 0, 1: the flat gradient buffer (reduced and normalized after `finish`)."""
        assert self.flat is not None, "no whole gradient buffer (stages 2, 3 keep a shard; see full_grads)"
        return self.flat

    def local(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(parameters, gradient) this rank's optimizer steps, per unit: whole units at stage 0,
        this rank's chunk of each at stages 1-3."""
        out = []
        for u in (u for u in self.units if u.numel):
            if self.stage == 0:
                out.append((u.full, self.unit_grad(u.index)))
            elif self.stage <= 2:
                grad = u.own(self.unit_grad(u.index)) if self.stage == 1 else self.shard_grad(u.index)
                out.append((u.own(u.full), grad))
            else:
                assert u.shard is not None
                out.append((u.shard, self.shard_grad(u.index)))
        return out

    def state_tensors(self) -> list[torch.Tensor]:
        """The buffers this schedule holds: parameter units (or shards), gradient buffers."""
        out = [u.full for u in self.units] + [u.shard for u in self.units if u.shard is not None]
        return out + [t for t in (self.flat, self.shard) if t is not None]

    # -- a step ------------------------------------------------------------------------------------
    def _step_state(self) -> None:
        self._reduction_state(counting=False)
        self.works: list[Any] = []

    def _reduction_state(self, counting: bool) -> None:
        """No unit reduced yet (in a step at stages 0-2, in a slot at stage 3)."""
        self.ready = [False] * len(self.units)
        self.count = [0] * len(self.units)
        self.next = 0  # position in self.order of the next unit to reduce
        self.counting = counting

    def begin_step(self) -> None:
        """Zeroed gradient buffers; parameters held in the gradient dtype get `.grad` views of them."""
        self._step_state()
        if self.stage <= 2:
            if self.flat is None:
                self._allocate_flat()
            else:
                self.flat.zero_()
            for u, views in zip(self.units, self.views, strict=True):
                for p, view in zip(u.params, views, strict=True):
                    p.grad = view if self.as_view[id(p)] else None
        if self.shard is not None:
            self.shard.zero_()

    def _allocate_flat(self) -> None:
        self.flat = torch.zeros(sum(u.padded for u in self.units), dtype=self.grad_dtype, device=self.state.device)
        self.views = [u.slices(self.unit_grad(u.index)) for u in self.units]

    def slots(self, plan: Plan, group: Group | None) -> int:
        """Micro-batch slots this rank runs: at stage 3 every rank runs the plan's most (its own
        micro-batches, then empty passes); otherwise its group's own."""
        if self.stage == 3:
            return max((len(g.microbatches) for g in plan.groups), default=0)
        return len(group.microbatches) if group else 0

    @contextlib.contextmanager
    def microbatch(self, last: bool) -> Iterator[None]:
        """Run one micro-batch's forward and backward inside: stages 0-2 start reductions as the
        last micro-batch's units finish; stage 3 gathers and reduce-scatters the slot's units."""
        if self.gathers is not None:
            self._reduction_state(counting=True)
            with self.gathers.slot():
                yield
                self._reduce_rest()
            return
        self.counting = last and self.overlap
        try:
            yield
        finally:
            self.counting = False

    def empty_pass(self) -> None:
        """Stage 3, a slot without a micro-batch on this rank: the slot's gathers and zero reductions."""
        assert self.gathers is not None
        self._reduction_state(counting=True)
        self.gathers.empty_slot()

    def finish(self, loss_sum: torch.Tensor, loss_tokens: torch.Tensor) -> tuple[float, float]:
        """Reduce what is left, all-reduce the loss sum and count, divide gradients by the count.

        Ranks back-propagated un-normalized loss sums: dividing the reduced sum by the global
        loss-token count afterwards equals normalizing each rank's loss by it beforehand."""
        if self.gathers is None:
            self._reduce_rest()
        else:
            self.gathers.land()
        scalars = torch.stack([loss_sum.double(), loss_tokens.double()]).to(self.state.device)
        dist.all_reduce(scalars, group=self.state.reduce_group)
        for work in self.works:
            work.wait()
        self.works = []
        total_loss, total_tokens = scalars.tolist()
        if total_tokens <= 0:
            raise ValueError("the global batch has no loss tokens: nothing to normalize the gradient by")
        if self.stage <= 1:
            assert self.flat is not None
            self.flat.div_(total_tokens)
            for u, views in zip(self.units, self.views, strict=True):
                for p, view in zip(u.params, views, strict=True):
                    if self.as_view[id(p)]:
                        p.grad = view
                    elif self.param_grads:
                        p.grad = view.to(p.dtype)
        else:
            assert self.shard is not None
            self.shard.div_(total_tokens)
            for p in self.params:
                p.grad = None
            self.flat, self.views = None, []  # stage 2: the whole gradient lives only during a step
        return total_loss, total_tokens

    # -- reductions ------------------------------------------------------------------------------
    def _on_grad(self, p: torch.Tensor) -> None:
        """A parameter's gradient of this backward is in: move it into its unit's buffer (unless
        it is a view of it already), and reduce the unit once all of it is in."""
        if getattr(p, "_dcp_zero", None) is not self:  # a later executor took this model over
            return
        u, j = self.where[id(p)]
        if self.gathers is not None:
            self.units[u].piece(self.gathers.unit_grad(u), j).add_(p.grad.reshape(-1))
            p.grad = None
        elif not self.as_view[id(p)]:
            self.views[u][j].add_(p.grad)
            p.grad = None
        if self.counting:
            self.count[u] += 1
            if self.count[u] == len(self.units[u].params):
                self.ready[u] = True
                self._reduce_ready()

    def _reduce_ready(self) -> None:
        """Start the reductions of ready units, strictly in `order`: a unit waits for the units
        before it, so every rank issues them in one order whatever its backward's."""
        while self.next < len(self.order) and self.ready[self.order[self.next]]:
            self._reduce(self.order[self.next])
            self.next += 1

    def _reduce_rest(self) -> None:
        """Every unit not reduced yet (no overlap, no micro-batch, or parameters without gradient)."""
        self.ready = [True] * len(self.units)
        self._reduce_ready()

    def _reduce(self, u: int) -> None:
        unit = self.units[u]
        if self.gathers is not None:
            self.gathers.reduce_scatter(u)
            return
        if unit.numel == 0:
            return
        for p, view in zip(unit.params, self.views[u], strict=True):
            if self.as_view[id(p)] and p.grad is not view:  # someone replaced the view: take theirs
                view.copy_(p.grad) if p.grad is not None else view.zero_()
                p.grad = view
        group = self.state.reduce_group
        if self.stage <= 1:
            self.works.append(dist.all_reduce(self.unit_grad(u), group=group, async_op=True))
        else:
            self.works.append(dist.reduce_scatter_single(self.shard_grad(u), self.unit_grad(u), group=group,
                                                         async_op=True))

    # -- after the optimizer -------------------------------------------------------------------
    def share_updated(self) -> None:
        """Stages 1, 2: all-gather every unit's updated chunks (in place) after the optimizer step."""
        if self.stage not in (1, 2) or self.world == 1:
            return
        works = [dist.all_gather_single(u.full, u.own(u.full), group=self.state.gather_group, async_op=True)
                 for u in self.units if u.numel]
        for work in works:
            work.wait()

    def full_grads(self) -> list[torch.Tensor]:
        """Every trainable parameter's whole reduced gradient (a copy), in unit order. At stages 2
        and 3 a collective: every rank must call it."""
        out = []
        for u in self.units:
            if self.stage <= 1:
                whole = self.unit_grad(u.index)
            else:
                whole = torch.empty(u.padded, dtype=self.grad_dtype, device=self.state.device)
                dist.all_gather_single(whole, self.shard_grad(u.index), group=self.state.gather_group)
            out += [t.clone() for t in u.slices(whole)]
        return out

    def full_params(self) -> list[torch.Tensor]:
        """Every trainable parameter's value (a copy), in unit order; at stage 3 a collective."""
        out = []
        for u in self.units:
            whole = u.full
            if u.shard is not None:
                whole = torch.empty(u.padded, dtype=u.shard.dtype, device=u.shard.device)
                dist.all_gather_single(whole, u.shard, group=self.state.gather_group)
            out += [t.detach().clone() for t in u.slices(whole)]
        return out
