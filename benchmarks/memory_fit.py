"""Do plans fit? Every micro-batch of every strategy's plan, re-priced from the model's measured
memory footprint against the device's real capacity.

    .venv/bin/python benchmarks/memory_fit.py                 # 100 batches per case (slow: the ILP)
    .venv/bin/python benchmarks/memory_fit.py --steps 5       # a quick look

Cases: llama-7b on `wikipedia` and `lognormal:scale=16`, opensora-stdit-1.1b on `opensora:long`,
32 `h200-sxm` GPUs in nodes of 8, ZeRO-1, each in the bf16 and the autocast-bf16 recipe. The
re-pricing does not call the cost model's memory: it sums, for the micro-batch's padded shard of
ceil(T/p) tokens per GPU, the training state FSDP2 holds in a step (`dcp.costmodel.zero`), autocast's weight
copies, and per token (K - r) saved layers, r checkpointed inputs and the working set, all
straight from the preset's `MemoryFootprint`, and compares that with the H200's reported
capacity less its allocator reserve. Writes benchmarks/results/memory_fit.json.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dcp.costmodel import Cluster, CostModel, TrainingSetup, load_hardware, load_model  # noqa: E402
from dcp.data import load_workload  # noqa: E402
from dcp.data.batches import make_batches  # noqa: E402
from dcp.planner import STRATEGIES, solve  # noqa: E402
from dcp.planner.plan import InfeasibleError, Plan  # noqa: E402
from dcp.planner.run import resolve_options  # noqa: E402

CASES = (("llama-7b", "wikipedia"), ("llama-7b", "lognormal:scale=16"), ("opensora-stdit-1.1b", "opensora:long"))
SAMPLES_PER_GPU = {"wikipedia": 16, "lognormal:scale=16": 4, "opensora:long": 2}
"""Global batch = samples per GPU x GPUs, as benchmarks/paper.py plans them."""
RECIPES = ("bf16", "autocast-bf16")
GPUS, GPUS_PER_NODE, HARDWARE = 32, 8, "h200-sxm"
ROOT = Path(__file__).resolve().parents[1]


def microbatch_need_bytes(cm: CostModel, tokens: int, sp_size: int, ckpt_layers: int) -> float:
    """Peak bytes per GPU of one micro-batch from the footprint itself (not CostModel.memory_bytes)."""
    fp, k = cm.footprint, cm.model.num_layers
    state = cm.resident_bytes + cm.in_step_bytes  # sharded state, gathered parameters, local gradient
    per_token = ((k - ckpt_layers) * fp.act_full_bytes_per_token + ckpt_layers * fp.act_ckpt_bytes_per_token
                 + fp.working_bytes_per_token)
    shard = math.ceil(tokens / sp_size)  # the executor pads the packed micro-batch to a multiple of p
    return state + fp.weight_copy_bytes(k) + fp.working_fixed_bytes + per_token * shard


def check_plan(plan: Plan, cm: CostModel) -> dict[str, Any]:
    """Micro-batches of `plan`, how many overflow the usable memory, and the fullest one."""
    tokens = {s.id: s.tokens for s in plan.samples}
    capacity = cm.hardware.memory_bytes
    needs = [microbatch_need_bytes(cm, sum(tokens[i] for i in mb.samples), g.sp, mb.ckpt_layers)
             for g in plan.groups for mb in g.microbatches]
    return {"microbatches": len(needs), "over": sum(n > capacity for n in needs),
            "max_fill": max(needs) / capacity if needs else 0.0}


def run_case(model: str, workload: str, recipe: str, strategies: list[str], steps: int,
             time_limit_s: float) -> dict[str, Any]:
    """Plan `steps` global batches with every strategy and check every micro-batch."""
    hw = load_hardware(HARDWARE)
    cm = CostModel(load_model(model), hw, Cluster(num_gpus=GPUS, gpus_per_node=GPUS_PER_NODE, memory_bytes=hw.memory_bytes),
                   TrainingSetup(precision=recipe, zero_stage=1))
    loaded = load_workload(workload, seed=0)
    batches = make_batches(loaded, cm, global_batch=SAMPLES_PER_GPU[workload] * GPUS, steps=steps, seed=0)
    out: dict[str, Any] = {"model": model, "workload": workload, "recipe": recipe, "batches": len(batches),
                           "usable_memory_gb": cm.hardware.memory_bytes / 1e9,
                           "capacity_gb": cm.hardware.memory_capacity_bytes / 1e9,
                           "training_state_gb": cm.resident_bytes / 1e9, "static_gb": cm.static_bytes / 1e9,
                           "strategies": {}}
    for name in strategies:
        started, rows, infeasible = time.perf_counter(), [], 0
        # The static baselines fix one SP size for the workload's longest sample.
        options = resolve_options(name, time_limit_s, dataset_longest_tokens=int(loaded.tokens.max()))
        for batch in batches:
            try:
                rows.append(check_plan(solve(batch, cm.cluster, cm, options), cm))
            except InfeasibleError:
                infeasible += 1
        out["strategies"][name] = {
            "plans": len(rows), "infeasible_batches": infeasible, "microbatches": sum(r["microbatches"] for r in rows),
            "microbatches_over": sum(r["over"] for r in rows), "max_fill": max((r["max_fill"] for r in rows), default=0),
            "seconds": time.perf_counter() - started}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100, help="global batches per case")
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    ap.add_argument("--recipes", nargs="+", default=list(RECIPES))
    ap.add_argument("--time-limit", type=float, default=1.0, help="ILP time limit per batch (s)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "memory_fit.json")
    args = ap.parse_args(argv)
    results = []
    for model, workload in CASES:
        for recipe in args.recipes:
            row = run_case(model, workload, recipe, args.strategies, args.steps, args.time_limit)
            results.append(row)
            for name, s in row["strategies"].items():
                print(f"{model:20s} {workload:20s} {recipe:14s} {name:11s} {s['plans']:4d} plans "
                      f"{s['microbatches']:6d} micro-batches, {s['microbatches_over']} over "
                      f"(fullest {s['max_fill']:.3f} of {row['usable_memory_gb']:.1f} GB), "
                      f"{s['infeasible_batches']} infeasible, {s['seconds']:.0f} s", flush=True)
    over = sum(s["microbatches_over"] for r in results for s in r["strategies"].values())
    args.out.write_text(json.dumps({"steps": args.steps, "gpus": GPUS, "hardware": HARDWARE,
                                    "ilp_time_limit_s": args.time_limit, "python": platform.python_version(),
                                    "microbatches_over": over, "cases": results}, indent=1) + "\n")
    print(f"{over} micro-batches over the usable memory; wrote {args.out}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
