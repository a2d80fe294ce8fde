"""A two-node launch simulated on one machine: two torchrun agents (`--nnodes 2`, 2 ranks each,
one c10d rendezvous endpoint, node ranks 0 and 1) train the reference Llama in float64 with HSDP
(shard within a "node" of `LOCAL_WORLD_SIZE` ranks, replicate across the two), 3 AdamW steps of
random plans (SP 1 and 2, uneven micro-batches), and rank 0 compares the gradients and the
parameters after each step with single-process training of the same batches
(`dcp.executor.reference.compare_step`).

    .venv/bin/python benchmarks/two_node_launch.py        # prints max_diff, exits 1 above 1e-12

Writes benchmarks/results/two_node_launch.json. (The same script is each rank's program: run
under torchrun it trains; run plainly it starts the two agents.)
"""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "two_node_launch.json"
TOLERANCE = 1e-12


def train() -> None:
    """One rank's program under torchrun."""
    import random

    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT / "tests"))
    from dist_helpers import llama_spec, random_case

    from dcp.executor import Executor, ParallelState, executor_optimizer
    from dcp.executor.reference import compare_step
    from dcp.models import build_model, lm_loss, sample_tensors

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    state = ParallelState.create(timeout_s=120)  # GPUs per node from LOCAL_WORLD_SIZE: 2
    spec = llama_spec()
    model = build_model(spec, dtype=torch.float64, seed=0)
    ref = copy.deepcopy(model)
    executor = Executor(model, state, zero_stage=2, shard_group=state.gpus_per_node)
    adamw = {"lr": 1e-2, "weight_decay": 0.1, "eps": 1e-2}  # lr / eps = 1: tests/test_sharding_dist.py ADAMW
    executor_optimizer(executor, **adamw)
    ref_opt = torch.optim.AdamW(ref.parameters(), **adamw)

    def loss_fn(o, b):  # noqa: ANN001, ANN202
        return lm_loss(o, b["labels"])

    rng, diffs = random.Random(0), []
    for step in range(3):
        counts = [rng.randint(1, 3) for _ in range(3)]
        plan, batch = random_case(spec, 70 + step, [(0, 2), (2, 1), (3, 1)], 4, microbatches=counts, gpus_per_node=2)
        tensors = {s.id: sample_tensors(spec, s, seed=step, dtype=torch.float64) for s in batch}
        diffs.append(max(compare_step(executor, ref, ref_opt, plan, batch, tensors, loss_fn)[:2]))
    if state.rank == 0:
        print(json.dumps({"mesh": list(executor.mesh.shape), "gpus_per_node": state.gpus_per_node,
                          "world": state.world_size, "diffs": diffs}))
    dist.barrier()
    dist.destroy_process_group()


def launch() -> int:
    """Start the two agents (node ranks 0 and 1) against one rendezvous endpoint and wait."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "2",
                "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "dcp-two-node"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    agents = [subprocess.Popen([*torchrun, "--node_rank", str(node), __file__, "--train"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    outputs = [a.communicate(timeout=600)[0] for a in agents]
    codes = [a.returncode for a in agents]
    line = next((ln for out in outputs for ln in out.splitlines() if ln.startswith('{"mesh"')), None)
    if any(codes) or line is None:
        print("\n".join(outputs))
        print(f"Error: the agents exited {codes}")
        return 1
    result = json.loads(line)
    worst = max(result["diffs"])
    print(f"mesh {result['mesh']} (replicate x shard), {result['world']} ranks, {result['gpus_per_node']} per node; "
          f"max_diff={worst:.2e} (gradients and parameters) over 3 AdamW steps")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"benchmark": "two_node_launch", **result, "max_diff": worst}, indent=1) + "\n")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    if "--train" in sys.argv:
        train()
    else:
        sys.exit(launch())
