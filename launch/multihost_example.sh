#!/usr/bin/env bash
# Multi-host without a scheduler: run this once on every host, same arguments except the
# process id.  Each process drives all GPUs of its host; process 0's host is the coordinator.
#
# Usage:
#   launch/multihost_example.sh COORDINATOR_HOST:PORT NUM_PROCESSES PROCESS_ID --config ... --workdir ...
# e.g. on two hosts:
#   host-a$ launch/multihost_example.sh host-a:12345 2 0 --config configs/cifar100_general.py --workdir /shared/wd
#   host-b$ launch/multihost_example.sh host-a:12345 2 1 --config configs/cifar100_general.py --workdir /shared/wd
#
# Sets CVS_JAX_MULTIHOST=1 and JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID,
# which cvs_jax.distributed.maybe_initialize passes to jax.distributed.initialize().
# The port must be open between the hosts; the workdir on a filesystem all hosts see.
# To try it on ONE machine with CPU devices (2 processes x 2 devices), in two shells:
#   JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=2 launch/multihost_example.sh localhost:12345 2 0 ...
#   JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=2 launch/multihost_example.sh localhost:12345 2 1 ...
set -euo pipefail
if [ $# -lt 3 ]; then
  awk 'NR > 1 && /^#/ {print} /^set /{exit}' "$0"; exit 2
fi
COORD="$1"; NPROC="$2"; PID="$3"; shift 3
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export CVS_JAX_MULTIHOST=1 JAX_COORDINATOR_ADDRESS="$COORD" JAX_NUM_PROCESSES="$NPROC" JAX_PROCESS_ID="$PID"
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}"
cmd=("$PYTHON" -m cvs_jax.main "$@")
echo "[multihost] process $PID of $NPROC, coordinator $COORD"
echo "[multihost] CVS_JAX_MULTIHOST=1 JAX_COORDINATOR_ADDRESS=$COORD JAX_NUM_PROCESSES=$NPROC JAX_PROCESS_ID=$PID ${cmd[*]}"
exec "${cmd[@]}"
