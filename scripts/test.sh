#!/usr/bin/env bash
# README test command: set up .venv, then run the test suite (benchmarks excluded).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# two workers, one test file each at a time (module fixtures stay in one process): XLA compiles are
# single-threaded, so the suite takes ~2/3 of the serial time on a 2-core machine.
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "${CVS_JAX_TEST_WORKERS:-2}" --dist loadfile tests "$@"
