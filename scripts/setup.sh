#!/usr/bin/env bash
# Creates .venv (if missing) and installs cvs_jax with its test dependencies.
# Also installs Debian's Fashion-MNIST files for the offline demo when run as root and missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip 2>&1 | grep -v -i warning || true
.venv/bin/pip install -q -e ".[dev]" 2>&1 | grep -v -i "warning: location" || true
.venv/bin/python -c "import cvs_jax, jax, flax, optax, orbax.checkpoint, tensorflow_datasets" 
if [ ! -d /usr/share/datasets/fashion-mnist ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) >/dev/null 2>&1 \
    || echo "note: could not apt-get install dataset-fashion-mnist; the demo needs it (tests do not)."
fi
