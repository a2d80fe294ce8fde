#!/usr/bin/env bash
# GPU calibration in one call (one H200, no network, PyTorch + numpy/scipy/pandas/click/rich only):
# profile a llama-7b layer in bf16 over 1K..128K tokens, validate it on whole micro-batches, and
# measure planned vs full checkpointing on Wikipedia lengths; then the executor on FSDP2 (NCCL,
# the varlen kernel): ZeRO stage 1 in autocast-bf16, and on a GPU stage 3 in the bf16 recipe
# (MixedPrecisionPolicy: fp32 master shards gathered in bf16, lockstep slots). Budget: 8 minutes.
# Results: JSON under $OUT when the device tool sets it, else benchmarks/results/. Adopt them here
# with `benchmarks/gpu/adopt.py DIR` (the h200-measured preset + benchmarks/results/), then commit.
#
#   benchmarks/gpu/run.sh                 # on the GPU machine; JSON under $OUT (or benchmarks/results)
#   benchmarks/gpu/run.sh --device cpu --tiny   # the same code on tiny sizes, on a CPU
set -euo pipefail
cd "$(dirname "$0")/../.."
# dcp from this checkout without installing (pip install --no-deps -e . works too); never the
# planner's ILP, so neither pulp nor highspy is needed.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# The first Python that has torch: $PYTHON, python3 (the device machine's), this checkout's venv.
PY=""
for candidate in ${PYTHON:-} python3 python .venv/bin/python; do
  if "$candidate" -c 'import torch' >/dev/null 2>&1; then PY="$candidate"; break; fi
done
if [ -z "$PY" ]; then echo "Error: no Python with torch found (set PYTHON)" >&2; exit 1; fi
OUT_DIR="${OUT:-benchmarks/results}"
mkdir -p "$OUT_DIR"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
# The phases share 330 s (validation and the checkpointing check stop starting micro-batches
# when their part is spent; every phase saves its JSON as it ends); hard limit 380 s.
rc=0
timeout 380 "$PY" benchmarks/gpu/calibrate.py --out "$OUT_DIR" --budget-s 330 "$@" || rc=$?
# Then, in at most 45 s each, the executor on this device: training steps of the tiny reference
# model through dcp.executor (FSDP2's fully_shard, NCCL on a GPU), gradients against fp32
# single-process training. First ZeRO stage 1 in the device's default recipe (autocast-bf16 on a
# GPU); then, on a GPU (or with DCP_FSDP_SMOKE=1), stage 3 in the bf16 recipe. Every micro-batch
# records torch.cuda.max_memory_allocated beside the plan's memory. The budget's rest is
# interpreter and CUDA start-up.
smoke() {  # smoke NAME ARGS...: one run of examples/train_reference.py, its log and step stats
  local name=$1; shift
  local rc=0
  rm -f "$OUT_DIR/$name-steps.jsonl"
  timeout 45 "$PY" -m torch.distributed.run --nproc_per_node 1 examples/train_reference.py --check-grads \
    --stats-out "$OUT_DIR/$name-steps.jsonl" "$@" > "$OUT_DIR/$name.log" 2>&1 || rc=$?
  echo "$rc"
}
smoke_rc=$(smoke executor-smoke --steps 3)
fsdp_rc=skipped
if [ "${DCP_FSDP_SMOKE:-}" = 1 ] || "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
  fsdp_rc=$(smoke executor-fsdp-bf16 --steps 2 --zero-stage 3 --precision bf16)
fi
"$PY" - "$OUT_DIR" "$smoke_rc" "$fsdp_rc" <<'PYEOF'
import json, os, re, sys
out, rc, fsdp_rc = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def run(name, code, command):
    """One smoke run's exit code, last max_grad_diff, every micro-batch's memory and log tail."""
    log = open(f"{out}/{name}.log").read()
    diff = re.findall(r"max_grad_diff=(\S+)", log)
    steps_path = f"{out}/{name}-steps.jsonl"
    steps = [json.loads(line) for line in open(steps_path)] if os.path.exists(steps_path) else []
    memory = [{"step": s["step"], "group": m["group"], "index": m["index"], "tokens": m["tokens"],
               "ckpt_layers": m["ckpt_layers"], "predicted_memory_bytes": m["predicted_memory_bytes"],
               "max_memory_allocated": m["peak_memory_bytes"]} for s in steps for m in s["microbatches"]]
    return {"command": command, "exit_code": code, "max_grad_diff": float(diff[-1]) if diff else None,
            "microbatch_memory": memory, "log_tail": log[-3000:]}

base = "torch.distributed.run --nproc_per_node 1 examples/train_reference.py --check-grads"
result = run("executor-smoke", rc, f"{base} --steps 3")
if fsdp_rc == "skipped":
    result["fsdp_bf16_stage3"] = {"skipped": "no GPU (set DCP_FSDP_SMOKE=1 to run it anyway)"}
else:
    result["fsdp_bf16_stage3"] = run("executor-fsdp-bf16", int(fsdp_rc), f"{base} --steps 2 --zero-stage 3 --precision bf16")
json.dump(result, open(f"{out}/executor-smoke.json", "w"), indent=1)
print(f"executor smoke: exit {rc}, max_grad_diff {result['max_grad_diff']}, {len(result['microbatch_memory'])} micro-batches")
fsdp = result["fsdp_bf16_stage3"]
print("FSDP2 stage 3 bf16:", fsdp.get("skipped") or f"exit {fsdp['exit_code']}, max_grad_diff {fsdp['max_grad_diff']}")
PYEOF
rm -f "$OUT_DIR"/executor-smoke.log "$OUT_DIR"/executor-smoke-steps.jsonl \
  "$OUT_DIR"/executor-fsdp-bf16.log "$OUT_DIR"/executor-fsdp-bf16-steps.jsonl  # in the JSON
fsdp_code=$([ "$fsdp_rc" = skipped ] && echo 0 || echo "$fsdp_rc")
exit $((rc != 0 ? rc : (smoke_rc != 0 ? smoke_rc : fsdp_code)))
