"""Carry out a plan on torch.distributed: process groups, Ulysses attention, checkpoint
switches, the step runner on FSDP2. Never solves: plans come from dcp.planner (or anywhere else)."""

from dcp.executor.batch import PackedBatch, pack_microbatch
from dcp.executor.checkpoint import CheckpointSwitches
from dcp.executor.executor import Executor, MicroBatchStats, StepStats, default_forward
from dcp.executor.optim import executor_optimizer, held_bytes
from dcp.executor.parallel_state import ParallelState, aligned_blocks
from dcp.executor.plan_check import ExecutorError, agree_on_plan, broadcast_plan, check_plan
from dcp.executor.run_checkpoint import Checkpointer, CheckpointError, Resumed
from dcp.executor.run_checkpoint_state import run_digest
from dcp.executor.ulysses import SPContext, UlyssesAttention, install_ulysses

__all__ = [
    "CheckpointError", "CheckpointSwitches", "Checkpointer", "Executor", "ExecutorError", "MicroBatchStats", "PackedBatch",
    "ParallelState", "SPContext", "StepStats", "UlyssesAttention", "agree_on_plan", "aligned_blocks", "broadcast_plan",
    "check_plan", "default_forward", "executor_optimizer", "held_bytes", "install_ulysses", "pack_microbatch", "Resumed",
    "run_digest",
]
