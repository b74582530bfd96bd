#!/usr/bin/env bash
# README test command: set up .venv, then run the test suite (benchmarks excluded).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .            # lint: pyflakes (unused imports/variables), pycodestyle, import order
.venv/bin/ruff format --check .   # one code style
# types: pyright, basic mode, over cvs_jax/ ([tool.pyright] in pyproject.toml); the wheel's own node and bundled
# pyright, and no PyPI version check, so it runs offline (docs/testing.md)
PYRIGHT_PYTHON_GLOBAL_NODE=0 PYRIGHT_PYTHON_IGNORE_WARNINGS=1 .venv/bin/pyright
# bytecode caches (__pycache__, git-ignored) for the package and the tests: with PYTHONDONTWRITEBYTECODE set (as in
# some CI images) every worker compiled the sources anew (pytest's collection 6.5 s of CPU instead of 3.7 s) and
# every process a test starts recompiled cvs_jax (+0.25 s each; docs/testing.md)
unset PYTHONDONTWRITEBYTECODE
# two workers, one test file each at a time (module fixtures stay in one process): XLA compiles are
# single-threaded, so two workers use both cores; tests/conftest.py queues the heaviest files first (docs/testing.md
# has the measured time).
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "${CVS_JAX_TEST_WORKERS:-2}" --dist loadfile tests "$@"
