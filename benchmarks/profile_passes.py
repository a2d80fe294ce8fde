"""Raw readings of `dcp profile`'s executor rows over passes spaced apart, and how steady each
statistic of them is (docs/tuning-log.md, `CPU_PASSES`).

    .venv/bin/torchrun --nproc-per-node 2 benchmarks/profile_passes.py 8 60 6 passes.json
    .venv/bin/python benchmarks/profile_passes.py --analyze passes.json

Measures, in each of PASSES passes GAP seconds apart: the reference kernel, then the rows
`dcp.profiler.executor_cost.measure_executor` runs for tiny-llama on 2 gloo ranks (SP 1 at 16-1,024
tokens, SP 2 at twice that without and with both layers checkpointed), each row after the other,
one warm-up and REPS timed steps, keeping every middle micro-batch's CPU time (rank 0's); and the
all-to-all of 1, 16 and 256 KiB back to back (wall and CPU time). `--analyze` compares groups of
passes as two profiles would: per statistic (fastest, 10th and 25th percentile, median), how far
apart the groups' values of each row are. Not a test: nothing asserts on time.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
import time

import numpy as np


def measure(passes: int, gap: float, reps: int, out_path: str) -> None:
    import torch
    import torch.distributed as dist

    from dcp.costmodel import attention_pairs, load_model
    from dcp.executor import Executor, ParallelState
    from dcp.executor.reference import manual_plan
    from dcp.models import build_model, lm_loss, sample_tensors
    from dcp.planner import Sample
    from dcp.profiler.reference import ReferenceKernel

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    spec = load_model("tiny-llama")
    state = ParallelState.create(device=torch.device("cpu"))
    ex = Executor(build_model(spec, dtype=torch.float32, device=torch.device("cpu"), seed=0), state,
                  recipe="fp32", zero_stage=1)
    world, rank = 2, dist.get_rank()
    kernel = ReferenceKernel("cpu")

    def loss_fn(o, b):  # noqa: ANN001, ANN202
        return lm_loss(o, b["labels"])

    def mk(n: int, sp: int, ck: int) -> tuple:
        groups = world // sp
        batch = [Sample(i, n, attention_pairs(spec.attention, n)) for i in range(3 * groups)]
        tensors = {s.id: sample_tensors(spec, s, dtype=torch.float32) for s in batch}
        plan = manual_plan(batch, world, spec.num_layers,
                           [(g * sp, sp, [([3 * g + j], ck) for j in range(3)]) for g in range(groups)],
                           gpus_per_node=2)
        return plan, tensors

    keys = [(n, 1, 0) for n in (16, 64, 256, 1024)] + [(2 * n, 2, c) for c in (0, 2) for n in (16, 64, 256, 1024)]
    plans = {k: mk(*k) for k in keys}
    out: dict = {"passes": []}
    x = {m: torch.ones(m // 4) for m in (1 << 10, 1 << 14, 1 << 18)}
    for p in range(passes):
        if p:
            time.sleep(gap)
        rec: dict = {"t": time.time(), "load": os.getloadavg(), "ref": kernel.seconds(), "rows": {}, "a2a": {}}
        for k in keys:
            plan, tensors = plans[k]
            mids, firsts, lasts, steps, walls = [], [], [], [], []
            for i in range(1 + reps):
                st = ex.step(plan, tensors, loss_fn)
                if i:
                    mids.append(st.microbatches[1].cpu_s)
                    firsts.append(st.microbatches[0].cpu_s)
                    lasts.append(st.microbatches[2].cpu_s)
                    steps.append(st.cpu_step_s)
                    walls.append(st.microbatches[1].measured_s)
            rec["rows"][str(k)] = {"mid": mids, "first": firsts, "last": lasts, "step": steps, "mid_wall": walls}
        for m, t in x.items():
            o, ts = torch.empty_like(t), []
            for i in range(2 + 9):
                dist.barrier()
                a, c = time.perf_counter(), time.process_time()
                dist.all_to_all_single(o, t)
                if i >= 2:
                    ts.append((time.perf_counter() - a, time.process_time() - c))
            rec["a2a"][m] = ts
        out["passes"].append(rec)
        if rank == 0:
            print("pass", p, time.strftime("%H:%M:%S"), rec["load"], f"ref {rec['ref'] * 1e3:.2f}", flush=True)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()


def analyze(path: str) -> None:
    with open(path) as f:
        passes = json.load(f)["passes"]
    keys = list(passes[0]["rows"])
    print("reference ms", " ".join(f"{p['ref'] * 1e3:.1f}" for p in passes))
    for k in keys:
        mins = [min(p["rows"][k]["mid"]) for p in passes]
        print(f"{k:14s} per-pass fastest ms", " ".join(f"{m * 1e3:6.2f}" for m in mins),
              f" spread {max(mins) / min(mins) - 1:.1%}")
    stats = {"fastest": min, "q10": lambda v: float(np.percentile(v, 10)),
             "q25": lambda v: float(np.percentile(v, 25)), "median": statistics.median,
             "median of passes' fastest": None}
    n = len(passes)
    splits = [(tuple(range(n // 2)), tuple(range(n // 2, n))), (tuple(range(0, n, 2)), tuple(range(1, n, 2)))]
    for reps in (3, len(passes[0]["rows"][keys[0]]["mid"])):
        for a, b in splits:
            for name, fn in stats.items():
                def value(group: tuple[int, ...], k: str, fn=fn, reps=reps) -> float:  # noqa: ANN001
                    if fn is None:
                        return statistics.median(min(passes[i]["rows"][k]["mid"][:reps]) for i in group)
                    return fn([x for i in group for x in passes[i]["rows"][k]["mid"][:reps]])
                diffs = [abs(value(b, k) / value(a, k) - 1) for k in keys]
                print(f"{reps} repeats, passes {a} against {b}: {name:26s} worst row {max(diffs):.1%}, "
                      f"median row {statistics.median(diffs):.1%}")
    for g in (g for g in itertools.combinations(range(n), 3) if g[2] - g[0] == 2):
        lifts = [statistics.median(min(passes[i]["rows"][k]["mid"][:3]) for i in g)
                 / min(x for i in g for x in passes[i]["rows"][k]["mid"][:3]) for k in keys]
        print(f"passes {g}: median of the passes' fastest over the fastest of all, median over rows "
              f"{statistics.median(lifts):.3f}")


if __name__ == "__main__":
    if sys.argv[1] == "--analyze":
        analyze(sys.argv[2])
    else:
        measure(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
