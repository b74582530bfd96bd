"""Multi-device and multi-host plumbing: one ``data`` mesh, per-process batch slices.

One process drives all of its local devices (``jax.devices()`` spans every
process once ``jax.distributed.initialize`` has run).  The whole run uses a
single 1-axis mesh named ``data``; batches are sharded over it and the model
state is replicated.  In a multi-host run every process loads only its own rows
of each global batch (``process_slice``) and ``global_batch`` assembles the
global ``jax.Array`` from those per-process pieces, so no host ever reads the
whole batch.  With one process all of this is exactly ``jax.device_put``.

Turning multi-host on is explicit (``maybe_initialize(True)``, or the
environment variable ``CVS_JAX_MULTIHOST=1``); the coordinator address, the
process count and the process id then come from, in order: the arguments,
``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``, or
JAX's cluster auto-detection (SLURM, Open MPI, Kubernetes, Cloud TPU).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DATA_AXIS = "data"
ENV_FLAG = "CVS_JAX_MULTIHOST"

_log = logging.getLogger(__name__)


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else None


def _slurm_local_device_ids() -> list[int] | None:
    """All GPUs of the node when SLURM runs one task per node.

    JAX's SLURM auto-detection sets ``local_device_ids=[SLURM_LOCALID]``, i.e. one
    GPU per process, which silently leaves every other GPU of the node idle when
    the job runs one process per node.  With one task per node we hand the
    process every GPU SLURM gave the node (``SLURM_GPUS_ON_NODE``).
    """
    if "SLURM_JOB_ID" not in os.environ or "JAX_LOCAL_DEVICE_IDS" in os.environ:
        return None
    per_node = os.environ.get("SLURM_STEP_TASKS_PER_NODE") or os.environ.get("SLURM_NTASKS_PER_NODE")
    gpus = _env_int("SLURM_GPUS_ON_NODE")
    if per_node is None or gpus is None:
        return None
    # SLURM writes e.g. "1(x4)" or "1,1": one task per node when every entry starts with 1.
    if all(part.split("(")[0] == "1" for part in per_node.split(",")):
        return list(range(gpus))
    return None


def multihost_requested(enabled: bool = False) -> bool:
    """True when the config flag or ``CVS_JAX_MULTIHOST=1`` asks for a multi-process run."""
    return bool(enabled) or os.environ.get(ENV_FLAG, "").lower() in ("1", "true", "yes")


def maybe_initialize(
    enabled: bool = False,
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: Sequence[int] | None = None,
) -> bool:
    """Calls ``jax.distributed.initialize`` once, only when multi-host is requested.

    Must run before anything touches a JAX backend (``jax.devices()``, the first
    array).  Returns True when this process is part of a multi-process run.
    Calling it again, or with multi-host off, is a no-op.
    """
    if not multihost_requested(enabled):
        return False
    if jax.distributed.is_initialized():
        return True
    kwargs: dict[str, Any] = {}
    coordinator_address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
    num_processes = num_processes if num_processes is not None else _env_int("JAX_NUM_PROCESSES")
    process_id = process_id if process_id is not None else _env_int("JAX_PROCESS_ID")
    if local_device_ids is None:
        local_device_ids = _slurm_local_device_ids()
    for name, value in (
        ("coordinator_address", coordinator_address),
        ("num_processes", num_processes),
        ("process_id", process_id),
        ("local_device_ids", local_device_ids),
    ):
        if value is not None:
            kwargs[name] = value
    kwargs["heartbeat_timeout_seconds"] = HEARTBEAT_S
    _log.info("jax.distributed.initialize(%s)", ", ".join(f"{k}={v!r}" for k, v in kwargs.items()))
    jax.distributed.initialize(**kwargs)
    watch_peers(coordinator_address or "the coordinator")
    open_collectives()
    return True


HEARTBEAT_S = 10  # a process silent this long is lost (jax's default, 100 s, left the survivor hanging)
_FATAL = b"Terminating process because the JAX distributed service detected fatal errors"
_GLOO_LOST = ("Connection closed by peer", "Connection reset by peer", "Gloo all-reduce failed", "Gloo all-gather")


def _lost_line(processes: list[int], n: int, how: str) -> bytes:
    who = " and ".join(f"process {p}" for p in processes)
    return (
        f"error: lost {who} of {n} ({how}); this process stops too. Rerun every process with the same "
        f"command to resume from the last checkpoint.\n"
    ).encode()


def _lost_processes(lines: list[bytes], me: int) -> list[int]:
    """The processes XLA's coordination service reported dead, from its log lines before the abort."""
    found: set[int] = set()
    for k, line in enumerate(lines):
        found.update(int(t) for t in re.findall(rb"Task (\d+) heartbeat timeout", line))
        if b"stopped sending heartbeats" in line and k + 1 < len(lines):
            found.update(int(t) for t in re.findall(rb"\d+", lines[k + 1]))
    found.discard(me)
    return sorted(found) or [0]  # no word on a peer: the service itself (process 0) is gone


def watch_peers(coordinator: str) -> None:
    """Turns the loss of another process into one ``error:`` line (exit status 2) within about
    ``HEARTBEAT_S`` seconds, instead of a C++ stack trace after 100 s.

    XLA's coordination service marks a process dead after ``HEARTBEAT_S`` without heartbeats and every
    survivor's agent then aborts with a stack trace on stderr (at once when process 0, which runs the
    service, dies).  C++ output therefore passes through a pipe read here: lines are passed on, and that
    abort becomes the one line naming the lost process (Python's own ``sys.stderr`` keeps the terminal).
    A collective cut short by the loss (``Gloo ... Connection closed by peer``) waits for that line."""
    me, n = jax.process_index(), jax.process_count()
    err = os.dup(2)
    sys.stderr.flush()
    sys.stderr = os.fdopen(os.dup(err), "w", buffering=1, encoding=sys.stderr.encoding, errors="replace")
    read, write = os.pipe()
    os.dup2(write, 2)
    os.close(write)

    def relay():  # C++ logging, passed on line by line until an abort for a lost process
        recent: list[bytes] = []
        with os.fdopen(read, "rb") as pipe:
            for line in pipe:
                if _FATAL in line:
                    lost = _lost_processes(recent, me)
                    how = "no heartbeat for {} s: killed, crashed or unreachable".format(HEARTBEAT_S)
                    if lost == [0] and me != 0:
                        how = f"it ran the coordination service at {coordinator}"
                    os.write(err, _lost_line(lost, n, how))
                    os._exit(2)
                recent = (recent + [line])[-50:]
                os.write(err, line)

    hook = sys.excepthook

    def excepthook(kind, value, tb):
        if any(s in str(value) for s in _GLOO_LOST):
            time.sleep(HEARTBEAT_S + 15)  # relay() names the lost process and exits meanwhile
        hook(kind, value, tb)

    sys.excepthook = excepthook
    threading.Thread(target=relay, name="cvs_jax-stderr", daemon=True).start()


COLLECTIVES_BARRIER_MS = 20 * 60 * 1000  # how long a process waits at start for the others (compiles, data)


def open_collectives() -> None:
    """Opens the collectives' connections between every device of every process now, while the
    processes are in step.

    On CPU, XLA's Gloo collectives connect a set of devices at the first collective over that set and
    give up after 30 s (``Gloo context initialization failed: ... GetKeyValue() timed out``); later
    collectives over the same set wait as long as a peer needs.  With several devices per process, the
    first collective over all devices is the first training step, which each process reaches after its
    own compile (cache hit or miss) and data preparation: 40 s apart, the run died.  A
    coordination-service barrier (no 30 s limit) lines the processes up, then one small sum over the
    ``data`` mesh connects all devices."""
    if jax.process_count() == 1 or jax.default_backend() != "cpu":
        return
    from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top

    client = jax_distributed.global_state.client
    if client is not None:
        client.wait_at_barrier("cvs_jax_open_collectives", COLLECTIVES_BARRIER_MS)
    mesh = data_mesh()
    ones = global_batch(np.ones((jax.local_device_count(),), np.float32), mesh)
    total = jax.jit(lambda x: x.sum(), out_shardings=replicated_sharding(mesh))(ones)
    if float(jax.device_get(total)) != jax.device_count():
        raise RuntimeError(f"the collectives' first sum over {jax.device_count()} devices gave {total}")


# jax exports Device as a variable (jax.Device = xla_client.Device), which pyright refuses in an annotation
def data_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:  # pyright: ignore[reportInvalidTypeForm]
    """The 1-axis ``data`` mesh over all global devices (every process's), Auto axis type."""
    n = len(devices) if devices is not None else jax.device_count()
    return jax.make_mesh((n,), (DATA_AXIS,), axis_types=(jax.sharding.AxisType.Auto,), devices=devices)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(DATA_AXIS))


def replicated_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def _process_row_blocks(mesh: Mesh, global_rows: int) -> list[tuple[int, int]]:
    """The sorted, merged [start, stop) row ranges of a ``P('data')`` array this process holds."""
    if global_rows % mesh.devices.size:
        raise ValueError(
            f"a global batch of {global_rows} rows does not split over "
            f"{mesh.devices.size} devices; choose a multiple of {mesh.devices.size}."
        )
    index_map = batch_sharding(mesh).addressable_devices_indices_map((global_rows,))
    slices = [sl for sl in index_map.values() if sl is not None]  # jax types them Index | None; a NamedSharding has all
    spans = sorted({(sl[0].start or 0, global_rows if sl[0].stop is None else sl[0].stop) for sl in slices})
    merged: list[list[int]] = []
    for a, b in spans:
        if merged and merged[-1][1] == a:
            merged[-1][1] = b
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def process_rows(global_batch_size: int, mesh: Mesh | None = None) -> np.ndarray:
    """Indices of the global batch rows this process must load, in the order ``global_batch`` expects."""
    mesh = mesh or data_mesh()
    return np.concatenate([np.arange(a, b) for a, b in _process_row_blocks(mesh, global_batch_size)])


def process_slice(global_batch_size: int, mesh: Mesh | None = None) -> tuple[int, int]:
    """The [start, stop) rows of every global batch that this process loads.

    With one process this is ``(0, global_batch_size)``.  With several, each
    process's devices hold one contiguous run of rows of the ``data`` axis
    (``jax.make_mesh`` orders devices process by process); a mesh that breaks
    that raises here, and ``process_rows`` gives the general index list.
    """
    blocks = _process_row_blocks(mesh or data_mesh(), global_batch_size)
    if len(blocks) != 1:
        raise ValueError(
            f"this process's devices hold rows {blocks} of the batch, not one contiguous "
            f"slice; use process_rows() instead."
        )
    return blocks[0]


def global_batch(local_arrays: Any, mesh: Mesh | None = None) -> Any:
    """The global, ``data``-sharded ``jax.Array`` (pytree) of a batch from this process's rows.

    ``local_arrays`` is a pytree of host arrays holding rows ``process_slice(B)``
    of the global batch of ``B`` rows (all of them with one process).  Single
    process: the same array as ``jax.device_put(x, NamedSharding(mesh, P('data')))``.
    """
    mesh = mesh or data_mesh()
    sharding = batch_sharding(mesh)
    n_proc_rows = None
    for leaf in jax.tree.leaves(local_arrays):
        if n_proc_rows is None:
            n_proc_rows = np.shape(leaf)[0]
        elif np.shape(leaf)[0] != n_proc_rows:
            raise ValueError("the leaves of a batch have different numbers of rows")
    if jax.process_count() == 1:
        return jax.device_put(local_arrays, sharding)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), local_arrays)


def replicate(tree: Any, mesh: Mesh | None = None) -> Any:
    """Places a pytree (host values, identical on every process) replicated on every device of the mesh."""
    mesh = mesh or data_mesh()
    sharding = replicated_sharding(mesh)
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)

    def put(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return jax.device_put(x, sharding)  # already global: reshard on device
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

    return jax.tree.map(put, tree)


def to_host(x: Any) -> Any:
    """A pytree of (possibly multi-host, sharded) arrays as full numpy arrays on every process."""

    def get(a):
        if isinstance(a, jax.Array) and not a.is_fully_addressable and not a.is_fully_replicated:
            from jax.experimental import multihost_utils

            return np.asarray(multihost_utils.process_allgather(a, tiled=True))
        return np.asarray(a)

    return jax.tree.map(get, x)
