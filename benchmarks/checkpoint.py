"""Run checkpoints on CPU (gloo): what a save costs training, what each rank writes, what a load
costs on the same and on another world size.

    .venv/bin/python benchmarks/checkpoint.py [--ranks 4] [--other-ranks 2] [--repeats 3]

A Llama-like reference model (fp32) is `fully_shard`ed over `--ranks` gloo ranks with AdamW state
initialised by one step, then saved through dcp.executor.Checkpointer `--repeats` times each way:
synchronously (the save's wall time is what training waits), and asynchronously (`blocking`: the
time until save() returns, the copy to host memory; `total`: until the commit). Per rank it
reports the bytes of shard files it wrote against its shard of the state (the local tensors of
the model's and optimizer's state dicts: parameters, both Adam moments, step counts) and their
ratio. Then every rank loads the newest checkpoint (same world size), and `--other-ranks` ranks
load it again (resharding). Times are the slowest rank's (a save or load is over when the last
rank is done). On this shared 2-core machine the disk is the page cache and the ranks contend
for the cores, so the numbers show the protocol's costs relative to each other, not a cluster's
storage bandwidth.

Prints a table and writes benchmarks/results/checkpoint.json. Not a test: nothing asserts on time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dcp.costmodel import load_model
from dcp.executor.run_checkpoint import Checkpointer

RESULTS = Path(__file__).parent / "results" / "checkpoint.json"
# About 20 M parameters: 80 MB of fp32 weights and 160 MB of Adam moments, 240 MB of state.
SPEC = dataclasses.replace(load_model("tiny-llama"), name="bench-llama", num_layers=4, hidden=512, heads=8,
                           kv_heads=4, ffn_hidden=1376, vocab=8192, memory={})


def _setup(rank: int, world: int, store: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from dcp.models import PackedSeqs, build_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))
    model = build_model(SPEC, seed=0)
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.arange(8), PackedSeqs.pack([8])).sum().backward()  # Adam's moments exist from here
    opt.step()
    opt.zero_grad()
    return model, opt


def _shard_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.tensor import DTensor

    def local(t: torch.Tensor) -> int:
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    msd, osd = get_state_dict(model, opt)
    return sum(local(v) for v in msd.values()) + sum(local(v) for s in osd["state"].values() for v in s.values()
                                                     if torch.is_tensor(v))


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _time_loads(model: torch.nn.Module, opt: torch.optim.Optimizer, root: str, repeats: int) -> list[float]:
    """The slowest rank's time to load the newest synchronous checkpoint, `repeats` times."""
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        Checkpointer(Path(root) / "sync").load(model, opt)
        times.append(_slowest(time.perf_counter() - t0))
    return times


def save_worker(rank: int, world: int, store: str, root: str, repeats: int, out: Any) -> None:
    model, opt = _setup(rank, world, store)
    sync, blocking, total = [], [], []
    ckpt = Checkpointer(Path(root) / "sync", keep=1)
    for i in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        ckpt.save(i, model, opt)
        sync.append(_slowest(time.perf_counter() - t0))
    written = ckpt.last_writer.bytes_written
    async_ckpt = Checkpointer(Path(root) / "async", keep=1, async_save=True)
    for i in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        async_ckpt.save(i, model, opt)
        t1 = time.perf_counter()
        async_ckpt.wait()
        blocking.append(_slowest(t1 - t0))
        total.append(_slowest(time.perf_counter() - t0))
    load_same = _time_loads(model, opt, root, repeats)
    out[rank] = {"written_bytes": written, "shard_bytes": _shard_bytes(model, opt), "sync_s": sync,
                 "async_blocking_s": blocking, "async_total_s": total, "load_same_s": load_same}
    dist.destroy_process_group()


def load_worker(rank: int, world: int, store: str, root: str, repeats: int, out: Any) -> None:
    model, opt = _setup(rank, world, store)
    out[rank] = {"load_other_s": _time_loads(model, opt, root, repeats), "shard_bytes": _shard_bytes(model, opt)}
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--other-ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        saved, loaded = manager.dict(), manager.dict()
        mp.spawn(save_worker, args=(args.ranks, os.path.join(tmp, "store"), tmp, args.repeats, saved),
                 nprocs=args.ranks)
        mp.spawn(load_worker, args=(args.other_ranks, os.path.join(tmp, "store2"), tmp, args.repeats, loaded),
                 nprocs=args.other_ranks)
        saved, loaded = dict(saved), dict(loaded)
    med = {k: statistics.median(saved[0][k]) for k in ("sync_s", "async_blocking_s", "async_total_s", "load_same_s")}
    med["load_other_s"] = statistics.median(loaded[0]["load_other_s"])
    per_rank = [{"rank": r, "written_bytes": saved[r]["written_bytes"], "shard_bytes": saved[r]["shard_bytes"],
                 "ratio": saved[r]["written_bytes"] / saved[r]["shard_bytes"]} for r in sorted(saved)]
    print(f"model {SPEC.name}: {sum(p['shard_bytes'] for p in per_rank) / 1e6:.1f} MB of state over {args.ranks} ranks")
    print(f"{'':28s} {'median s':>9s}")
    for k, label in (("sync_s", "save, synchronous"), ("async_blocking_s", "save, async: blocking"),
                     ("async_total_s", "save, async: total"), ("load_same_s", f"load on {args.ranks} ranks"),
                     ("load_other_s", f"load on {args.other_ranks} ranks")):
        print(f"{label:28s} {med[k]:9.3f}")
    print(f"async blocking / total = {med['async_blocking_s'] / med['async_total_s']:.3f}")
    print(f"{'rank':>4s} {'written MB':>11s} {'shard MB':>9s} {'ratio':>7s}")
    for p in per_rank:
        print(f"{p['rank']:4d} {p['written_bytes'] / 1e6:11.3f} {p['shard_bytes'] / 1e6:9.3f} {p['ratio']:7.4f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "checkpoint", "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs", "torch": torch.__version__,
        "ranks": args.ranks, "other_ranks": args.other_ranks, "repeats": args.repeats,
        "model": dataclasses.asdict(SPEC), "median_s": med,
        "async_blocking_over_total": med["async_blocking_s"] / med["async_total_s"], "per_rank": per_rank,
        "times_s": {k: saved[0][k] for k in ("sync_s", "async_blocking_s", "async_total_s", "load_same_s")}
        | {"load_other_s": loaded[0]["load_other_s"]},
    }, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
