"""Starting a training job under torchrun: what every training script shares before its model.

    parser = argparse.ArgumentParser(); RunOptions.add_arguments(parser)
    options = RunOptions.from_args(parser.parse_args())
    state = init_distributed()                        # process groups on nccl (GPUs) or gloo (CPU)
    sampler = planned_batches(spec, state, options)   # planned global batches for this cluster
    for step, planned in zip(range(options.steps), sampler): ...

    if __name__ == "__main__":
        run_main(main)    # bad input or no torchrun: one `Error:` line, exit status 1

Every rank draws and plans the same batches (dcp-greedy is deterministic; a time-limited ilp
solve is not, so with ilp broadcast rank 0's plan, `dcp.executor.broadcast_plan`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from dcp.cli_errors import end_job, rank
from dcp.costmodel import (
    DEFAULT_HARDWARE,
    RECIPES,
    Cluster,
    CostModel,
    HardwareProfile,
    ModelSpec,
    PrecisionRecipe,
    TrainingSetup,
    get_recipe,
    load_hardware,
)
from dcp.costmodel.hardware import CostModelError
from dcp.costmodel.presets import check_fitted_for
from dcp.data import GlobalBatchSampler, load_workload
from dcp.data.sampler import PlannedBatch
from dcp.executor import (
    Checkpointer,
    CheckpointError,
    ExecutorError,
    ParallelState,
    StepStats,
    run_digest,
)
from dcp.executor.run_checkpoint_files import partial_steps
from dcp.models.attention import PRICED_AS, attention_backend
from dcp.models.precision import torch_dtype
from dcp.planner import STRATEGIES
from dcp.planner.plan import Plan

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
"""What torchrun sets for every rank."""


class LaunchError(RuntimeError):
    """The script was not started the way it needs (e.g. without torchrun)."""


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """The data, planner and loop settings of a training run."""

    workload: str = "lognormal:mean=64,sigma=1,min=8,max=512"
    """`dcp.data.load_workload` spec of the sample lengths (scaled down for a tiny model)."""
    strategy: str = "dcp-greedy"
    """Planner strategy, a name of `dcp.planner.STRATEGIES`."""
    global_batch: int = 32
    """Samples per global batch."""
    memory_gb: float | None = None
    """Usable memory per rank for the planner in GB (1e9 bytes; small values force SP and
    checkpointing); None: the hardware profile's."""
    hardware: str | None = None
    """Hardware profile of the cost model; None: h200-sxm on GPUs, cpu otherwise."""
    steps: int = 20
    """Training steps."""
    lr: float = 3e-3
    """Learning rate."""
    seed: int = 0
    """Seed of the workload, the batches and the model's weights."""
    check_grads: bool = False
    """Compare every step's gradients with single-process training on the same global batch
    (in fp32: the recipe is fp32 whatever `precision` says)."""
    precision: str | None = None
    """Precision recipe (bf16, autocast-bf16, fp32) of the executor and the cost model; None:
    autocast-bf16 on GPUs, fp32 on CPU."""
    zero_stage: int = 1
    """ZeRO stage (0-3) of the executor and the planner's cost model: 1 shards the optimizer state,
    2 the gradients too, 3 the parameters too (per-layer gathers in lockstep slots)."""
    stats_out: str | None = None
    """Rank 0 appends each step's micro-batches (predicted and measured time and memory) to this
    JSON-lines file."""
    checkpoint_dir: str | None = None
    """Directory of the run's checkpoints (dcp.executor.Checkpointer); None: no checkpoints."""
    save_every: int = 0
    """Save a checkpoint every this many steps (0: never)."""
    resume: bool = False
    """Resume from the newest complete checkpoint in checkpoint_dir (start at step 0 if it holds none)."""

    def __post_init__(self) -> None:
        if self.global_batch <= 0:
            raise ValueError(f"global batch must be positive, got {self.global_batch}")
        if self.steps < 0:
            raise ValueError(f"steps must not be negative, got {self.steps}")
        if self.memory_gb is not None and not 0 < self.memory_gb < float("inf"):
            raise ValueError(f"memory per rank must be a positive number of GB, got {self.memory_gb}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; known: {', '.join(STRATEGIES)}")
        if self.precision is not None:
            get_recipe(self.precision)  # a clear error naming the known recipes
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        if self.save_every < 0:
            raise ValueError(f"--save-every must not be negative, got {self.save_every}")
        if (self.save_every or self.resume) and self.checkpoint_dir is None:
            raise ValueError("--save-every and --resume need --checkpoint-dir")

    def recipe(self, cuda: bool) -> PrecisionRecipe:
        """The run's precision recipe on a GPU (`cuda`) or CPU job."""
        if self.check_grads:
            return get_recipe("fp32")
        return get_recipe(self.precision or ("autocast-bf16" if cuda else "fp32"))

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One --option per field, with the field's default."""
        d = cls()
        parser.add_argument("--workload", default=d.workload,
                            help="dcp.data.load_workload spec of the sample lengths")
        parser.add_argument("--strategy", default=d.strategy, choices=list(STRATEGIES),
                            help="planner strategy (default %(default)s)")
        parser.add_argument("--global-batch", type=int, default=d.global_batch, help="samples per global batch")
        parser.add_argument("--memory-gb", type=float, default=d.memory_gb,
                            help="usable memory per rank for the planner in GB (small values force SP and "
                                 "checkpointing; default: the hardware profile's)")
        parser.add_argument("--hardware", default=d.hardware,
                            help="hardware profile for the cost model: a profile JSON from `dcp profile` (measured "
                                 "on this machine), or a preset (default: cpu, or h200-sxm on GPUs)")
        parser.add_argument("--steps", type=int, default=d.steps, help="training steps")
        parser.add_argument("--lr", type=float, default=d.lr, help="learning rate")
        parser.add_argument("--seed", type=int, default=d.seed, help="seed of data, batches and weights")
        parser.add_argument("--check-grads", action="store_true",
                            help="compare gradients with single-process training every step (fp32)")
        parser.add_argument("--precision", default=d.precision, choices=list(RECIPES),
                            help="precision recipe (default: autocast-bf16 on GPUs, fp32 on CPU)")
        parser.add_argument("--zero-stage", type=int, default=d.zero_stage, choices=[0, 1, 2, 3],
                            help="ZeRO stage: 1 optimizer state, 2 also gradients, 3 also parameters (default 1)")
        parser.add_argument("--stats-out", default=d.stats_out,
                            help="JSON-lines file for each step's micro-batches (time and memory, planned and measured)")
        parser.add_argument("--checkpoint-dir", default=d.checkpoint_dir, help="directory of the run's checkpoints")
        parser.add_argument("--save-every", type=int, default=d.save_every,
                            help="save a checkpoint every N steps (default 0: never)")
        parser.add_argument("--resume", action="store_true",
                            help="resume from the newest complete checkpoint in --checkpoint-dir")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunOptions:
        """The options from parsed arguments (other attributes of `args` are ignored)."""
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def init_distributed(timeout_s: float = 300.0) -> ParallelState:
    """Join the torchrun job: this rank's GPU from LOCAL_RANK, nccl on GPUs or gloo on CPU, and
    every aligned process group. `timeout_s` bounds every collective, so a dead rank ends the job
    with an error instead of a hang."""
    missing = [name for name in TORCHRUN_ENV if name not in os.environ]
    if missing:
        script = os.path.basename(sys.argv[0]) or "SCRIPT"
        raise LaunchError(f"not started by torchrun ({', '.join(missing)} unset): run "
                          f"`torchrun --nproc_per_node N {script} ...` (N=1 for one process)")
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=timeout_s))
    return ParallelState.create(timeout_s=timeout_s)


def shutdown_distributed() -> None:
    """Leave the job: a barrier, then destroy every process group. The barrier holds each rank
    until every rank is done with every collective and ring exchange; without it the first rank
    to finish tore down its gloo connections while a slower peer's transport threads still used
    them, and that peer aborted at exit (`terminate called without an active exception`, exit
    -6: about one launch in six of 8 gloo ranks) after every step had passed."""
    if not dist.is_initialized():
        return
    dist.barrier()
    dist.destroy_process_group()


def planned_batches(spec: ModelSpec, state: ParallelState, options: RunOptions) -> GlobalBatchSampler:
    """Global batches of the workload, each planned for this job's ranks with a cost model of
    `spec` on the hardware in the run's precision recipe and ZeRO stage (`options.recipe`), the
    ones the training script gives its executor and `executor_optimizer`."""
    cuda = state.device.type == "cuda"
    hardware = options.hardware or (DEFAULT_HARDWARE if cuda else "cpu")
    hw = load_hardware(hardware)
    check_fitted_for(hw, spec, hardware, spec.name)
    recipe = options.recipe(cuda)
    ran, _ = attention_backend(state.device, torch_dtype(get_recipe(recipe).compute_dtype))
    attention, warning = priced_attention(hardware, hw, ran)
    if state.rank == 0:
        print(pricing_line(hardware, hw, spec), flush=True)
        if warning:
            print(f"warning: {warning}", file=sys.stderr, flush=True)
    cluster = Cluster(num_gpus=state.world_size, gpus_per_node=state.gpus_per_node,
                      memory_bytes=options.memory_gb * 1e9 if options.memory_gb else hw.memory_bytes)
    training = TrainingSetup(precision=recipe, zero_stage=options.zero_stage, attention=attention)
    cm = CostModel(spec, hw, cluster, training)
    # Planned inline (workers=0): on a CPU job the ranks already use every core.
    return GlobalBatchSampler.from_workload(load_workload(options.workload, seed=options.seed), cm,
                                            batch_size=options.global_batch, strategy=options.strategy,
                                            seed=options.seed, workers=0)


def priced_attention(hardware: str, hw: HardwareProfile, ran: str) -> tuple[str | None, str | None]:
    """(`TrainingSetup.attention`, a warning or None) for plans whose attention runs the fast-path
    kernel `ran` (`dcp.models.attention.attention_backend`'s name): the profile's own rates when
    it measured that kernel (`dcp profile` records its name) or its default is that kernel, its
    curve for the kernel where it has one, else its default rates and a warning naming both: the
    planner prices the kernel the executor runs, or says that it cannot."""
    if ran == hw.attention_backend:
        return None, None
    name = PRICED_AS.get(ran)
    if name is not None:
        try:
            hw.attention_kernel(name)
            return name, None
        except CostModelError:
            pass
    default = hw.attention_backend or "default"
    return None, (f"attention runs {ran}, for which hardware profile {hardware} has no curve: its plans "
                  f"price attention as its {default} kernel (add the kernel to its attention_kernels)")


def pricing_line(hardware: str, hw: HardwareProfile, spec: ModelSpec) -> str:
    """Which profile priced the plans' predicted times, and how far to trust it: a fit measured
    for this model (with its held-out error), or a preset's datasheet rates (no fit: measure one)."""
    fit = hw.fits.get(spec.name)
    if fit is not None:
        error = "" if fit.heldout_mape is None else f", held-out error {fit.heldout_mape:.1%}"
        return f"predictions priced by hardware profile {hardware} ({hw.device}: fitted for {spec.name}{error})"
    return (f"predictions priced by hardware profile {hardware} ({hw.device}: no fit for {spec.name}, priced from "
            f"its datasheet rates; measure this machine with `dcp profile --model {spec.name} -o p.json` and pass "
            "--hardware p.json)")


def step_summary(step: int, plan: Plan, stats: StepStats) -> str:
    """One log line: loss, loss tokens, the plan's groups (SP layout: micro-batches; phases apart
    by " | "), predicted versus measured step time, and the rank's CPU time over the step beside it
    (a measured time well above the CPU time is contention or waiting, not compute)."""
    groups = " | ".join(" ".join(f"sp{g.layout}:{len(g.microbatches)}mb" for g in phase) for phase in plan.phases())
    return (f"step {step:3d} loss {stats.loss:.4f} tokens {stats.loss_tokens:5d} groups [{groups}] "
            f"predicted {stats.predicted_step_s * 1e3:8.2f} ms measured {stats.measured_step_s * 1e3:8.2f} ms "
            f"(cpu {stats.cpu_step_s * 1e3:.2f} ms)")


def write_step_stats(path: str, step: int, stats: StepStats) -> None:
    """Append one JSON line: the step's micro-batches as planned and as measured (wall time and
    the rank's CPU time beside it; memory: the plan's prediction and torch.cuda.max_memory_allocated,
    None on a CPU)."""
    rows = [dataclasses.asdict(m) for m in stats.microbatches]
    with open(path, "a") as f:
        f.write(json.dumps({"step": step, "loss": stats.loss, "predicted_step_s": stats.predicted_step_s,
                            "measured_step_s": stats.measured_step_s, "cpu_step_s": stats.cpu_step_s,
                            "attention_kernels": list(stats.attention_kernels), "microbatches": rows}) + "\n")
def lead_rank() -> bool:
    """Whether this process speaks for the job: rank 0 under torchrun, or a process on its own."""
    return rank() == 0


def fail(message: str) -> NoReturn:
    """End this rank with exit status 1, and `Error: message` on stderr from rank 0 only: the
    errors that reach here (bad arguments, a missing extra, a launch error, a plan error every rank
    agreed on in its all-gather) are the same on every rank, so one line says it for the job, and
    torchrun's summary shows it as rank 0's error (`dcp.cli_errors.end_job`)."""
    end_job(1, f"Error: {' '.join(message.split())}")


def open_checkpoints(options: RunOptions, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                     sampler: GlobalBatchSampler) -> tuple[Checkpointer | None, int]:
    """The run's Checkpointer (None without --checkpoint-dir; its digest from the sampler's cost
    model) and the step to start from: with --resume the newest complete checkpoint's, with the
    model, optimizer, sampler and RNG states restored; 0 when the directory holds no save at all
    (one holding only an incomplete save is an error)."""
    if options.checkpoint_dir is None:
        return None, 0
    cm = sampler.cost_model
    ckpt = Checkpointer(options.checkpoint_dir, digest=run_digest(model=cm.model, hardware=cm.hardware,
                                                                  zero_stage=cm.training.zero_stage,
                                                                  recipe=cm.training.recipe))
    if not options.resume:
        return ckpt, 0
    if ckpt.latest() is None and not partial_steps(ckpt.root):
        if lead_rank():
            print(f"no checkpoint in {options.checkpoint_dir}: starting at step 0", flush=True)
        return ckpt, 0
    resumed = ckpt.load(model, optimizer, sampler=sampler)
    if lead_rank():
        print(f"resumed from {resumed.path} (saved on {resumed.saved_world_size} rank{'s' * (resumed.saved_world_size != 1)}) at step {resumed.step}",
              flush=True)
    return ckpt, resumed.step


def maybe_save(ckpt: Checkpointer | None, options: RunOptions, steps_done: int, model: torch.nn.Module,
               optimizer: torch.optim.Optimizer, sampler: GlobalBatchSampler, planned: PlannedBatch) -> None:
    """Save after `steps_done` optimizer steps when --save-every says so; the sampler's state is
    the one after `planned` (the batch just trained)."""
    if ckpt is None or not options.save_every or steps_done % options.save_every:
        return
    path = ckpt.save(steps_done, model, optimizer, sampler_state=sampler.state_dict_after(planned))
    if lead_rank():
        print(f"saved checkpoint {path}", flush=True)


def run_main(main: Callable[[], None]) -> None:
    """Run a training script's `main`: a launch, input or plan error ends it with one `Error:` line
    on stderr (from rank 0 under torchrun, `fail`) and exit status 1 instead of a traceback."""
    try:
        main()
    except (LaunchError, ExecutorError, CheckpointError, ValueError) as e:
        fail(str(e))
