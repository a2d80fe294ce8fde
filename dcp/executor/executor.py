"""The step runner: carry out this rank's part of a plan on a model sharded by torch FSDP2.

    executor = Executor(model, ParallelState.create(), zero_stage=2)
    optimizer = executor_optimizer(executor, lr=...)   # plain torch AdamW over the DTensor parameters
    stats = executor.step(plan, samples, loss_fn)       # gradients reduced and normalized in .grad
    optimizer.step(); optimizer.zero_grad()

Every rank runs its group's micro-batches one after another (in a multi-phase plan, its group of
each phase in turn, gradients accumulating across them): forward and backward with Ulysses (and
ring) attention in the group and the first `ckpt_layers` layers checkpointed, the loss a plain sum
over its shard's loss tokens. FSDP2 (dcp.executor.fsdp) gathers the parameters and reduces the
gradients over the world in the settings of the ZeRO stage, summing them; the executor then
divides them by the global loss-token count. At stage 3 every rank runs the plan's micro-batch
slots in lockstep (empty passes where its group has fewer; single-layout plans only). Whatever
the plan and the stage, the result equals single-process training on the same global batch with
a per-token mean loss.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from dcp.costmodel.precision import PrecisionRecipe, get_recipe
from dcp.costmodel.zero import ZERO_STAGES
from dcp.data.local import local_samples
from dcp.executor import fsdp
from dcp.executor.batch import (
    PackedBatch,
    SampleTensors,
    check_sample_tensors,
    one_token_sample,
    pack_microbatch,
    sample_template,
)
from dcp.executor.checkpoint import CheckpointSwitches
from dcp.executor.parallel_state import ParallelState
from dcp.executor.plan_check import ExecutorError, agree_on_plan, check_plan
from dcp.executor.ring_comm import ring_peers
from dcp.executor.ulysses import SPContext, install_ulysses
from dcp.models.attention import kernels_run
from dcp.models.losses import IGNORE_INDEX
from dcp.models.precision import check_param_dtypes, forward_autocast, recipe_for_model
from dcp.planner.plan import Group, MicroBatch, Plan
from dcp.planner.sample import Sample

LossFn = Callable[[torch.Tensor, PackedBatch], tuple[torch.Tensor, torch.Tensor]]
"""(model output, packed batch) -> (loss summed over the shard's loss tokens, their count)."""
ForwardFn = Callable[[nn.Module, PackedBatch], torch.Tensor]


def default_forward(model: nn.Module, batch: PackedBatch) -> torch.Tensor:
    """model(inputs, seqs[, cond]): the reference models' signature."""
    if "cond" in batch:
        return model(batch["inputs"], batch.seqs, batch["cond"])
    return model(batch["inputs"], batch.seqs)


@dataclass(frozen=True)
class MicroBatchStats:
    """One micro-batch as planned and as measured on this rank."""

    group: int
    index: int
    sp: int
    samples: int
    tokens: int
    ckpt_layers: int
    predicted_s: float
    measured_s: float
    predicted_memory_bytes: float = 0.0
    """The plan's memory of the micro-batch (the cost model's, per GPU)."""
    peak_memory_bytes: int | None = None
    """torch.cuda.max_memory_allocated during the micro-batch on this rank; None on a CPU."""
    cpu_s: float = 0.0
    """This rank's process CPU time over the micro-batch (time.process_time, every thread of the
    process), beside `measured_s`, its wall time. On a CPU with one torch thread it is the
    micro-batch's own work: it leaves out the waits for peers and the time other processes held
    the cores, so a `measured_s` well above it reads as contention, not as a slow micro-batch.
    On CUDA it is the host's launch work."""


@dataclass(frozen=True)
class StepStats:
    """What a step did: the global mean loss and planned versus measured times."""

    loss: float
    """Global batch loss per loss token (identical on every rank)."""
    loss_tokens: int
    predicted_step_s: float
    measured_step_s: float
    """This rank's wall time from the start of step() to reduced gradients."""
    grad_sync_s: float
    """This rank's time from its last micro-batch to reduced gradients (the reductions not hidden
    under that micro-batch's backward, and the wait for slower groups)."""
    microbatches: list[MicroBatchStats] = field(default_factory=list)
    """This rank's groups' micro-batches, in phase order (every group's with gather_stats=True)."""
    cpu_step_s: float = 0.0
    """This rank's process CPU time over the same span as `measured_step_s` (see
    `MicroBatchStats.cpu_s`)."""
    attention_kernels: tuple[str, ...] = ()
    """The attention kernels this rank's micro-batches ran (`dcp.models.attention.kernels_run`
    names); empty when the model's attention does not go through dcp's fast path."""


class Executor:
    """Runs plans on one model replica per rank. Build once; call step() every training step."""

    def __init__(self, model: nn.Module, state: ParallelState, *, layers: Sequence[nn.Module] | None = None,
                 heads: tuple[int, int] | None = None, forward_fn: ForwardFn = default_forward,
                 per_sample_keys: Sequence[str] = ("cond",), pad_values: Mapping[str, float] | None = None,
                 recipe: str | PrecisionRecipe = "auto", zero_stage: int = 1, shard_group: int | None = None,
                 sync_params: bool = True, check_agreement: bool = True, gather_stats: bool = False) -> None:
        """`layers`: the transformer layers (default `model.layers`), whose first r are checkpointed;
        `heads`: (heads, kv_heads), read from the attention modules when None; `pad_values`: fill
        of pad tokens per tensor name (labels are padded with -100 so pads carry no loss);
        `recipe`: the precision recipe (dcp.costmodel.precision: bf16, autocast-bf16, fp32) the
        cost model prices; the model's parameters must be in its parameter dtype. "auto" reads it
        from them: bf16 -> bf16, fp32 -> autocast-bf16 on CUDA and fp32 elsewhere. `zero_stage`
        (0-3): replicated (0), gradients and optimizer state sharded (1 and 2: FSDP2 always
        reduce-scatters, so 1 is 2), parameters too (3), as `TrainingSetup.zero_stage` prices;
        `shard_group`: ranks a parameter is sharded over (default the world; fewer: HSDP,
        replicated across the groups). A model already wrapped with `fully_shard` (each layer,
        then the root) keeps its wrapping and mesh. `sync_params`: every rank starts from rank
        0's values (an unwrapped model only)."""
        if zero_stage not in ZERO_STAGES:
            raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {zero_stage!r}")
        self.model, self.state, self.zero_stage = model, state, zero_stage
        self.forward_fn, self.per_sample_keys = forward_fn, tuple(per_sample_keys)
        self.pad_values = {"labels": IGNORE_INDEX, **(pad_values or {})}
        self.recipe = recipe_for_model(model, state.device.type) if recipe == "auto" else get_recipe(recipe)
        check_param_dtypes(model, self.recipe)
        self.check_agreement, self.gather_stats = check_agreement, gather_stats
        layers = list(layers if layers is not None else getattr(model, "layers", []))
        if not layers:
            raise ValueError("the model has no `layers`; pass the transformer layers to checkpoint")
        self.mesh = fsdp.shard_model(model, layers, state, self.recipe, zero_stage, shard_group, sync_params)
        self.optimizer: torch.optim.Optimizer | None = None
        """The optimizer `executor_optimizer` made for this executor (None until then)."""
        self.switches = CheckpointSwitches(layers)
        self.ctx = SPContext()
        attn_modules = install_ulysses(model, self.ctx)
        if heads is None and attn_modules and all(hasattr(m, "heads") for m in attn_modules):
            heads = (min(m.heads for m in attn_modules), min(m.kv_heads for m in attn_modules))
        self.heads = heads
        self._template = None  # a sample's tensor names, dtypes and shapes: the empty pass's input

    # -- one step ------------------------------------------------------------------------------
    def step(self, plan: Plan, samples: Mapping[int, SampleTensors], loss_fn: LossFn) -> StepStats:
        """Run this rank's part of `plan` on `samples` (sample id -> tensors; at least those of this
        rank's groups) and leave the reduced, normalized gradients in `.grad` (overwritten)."""
        start, cpu_start = time.perf_counter(), time.process_time()
        kernels_run()  # forget kernels run before this step
        state = self.state
        # Every check before the first collective, and with check_agreement every rank learns of
        # any rank's failure in the same all-gather: one bad plan or missing sample anywhere stops
        # all ranks with the same error, instead of leaving the others waiting in a collective.
        try:
            check_plan(plan, state, len(self.switches.layers), self.heads, self.zero_stage)
            error = check_sample_tensors(local_samples(plan, state.rank), plan.sample_map(), samples,
                                         self.per_sample_keys)
        except ExecutorError as e:
            error = str(e)
        template = sample_template(samples)
        if self.check_agreement:  # a rank without samples learns the empty pass's input here
            templates = agree_on_plan(plan, state, error, template)
            template = template or next((t for t in templates if t is not None), None)
        elif error:
            raise ExecutorError(error)
        self._template = template or self._template
        specs = plan.sample_map()
        self.model.zero_grad(set_to_none=True)  # the step's gradients overwrite, never add to, the last
        loss_sum = torch.zeros((), dtype=torch.float64, device=state.device)
        loss_tokens = torch.zeros((), dtype=torch.float64, device=state.device)
        # (group, index, mb, begin, end, peak, CPU seconds)
        runs: list[tuple[int, int, MicroBatch, Mark, Mark, int | None, float]] = []
        cuda = state.device.type == "cuda"
        # Phase by phase: this rank's group of each phase, its micro-batches one after another
        # (stage 3: every slot of the plan, empty passes past its own). No barrier between
        # phases: a group's first collective waits for its last member.
        if plan.num_phases > 1:
            fsdp.gather_all(self.model)
        try:
            for run in fsdp.passes(plan, state.rank, self.zero_stage):
                fsdp.set_sync(self.model, run.sync)
                if run.microbatch is None:
                    self._empty_pass(loss_fn)
                    continue
                mb, group = run.microbatch, run.group
                self._enter_group(group)
                if cuda:  # the allocator's own count, kept on the host: no sync needed
                    torch.cuda.reset_peak_memory_stats(state.device)
                begin, cpu_begin = _mark(state.device), time.process_time()
                batch = pack_microbatch(mb.samples, specs, samples, sp_size=group.sp,
                                        sp_rank=state.rank - group.ranks[0], device=state.device,
                                        per_sample_keys=self.per_sample_keys, pad_values=self.pad_values,
                                        ring=group.ring)
                self.switches.set(mb.ckpt_layers)
                with forward_autocast(self.recipe, state.device.type):
                    out = self.forward_fn(self.model, batch)
                    mb_loss, mb_tokens = loss_fn(out, batch)
                mb_loss.backward()
                end, cpu_s = _mark(state.device), time.process_time() - cpu_begin
                peak = torch.cuda.max_memory_allocated(state.device) if cuda else None
                loss_sum += mb_loss.detach().double()
                loss_tokens += mb_tokens.detach().double() if torch.is_tensor(mb_tokens) else float(mb_tokens)
                runs.append((run.group_index, run.index, mb, begin, end, peak, cpu_s))
        finally:
            self._enter_group(None)
        sync_start = time.perf_counter()
        total_loss, total_tokens = self._normalize(loss_sum, loss_tokens)
        now, cpu_now = time.perf_counter(), time.process_time()
        # Read the marks only now: on CUDA that waits for the events, which must not delay
        # launching the all-reduce.
        stats = [MicroBatchStats(gi, mi, plan.groups[gi].sp, len(mb.samples), sum(specs[i].tokens for i in mb.samples),
                                 mb.ckpt_layers, mb.time_s, _seconds(begin, end), mb.memory_bytes, peak, cpu_s)
                 for gi, mi, mb, begin, end, peak, cpu_s in runs]
        if self.gather_stats and state.world_size > 1:
            stats = self._gather(stats)
        return StepStats(total_loss / total_tokens, round(total_tokens), plan.step_time_s, now - start,
                         now - sync_start, stats, cpu_now - cpu_start, kernels_run())

    def _empty_pass(self, loss_fn: LossFn) -> None:
        """A pass without a micro-batch: one token through the whole model, its loss times zero,
        so this rank joins the pass's gathers and reductions with a zero contribution."""
        if self._template is None:
            raise ExecutorError("an empty pass needs one sample's tensor names and shapes; this rank has no "
                                "samples and check_agreement=False: pass check_agreement=True")
        self._enter_group(None)  # no SP: alone
        tensors = one_token_sample(self._template, self.pad_values)
        spec = {-1: Sample(-1, 1, 1)}
        batch = pack_microbatch([-1], spec, {-1: tensors}, sp_size=1, sp_rank=0, device=self.state.device,
                                per_sample_keys=self.per_sample_keys, pad_values=self.pad_values)
        self.switches.set(0)
        with forward_autocast(self.recipe, self.state.device.type):
            loss, _ = loss_fn(self.forward_fn(self.model, batch), batch)
        (loss * 0).backward()

    def _normalize(self, loss_sum: torch.Tensor, loss_tokens: torch.Tensor) -> tuple[float, float]:
        """All-reduce the loss sum and token count and divide the summed gradients by the count.

        Ranks back-propagated un-normalized loss sums and FSDP2 summed them (divide factor 1):
        dividing by the global loss-token count afterwards equals normalizing each rank's loss
        by it beforehand."""
        scalars = torch.stack([loss_sum.double(), loss_tokens.double()]).to(self.state.device)
        if self.state.world_size > 1:
            dist.all_reduce(scalars)
        total_loss, total_tokens = scalars.tolist()
        if total_tokens <= 0:
            raise ValueError("the global batch has no loss tokens: nothing to normalize the gradient by")
        with torch.no_grad():
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.div_(total_tokens)
        return total_loss, total_tokens

    def full_grads(self) -> list[torch.Tensor]:
        """Every trainable parameter's whole gradient (zeros where none), in `model.parameters()`
        order. A collective: every rank calls it."""
        return [fsdp.full_tensor(p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
                for p in self.model.parameters() if p.requires_grad]

    def full_params(self) -> list[torch.Tensor]:
        """Every trainable parameter's whole value, in `model.parameters()` order (a collective)."""
        return [fsdp.full_tensor(p.detach()).clone() for p in self.model.parameters() if p.requires_grad]

    def _enter_group(self, group: Group | None) -> None:
        """Point the SP context at this rank's Ulysses group (its u consecutive ranks) and ring, or
        at this rank alone (None: no SP)."""
        if group is None:
            self.ctx.group, self.ctx.size, self.ctx.rank, self.ctx.ring = None, 1, 0, None
            return
        sp_rank = self.state.rank - group.ranks[0]
        u = group.ulysses
        self.ctx.group = self.state.group(group.ranks[0] + sp_rank // u * u, u)
        self.ctx.size, self.ctx.rank = group.sp, sp_rank
        self.ctx.ring = ring_peers(group.ranks[0], u, group.ring, sp_rank) if group.ring > 1 else None

    def _gather(self, stats: list[MicroBatchStats]) -> list[MicroBatchStats]:
        """Every group's micro-batch stats, from the first rank of each group."""
        everyone: list[list[MicroBatchStats] | None] = [None] * self.state.world_size
        dist.all_gather_object(everyone, stats)
        first: dict[tuple[int, int], MicroBatchStats] = {}
        for s in (s for rank_stats in everyone for s in rank_stats or []):
            first.setdefault((s.group, s.index), s)
        return list(first.values())


Mark = float | torch.cuda.Event
"""A point in a rank's time: perf_counter on a CPU, an event recorded on the stream on CUDA."""


def _mark(device: torch.device) -> Mark:
    if device.type != "cuda":
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _seconds(begin: Mark, end: Mark) -> float:
    """Seconds between two marks (on CUDA: waits for the later event; read after the step's sync)."""
    if isinstance(begin, float):
        return end - begin
    end.synchronize()
    return begin.elapsed_time(end) / 1e3
