#!/usr/bin/env bash
# README test command: set up .venv, then run the test suite (benchmarks excluded).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .            # lint: pyflakes (unused imports/variables), pycodestyle, import order
.venv/bin/ruff format --check .   # one code style
# two workers, one test file each at a time (module fixtures stay in one process): XLA compiles are
# single-threaded, so two workers use both cores (docs/testing.md has the measured time).
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "${CVS_JAX_TEST_WORKERS:-2}" --dist loadfile tests "$@"
