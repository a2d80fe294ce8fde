"""Clean exits at scale: launch an 8-rank gloo training run many times and count the launches in
which every rank exited 0 (issue 56, item 18: about one launch in six ended with one rank aborting
at exit, `terminate called without an active exception`, exit -6, after every step had passed;
`dcp.launch.shutdown_distributed` is the fix).

    .venv/bin/python benchmarks/launches.py                      # 50 launches of 8 ranks, 2 steps
    .venv/bin/python benchmarks/launches.py --launches 10 --ranks 4 --steps 1

Each launch is `torchrun --standalone --nproc_per_node RANKS examples/train_reference.py --steps
STEPS`; torchrun exits 0 only when every rank did. Prints one line per launch and a summary;
exits 1 if any launch failed (its output is kept under --logs). Minutes: a launch of 8 ranks
imports torch 8 times (20-50 s on a shared 2-core machine).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--launches", type=int, default=50)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600, help="seconds one launch may take")
    ap.add_argument("--logs", default="benchmarks/results/launches", help="folder for failed launches' output")
    args = ap.parse_args()
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", str(args.ranks),
           str(ROOT / "examples" / "train_reference.py"), "--steps", str(args.steps)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    failed = 0
    for i in range(args.launches):
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
            rc, out = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            rc, out = "timeout", f"{e.stdout or ''}{e.stderr or ''}"
        aborted = out.count("terminate called")
        steps_seen = sum(line.startswith("step ") for line in out.splitlines())
        ok = rc == 0 and aborted == 0 and steps_seen == args.steps
        if not ok:
            failed += 1
            log = ROOT / args.logs / f"launch{i:03d}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(out)
        print(f"launch {i + 1:3d}/{args.launches}: rc {rc}, steps {steps_seen}/{args.steps}, "
              f"aborts {aborted}, {time.perf_counter() - t0:5.1f} s{'' if ok else '  FAILED'}", flush=True)
    print(f"{args.launches - failed}/{args.launches} launches of {args.ranks} gloo ranks ended with exit 0 on every rank "
          f"(load average {os.getloadavg()[0]:.1f} at the end)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
