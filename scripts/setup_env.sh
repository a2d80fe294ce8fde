#!/usr/bin/env bash
# Create .venv if missing and install dcp (with optional extras) into it.
# Idempotent: a second run with everything installed takes a few seconds.
# Usage: scripts/setup_env.sh [EXTRAS]   e.g. scripts/setup_env.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
py=.venv/bin/python
stamp=".venv/.dcp-installed${extras:+-$extras}"
# Reinstall only when the project metadata changed since the last install.
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  "$py" -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
  # The CPU build of torch lies on this machine's disk; an unpinned torch would
  # pull a multi-GB CUDA build. The package itself keeps a version range.
  "$py" -m pip install -q "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
  "$py" -m pip install -q -e ".${extras:+[$extras]}"
  touch "$stamp"
fi
