#!/usr/bin/env bash
# Set up .venv with the test extra (if needed) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh test
.venv/bin/ruff check dcp tests benchmarks examples
exec .venv/bin/python -m pytest "$@"
