#!/usr/bin/env bash
# Create .venv if missing and install dcp (with optional extras) into it.
# Idempotent: with everything installed a second run returns at once.
# Usage: scripts/setup_env.sh [EXTRAS]   e.g. scripts/setup_env.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
[ -x .venv/bin/python ] || python3 -m venv .venv
py=.venv/bin/python
stamp=".venv/.dcp-installed${extras:+-$extras}"

pip_quiet() {  # pip install, showing its output only when it fails
  local log
  log=$(mktemp)
  if ! "$py" -m pip install -q "$@" >"$log" 2>&1; then
    grep -v '^WARNING: Location' "$log" >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
}

# Reinstall only when the project metadata changed since the last install.
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup_env.sh: installing dcp${extras:+[$extras]} and torch into .venv (about 2 minutes, once)" >&2
  pip_quiet --upgrade pip
  # The CPU build of torch lies on this machine's disk; an unpinned torch would pull a
  # multi-GB CUDA build. The package itself keeps a version range.
  pip_quiet "torch==2.13.0"
  pip_quiet -e ".${extras:+[$extras]}"
  touch "$stamp"
fi
