"""A small process-launch helper for multi-process gloo tests (our own, not torch's private test bases).

`run_ranks(fn, world_size, *args)` starts one process per rank, initializes gloo through a
file store, calls `fn(rank, world_size, *args)` and returns what each rank returned, or
raises if a rank failed, died, or did not finish before the deadline (the processes are then
terminated, by their own ids, so a hang fails the test instead of the suite). `check_grads`
judges what gradient-comparing workers return."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import queue
import random
import tempfile
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import fakeclock

from dcp.costmodel import ModelSpec, attention_pairs, load_model
from dcp.executor.reference import manual_plan
from dcp.planner import Sample
from dcp.planner.plan import Plan


@dataclass
class RankResult:
    rank: int
    ok: bool
    value: Any = None
    error: str = ""
    """Traceback text when the rank raised; 'died (exit code N)' when it exited without a result."""


def _entry(fn: Callable[..., Any], rank: int, world: int, store: str, out: Any, timeout_s: float,
           args: tuple[Any, ...]) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # tests share two cores among all ranks
    ok = False
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        value = fn(rank, world, *args)
        out.put(RankResult(rank, True, value))
        ok = True
    except BaseException as e:  # report everything, including assertion errors, to the parent
        out.put(RankResult(rank, False, error=f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            if ok:  # as dcp.launch.shutdown_distributed: no rank tears down links a peer still uses
                try:
                    dist.barrier()
                except Exception:  # a peer failed: it reported why; nothing to wait for
                    pass
            dist.destroy_process_group()


def run_ranks_raw(fn: Callable[..., Any], world_size: int, *args: Any, deadline_s: float = 120.0,
                  pg_timeout_s: float = 30.0) -> list[RankResult]:
    """Every rank's result (including failures and deaths), in rank order."""
    # forkserver: ranks fork from a server that imported torch and dcp once per test session,
    # instead of each spawned rank importing them again (seconds each on a shared 2-core box).
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "dcp.executor", "dcp.models"])
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_entry, args=(fn, r, world_size, store, out, pg_timeout_s, args))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        results: dict[int, RankResult] = {}
        # A hang guard, not a verdict: the real clock, also under --clock-speed (tests/fakeclock).
        end = fakeclock.REAL["monotonic"]() + deadline_s
        killed = set()
        try:
            while len(results) < world_size and fakeclock.REAL["monotonic"]() < end:
                try:
                    res = out.get(timeout=0.2)
                    results[res.rank] = res
                except queue.Empty:
                    for r, p in enumerate(procs):
                        if r not in results and p.exitcode is not None and p.exitcode != 0:
                            results[r] = RankResult(r, False, error=f"died (exit code {p.exitcode})")
        finally:
            for r, p in enumerate(procs):
                p.join(timeout=30)
                if p.is_alive():
                    killed.add(r)
                    p.kill()
                    p.join()
        for r, p in enumerate(procs):  # a rank that aborted at exit after its result (issue 56, item 18)
            if r in results and results[r].ok and r not in killed and p.exitcode != 0:
                results[r] = RankResult(r, False, error=f"exited with code {p.exitcode} after returning its result")
        missing = sorted(set(range(world_size)) - set(results))
        if missing:
            raise TimeoutError(f"ranks {missing} did not finish within {deadline_s} s (hang?)")
    return [results[r] for r in range(world_size)]


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, deadline_s: float = 120.0,
              pg_timeout_s: float = 30.0) -> list[Any]:
    """Every rank's return value; raises AssertionError with the tracebacks if any rank failed."""
    results = run_ranks_raw(fn, world_size, *args, deadline_s=deadline_s, pg_timeout_s=pg_timeout_s)
    failed = [r for r in results if not r.ok]
    if failed:
        raise AssertionError("\n".join(f"rank {r.rank} failed: {r.error}" for r in failed))
    return [r.value for r in results]


GradResult = tuple[str, int, float, float]
"""(model name, step, rank 0's relative gradient difference from its reference (0.0 elsewhere), loss)."""


def check_grads(results: list[list[GradResult]], tolerance: float, reference: str = "single process") -> None:
    """Rank 0's largest gradient difference is within `tolerance`, and every rank reports the same
    global loss every step."""
    worst = max(diff for _, _, diff, _ in results[0])
    print(f"max relative grad diff vs {reference} {worst:.2e} over {len(results[0])} steps")
    assert worst <= tolerance, results[0]
    for rank_results in results[1:]:
        assert [r[3] for r in rank_results] == [r[3] for r in results[0]]


def random_groups(rng: random.Random, ids: Sequence[int], layout: Sequence[tuple[int, ...]], num_layers: int,
                  microbatches: Sequence[int] | None = None) -> list[tuple[Any, ...]]:
    """`manual_plan` groups over `layout` ((first rank, SP size[, ring degree]) per group) for the
    samples `ids`:
    shuffled, at least `microbatches[g]` samples in group g (default one: no group without work),
    the rest spread at random; `microbatches[g]` micro-batches in group g (default 1-3 at random),
    random checkpointed layers."""
    ids = list(ids)
    rng.shuffle(ids)
    least = list(microbatches or [1] * len(layout))
    bounds = [sum(least[:g]) for g in range(len(layout) + 1)]
    per_group = [ids[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    for i in ids[bounds[-1]:]:
        per_group[rng.randrange(len(layout))].append(i)
    groups = []
    for g, (where, members) in enumerate(zip(layout, per_group, strict=True)):
        n_cuts = rng.randint(0, 2) if microbatches is None else microbatches[g] - 1
        cuts = sorted(rng.sample(range(1, len(members)), min(n_cuts, len(members) - 1)))
        chunks = [members[a:b] for a, b in zip([0, *cuts], [*cuts, len(members)], strict=True)]
        groups.append((where[0], where[1], [(c, rng.randint(0, num_layers)) for c in chunks], *where[2:]))
    return groups


Case = tuple[Plan, list[Sample]]


def llama_spec() -> ModelSpec:
    # 8 heads over 4 KV heads: GQA that SP 4 can shard (1 KV head, 2 query heads per rank).
    return dataclasses.replace(load_model("tiny-llama"), heads=8, kv_heads=4)


def random_case(spec: ModelSpec, seed: int, layout: Sequence[tuple[int, ...]], num_gpus: int = 4, *,
                microbatches: Sequence[int] | None = None, gpus_per_node: int | None = None) -> Case:
    """A random plan over `layout`: odd lengths (padding), several samples packed per micro-batch,
    `microbatches[g]` micro-batches in group g (default 1-3 at random), random checkpointed layers."""
    rng = random.Random(seed)
    least = list(microbatches or [1] * len(layout))  # a sample per micro-batch: no group without work
    batch = []
    for i in range(max(rng.randint(2 * len(layout), 10), sum(least) + len(layout))):
        if spec.attention == "spatial_temporal":
            frames = rng.randint(1, 3)
            tokens = frames * rng.randint(1, 5)
        else:
            frames, tokens = 1, rng.randint(1, 23)
        batch.append(Sample(100 * seed + i, tokens, attention_pairs(spec.attention, tokens, frames), frames))
    groups = random_groups(rng, [s.id for s in batch], layout, spec.num_layers, microbatches)
    return manual_plan(batch, num_gpus, spec.num_layers, groups, gpus_per_node=gpus_per_node), batch
