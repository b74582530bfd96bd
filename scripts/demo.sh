#!/usr/bin/env bash
# README demo command: set up .venv, then run finetune and joint on offline Fashion-MNIST
# (general setup) and print both result tables.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
WORKDIR=${WORKDIR:-workdirs/demo}
for method in finetune joint; do
  .venv/bin/python -m cvs_jax.main --config configs/fashion_mnist_general.py \
    --workdir "$WORKDIR/$method" --config.method="$method" --config.data.data_dir="$WORKDIR/tfds"
done
.venv/bin/python -m cvs_jax.summarize "$WORKDIR"/finetune "$WORKDIR"/joint
