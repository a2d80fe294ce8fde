"""dcp.launch on one process: the shared run options and the planned batch stream."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch

from dcp.costmodel import load_hardware, load_model
from dcp.costmodel.hardware import AttentionKernel
from dcp.executor import ParallelState, StepStats
from dcp.launch import RunOptions, planned_batches, priced_attention, step_summary


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


def test_plans_price_the_attention_kernel_the_executor_runs() -> None:
    cpu, h100 = load_hardware("cpu"), load_hardware("h100-sxm")
    # A profile that measured the kernel (its name recorded as the profile's backend): its own rates.
    assert priced_attention("cpu", cpu, "sdpa per sample") == (None, None)
    # flash-attn's package and torch's varlen kernel are FlashAttention-2: the preset's fa2 curve,
    # which is its default, so the same rates.
    assert priced_attention("h100-sxm", h100, "flash-attn varlen") == ("fa2", None)
    assert priced_attention("h100-sxm", h100, "torch varlen_attn") == ("fa2", None)
    assert h100.attention_kernel("fa2") == h100.attention_kernel(None)
    # A kernel the profile has no curve for: its default rates, and a warning naming both.
    attention, warning = priced_attention("h100-sxm", h100, "sdpa per sample")
    assert attention is None
    assert "sdpa per sample" in warning and "h100-sxm" in warning and "flash-attn-2" in warning
    # Where the profile holds a curve under the kernel's name, that curve.
    sdpa = AttentionKernel(fwd_flops=1e14, fwd_pairs_per_token=0.0, bwd_flops=8e13, bwd_pairs_per_token=0.0)
    with_sdpa = dataclasses.replace(h100, attention_kernels={**h100.attention_kernels, "sdpa": sdpa})
    assert priced_attention("mine.json", with_sdpa, "sdpa per sample") == ("sdpa", None)
