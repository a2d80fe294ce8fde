#!/usr/bin/env bash
# GPU calibration in one call (one H200, no network, PyTorch + numpy/scipy/pandas/click/rich only):
# profile a llama-7b layer in bf16 over 1K..128K tokens, validate it on whole micro-batches, and
# measure planned vs full checkpointing on Wikipedia lengths. Budget: under 8 minutes.
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
# The phases share 400 s (validation and the checkpointing check stop starting micro-batches
# when their part is spent; every phase saves its JSON as it ends); the hard limit of 460 s
# leaves the 8-minute budget's rest for interpreter and CUDA start-up.
timeout 460 "$PY" benchmarks/gpu/calibrate.py --out "$OUT_DIR" --budget-s 400 "$@"
