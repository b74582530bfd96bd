#!/usr/bin/env bash
# One process drives every local GPU (single node): the batch is sharded over all of
# them on the mesh's `data` axis, the model replicated (cvs_jax.distributed.data_mesh).
#
# Usage:
#   launch/single_node.sh --config configs/cifar100_general.py --workdir workdirs/c100_cvs [--config.key=value ...]
#   GPUS=0,1 launch/single_node.sh --config ...      # only these GPUs (CUDA_VISIBLE_DEVICES)
#   PYTHON=/path/to/python launch/single_node.sh ... # interpreter (default: .venv/bin/python, else python3)
#
# train.batch_size and train.eval_batch_size must be multiples of the GPU count.
# No jax.distributed.initialize here (one process); multi-node: launch/slurm_multinode.sbatch
# or launch/multihost_example.sh.  Rerunning the same command resumes the run.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
if [ -n "${GPUS:-}" ]; then export CUDA_VISIBLE_DEVICES="$GPUS"; fi
# Let XLA take most GPU memory up front (JAX's default is 75%).
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}"
unset CVS_JAX_MULTIHOST
cmd=("$PYTHON" -m cvs_jax.main "$@")
echo "[single_node] CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-<all>} XLA_PYTHON_CLIENT_MEM_FRACTION=$XLA_PYTHON_CLIENT_MEM_FRACTION"
echo "[single_node] ${cmd[*]}"
exec "${cmd[@]}"
