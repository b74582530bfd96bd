#!/usr/bin/env bash
# One resumable chunk (< 10 minutes) of the Tiny-ImageNet mini GPU protocol: finetune, cvs, joint and
# rainbow at the paper's network and recipe (cvs_jax/config/variants.py: gpu). Run it again until it prints
# "done"; each run resumes from the last checkpoint (progress checkpoints every epoch and every
# train.checkpoint_every_steps steps), so a chunk killed by its time limit loses at most that much.
#   usage: launch/gpu_chunk.sh WORKDIR [DATA_DIR] [SECONDS]
set -uo pipefail
cd "$(dirname "$0")/.."
WORKDIR=${1:?usage: launch/gpu_chunk.sh WORKDIR [DATA_DIR] [SECONDS]}
DATA_DIR=${2:-$WORKDIR/tfds}
SECONDS_LEFT=${3:-540}
PY=${PYTHON:-python}
timeout --signal=KILL "$SECONDS_LEFT" "$PY" -m cvs_jax.compare \
  --config configs/tinyimagenet_mini_general.py:gpu --workdir "$WORKDIR" \
  --methods finetune,cvs,joint,rainbow --seeds 0 \
  --config.data.data_dir="$DATA_DIR" --config.train.checkpoint_every_steps=200
status=$?
if [ -f "$WORKDIR/comparison.md" ] && [ $status -eq 0 ]; then
  echo done; cat "$WORKDIR/comparison.md"
else
  echo "chunk ended (status $status); run the same command again to continue"
fi
