"""dcp.launch on one process: the shared run options and the planned batch stream."""

from __future__ import annotations

import argparse

import pytest
import torch

from dcp.costmodel import load_model
from dcp.executor import ParallelState, StepStats
from dcp.launch import RunOptions, planned_batches, step_summary


def test_run_options_round_trip_through_argparse() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny-llama")  # a script's own option is left alone
    RunOptions.add_arguments(parser)
    assert RunOptions.from_args(parser.parse_args([])) == RunOptions()
    args = parser.parse_args(["--global-batch", "8", "--memory-gb", "0.003", "--check-grads", "--strategy", "packed"])
    assert RunOptions.from_args(args) == RunOptions(global_batch=8, memory_gb=0.003, check_grads=True,
                                                    strategy="packed")
    with pytest.raises(ValueError, match="memory per rank must be a positive number of GB, got 0"):
        RunOptions(memory_gb=0)
    with pytest.raises(ValueError, match="unknown strategy 'magic'"):
        RunOptions(strategy="magic")


def test_planned_batches_are_planned_for_this_job() -> None:
    state = ParallelState(world_size=1, rank=0, gpus_per_node=1, device=torch.device("cpu"), groups={})
    sampler = planned_batches(load_model("tiny-llama"), state, RunOptions(global_batch=4, memory_gb=0.05))
    with sampler:
        planned = next(iter(sampler))
    plan = planned.plan
    assert (plan.num_gpus, plan.gpus_per_node, len(plan.samples)) == (1, 1, 4)
    assert (plan.strategy, plan.memory_limit_bytes) == ("dcp-greedy", 50e6)
    assert sorted(planned.local_samples(0)) == sorted(planned.sample_ids)
    stats = StepStats(loss=1.5, loss_tokens=42, predicted_step_s=plan.step_time_s, measured_step_s=0.25,
                      grad_sync_s=0.0, cpu_step_s=0.125)
    line = step_summary(7, plan, stats)
    assert line.startswith("step   7 loss 1.5000 tokens    42 groups [sp1:")
    assert line.endswith("measured   250.00 ms (cpu 125.00 ms)")
