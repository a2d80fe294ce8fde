"""HSDP against sharding over the whole world, at 256 and 1024 GPUs, priced by the cost model.

    .venv/bin/python benchmarks/hsdp_scale.py [--hardware h200-sxm]

For each preset model and ZeRO stage, the same fixed step on every GPU count (the planner is not
involved, so only the sharding differs): every node one SP group of 8 GPUs running 4 micro-batches
of `TOKENS` tokens (causal, every layer checkpointed). For each shard group (the world; 8, a node;
for 70B also 32, four nodes) it prices, with `CostModel.step_price` (dcp.costmodel.schedule), the
step time and what synchronization adds beyond the micro-batches (`exposed`), the collectives
summed back to back (`CostModel.sync_terms`), and the per-GPU memory: the state held between
steps (`resident_bytes`), the step's peak with the largest micro-batch (`memory_bytes`) and
whether it fits the hardware's usable memory.

A prediction of the cost model on the preset's curves, not a measurement: the replicas'
all-reduce runs at one GPU's NIC bandwidth (`HardwareProfile.strided_time_s`; the preset's
46 GB/s send/recv estimate), the world's collectives at the preset's 32-GPU curves. Writes
benchmarks/results/hsdp_scale.json and prints a table (docs/results.md, "HSDP at scale").
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path

from dcp.costmodel import Cluster, CostModel, TrainingSetup, load_hardware, load_model
from dcp.costmodel.schedule import GroupShape, MicroBatchShape

RESULTS = Path(__file__).parent / "results" / "hsdp_scale.json"
TOKENS = 32_768
"""Tokens per micro-batch (4 per SP group of 8 GPUs: 16,384 per GPU per step)."""
CASES = [("llama-3-8b", 2, [None, 8]), ("llama-3-8b", 3, [None, 8]), ("llama-70b", 3, [None, 8, 32])]
"""(model preset, ZeRO stage, shard groups: None is the world)."""
GPUS = (256, 1024)


def price(model: str, stage: int, gpus: int, shard_group: int | None, hardware: str) -> dict:
    hw, spec = load_hardware(hardware), load_model(model)
    cm = CostModel(spec, hw, Cluster(num_gpus=gpus, gpus_per_node=8, memory_bytes=hw.memory_bytes),
                   TrainingSetup(precision="bf16", zero_stage=stage, shard_group=shard_group))
    mb = MicroBatchShape(TOKENS, TOKENS * (TOKENS + 1) / 2, spec.num_layers)
    step = cm.step_price([GroupShape(8, (mb,) * 4)] * (gpus // 8))
    peak = cm.memory_bytes(TOKENS, 8, spec.num_layers)
    terms = cm.sync_terms()
    return {"model": model, "zero_stage": stage, "gpus": gpus, "shard_group": shard_group or gpus,
            "step_s": step.step_time_s, "busy_s": step.busy_s, "exposed_s": step.exposed_s,
            "grad_reduce_s": terms["grad_reduce"], "param_all_gather_s": terms.get("param_all_gather", 0.0),
            "resident_gb": cm.resident_bytes / 1e9, "peak_gb": peak / 1e9, "usable_gb": hw.memory_bytes / 1e9,
            "fits": peak <= hw.memory_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hardware", default="h200-sxm")
    args = parser.parse_args()
    rows = [price(model, stage, gpus, group, args.hardware)
            for model, stage, groups in CASES for gpus in GPUS for group in groups]
    print(f"{'model':11s} {'stage':>5s} {'GPUs':>5s} {'shard':>5s} {'step s':>7s} {'exposed':>8s} "
          f"{'reduce':>7s} {'gather':>7s} {'state GB':>8s} {'peak GB':>7s} fits")
    for r in rows:
        print(f"{r['model']:11s} {r['zero_stage']:5d} {r['gpus']:5d} {r['shard_group']:5d} {r['step_s']:7.3f} "
              f"{r['exposed_s']:8.3f} {r['grad_reduce_s']:7.3f} {r['param_all_gather_s']:7.3f} "
              f"{r['resident_gb']:8.2f} {r['peak_gb']:7.1f} {'yes' if r['fits'] else 'no'}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "hsdp_scale", "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "hardware": args.hardware, "precision": "bf16", "tokens_per_microbatch": TOKENS,
        "workload": "every node one SP group of 8 GPUs, 4 causal micro-batches, every layer checkpointed",
        "rows": rows,
    }, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
