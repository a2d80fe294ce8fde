"""bucket, packed and dcp-greedy: valid plans on random batches, and each strategy's own rules."""

from __future__ import annotations

import heapq

import numpy as np
import pytest
from conftest import cost_model, make_batch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dcp.costmodel.schedule import slot_link_s
from dcp.data.batches import make_batches
from dcp.planner import (
    STRATEGIES,
    BucketOptions,
    GreedyOptions,
    InfeasibleError,
    PackedOptions,
    lower_bound,
    solve,
    with_dataset,
)
from dcp.planner.baselines import (
    by_bucket,
    ffd_indices,
    group_share,
    length_bucket,
    lpt_assign,
    solve_bucket,
    solve_packed,
)
from dcp.planner.feasibility import allowed_sp_sizes
from dcp.planner.greedy import _MicroBatches, _Schedule, profile_bucket, solve_greedy
from dcp.planner.lpt import least_loaded
from dcp.planner.pricing import Pricer

HEURISTICS = {"bucket-per-batch": BucketOptions(), "packed-per-batch": PackedOptions(), "dcp-greedy": GreedyOptions(),
              "dcp-greedy-inter": GreedyOptions(pyramid=False)}
CLUSTERS = [(1, 8), (2, 8), (8, 8), (16, 8), (32, 8), (8, 4)]  # (GPUs, GPUs per node)


@settings(max_examples=100)
@given(lengths=st.lists(st.integers(1, 250_000), min_size=1, max_size=60),
       cluster=st.sampled_from(CLUSTERS), memory_gb=st.sampled_from([None, 60.0]))
def test_every_heuristic_plan_is_valid(lengths: list[int], cluster: tuple[int, int],
                                       memory_gb: float | None) -> None:
    cm = cost_model(gpus=cluster[0], gpus_per_node=cluster[1], memory_gb=memory_gb)
    batch = make_batch(lengths)
    fits = all(cm.min_ckpt_layers(t, max(allowed_sp_sizes(cm))) is not None for t in lengths)
    for name, options in HEURISTICS.items():
        if not fits:
            with pytest.raises(InfeasibleError, match="fits nowhere|model states"):
                solve(batch, cm.cluster, cm, options)
            continue
        plan = solve(batch, cm.cluster, cm, options)
        plan.validate()  # every sample once, aligned disjoint groups, memory, step >= bound
        assert plan.strategy == name
        assert plan.step_time_s >= lower_bound(batch, cm) * (1 - 1e-9)
        assert solve(list(batch), cm.cluster, cm, options).digest() == plan.digest()  # deterministic
        for g in plan.groups:
            for mb in g.microbatches:
                tokens = sum(lengths[i] for i in mb.samples)
                r_min = cm.min_ckpt_layers(tokens, g.sp)
                assert r_min is not None and mb.ckpt_layers >= r_min


def test_length_buckets() -> None:
    assert [length_bucket(t) for t in (1, 2, 3, 4, 5, 1024, 1025)] == [1, 2, 4, 4, 8, 1024, 2048]
    buckets = by_bucket(make_batch([3, 900, 4, 1000, 2]))
    assert list(buckets) == [2, 4, 1024]
    assert [s.id for s in buckets[4]] == [0, 2]  # batch order inside a bucket


def test_group_share() -> None:
    assert group_share(100, 1, 32) == 4  # ceil(100 / 32)
    assert group_share(100, 8, 32) == 25
    assert group_share(1, 1, 32) == 1


def test_first_fit_decreasing_respects_the_budget() -> None:
    batch = make_batch([70, 50, 40, 30, 20, 10, 500])
    bins = ffd_indices(np.array([s.tokens for s in batch], dtype=np.float64), np.array([s.id for s in batch]), 100)
    assert [[batch[i].tokens for i in b] for b in bins] == [[500], [70, 30], [50, 40, 10], [20]]


def test_lpt_assign() -> None:
    # 5 -> g0, 4 -> g1, 3 -> g1 (4 < 5), 3 -> g0 (5 < 7), 1 -> g1 (7 < 8): loads 8 and 8.
    assert lpt_assign([5.0, 1.0, 4.0, 3.0, 3.0], 2) == [[0, 4], [2, 3, 1]]
    assert lpt_assign([1.0], 3) == [[0], [], []]


def _heap_lpt(times: list[float], groups: int, loads: list[float] | None = None) -> list[int]:
    """The reference: a heap step per job to the least-loaded group, ties by the lower index."""
    heap, owner = [(0.0 if loads is None else loads[g], g) for g in range(groups)], []
    heapq.heapify(heap)
    for t in times:
        load, g = heapq.heappop(heap)
        owner.append(g)
        heapq.heappush(heap, (load + t, g))
    return owner


@settings(max_examples=300)
@given(times=st.lists(st.one_of(st.integers(1, 4).map(float), st.floats(0.01, 1000.0)), min_size=1, max_size=400),
       groups=st.integers(1, 90), longest_first=st.booleans(), start=st.sampled_from([0, 1, 10]))
@example(times=[1.0] * 16 + [2.0] * 16 + [1.0] * 32, groups=32, longest_first=False, start=0)
def test_lpt_rounds_take_the_heap_steps_decisions(times: list[float], groups: int, longest_first: bool,
                                                  start: int) -> None:
    # Rounds of a job per group (from 16 groups up) must pop the groups in the heap's order, ties
    # (equal integer loads) included, whether the jobs come longest first or in any order. The
    # example: after the first round groups 0-15 hold 1 and 16-31 hold 2; the next 16 jobs bring
    # 0-15 to 2, and the heap then pops group 0 again (2, 0) before group 16 (2, 16).
    # With `start`, the groups begin loaded (integers up to it: ties; the backfill's ranks free
    # at different times), and end with the heap's loads.
    jobs = sorted(times, reverse=True) if longest_first else times
    loads = [float((7 * g) % (start + 1)) for g in range(groups)]
    held = np.array(loads)
    assert least_loaded(np.array(jobs), groups, held).tolist() == _heap_lpt(jobs, groups, loads)
    expected = list(loads)
    for t, g in zip(jobs, _heap_lpt(jobs, groups, loads), strict=True):
        expected[g] += t
    assert held.tolist() == expected


def _balanced_by_scan(times: np.ndarray, where: list[int], size_of: list[int]) -> list[int]:
    """The greedy's balancing rule as plain loops: while it lowers the slowest group, move the
    first of its micro-batches (in number order), to the first size's least-loaded other group
    (first by number), that gives the least larger-of-the-two loads."""
    where = list(where)
    loads = [0.0] * len(size_of)
    for mb, g in enumerate(where):
        loads[g] += times[mb, size_of[g]]
    for _ in range(2 * len(where) + 64):
        c = max(range(len(loads)), key=lambda g: (loads[g], -g))
        best = None
        for j in sorted(set(size_of), key=lambda j: size_of.index(j)):
            block = [g for g in range(len(loads)) if size_of[g] == j and g != c]
            if not block:
                continue
            h = min(block, key=lambda g: (loads[g], g))
            for i, mb in enumerate(m for m in range(len(where)) if where[m] == c):
                val = max(loads[h] + times[mb, j], loads[c] - times[mb, size_of[c]])
                if best is None or val < best[0] or (val == best[0] and i < best[1]):
                    best = (val, i, h, mb)
        if best is None or not best[0] < loads[c] * (1 - 1e-9):
            return where
        _, _, h, mb = best
        loads[c] -= times[mb, size_of[c]]
        loads[h] += times[mb, size_of[h]]
        where[mb] = h
    return where


@settings(max_examples=200, deadline=None)
@given(data=st.data(), sizes=st.integers(1, 4), groups=st.integers(1, 12), mbs=st.integers(1, 40))
def test_greedy_balance_follows_its_rule(data, sizes: int, groups: int, mbs: int) -> None:  # noqa: ANN001
    # The balancing step keeps each size's least-loaded group and values every size's move at once;
    # it must make exactly the moves of the rule scanned group by group (ties on integer times;
    # groups numbered largest size first, as the schedule numbers them).
    size_of = sorted(data.draw(st.lists(st.integers(0, sizes - 1), min_size=groups, max_size=groups)), reverse=True)
    times = np.array(data.draw(st.lists(st.lists(st.integers(1, 9).map(float), min_size=sizes, max_size=sizes),
                                        min_size=mbs, max_size=mbs)))
    where = data.draw(st.lists(st.integers(0, groups - 1), min_size=mbs, max_size=mbs))
    expected = _balanced_by_scan(times, where, size_of)
    schedule = object.__new__(_Schedule)  # the placement as given, then balanced
    schedule.mbs = _MicroBatches(np.arange(mbs), np.arange(mbs + 1), np.zeros(mbs, dtype=np.int64), times)
    schedule.size_of = np.array(size_of, dtype=np.int64)
    schedule.where = np.array(where, dtype=np.int64)
    schedule.loads = np.bincount(schedule.where, weights=times[np.arange(mbs), schedule.size_of[schedule.where]],
                                 minlength=groups)
    schedule._balance()
    assert schedule.where.tolist() == expected


def test_bucket_rules(wiki_batches) -> None:
    cm, batch = cost_model(), wiki_batches[1]
    plan = solve_bucket(batch, cm)
    longest = max(s.tokens for s in batch)
    p = min(s for s in allowed_sp_sizes(cm) if cm.min_ckpt_layers(longest, s) is not None)
    assert {g.sp for g in plan.groups} == {p} and len(plan.groups) == cm.cluster.num_gpus // p
    assert all(mb.ckpt_layers == cm.model.num_layers for g in plan.groups for mb in g.microbatches)
    tokens = plan.sample_map()
    for g in plan.groups:
        for mb in g.microbatches:
            assert len({length_bucket(tokens[i].tokens) for i in mb.samples}) == 1  # one bucket each
    # Round-robin in bucket order: group loads are what they are, no balancing.
    counts = [len(g.microbatches) for g in plan.groups]
    assert max(counts) - min(counts) <= 1


def test_packed_rules(wiki_batches) -> None:
    cm, batch = cost_model(), wiki_batches[0]
    plan = solve_packed(batch, cm, PackedOptions(token_budget=20_000))
    tokens = plan.sample_map()
    assert len({g.sp for g in plan.groups}) == 1
    for g in plan.groups:
        for mb in g.microbatches:
            total = sum(tokens[i].tokens for i in mb.samples)
            assert total <= 20_000 or len(mb.samples) == 1
            assert mb.ckpt_layers == cm.min_ckpt_layers(total, g.sp)
    # LPT: each group's last micro-batch went to it when it was the least loaded, so without
    # that micro-batch no group is busier than the least busy group ends up.
    least = min(g.busy_s for g in plan.groups)
    for g in plan.groups:
        if g.microbatches:
            times = [mb.time_s for mb in g.microbatches]
            assert times == sorted(times, reverse=True)  # longest first
            assert g.busy_s - times[-1] <= least * (1 + 1e-9)


def test_packed_budget_too_large_is_named() -> None:
    cm = cost_model(gpus=8)
    batch = make_batch([100_000] * 4)
    with pytest.raises(InfeasibleError, match="token budget 10000000"):
        solve_packed(batch, cm, PackedOptions(token_budget=10_000_000))


def test_greedy_pyramid_and_inter(wiki_batches) -> None:
    cm, batch = cost_model(), wiki_batches[0]
    pyramid, inter = solve_greedy(batch, cm), solve_greedy(batch, cm, GreedyOptions(pyramid=False))
    assert (pyramid.strategy, inter.strategy) == ("dcp-greedy", "dcp-greedy-inter")
    k = cm.model.num_layers
    assert all(mb.ckpt_layers == k for g in inter.groups for mb in g.microbatches)
    tokens = pyramid.sample_map()
    for g in pyramid.groups:
        for mb in g.microbatches:
            assert mb.ckpt_layers == cm.min_ckpt_layers(sum(tokens[i].tokens for i in mb.samples), g.sp)


def test_greedy_profile_maximizes_samples_per_gpu_second() -> None:
    cm = cost_model()
    longest = make_batch([3000])[0]
    prof = profile_bucket(longest, 64, cm, allowed_sp_sizes(cm), pyramid=False)
    # With all layers checkpointed, throughput only grows with batch size: the largest that
    # the bucket's per-group share allows, at the smallest SP size.
    assert (prof.sp, prof.batch_size) == (1, group_share(64, 1, 32))
    for p in (1, 2, 4):
        for b in (1, 2):
            t = cm.time_s(b * 3000, b * longest.attn_pairs, p, cm.model.num_layers)
            assert b / (p * t) <= prof.samples_per_gpu_s * (1 + 1e-12)


def test_greedy_mixes_sp_sizes_and_beats_static_baselines(wiki_batches) -> None:
    cm = cost_model()
    for batch in wiki_batches:
        greedy = solve_greedy(batch, cm)
        assert len({g.sp for g in greedy.groups}) > 1  # long samples get SP, short ones do not
        assert sum(g.sp for g in greedy.groups) <= cm.cluster.num_gpus
        assert greedy.step_time_s < solve_bucket(batch, cm).step_time_s
        assert greedy.step_time_s < solve_packed(batch, cm).step_time_s


def test_greedy_under_zero3_merges_short_micro_batches_and_beats_bucket() -> None:
    """Llama-70B, ZeRO-3, 2,048 wikipedia samples on 32 GPUs: every micro-batch is a lockstep slot
    that gathers every layer (1.65 s of the link), and the profile sizes them without that. The
    greedy merges each group's two shortest while that runs shorter (before: 402 slots, 683 s,
    0.21x bucket's speed). No group is left with two that would."""
    cm = cost_model(model="llama-70b", gpus=32, zero_stage=3)
    batch = make_batches("wikipedia", cm, global_batch=2048, steps=1, seed=0)[0]
    sizes = allowed_sp_sizes(cm)
    greedy = solve_greedy(batch, cm)
    assert greedy.step_time_s < solve_bucket(batch, cm).step_time_s
    slot_s = slot_link_s(cm)
    pricer = Pricer(cm, sizes)
    by_id = {s.id: s for s in batch}
    for g in greedy.groups:
        if len(g.microbatches) < 2:
            continue
        a, b = sorted(g.microbatches, key=lambda mb: mb.time_s)[:2]
        tokens = sum(by_id[i].tokens for i in a.samples + b.samples)
        pairs = sum(by_id[i].attn_pairs for i in a.samples + b.samples)
        together = pricer.times(g.sp, np.array([float(tokens)]), np.array([float(pairs)]))[0]
        assert together >= (max(a.time_s, slot_s) + max(b.time_s, slot_s)) * (1 - 1e-9)


def test_infeasible_sample_is_named() -> None:
    cm = cost_model(gpus=8)
    batch = make_batch([1000, 5_000_000])
    for options in HEURISTICS.values():
        with pytest.raises(InfeasibleError, match=r"sample 1 \(5000000 tokens\) fits nowhere.*GB per GPU"):
            solve(batch, cm.cluster, cm, options)


def test_sp_sizes_option() -> None:
    cm = cost_model(gpus=8)
    batch = make_batch([100, 30_000, 200_000, 5])
    for options in (BucketOptions(sp_sizes=(4, 8)), PackedOptions(sp_sizes=(4,)), GreedyOptions(sp_sizes=(2, 8))):
        plan = solve(batch, cm.cluster, cm, options)
        assert {g.sp for g in plan.groups} <= set(options.sp_sizes)
    with pytest.raises(InfeasibleError, match="SP size 3 is not allowed"):
        solve(batch, cm.cluster, cm, GreedyOptions(sp_sizes=(3,)))


def test_sp_sizes_tile_nodes() -> None:
    # 6 GPUs per node: an aligned block of 4 at ranks 4-7 would straddle two nodes.
    assert allowed_sp_sizes(cost_model(gpus=12, gpus_per_node=6)) == [1, 2]
    assert allowed_sp_sizes(cost_model(gpus=32, gpus_per_node=8)) == [1, 2, 4, 8, 16, 32]
    assert allowed_sp_sizes(cost_model(model="opensora-stdit-1.1b")) == [1, 2, 4, 8, 16]  # 16 heads


def test_strategy_table_names_match_plans() -> None:
    cm = cost_model(gpus=8)
    batch = make_batch([100, 2000, 40_000])
    for name, options in STRATEGIES.items():
        if name == "ilp":
            continue  # owned and tested by the ILP module
        assert solve(batch, cm.cluster, cm, with_dataset(options, 40_000)).strategy == name
