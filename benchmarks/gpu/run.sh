#!/usr/bin/env bash
# GPU calibration in one call (one H200, no network, PyTorch + numpy/scipy/pandas/click/rich only):
# profile a llama-7b layer in bf16 over 1K..128K tokens, validate it on whole micro-batches, and
# measure planned vs full checkpointing on Wikipedia lengths; then one executor smoke check
# (NCCL, bf16, the varlen kernel). Budget: under 8 minutes.
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
# The phases share 360 s (validation and the checkpointing check stop starting micro-batches
# when their part is spent; every phase saves its JSON as it ends); hard limit 420 s.
rc=0
timeout 420 "$PY" benchmarks/gpu/calibrate.py --out "$OUT_DIR" --budget-s 360 "$@" || rc=$?
# Then, in at most 45 s, the executor on this device (NCCL, bf16 autocast, the varlen attention
# kernel): 3 training steps of the tiny reference model, gradients against fp32 single-process
# training. The 8-minute budget's rest is interpreter and CUDA start-up.
# Every micro-batch it runs records torch.cuda.max_memory_allocated beside the plan's memory.
smoke_rc=0
rm -f "$OUT_DIR/executor-smoke-steps.jsonl"
timeout 45 "$PY" -m torch.distributed.run --nproc_per_node 1 examples/train_reference.py --steps 3 \
  --check-grads --stats-out "$OUT_DIR/executor-smoke-steps.jsonl" > "$OUT_DIR/executor-smoke.log" 2>&1 || smoke_rc=$?
"$PY" - "$OUT_DIR" "$smoke_rc" <<'PYEOF'
import json, os, re, sys
out, rc = sys.argv[1], int(sys.argv[2])
log = open(f"{out}/executor-smoke.log").read()
diff = re.findall(r"max_grad_diff=(\S+)", log)
steps_path = f"{out}/executor-smoke-steps.jsonl"
steps = [json.loads(line) for line in open(steps_path)] if os.path.exists(steps_path) else []
memory = [{"step": s["step"], "group": m["group"], "index": m["index"], "tokens": m["tokens"],
           "ckpt_layers": m["ckpt_layers"], "predicted_memory_bytes": m["predicted_memory_bytes"],
           "max_memory_allocated": m["peak_memory_bytes"]} for s in steps for m in s["microbatches"]]
json.dump({"command": "torch.distributed.run --nproc_per_node 1 examples/train_reference.py --steps 3 --check-grads",
           "exit_code": rc, "max_grad_diff": float(diff[-1]) if diff else None, "microbatch_memory": memory,
           "log_tail": log[-3000:]}, open(f"{out}/executor-smoke.json", "w"), indent=1)
print(f"executor smoke: exit {rc}, max_grad_diff {diff[-1] if diff else None}, {len(memory)} micro-batches")
PYEOF
rm -f "$OUT_DIR/executor-smoke.log" "$OUT_DIR/executor-smoke-steps.jsonl"  # in the JSON
exit $((rc != 0 ? rc : smoke_rc))
