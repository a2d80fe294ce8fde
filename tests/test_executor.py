"""Executor on one process (gloo, world of 1): checkpointing recomputes, stats, clear errors."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from dcp.costmodel import attention_pairs, load_model
from dcp.executor import Executor, ExecutorError, ParallelState, aligned_blocks, default_forward
from dcp.executor.reference import manual_plan, reference_step, relative_grad_diff
from dcp.models import PackedSeqs, attention, build_model, lm_loss, mse_loss, sample_tensors
from dcp.planner import Sample

LLAMA = load_model("tiny-llama")
STDIT = load_model("tiny-stdit")


def loss_fn_for(spec):  # noqa: ANN001, ANN201 - test helper
    if spec.attention == "spatial_temporal":
        return lambda out, b: mse_loss(out, b["target"], b.valid)
    return lambda out, b: lm_loss(out, b["labels"])


def make_batch(spec, lengths, frames=None):  # noqa: ANN001, ANN201 - test helper
    frames = frames or [1] * len(lengths)
    batch = [Sample(i, n, attention_pairs(spec.attention, n, f), f) for i, (n, f) in enumerate(zip(lengths, frames, strict=True))]
    return batch, {s.id: sample_tensors(spec, s, dtype=torch.float64) for s in batch}


def test_aligned_blocks_and_state_validation(state: ParallelState) -> None:
    assert aligned_blocks(1) == []
    assert aligned_blocks(4) == [(0, 2), (2, 2), (0, 4)]
    assert aligned_blocks(6) == [(0, 2), (2, 2), (4, 2), (0, 4)]
    assert state.group(0, 1) is None
    with pytest.raises(ValueError, match="missing for blocks"):
        ParallelState(4, 0, 4, torch.device("cpu"), {})
    with pytest.raises(ValueError, match="outside a world"):
        ParallelState(1, 1, 1, torch.device("cpu"), {})
    with pytest.raises(ValueError, match="aligned powers of two"):
        state.group(1, 2)


@pytest.mark.parametrize("spec", [LLAMA, STDIT], ids=["llama", "stdit"])
def test_checkpointing_recomputes_r_layers(state: ParallelState, spec) -> None:  # noqa: ANN001
    """r checkpointed layers add exactly r layers' forward FLOPs (counted, not timed)."""
    frames = [1, 1] if spec.attention != "spatial_temporal" else [2, 3]
    batch, tensors = make_batch(spec, [8, 12], frames)
    model = build_model(spec, dtype=torch.float64, seed=0)
    seqs = PackedSeqs.pack([8, 12], frames)
    with FlopCounterMode(display=False) as layer_count, torch.no_grad():  # before FSDP2 takes the layers
        model.layers[0](torch.randn(seqs.total, spec.hidden, dtype=torch.float64), seqs)
    layer_flops = layer_count.get_total_flops()
    assert layer_flops > 0
    executor = Executor(model, state)

    def added_flops() -> list[int]:
        totals = []
        for r in range(spec.num_layers + 1):
            plan = manual_plan(batch, 1, spec.num_layers, [(0, 1, [([0, 1], r)])])
            with FlopCounterMode(display=False) as count:
                executor.step(plan, tensors, loss_fn_for(spec))
            totals.append(count.get_total_flops())
        return [t - totals[0] for t in totals]

    with torch.utils.checkpoint.set_checkpoint_early_stop(False):
        assert added_flops() == [r * layer_flops for r in range(spec.num_layers + 1)]
    # torch's default stops recomputing once the last saved activation is rebuilt: the layer's
    # final MLP projection (its output is not saved) is skipped; still exactly linear in r.
    skipped = 2 * seqs.total * spec.hidden * spec.ffn_hidden
    assert added_flops() == [r * (layer_flops - skipped) for r in range(spec.num_layers + 1)]


def test_step_equals_reference_and_reports_times(state: ParallelState) -> None:
    batch, tensors = make_batch(LLAMA, [5, 9, 3, 12])
    model = build_model(LLAMA, dtype=torch.float64, seed=0)
    ref = copy.deepcopy(model)  # before the executor swaps attention and installs switches
    executor = Executor(model, state)
    plan = manual_plan(batch, 1, 2, [(0, 1, [([0, 1], 2), ([2], 0), ([3], 1)])])
    attention._RAN.add("a kernel run before the step")
    stats = executor.step(plan, tensors, loss_fn_for(LLAMA))
    ref_loss = reference_step(ref, batch, tensors, loss_fn_for(LLAMA), default_forward)
    assert relative_grad_diff(list(model.parameters()), list(ref.parameters())) < 1e-12
    assert stats.loss == pytest.approx(ref_loss, rel=1e-12)
    assert stats.loss_tokens == sum(n - 1 for n in [5, 9, 3, 12])  # the last token of a sample has no label
    assert [(m.index, m.samples, m.tokens, m.ckpt_layers) for m in stats.microbatches] == [
        (0, 2, 14, 2), (1, 1, 3, 0), (2, 1, 12, 1)]
    assert all(m.measured_s > 0 for m in stats.microbatches)
    # CPU time beside wall time: every micro-batch spends some, and the step's window holds every
    # micro-batch's. (No upper bound from the wall time: the process's other threads, gloo's and
    # autograd's, run beside the measured one, so it depends on the machine's load.)
    assert all(m.cpu_s > 0 for m in stats.microbatches)
    assert stats.cpu_step_s >= sum(m.cpu_s for m in stats.microbatches)
    assert [m.predicted_s for m in stats.microbatches] == [mb.time_s for mb in plan.groups[0].microbatches]
    assert stats.predicted_step_s == plan.step_time_s and stats.measured_step_s > 0
    # The kernel its attention ran, and only this step's: on a CPU, SDPA once per sample.
    assert stats.attention_kernels == ("sdpa per sample",)


def test_bf16_autocast_keeps_fp32_gradients(state: ParallelState) -> None:
    batch, tensors = make_batch(LLAMA, [6, 7])
    model = build_model(LLAMA, seed=0)
    ref = copy.deepcopy(model)
    executor = Executor(model, state, recipe="autocast-bf16")
    executor.step(manual_plan(batch, 1, 2, [(0, 1, [([0, 1], 1)])]), tensors, loss_fn_for(LLAMA))
    reference_step(ref, batch, tensors, loss_fn_for(LLAMA), default_forward)
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())
    assert relative_grad_diff(list(model.parameters()), list(ref.parameters())) < 0.1  # bf16 round-off


def test_bad_inputs_raise_clear_errors(state: ParallelState) -> None:
    batch, tensors = make_batch(LLAMA, [5, 9])
    executor = Executor(build_model(LLAMA, dtype=torch.float64, seed=0), state)
    loss_fn = loss_fn_for(LLAMA)
    good = manual_plan(batch, 1, 2, [(0, 1, [([0, 1], 0)])])
    with pytest.raises(ExecutorError, match="plan is for 2 GPUs but this job has 1 ranks"):
        executor.step(dataclasses.replace(good, num_gpus=2), tensors, loss_fn)
    with pytest.raises(ExecutorError, match="rank 0: sample 1 is in the plan but missing"):
        executor.step(good, {0: tensors[0]}, loss_fn)
    with pytest.raises(ExecutorError, match="rank 0: sample 0: tensor 'inputs' has 4 rows"):
        executor.step(good, {**tensors, 0: {k: v[:4] for k, v in tensors[0].items()}}, loss_fn)
    twice = copy.deepcopy(good)
    twice.groups[0].microbatches[0].samples = [0, 1, 1]
    with pytest.raises(ExecutorError, match="does not validate: sample 1 runs 2 times"):
        executor.step(twice, tensors, loss_fn)
    with pytest.raises(ExecutorError, match="model of 3 layers"):
        executor.step(dataclasses.replace(good, num_layers=3), tensors, loss_fn)
    executor.step(good, tensors, loss_fn)  # still usable after refusing bad steps
