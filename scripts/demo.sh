#!/usr/bin/env bash
# README demo command: set up .venv, then run finetune, cvs and joint on offline Fashion-MNIST
# (general setup), print each run's table and a comparison.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
WORKDIR=${WORKDIR:-workdirs/demo}
for method in finetune cvs joint; do
  .venv/bin/python -m cvs_jax.main --config configs/fashion_mnist_general.py \
    --workdir "$WORKDIR/$method" --config.method="$method" --config.data.data_dir="$WORKDIR/tfds"
done
.venv/bin/python -m cvs_jax.summarize "$WORKDIR"/finetune "$WORKDIR"/cvs "$WORKDIR"/joint
