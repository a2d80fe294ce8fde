"""`Executor(overlap=False)`: the gradient reductions start only after the last micro-batch (to
measure what overlapping them with the backward saves); the gradients must be the same."""

from __future__ import annotations

import copy

import torch
from dist_helpers import llama_spec, random_case, run_ranks

LAYOUTS = [[(0, 2), (2, 1), (3, 1)], [(0, 1), (1, 1), (2, 2)]]


def overlap_worker(rank: int, world: int) -> list[tuple[float, float]]:
    """Two executors on copies of one float64 model, `overlap` on and off, the same random plans
    (several micro-batches per group, SP 1 and 2); per step: the largest gradient difference
    between them, and (rank 0) the non-overlapped one's from single-process training."""
    from dcp.executor import Executor, ParallelState, default_forward
    from dcp.executor.reference import reference_step, relative_grad_diff
    from dcp.models import build_model, lm_loss, reference_attention, sample_tensors

    spec = llama_spec()
    state = ParallelState.create(timeout_s=30)
    model = build_model(spec, dtype=torch.float64, seed=0)
    serial, ref = copy.deepcopy(model), copy.deepcopy(model)
    for m in ref.modules():
        if hasattr(m, "attn_fn"):
            m.attn_fn = reference_attention
    overlapped, plain = Executor(model, state), Executor(serial, state, overlap=False)

    def loss_fn(o, b):  # noqa: ANN001, ANN202
        return lm_loss(o, b["labels"])

    out = []
    for step, layout in enumerate(LAYOUTS):
        plan, batch = random_case(spec, 100 + step, layout, microbatches=[2] * len(layout))
        tensors = {s.id: sample_tensors(spec, s, seed=step, dtype=torch.float64) for s in batch}
        for p in (*model.parameters(), *serial.parameters()):
            p.grad = None
        a = overlapped.step(plan, tensors, loss_fn)
        b = plain.step(plan, tensors, loss_fn)
        assert a.loss == b.loss
        between = max((x.grad - y.grad).abs().max().item() for x, y in zip(model.parameters(), serial.parameters(),
                                                                           strict=True))
        to_ref = 0.0
        if rank == 0:
            ref.zero_grad(set_to_none=True)
            reference_step(ref, batch, tensors, loss_fn, default_forward)
            to_ref = relative_grad_diff(list(serial.parameters()), list(ref.parameters()))
        out.append((between, to_ref))
    return out


def test_reductions_after_the_last_microbatch_give_the_same_gradients() -> None:
    results = run_ranks(overlap_worker, 4, deadline_s=150)
    assert all(between <= 1e-12 for rank in results for between, _ in rank)
    assert all(to_ref <= 1e-10 for _, to_ref in results[0])
