"""Does a CPU's drift touch every size of work alike? The reference kernel against one tiny-llama
layer at several sizes, interleaved, for some minutes (docs/tuning-log.md, the profiler's anchor).

    .venv/bin/python benchmarks/reference_drift.py --minutes 12 --output drift.json
    .venv/bin/python benchmarks/reference_drift.py --analyze drift.json

Each round times the reference kernel (`dcp.profiler.reference.ReferenceKernel`), then one layer's
forward and backward at 128, 512, 2,048 and 8,192 tokens (fastest of 3 after a warm-up, one torch
thread, as `dcp profile` times a point), then the kernel again. `--analyze` groups rounds into
windows of 10 and prints each window's median kernel time, each size's median time, and each
size's median time in units of the kernel read around it (what `dcp.profiler.anchor.Anchor`
records): a drift the kernel tracks moves the times and leaves the units still. Not a test:
nothing asserts on time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

SIZES = (128, 512, 2048, 8192)
WINDOW = 10


def measure(minutes: float, output: str) -> None:
    import torch

    from dcp.costmodel import load_model
    from dcp.profiler.compute import Repeats, measure_layer
    from dcp.profiler.reference import ReferenceKernel, reference_bench

    torch.set_num_threads(1)
    kernel = ReferenceKernel()
    bench = reference_bench(load_model("tiny-llama"), "cpu", "fp32")
    layer = bench.build_layer()
    rows: list[dict[str, float]] = []
    start = time.monotonic()
    while time.monotonic() - start < minutes * 60:
        row = {"t": time.monotonic() - start, "ref": kernel.seconds()}
        for n in SIZES:
            p = measure_layer(layer, bench, [bench.shape(n)], Repeats(warmup=1, repeats=3))
            row[str(n)] = p.fwd_s + p.bwd_s
        row["ref_after"] = kernel.seconds()
        rows.append(row)
        with open(output, "w") as f:  # every round: an interrupted run keeps what it measured
            json.dump({"benchmark": "reference_drift", "sizes": SIZES, "rows": rows}, f)


def analyze(path: str) -> None:
    with open(path) as f:
        data = json.load(f)
    rows = data["rows"] if isinstance(data, dict) else data
    print(f"{len(rows)} rounds over {rows[-1]['t']:.0f} s")
    for i in range(0, len(rows) - WINDOW + 1, WINDOW):
        chunk = rows[i:i + WINDOW]
        ref = [(r["ref"] + r["ref_after"]) / 2 for r in chunk]
        times = " ".join(f"{n}:{statistics.median(r[str(n)] for r in chunk) * 1e3:7.2f}" for n in SIZES)
        units = " ".join(f"{statistics.median(r[str(n)] / k for r, k in zip(chunk, ref, strict=True)):7.3f}"
                         for n in SIZES)
        print(f"t {chunk[0]['t']:5.0f} s  kernel {statistics.median(ref) * 1e3:6.2f} ms | ms {times} | units {units}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=12.0)
    parser.add_argument("--output", default="reference-drift.json")
    parser.add_argument("--analyze", metavar="JSON", help="summarize a run instead of measuring")
    args = parser.parse_args()
    if args.analyze:
        analyze(args.analyze)
    else:
        measure(args.minutes, args.output)


if __name__ == "__main__":
    main()
