#!/usr/bin/env bash
# Set up .venv (if missing) and run the main job on the built-in defaults:
# plan the wikipedia workload for llama-7b on 32 GPUs of the default hardware preset.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
exec .venv/bin/dcp plan --steps 3 "$@"
