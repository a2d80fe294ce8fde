#!/usr/bin/env bash
# Set up .venv (if missing) and run the main job on the built-in defaults:
# plan the wikipedia workload for llama-7b on 32 GPUs of the default hardware preset.
# Extra arguments go to `dcp plan`; relative paths in them (--workload, -o, --hardware) are the
# caller's, so this script stays in the caller's directory.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup_env.sh"
exec "$root/.venv/bin/dcp" plan --steps 3 "$@"
