"""Self-check of a CPU profile: the cost model it fits against the executor, on 2 gloo ranks.

    .venv/bin/dcp profile --device cpu -o A.json            # a profile of tiny-llama on this machine
    .venv/bin/python benchmarks/selfcheck.py --profile A.json [--profile B.json] [--rounds 5]

Runs `PLANS` (15 hand-made plans of tiny-llama: micro-batch sizes and counts, packed samples,
0-2 checkpointed layers, SP 1 and 2, balanced and not) through the executor (ZeRO stage 1, fp32,
one torch thread per rank, as the profile was timed) and compares, per profile, the cost model's
predicted micro-batch times (`CostModel.time_s`) and step times (`CostModel.step_price`) with
the measured ones. Measured is the CPU time the executor logs (`MicroBatchStats.cpu_s`,
`StepStats.cpu_step_s`; a step's is its busiest rank's), the fastest of `--rounds` steps of each
plan (the first round is a warm-up): CPU time, because the machine is shared and wall time there
measures the other jobs too (the wall-clock ratios are kept beside). Plans run round-robin, so a
slow drift of the machine touches every plan alike.

Each round also times the profiler's reference kernel (`dcp.profiler.reference.ReferenceKernel`)
before its first plan and after every plan, both ranks at once as they run the plans: a CPU profile
reads each of its points in units of that kernel timed beside it and records them at the kernel's
median reading (`dcp.profiler.profile.Anchor`, `meta.reference`), and the self-check reads each
round's step the same way. The machine's speed then reads apart from the cost model's error
("machine speed": the kernel's median here over the profile's), and two profiles' disagreement
apart from the machine's drift between them.

Reports, per profile, measured / predicted of each plan's step and of each micro-batch (median,
min, max) and the Spearman rank correlation of predicted and measured steps, in CPU seconds and at
one machine speed (the step in kernel units against the prediction in the profile's units:
model error apart from the machine's drift); with two profiles, how far their predictions of each
plan lie apart, in seconds and in each profile's units (the disagreement the machine's drift
between them does not explain). Writes benchmarks/results/selfcheck.json (or
--output). Not a test: nothing asserts on time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from scipy.stats import spearmanr

from dcp.costmodel import (
    Cluster,
    CostModel,
    HardwareProfile,
    TrainingSetup,
    attention_pairs,
    load_hardware,
    load_model,
)
from dcp.costmodel.schedule import GroupShape, MicroBatchShape

RESULTS = Path(__file__).parent / "results" / "selfcheck.json"
MODEL = "tiny-llama"
ZERO_STAGE = 1
WORLD = 2
# Per plan: a name and its groups, (first rank, SP size, [(sample lengths, checkpointed layers), ...]).
PLANS: list[tuple[str, list[tuple[int, int, list[tuple[list[int], int]]]]]] = [
    ("sp1 1x1024", [(0, 1, [([1024], 0)]), (1, 1, [([1024], 0)])]),
    ("sp1 2x512", [(0, 1, [([512], 0), ([512], 0)]), (1, 1, [([512], 0), ([512], 0)])]),
    ("sp1 4x256+256 packed", [(r, 1, [([256, 256], 0)] * 4) for r in range(2)]),
    ("sp1 2048 r=2", [(0, 1, [([2048], 2)]), (1, 1, [([2048], 2)])]),
    ("sp1 8x512 packed r=1", [(0, 1, [([512] * 8, 1)]), (1, 1, [([512] * 4, 1)])]),
    ("sp1 uneven 3000 | 2x500", [(0, 1, [([3000], 0)]), (1, 1, [([500], 0), ([500], 1)])]),
    ("sp1 16x64 packed | 1024", [(0, 1, [([64] * 16, 0)]), (1, 1, [([1024], 0)])]),
    ("sp1 8x128", [(r, 1, [([128], 0)] * 8) for r in range(2)]),
    ("sp1 4096+1024 r=1", [(0, 1, [([4096], 1), ([1024], 0)]), (1, 1, [([2048, 2048], 1), ([1024], 0)])]),
    ("sp2 2048", [(0, 2, [([2048], 0)])]),
    ("sp2 2x1024", [(0, 2, [([1024], 0), ([1024], 0)])]),
    ("sp2 4096 r=2", [(0, 2, [([4096], 2)])]),
    ("sp2 8x256 packed r=1", [(0, 2, [([256] * 8, 1)])]),
    ("sp2 1536 | 768x2 | 512+2x256", [(0, 2, [([1536], 0), ([768, 768], 0), ([512, 256, 256], 1)])]),
    ("sp2 6000 r=1", [(0, 2, [([6000], 1)])]),
]


def build(plan_groups: list[tuple[int, int, list[tuple[list[int], int]]]]) -> tuple[list[Any], list[tuple]]:
    """Samples with ids in plan order, and the groups of `manual_plan` over their ids."""
    from dcp.planner import Sample

    batch, groups = [], []
    for first, sp, mbs in plan_groups:
        ids_r = []
        for lengths, r in mbs:
            ids = []
            for n in lengths:
                batch.append(Sample(len(batch), n, attention_pairs("causal", n)))
                ids.append(batch[-1].id)
            ids_r.append((ids, r))
        groups.append((first, sp, ids_r))
    return batch, groups


def worker(rank: int, store: str, rounds: int, out: dict) -> None:
    from dcp.executor import Executor, ParallelState
    from dcp.executor.reference import manual_plan
    from dcp.models import build_model, lm_loss, sample_tensors
    from dcp.profiler.anchor import Anchor
    from dcp.profiler.reference import ReferenceKernel

    torch.set_num_threads(1)  # as the profile was timed
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                            timeout=timedelta(minutes=5))
    state = ParallelState.create(timeout_s=300)
    spec = load_model(MODEL)
    executor = Executor(build_model(spec, seed=0), state, recipe="fp32", zero_stage=ZERO_STAGE, gather_stats=True)
    plans = []
    for _, plan_groups in PLANS:
        batch, groups = build(plan_groups)
        plan = manual_plan(batch, WORLD, spec.num_layers, groups, gpus_per_node=WORLD)
        plans.append((plan, {s.id: sample_tensors(spec, s) for s in batch}))

    def loss_fn(o, b):  # noqa: ANN001, ANN202
        return lm_loss(o, b["labels"])

    measured: list[dict[str, Any]] = [{"step_cpu_s": [], "step_wall_s": [], "reference_s": [], "mb": {}}
                                      for _ in PLANS]
    anchor = Anchor(ReferenceKernel())  # every rank reads it at once, as the profile's points were read
    for rnd in range(rounds + 1):  # round 0: warm-up
        dist.barrier()
        anchor.gap()
        for i, (plan, tensors) in enumerate(plans):
            dist.barrier()
            stats, kernel_s = anchor.bracket(lambda p=plan, t=tensors: executor.step(p, t, loss_fn))
            steps: list[Any] = [None] * WORLD
            dist.all_gather_object(steps, (stats.cpu_step_s, stats.measured_step_s))
            if rnd == 0:
                continue
            measured[i]["step_cpu_s"].append(max(c for c, _ in steps))
            measured[i]["step_wall_s"].append(max(w for _, w in steps))
            measured[i]["reference_s"].append(kernel_s)
            for m in stats.microbatches:
                row = measured[i]["mb"].setdefault(f"{m.group}.{m.index}", {"cpu_s": [], "wall_s": []})
                row["cpu_s"].append(m.cpu_s)
                row["wall_s"].append(m.measured_s)
    if rank == 0:
        out["measured"] = measured
        out["reference_s"] = anchor.readings[len(PLANS) + 1:]  # after the warm-up round
        out["load_after"] = os.getloadavg()
    dist.barrier()
    dist.destroy_process_group()


def predictions(profile: HardwareProfile) -> list[dict[str, Any]]:
    """Per plan: each micro-batch's predicted time ("group.index" -> seconds) and the step's."""
    spec = load_model(MODEL)
    cm = CostModel(spec, profile, Cluster(num_gpus=WORLD, gpus_per_node=WORLD, memory_bytes=profile.memory_bytes),
                   TrainingSetup(precision="fp32", zero_stage=ZERO_STAGE))
    out = []
    for _, plan_groups in PLANS:
        mbs, shapes = {}, []
        for gi, (_, sp, micro) in enumerate(plan_groups):
            shape = []
            for mi, (lengths, r) in enumerate(micro):
                tokens, pairs = sum(lengths), sum(attention_pairs("causal", n) for n in lengths)
                mbs[f"{gi}.{mi}"] = cm.time_s(tokens, pairs, sp, r)
                shape.append(MicroBatchShape(tokens, pairs, r))
            shapes.append(GroupShape(sp, tuple(shape)))
        # The executor's step, which the self-check times, runs no optimizer: its step is priced without.
        out.append({"mb": mbs, "step_s": cm.step_price(shapes, False).step_time_s - cm.optimizer_s})
    return out


def ratio_summary(ratios: list[float]) -> dict[str, float]:
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def compare(measured: list[dict[str, Any]], predicted: list[dict[str, Any]], profile_speed_s: float | None
            ) -> dict[str, Any]:
    """measured / predicted per plan (step) and per micro-batch, on CPU time and on wall time;
    with the profile's speed (`profile_speed_s`, its reference kernel's median reading), the step
    ratio at one machine speed too: each round's step in units of the kernel read beside it (the
    mean of the readings before and after it), the fastest round's, against the prediction in the
    profile's units (predicted / `profile_speed_s`), as the profile read its points (`Anchor`)."""
    plans, steps_m, steps_p, mb_ratios, mb_wall = [], [], [], [], []
    for (name, _), m, p in zip(PLANS, measured, predicted, strict=True):
        step_cpu, step_wall = min(m["step_cpu_s"]), min(m["step_wall_s"])
        step_units = min(c / r for c, r in zip(m["step_cpu_s"], m["reference_s"], strict=True))
        mbs = {k: {"predicted_s": p["mb"][k], "cpu_s": min(v["cpu_s"]), "wall_s": min(v["wall_s"]),
                   "ratio": min(v["cpu_s"]) / p["mb"][k]} for k, v in sorted(m["mb"].items())}
        mb_ratios += [v["ratio"] for v in mbs.values()]
        mb_wall += [v["wall_s"] / v["predicted_s"] for v in mbs.values()]
        steps_m.append(step_cpu)
        steps_p.append(p["step_s"])
        plans.append({"plan": name, "predicted_step_s": p["step_s"], "step_cpu_s": step_cpu, "step_wall_s": step_wall,
                      "ratio": step_cpu / p["step_s"], "wall_ratio": step_wall / p["step_s"], "step_units": step_units,
                      "ratio_at_speed": step_units * profile_speed_s / p["step_s"] if profile_speed_s else None,
                      "microbatches": mbs})
    step_ratios = [p["ratio"] for p in plans]
    scaled = None
    if profile_speed_s is not None:
        at_speed = [p["ratio_at_speed"] for p in plans]
        scaled = {**ratio_summary(at_speed), "in_0.75_1.33": sum(0.75 <= r <= 1.33 for r in at_speed),
                  "spearman": float(spearmanr([p["step_units"] for p in plans], steps_p).statistic)}
    return {
        "step": {**ratio_summary(step_ratios), "spearman": float(spearmanr(steps_p, steps_m).statistic),
                 "in_0.75_1.33": sum(0.75 <= r <= 1.33 for r in step_ratios), "plans": len(plans),
                 "wall": ratio_summary([p["wall_ratio"] for p in plans]), "at_machine_speed": scaled},
        "microbatch": {**ratio_summary(mb_ratios), "spearman": float(spearmanr(
            [v["predicted_s"] for p in plans for v in p["microbatches"].values()],
            [v["cpu_s"] for p in plans for v in p["microbatches"].values()]).statistic),
            "in_0.75_1.33": sum(0.75 <= r <= 1.33 for r in mb_ratios), "count": len(mb_ratios),
            "wall": ratio_summary(mb_wall)},
        "plans": plans,
    }


def profile_record(path: str, profile: HardwareProfile) -> dict[str, Any]:
    fit_meta = profile.meta.get("fits", {}).get(MODEL, {})
    executor = fit_meta.get("executor") or {}
    return {"path": path, "name": profile.name, "created": profile.meta.get("created"),
            "r2": fit_meta.get("r2"), "r2_below": fit_meta.get("r2_below"),
            "r2_all_to_all": (executor.get("all_to_all") or {}).get("r2"), "reference": profile.meta.get("reference"),
            "warnings": profile.meta.get("warnings"),
            "a2a_call_s": profile.fits[MODEL].a2a_call_s, "a2a_token_s": profile.fits[MODEL].a2a_token_s,
            "step_fixed_s": profile.fits[MODEL].step_fixed_s,
            "heldout_mape": profile.fits[MODEL].heldout_mape,
            "microbatch_fixed_s": profile.fits[MODEL].microbatch_fixed_s, "timing": fit_meta.get("timing")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", action="append", required=True,
                        help=f"a CPU profile of {MODEL} (dcp profile --device cpu -o P.json); give two to compare them")
    parser.add_argument("--rounds", type=int, default=5, help="timed steps of each plan (after one warm-up)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    profiles = {p: load_hardware(p) for p in args.profile}
    for path, prof in profiles.items():
        if MODEL not in prof.fits:
            parser.error(f"--profile {path}: no fit for {MODEL}; run `dcp profile --device cpu -o {path}`")
    preds = {p: predictions(prof) for p, prof in profiles.items()}  # before running: a bad profile fails early
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(worker, args=(os.path.join(tmp, "store"), args.rounds, out), nprocs=WORLD)
        measured, load_after, reference = out["measured"], out["load_after"], out["reference_s"]
    # The profile's speed: the median of its reference readings (an anchored profile's points are
    # recorded at it; a profile from before that kept its fastest reading: the fastest).
    profile_speed = {p: ref.get("median_s", ref["fastest_s"]) if (ref := prof.meta.get("reference")) else None
                     for p, prof in profiles.items()}
    speeds = {p: statistics.median(reference) / s if s else None for p, s in profile_speed.items()}
    results: dict[str, Any] = {}
    for path, prof in profiles.items():
        results[path] = {"profile": profile_record(path, prof), "machine_speed": speeds[path],
                         **compare(measured, preds[path], profile_speed[path])}
    agreement = None
    if len(profiles) > 1:
        first, *rest = list(preds)
        agreement = {}
        for other in rest:
            step = [b["step_s"] / a["step_s"] for a, b in zip(preds[first], preds[other], strict=True)]
            mb = [b["mb"][k] / a["mb"][k] for a, b in zip(preds[first], preds[other], strict=True) for k in a["mb"]]
            agreement[other] = {"against": first, "step_ratio": ratio_summary(step), "microbatch_ratio": ratio_summary(mb),
                                "max_step_difference": max(abs(r - 1) for r in step),
                                "max_microbatch_difference": max(abs(r - 1) for r in mb)}
            a, b = profile_speed[first], profile_speed[other]
            if a and b:  # each profile's predictions in its kernel's units (at one machine speed)
                agreement[other]["reference_ratio"] = b / a
                agreement[other]["max_step_difference_at_speed"] = max(abs(r * a / b - 1) for r in step)
    for path, r in results.items():
        s, m = r["step"], r["microbatch"]
        print(f"{path}: R^2 {r['profile']['r2']}")
        print(f"  step  measured/predicted median {s['median']:.3f} [{s['min']:.3f}, {s['max']:.3f}] "
              f"in 0.75-1.33: {s['in_0.75_1.33']}/{s['plans']}  Spearman {s['spearman']:.3f}  "
              f"(wall: median {s['wall']['median']:.3f} [{s['wall']['min']:.3f}, {s['wall']['max']:.3f}])")
        if s["at_machine_speed"]:
            z = s["at_machine_speed"]
            print(f"  machine {r['machine_speed']:.3f} x as slow as the profile's (reference kernel); step at one "
                  f"speed (kernel units): median {z['median']:.3f} [{z['min']:.3f}, {z['max']:.3f}] in 0.75-1.33: "
                  f"{z['in_0.75_1.33']}/{s['plans']}  Spearman {z['spearman']:.3f}")
        print(f"  micro-batch median {m['median']:.3f} [{m['min']:.3f}, {m['max']:.3f}] in 0.75-1.33: "
              f"{m['in_0.75_1.33']}/{m['count']}  Spearman {m['spearman']:.3f}")
        for p in r["plans"]:
            print(f"    {p['plan']:32s} predicted {p['predicted_step_s'] * 1e3:8.2f} ms  cpu {p['step_cpu_s'] * 1e3:8.2f} ms"
                  f"  ratio {p['ratio']:.3f}  wall {p['wall_ratio']:.3f}")
    if agreement:
        for other, a in agreement.items():
            print(f"{other} against {a['against']}: steps {a['step_ratio']}, largest difference "
                  f"{a['max_step_difference']:.1%} (micro-batches {a['max_microbatch_difference']:.1%})")
            if "reference_ratio" in a:
                print(f"  reference kernel {a['reference_ratio']:.3f} x as long in {other}; predictions scaled by it "
                      f"differ by at most {a['max_step_difference_at_speed']:.1%}")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "benchmark": "selfcheck", "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python benchmarks/selfcheck.py " + " ".join(f"--profile {p}" for p in args.profile)
                   + f" --rounds {args.rounds}",
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs", "torch": torch.__version__,
        "load_average_before": load_before, "load_average_after": load_after, "ranks": WORLD, "model": MODEL,
        "reference_s": reference,
        "zero_stage": ZERO_STAGE, "rounds": args.rounds,
        "plans": [{"plan": n, "groups": g} for n, g in PLANS],
        "profiles": results, "agreement": agreement,
    }, indent=1, default=lambda o: dataclasses.asdict(o)) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
