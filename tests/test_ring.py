"""Hybrid Ulysses x ring attention: the zigzag layout and the block merge on one process, then gloo
runs (4 and 8 ranks) whose float64 gradients under random plans mixing Ulysses-only and u x c groups
must equal single-process training to 1e-12, for the reference Llama (GQA) and an HF Llama."""

from __future__ import annotations

import copy
import dataclasses
import random

import pytest
import torch
from dist_helpers import check_grads, random_groups, run_ranks
from test_executor_dist import grads_worker, random_case

from dcp.costmodel import load_model
from dcp.executor.reference import manual_plan
from dcp.executor.ring_blocks import ReferenceBlocks, merge
from dcp.executor.ring_comm import ring_peers
from dcp.executor.ring_flash import FusedBlocks, ReferenceVarlen
from dcp.models import PackedSeqs, reference_attention
from dcp.models.attention import attention_mask
from dcp.planner import Sample

TOLERANCE = 1e-12
# (first rank, SP size[, ring degree]) per group, one layout per step: u x c groups with c in {2, 4}
# and u in {1, 2} beside Ulysses-only groups (SP 1, 2, 4; 4 and 8 over 4 KV heads replicate them).
FOUR_RANKS = [
    [(0, 4, 4)],                    # 1 x 4
    [(0, 4, 2)],                    # 2 x 2
    [(0, 2, 2), (2, 2)],            # 1 x 2 beside Ulysses 2
    [(0, 2, 2), (2, 1), (3, 1)],
    [(0, 4)],                       # Ulysses 4 over 4 KV heads
]
EIGHT_RANKS = [
    [(0, 8, 4)],                    # 2 x 4
    [(0, 4, 2), (4, 4, 4)],         # 2 x 2 beside 1 x 4
    [(0, 2, 2), (2, 2), (4, 4, 2)],
    [(0, 8)],                       # Ulysses 8: each of the 4 KV heads replicated twice
    [(0, 8, 2)],                    # 4 x 2
]


def llama_spec():  # noqa: ANN201
    # 8 heads over 4 KV heads: GQA; Ulysses 8 replicates each KV head on two ranks.
    return dataclasses.replace(load_model("tiny-llama"), heads=8, kv_heads=4)


# -- one process --------------------------------------------------------------------------------
def test_zigzag_layout_partitions_the_sequence_and_balances_causal_work() -> None:
    lengths, ulysses, ring = [13, 30, 5], 2, 4
    p = ulysses * ring
    shards = [PackedSeqs.pack(lengths, sp_size=p, sp_rank=r, ring=ring) for r in range(p)]
    total = shards[0].total
    assert total % (2 * p) == 0 and total - sum(lengths) == shards[0].num_pad < 2 * p
    order = shards[0].order()
    chunk = total // (2 * ring)
    # Ring rank j holds chunks j and 2c-1-j; its u ranks split them contiguously.
    for j in range(ring):
        want = [*range(j * chunk, (j + 1) * chunk), *range((2 * ring - 1 - j) * chunk, (2 * ring - j) * chunk)]
        assert order[j * 2 * chunk:(j + 1) * 2 * chunk].tolist() == want
    every = torch.cat([s.take(torch.arange(total)) for s in shards])
    assert sorted(every.tolist()) == list(range(total))
    full = PackedSeqs.pack(lengths, sp_size=p)
    for s in shards:
        assert torch.equal(s.positions(), s.take(full.positions_full()))
        assert torch.equal(s.valid(), s.take(torch.arange(total)) < sum(lengths))
    # One causal sample: every ring rank's queries see the same number of keys, up to the diagonal.
    one = PackedSeqs.pack([64], sp_size=ring, ring=ring)
    mask = attention_mask(one, "causal")
    rows = one.order().view(ring, -1)
    work = [int(mask[r].sum()) for r in rows]
    assert max(work) - min(work) == 0


def test_merged_blocks_equal_attention_over_all_keys() -> None:
    """Two key blocks merged by log-sum-exp give plain attention, output and gradients (GQA, packed,
    causal, a query row with no key in one block)."""
    torch.manual_seed(0)
    seqs = PackedSeqs.pack([7, 9])
    n = seqs.total
    q = torch.randn(n, 4, 8, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(n, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    want = reference_attention(q, k, v, seqs, "causal")
    mask = attention_mask(seqs, "causal")
    halves = [torch.arange(0, 10), torch.arange(10, n)]
    kernel = ReferenceBlocks()
    out = lse = None
    for keys in halves:
        o, lse_b = kernel.forward(q, k[keys], v[keys], mask[:, keys])
        out, lse = (o, lse_b) if out is None else merge(out, lse, o, lse_b)
    torch.testing.assert_close(out, want, rtol=1e-13, atol=1e-13)
    dout = torch.randn_like(want)
    grads = torch.autograd.grad(want, (q, k, v), dout)
    delta = (dout * out).sum(-1)
    dq = torch.zeros_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for keys in halves:
        dq_b, dk_b, dv_b = kernel.backward(q, k[keys], v[keys], dout, out, lse, delta, mask[:, keys])
        dq += dq_b
        dk[keys] += dk_b
        dv[keys] += dv_b
    for got, exp in zip((dq, dk, dv), grads, strict=True):
        torch.testing.assert_close(got, exp, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["causal", "full"])
def test_fused_kernel_blocks_equal_the_reference_blocks(kind: str) -> None:
    """Every (queries, block) pair of a ring of 4 over a packed micro-batch (a sample spanning
    chunks, short ones inside one, pads): the varlen sub-blocks the fused path runs give the
    reference's output, log-sum-exp and gradients (here on the varlen kernel's CPU stand-in)."""
    seqs = PackedSeqs.pack([37, 3, 11, 1], sp_size=4, sp_rank=0, ring=4).ring_view()
    n = seqs.total // 4
    gen = torch.Generator().manual_seed(1)
    fused, plain = FusedBlocks(ReferenceVarlen()), ReferenceBlocks()
    for mine in range(4):
        for source in range(4):
            q = torch.randn(n, 4, 8, generator=gen, dtype=torch.float64)
            k, v = (torch.randn(n, 2, 8, generator=gen, dtype=torch.float64) for _ in range(2))
            block, mask = fused.prepare(seqs, kind, mine, source, q.device), plain.prepare(seqs, kind, mine, source, q.device)
            out, lse = fused.forward(q, k, v, block)
            want_out, want_lse = plain.forward(q, k, v, mask)
            torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
            assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
            finite = torch.isfinite(want_lse)
            torch.testing.assert_close(lse[finite], want_lse[finite], rtol=1e-12, atol=1e-12)
            # Backward against a final output and log-sum-exp (here this block's alone, made finite).
            lse_all = torch.where(finite, want_lse, torch.zeros_like(want_lse))
            dout = torch.randn(n, 4, 8, generator=gen, dtype=torch.float64)
            delta = (dout * want_out).sum(-1)
            for got, exp in zip(fused.backward(q, k, v, dout, want_out, lse_all, delta, block),
                                plain.backward(q, k, v, dout, want_out, lse_all, delta, mask), strict=True):
                torch.testing.assert_close(got, exp, rtol=1e-12, atol=1e-12)


def test_ring_peers_stride_over_the_ulysses_ranks() -> None:
    # SP group of 8 at rank 8 as 2 x 4: Ulysses over (8, 9), (10, 11), ...; rings (8, 10, 12, 14), (9, ...).
    ring = ring_peers(8, 2, 4, 5)
    assert ring.peers == (9, 11, 13, 15) and ring.index == 2 and (ring.next, ring.prev) == (15, 11)
    assert [ring.source(s) for s in range(4)] == [2, 1, 0, 3]


# -- gloo ---------------------------------------------------------------------------------------
def _cases(spec, layouts, world: int, seed: int):  # noqa: ANN001, ANN202
    cases = [random_case(spec, seed + i, layout, world, gpus_per_node=4) for i, layout in enumerate(layouts)]
    mbs = [(g, mb) for plan, _ in cases for g in plan.groups for mb in g.microbatches]
    # What the cases are meant to cover, checked rather than hoped for.
    assert {(g.ulysses, g.ring) for g, _ in mbs if g.ring > 1} >= {(1, 2), (1, 4), (2, 2)}
    assert any(len(mb.samples) > 1 for g, mb in mbs if g.ring > 1), "no packed ring micro-batch"
    assert any(len(mb.samples) == 1 for g, mb in mbs if g.ring > 1), "no single-sample ring micro-batch"
    assert len({mb.ckpt_layers for g, mb in mbs if g.ring > 1}) > 1, "checkpointing is not mixed"
    return cases


def test_four_ranks_mixed_ulysses_and_ring_plans_equal_single_process() -> None:
    spec = llama_spec()
    cases = _cases(spec, FOUR_RANKS * 2, 4, 40)
    check_grads(run_ranks(grads_worker, 4, [(spec, cases)], 4, deadline_s=150), TOLERANCE)


def test_eight_ranks_mixed_ulysses_and_ring_plans_equal_single_process() -> None:
    spec = llama_spec()
    cases = _cases(spec, EIGHT_RANKS, 8, 80)
    check_grads(run_ranks(grads_worker, 8, [(spec, cases)], 4, deadline_s=150), TOLERANCE)


def float64_hf(model: torch.nn.Module) -> torch.nn.Module:
    """HF Llama computes RoPE's angles and RMSNorm in float32 whatever the model's dtype (down from
    float64 here), and float32 kernels round differently for rows at different offsets (packed or
    alone): ~1e-7 apart before dcp does anything. Run both in the model's own dtype, so the
    comparison sees dcp's arithmetic, not HF's float32 round-off."""
    for m in model.modules():
        if hasattr(m, "inv_freq") and hasattr(m, "attention_scaling"):
            def rope(x: torch.Tensor, position_ids: torch.Tensor, m: torch.nn.Module = m) -> tuple[torch.Tensor, ...]:
                freqs = position_ids[..., None].to(m.inv_freq.dtype) * m.inv_freq.to(x.device)
                emb = torch.cat((freqs, freqs), dim=-1)
                return (emb.cos() * m.attention_scaling).to(x.dtype), (emb.sin() * m.attention_scaling).to(x.dtype)
            m.forward = rope
        elif hasattr(m, "variance_epsilon") and hasattr(m, "weight"):
            def norm(x: torch.Tensor, m: torch.nn.Module = m) -> torch.Tensor:
                return m.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.variance_epsilon))
            m.forward = norm
    return model


def plain_float64_step(model: torch.nn.Module, input_ids: list[torch.Tensor]) -> float:
    """`plain_hf_step` with the loss in float64 (HF's loss function casts logits to float32): each
    sample alone through the model, next-token cross-entropy summed over tokens, divided by the
    batch's token count."""
    model.zero_grad(set_to_none=True)
    count = sum(len(ids) - 1 for ids in input_ids)
    total = 0.0
    for ids in input_ids:
        logits = model(input_ids=ids[None], use_cache=False).logits[0]
        loss = torch.nn.functional.cross_entropy(logits[:-1], ids[1:], reduction="sum") / count
        loss.backward()
        total += loss.item()
    return total


def hf_ring_worker(rank: int, world: int, cases: list) -> list[tuple[str, int, float, float]]:  # noqa: ANN001
    from test_hf import step_against, tiny_config, tiny_model

    from dcp.executor import ParallelState
    from dcp.executor.hf import hf_executor

    state = ParallelState.create(timeout_s=30)
    model = float64_hf(tiny_model(tiny_config("llama")))
    reference = float64_hf(copy.deepcopy(model))
    executor = hf_executor(model, state)
    return [("hf-llama", step, *step_against(rank, executor, model, reference, plain_float64_step, plan, batch,
                                            step, TOLERANCE))
            for step, (plan, batch) in enumerate(cases)]


def test_hf_llama_on_four_ranks_with_ring_plans_equals_plain_hf() -> None:
    pytest.importorskip("transformers")
    cases = []
    for step, layout in enumerate(FOUR_RANKS):
        rng = random.Random(step)
        batch = [Sample(100 * step + i, rng.randint(1, 19), 0) for i in range(rng.randint(2 * len(layout), 8))]
        cases.append((manual_plan(batch, 4, 2, random_groups(rng, [s.id for s in batch], layout, 2)), batch))
    assert {g.ring for plan, _ in cases for g in plan.groups} == {1, 2, 4}
    check_grads(run_ranks(hf_ring_worker, 4, cases, deadline_s=150), TOLERANCE, "plain HF")
