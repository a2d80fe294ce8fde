"""GPU calibration in one call: profile a Llama-7B layer, validate it, and measure what planned
checkpointing buys over full checkpointing. Results are JSON files under --out.

1. `dcp profile` of one llama-7b layer in bf16 over 1K..128K tokens (fit + held-out MAPE).
2. `dcp profile --validate`: whole 4-layer micro-batches, r = 0, 2, 4, predicted vs measured.
3. Checkpointing: a few-layer llama-7b-width model on micro-batches of Wikipedia lengths (short
   samples dominate: median 347 tokens in FlexSP's
   published lengths, arXiv 2412.01523), each run with the fewest checkpointed
   layers that fit memory by the profile's own memory model (DCP's per-micro-batch choice) and
   with every layer checkpointed (the bucket baseline's static choice). Reports the measured
   speedup, the cost model's predicted one, and each run's measured peak memory.

Every whole micro-batch run (phases 2 and 3) records torch.cuda.max_memory_allocated beside the
predicted memory (None on a CPU); so does the executor smoke check of run.sh.

Imports only dcp's torch side and numpy/scipy/rich (no planner ILP: no pulp/highspy needed).
`--device cpu --tiny` runs the same code on tiny sizes so that CI knows it works.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402

from dcp.costmodel import (  # noqa: E402
    DATASHEET_H200,
    Cluster,
    CostModel,
    HardwareProfile,
    TrainingSetup,
    load_hardware,
    load_model,
    save_hardware,
)
from dcp.data.workloads import wikipedia  # noqa: E402
from dcp.models.attention import attention_backend  # noqa: E402
from dcp.profiler.compute import Repeats, measure_model  # noqa: E402
from dcp.profiler.profile import ProfileOptions, profile_model, torch_device  # noqa: E402
from dcp.profiler.reference import reference_bench  # noqa: E402
from dcp.profiler.report import fit_table, mape_panel, validation_table  # noqa: E402
from dcp.profiler.timing import peak_allocated  # noqa: E402
from dcp.profiler.validate import predicted_bench_memory, validate_profile  # noqa: E402

console = Console()


def microbatches(cap_tokens: int, count: int, seed: int) -> list[list[int]]:
    """Consecutive Wikipedia samples packed into micro-batches of at most `cap_tokens` (longer
    samples are cut to the cap: this check is about checkpointing, not SP)."""
    lengths = np.random.default_rng(seed).permutation(wikipedia().tokens)
    out, cur = [], []
    for n in lengths:
        n = int(min(n, cap_tokens))
        if sum(cur) + n > cap_tokens:
            out.append(cur)
            cur = []
            if len(out) == count:
                break
        cur.append(n)
    return out


def checkpoint_speedup(profile: HardwareProfile, model_name: str, *, device: str, layers: int,
                       cap_tokens: int, count: int, reps: Repeats, deadline: float | None = None) -> dict:
    """Measured time of each micro-batch at r = fewest layers that fit and at r = K. No
    micro-batch starts when the last one's duration would carry it past `deadline`."""
    spec = replace(load_model(model_name), num_layers=layers)
    dtype = "fp32" if device == "cpu" else "bf16"
    # Single-GPU training of this K-layer model: bf16 weights, fp32 grads and Adam (18 B/param).
    training = TrainingSetup(precision="fp32" if dtype == "fp32" else "bf16", zero_stage=0)
    cm = CostModel(spec, profile, Cluster(num_gpus=1, gpus_per_node=1, memory_bytes=profile.memory_bytes), training)
    bench = reference_bench(spec, torch_device(device), dtype)
    model = bench.build_model(layers)  # type: ignore[misc]
    rows = []
    truncated, last_s = False, 0.0
    for mb in microbatches(cap_tokens, count, seed=0):
        if deadline is not None and time.monotonic() + last_s >= deadline:
            truncated = True
            break
        started = time.monotonic()
        tokens = sum(mb)
        r_min = cm.min_ckpt_layers(tokens, 1)
        if r_min is None:
            continue
        row = {"tokens": tokens, "samples": len(mb), "r_planned": r_min, "r_full": layers}
        for key, r in (("planned", r_min), ("full", layers)):
            model.set_ckpt_layers(r)
            samples = [bench.shape(n) for n in mb]
            try:
                with peak_allocated(bench.device) as peak:
                    point = measure_model(model, bench, samples, layers, reps, ckpt_layers=r)
            except torch.cuda.OutOfMemoryError:
                # The profile's memory model was too optimistic for this r: that is a result too.
                row[f"{key}_oom"] = True
                torch.cuda.empty_cache()
                break
            row[f"{key}_s"] = point.seconds
            row[f"{key}_predicted_s"] = cm.time_s(tokens, point.attn_pairs, 1, r)
            row[f"{key}_act_bytes"] = point.act_bytes
            row[f"{key}_predicted_act_bytes"] = cm.memory_bytes(tokens, 1, r) - cm.static_bytes
            # The whole micro-batch's peak against the prediction (the bench holds no optimizer).
            row[f"{key}_predicted_memory_bytes"] = predicted_bench_memory(cm, model, tokens, r)
            row[f"{key}_max_memory_allocated"] = peak[0]
        if "planned_oom" in row or "full_oom" in row:
            console.print(f"  [red]{tokens:,} tokens: out of memory at r={row['r_planned']}[/red]")
            rows.append(row)
            continue
        rows.append(row)
        last_s = time.monotonic() - started
        console.print(f"  {tokens:>7,} tokens {len(mb):>4} samples  r={r_min}: {row['planned_s']:.3f} s   "
                      f"r={layers}: {row['full_s']:.3f} s")
    done = [r for r in rows if "full_s" in r]
    planned = sum(r["planned_s"] for r in done)
    full = sum(r["full_s"] for r in done)
    predicted_planned = sum(r["planned_predicted_s"] for r in done)
    predicted = sum(r["full_predicted_s"] for r in done) / predicted_planned if predicted_planned else None
    return {"model": model_name, "layers": layers, "cap_tokens": cap_tokens, "memory_bytes": profile.memory_bytes,
            "static_bytes": cm.static_bytes, "rows": rows, "measured_speedup": full / planned if planned else None,
            "predicted_speedup": predicted, "out_of_memory": len(rows) - len(done), "truncated": truncated}


def environment(device: str) -> dict:
    """What the numbers were measured on: date, device, memory and software versions."""
    env = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
           "python": platform.python_version(), "numpy": np.__version__}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(device_name=props.name, device_memory_bytes=props.total_memory, cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version(), capability=f"{props.major}.{props.minor}",
                   attention_kernel=attention_backend(torch.device("cuda"), torch.bfloat16)[0])
    else:
        env.update(device_name=f"{platform.machine()} CPU")
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes (CPU check of this script)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--budget-s", type=float, default=400.0,
                    help="seconds for all three phases: validation stops starting micro-batches at 70%% "
                         "of it, the checkpointing check at 100%% (the profile itself always completes)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if args.tiny:
        model, base = "tiny-llama", "cpu"
        opts = ProfileOptions(device=args.device, quick=True, min_tokens=64, max_tokens=512, heldout=3)
        val = dict(layers=2, count=1, max_tokens=512)
        ck = dict(layers=2, cap_tokens=512, count=2, reps=Repeats(warmup=1, repeats=1))
    else:
        model, base = "llama-7b", DATASHEET_H200
        opts = ProfileOptions(device=args.device, min_tokens=1024, max_tokens=131072, heldout=8)
        val = dict(layers=4, count=3, max_tokens=65536)
        ck = dict(layers=8, cap_tokens=65536, count=6, reps=Repeats(warmup=1, repeats=2))
    spec = load_model(model)
    suffix = "tiny" if args.tiny else "h200"
    results: dict = {"device": args.device, "model": model, "budget_s": args.budget_s,
                     "environment": environment(args.device)}
    path = args.out / f"gpu-calibration-{suffix}.json"
    failed: list[str] = []

    def save() -> None:
        """After every phase: a run cut short by its time limit still leaves what it measured."""
        path.write_text(json.dumps(results, indent=1) + "\n")

    def phase(key: str, run: Callable[[], dict]) -> None:
        """Run one phase; a phase that fails is recorded (and fails the script) but does not cost
        the phases after it, since the device is lent for one call."""
        try:
            results[key] = {**run(), "elapsed_s": time.monotonic() - t0}
        except Exception as e:  # noqa: BLE001 - recorded and reported, exit status 1
            results[key] = {"error": f"{type(e).__name__}: {e}", "elapsed_s": time.monotonic() - t0}
            failed.append(key)
            console.print(f"[bold red]{key} failed: {type(e).__name__}: {e}[/bold red]")
        save()

    console.rule(f"1. profile {model} ({opts.device})")
    profiles: list[HardwareProfile] = []

    def profiling() -> dict:
        prof = profile_model(spec, load_hardware(base), opts)
        save_hardware(prof, args.out / f"profile-{suffix}.json")
        console.print(fit_table(prof, spec.name), mape_panel(spec.name, prof.heldout_mape))
        profiles.append(prof)
        return {"heldout_mape": prof.heldout_mape, "fit": asdict(prof.fits[spec.name])}

    phase("profile", profiling)
    if not profiles:
        return 1  # the other phases check the profile: nothing to check
    prof = profiles[0]

    def validation() -> dict:
        report = validate_profile(prof, spec, device=args.device, quick=True, deadline=t0 + 0.7 * args.budget_s, **val)
        console.print(validation_table(report), mape_panel("validation", report.mape))
        return {"mape": report.mape, "truncated": report.truncated, "rows": [asdict(r) for r in report.rows]}

    def checkpointing() -> dict:
        speed = checkpoint_speedup(prof, model, device=args.device, deadline=t0 + args.budget_s, **ck)
        console.print(f"measured speedup {speed['measured_speedup'] or 0:.3f}x (cost model predicted "
                      f"{speed['predicted_speedup'] or 0:.3f}x)")
        return speed

    console.rule("2. validate whole micro-batches")
    phase("validation", validation)
    console.rule("3. planned vs full checkpointing on Wikipedia lengths")
    phase("checkpointing", checkpointing)
    console.print(f"wrote {path} and {args.out / f'profile-{suffix}.json'} in {time.monotonic() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
