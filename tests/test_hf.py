"""dcp on Hugging Face transformers models: one-process checks of dcp attention, and gloo runs
(2 and 4 ranks) whose gradients under mixed plans must equal plain single-process HF training:
each sample alone through the model with sdpa attention and `labels`, summed over tokens and
divided by the global batch's token count."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
from dist_helpers import check_grads, random_groups, run_ranks

from dcp.executor.batch import PackedBatch
from dcp.planner import Sample
from dcp.planner.plan import Plan

pytest.importorskip("transformers")

TOLERANCE = 1e-5
# (first rank, SP size) per group, one layout per step: SP 1, 2 and 4 mixed, an idle rank.
LAYOUTS = {
    2: [[(0, 2)], [(0, 1), (1, 1)], [(0, 1)]],
    4: [[(0, 2), (2, 1), (3, 1)], [(0, 4)], [(0, 1), (1, 1), (2, 2)], [(0, 2), (2, 1)]],
}


def tiny_config(kind: str, heads: int = 8, kv_heads: int = 4):  # noqa: ANN201 - a transformers config
    """A two-layer model of `kind` (llama, mistral, qwen2) with GQA that SP 4 can shard."""
    import transformers

    cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
           "qwen2": transformers.Qwen2Config}[kind]
    return cls(vocab_size=96, hidden_size=8 * heads, intermediate_size=48, num_hidden_layers=2,
               num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=64)


def tiny_model(config, seed: int = 0) -> torch.nn.Module:  # noqa: ANN001
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").double()


def token_ids(sample: Sample, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 7919 + sample.id)
    return torch.randint(vocab, (sample.tokens,), generator=g)


def random_case(world: int, step: int, num_layers: int) -> tuple[Plan, list[Sample]]:
    """A random plan over the step's layout: odd lengths (pads), several samples packed per
    micro-batch, 1-3 micro-batches per group, random checkpointed layers; same on every rank."""
    from dcp.executor.reference import manual_plan

    rng = random.Random(step)
    layout = LAYOUTS[world][step % len(LAYOUTS[world])]
    batch = [Sample(100 * step + i, rng.randint(1, 19), 0) for i in range(rng.randint(2 * len(layout), 8))]
    return manual_plan(batch, world, num_layers, random_groups(rng, [s.id for s in batch], layout, num_layers)), batch


# -- one process ----------------------------------------------------------------------------------
CallArgs = Callable[[PackedBatch], dict[str, Any]]


def packed_logits(model: torch.nn.Module, lengths: list[int],
                  call: CallArgs | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits of the samples packed as one sequence under dcp attention, plain HF's logits of
    each sample alone). `call`: the model's keyword arguments, HF style, instead of hf_forward."""
    from dcp.executor import SPContext, pack_microbatch
    from dcp.executor.hf import hf_forward, install_dcp_attention, lm_sample

    batch = [Sample(i, n, 0) for i, n in enumerate(lengths)]
    ids = {s.id: token_ids(s, model.config.vocab_size, 0) for s in batch}
    plain = torch.cat([model(input_ids=ids[s.id][None]).logits[0] for s in batch])
    install_dcp_attention(model, SPContext())
    packed = pack_microbatch([s.id for s in batch], {s.id: s for s in batch},
                             {i: lm_sample(x) for i, x in ids.items()}, sp_size=1, sp_rank=0,
                             device=torch.device("cpu"))
    if call is None:
        return hf_forward(model, packed), plain
    return model(input_ids=packed["input_ids"][None], **call(packed)).logits[0], plain


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_packed_samples_attend_apart_with_their_own_positions(kind: str) -> None:
    out, plain = packed_logits(tiny_model(tiny_config(kind)), [5, 1, 9])
    torch.testing.assert_close(out, plain, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("call", [
    lambda b: {"position_ids": b.seqs.positions()[None]},
    lambda b: {"position_ids": b.seqs.positions()[None], "cu_seq_lens_q": b.seqs.cu_seqlens()},
], ids=["position_ids", "cu_seq_lens"])
def test_hf_packing_conventions_give_the_same_attention(call: CallArgs) -> None:
    """Outside the executor, HF's own ways of describing a packed sequence work too."""
    out, plain = packed_logits(tiny_model(tiny_config("llama")), [4, 7, 2], call)
    torch.testing.assert_close(out, plain, rtol=1e-10, atol=1e-10)


def test_unsupported_inputs_are_refused_clearly() -> None:
    model = tiny_model(tiny_config("mistral"))
    model.config.sliding_window = 6
    with pytest.raises(ValueError, match="a sample of 9 tokens exceeds the model's sliding window of 6"):
        packed_logits(model, [5, 9])
    out, plain = packed_logits(tiny_model(tiny_config("mistral")), [5, 9])  # inside the window: plain causal
    torch.testing.assert_close(out, plain, rtol=1e-10, atol=1e-10)
    ids = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="call the model without attention_mask"):  # HF passes 4-D masks on
        model(input_ids=ids, attention_mask=torch.ones(1, 1, 4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="one packed sequence without a KV cache"):
        model(input_ids=ids.expand(2, 4))


def test_planner_is_told_the_sp_sizes_the_model_allows() -> None:
    """Ulysses alone where it divides the heads and KV heads; beyond, Ulysses over whole heads
    (KV heads replicated up to the query heads) with a ring over the rest, so every size runs."""
    from dcp.costmodel import Cluster, CostModel, TrainingSetup, load_hardware
    from dcp.executor.hf import allowed_sp_sizes
    from dcp.executor.hf_memory import measured_model_spec
    from dcp.planner.feasibility import allowed_sp_sizes as planner_sizes

    for heads, kv, ulysses, layouts in [
        (8, 4, [1, 2, 4], {8: ["8"]}),            # 8 over 4 KV heads: each replicated twice
        (8, 8, [1, 2, 4, 8], {8: ["8"]}),
        (6, 3, [1], {2: ["1x2"], 8: ["1x8"]}),     # 3 KV heads: no Ulysses degree above 1
        (12, 2, [1, 2], {4: ["4"], 8: ["4x2"]}),  # 12 heads: Ulysses up to 4, a ring beyond
    ]:
        config = tiny_config("llama", heads, kv)
        assert allowed_sp_sizes(config, 8, ulysses_only=True) == ulysses
        assert allowed_sp_sizes(config, 8) == [1, 2, 4, 8]
        spec = measured_model_spec(config, "fp32", bytes_per_element=4)
        assert (spec.num_layers, spec.hidden, spec.heads, spec.kv_heads, spec.ffn_hidden, spec.vocab) == \
            (2, 8 * heads, heads, kv, 48, 96)
        cm = CostModel(spec, load_hardware("cpu"), Cluster(num_gpus=8, gpus_per_node=8, memory_bytes=1e10),
                       TrainingSetup(precision="fp32"))
        assert planner_sizes(cm) == [1, 2, 4, 8]
        assert all([o.label for o in cm.layouts(p)] == want for p, want in layouts.items()), (heads, kv)
    assert allowed_sp_sizes(tiny_config("llama"), 2) == [1, 2]


# -- gloo, 2 and 4 ranks ------------------------------------------------------------------------
def grads_worker(rank: int, world: int, kinds: list[str], steps: int) -> list[tuple[str, int, float, float]]:
    """Random mixed plans per model kind; rank 0 compares each step with plain HF training."""
    from dcp.executor import ParallelState
    from dcp.executor.hf import hf_executor, plain_hf_step

    state = ParallelState.create(timeout_s=30)
    out = []
    for kind in kinds:
        model = tiny_model(tiny_config(kind))
        reference = copy.deepcopy(model)  # plain HF: sdpa attention, one sample at a time
        executor = hf_executor(model, state)
        for step in range(steps):
            plan, batch = random_case(world, step, model.config.num_hidden_layers)
            out.append((kind, step, *step_against(rank, executor, model, reference, plain_hf_step, plan, batch,
                                                  step, TOLERANCE)))
    return out


def step_against(rank: int, executor: Any, model: Any, reference: Any, reference_step: Callable,
                 plan: Plan, batch: list[Sample], step: int, tolerance: float) -> tuple[float, float]:
    """One executor step of `plan` on `model`; on rank 0 the same batch through `reference_step`
    on `reference`, its loss checked within `tolerance`. Returns (gradient diff, loss)."""
    from dcp.executor.hf import causal_lm_loss, lm_sample
    from dcp.executor.reference import relative_diff, trainable

    ids = {s.id: token_ids(s, model.config.vocab_size, step) for s in batch}
    stats = executor.step(plan, {i: lm_sample(x) for i, x in ids.items()}, causal_lm_loss)
    grads = executor.full_grads()  # a collective: every rank joins
    diff = 0.0
    if rank == 0:
        ref_loss = reference_step(reference, [ids[s.id] for s in batch])
        diff = relative_diff(grads, [p.grad for p in trainable(reference)])
        assert abs(stats.loss - ref_loss) <= tolerance * ref_loss, (stats.loss, ref_loss)
    return diff, stats.loss


def refused_heads_worker(rank: int, world: int) -> str:
    """6 heads over 3 KV heads cannot be split over 2 ranks: refused before any collective."""
    from dcp.executor import ExecutorError, ParallelState
    from dcp.executor.hf import causal_lm_loss, hf_executor, lm_sample
    from dcp.executor.reference import manual_plan

    executor = hf_executor(tiny_model(tiny_config("llama", heads=6, kv_heads=3)), ParallelState.create(timeout_s=10))
    batch = [Sample(0, 7, 0)]
    plan = manual_plan(batch, 2, 2, [(0, 2, [([0], 0)])])
    try:
        executor.step(plan, {0: lm_sample(torch.arange(7))}, causal_lm_loss)
    except ExecutorError as e:
        return str(e)
    return "no error"


def test_two_ranks_match_plain_hf_and_refuse_unsplittable_heads() -> None:
    check_grads(run_ranks(grads_worker, 2, ["llama", "mistral"], 3, deadline_s=120), TOLERANCE, "plain HF")
    for error in run_ranks(refused_heads_worker, 2, deadline_s=60, pg_timeout_s=10):
        assert "SP size 2 as Ulysses 2 x ring 1: Ulysses degree 2 and the model's 3 KV heads do not divide one another" in error


def test_four_ranks_match_plain_hf() -> None:
    check_grads(run_ranks(grads_worker, 4, ["llama", "qwen2"], 4, deadline_s=150), TOLERANCE, "plain HF")


def sharded_worker(rank: int, world: int, stage: int, kinds: list[str], steps: int) -> list[tuple[str, int, float, float]]:
    """`hf_executor` at a ZeRO stage: random mixed plans (groups of 1-3 micro-batches); rank 0
    compares the gathered gradients with single-process training of the same model in fp64 (each
    sample alone through `hf_forward` and `causal_lm_loss`: plain HF computes its loss in fp32,
    which alone differs by 1e-7), and the loss with plain HF's."""
    from dcp.executor import ParallelState, SPContext
    from dcp.executor.hf import (
        causal_lm_loss,
        hf_executor,
        hf_forward,
        install_dcp_attention,
        lm_sample,
        plain_hf_step,
    )
    from dcp.executor.reference import reference_step, trainable
    from dcp.executor.reference import relative_diff as relative

    state = ParallelState.create(timeout_s=30)
    out = []
    for kind in kinds:
        config = tiny_config(kind.removesuffix("-tied"))
        config.tie_word_embeddings = kind.endswith("-tied")
        model = tiny_model(config)
        plain = copy.deepcopy(model)
        reference = copy.deepcopy(model)
        install_dcp_attention(reference, SPContext())  # one process, one sample at a time
        executor = hf_executor(model, state, zero_stage=stage)
        for step in range(steps):
            plan, batch = random_case(world, step, model.config.num_hidden_layers)
            ids = {s.id: token_ids(s, model.config.vocab_size, step) for s in batch}
            samples = {i: lm_sample(x) for i, x in ids.items()}
            stats = executor.step(plan, samples, causal_lm_loss)
            grads = executor.full_grads()  # a collective: every rank joins
            diff = 0.0
            if rank == 0:
                reference_step(reference, batch, samples, causal_lm_loss, hf_forward)
                diff = relative(grads, [p.grad for p in trainable(reference)])
                ref_loss = plain_hf_step(plain, [ids[s.id] for s in batch])
                assert abs(stats.loss - ref_loss) <= TOLERANCE * ref_loss, (stats.loss, ref_loss)
            out.append((kind, step, diff, stats.loss))
    return out


@pytest.mark.parametrize("stage", [2, 3])
def test_four_ranks_at_zero_stage_2_and_3_match_single_process(stage: int) -> None:
    """Sharded gradients (stage 2) and parameters (stage 3, lockstep slots), tied embeddings too."""
    results = run_ranks(sharded_worker, 4, stage, ["llama", "qwen2-tied"], 3, deadline_s=150)
    check_grads(results, 1e-12, "single process")


def user_wrapped_worker(rank: int, world: int) -> list[float]:
    """An HF Llama the test wraps with fully_shard itself (each decoder layer, then the root)
    before dcp sees it: three AdamW steps of random mixed plans at stage 2; after each, rank 0's
    parameter difference from single-process training (fp64, each sample alone)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from dcp.executor import ParallelState, SPContext, executor_optimizer
    from dcp.executor.hf import (
        causal_lm_loss,
        decoder_layers,
        hf_executor,
        hf_forward,
        install_dcp_attention,
        lm_sample,
    )
    from dcp.executor.reference import reference_step, trainable
    from dcp.executor.reference import relative_diff as relative

    state = ParallelState.create(timeout_s=30)
    model = tiny_model(tiny_config("llama"))
    reference = copy.deepcopy(model)
    install_dcp_attention(reference, SPContext())  # one process, one sample at a time
    mesh = init_device_mesh("cpu", (world,))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    executor = hf_executor(model, state, zero_stage=2)
    adamw = {"lr": 1e-2, "eps": 1e-6}
    optimizer, ref_opt = executor_optimizer(executor, **adamw), torch.optim.AdamW(reference.parameters(), **adamw)
    diffs = []
    for step in range(3):
        plan, batch = random_case(world, step, model.config.num_hidden_layers)
        samples = {s.id: lm_sample(token_ids(s, model.config.vocab_size, step)) for s in batch}
        executor.step(plan, samples, causal_lm_loss)
        optimizer.step()
        optimizer.zero_grad()
        params = executor.full_params()  # a collective: every rank joins
        reference_step(reference, batch, samples, causal_lm_loss, hf_forward)
        ref_opt.step()
        diffs.append(relative(params, [p.detach() for p in trainable(reference)]))
    return diffs


def test_an_hf_llama_the_user_wrapped_with_fully_shard_trains_as_it_is() -> None:
    for diffs in run_ranks(user_wrapped_worker, 4, deadline_s=150):
        assert len(diffs) == 3 and max(diffs) <= 1e-12, diffs
