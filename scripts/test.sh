#!/usr/bin/env bash
# README test command: set up .venv, then run the test suite (benchmarks excluded).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider tests "$@"
