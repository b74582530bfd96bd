"""The training batches of a session, read ahead of the step and placed on the devices.

Each batch is a pure function of (seed, session, epoch, step): ``batch_reader`` reads this process's rows
of one step's batch, ``batch_loader`` a session's batches from a step on (threads or worker processes,
``data.loader_threads`` / ``data.loader_workers``), ``call_loader`` the stacked batches of k steps per
call (``cadence.calls``; a population's members stacked too), and ``global_stacked`` the global arrays
of a stacked batch from this process's rows (multi-host).
"""

from __future__ import annotations

from typing import Callable, Iterable, Protocol

import grain
import jax
import ml_collections
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from cvs_jax import distributed
from cvs_jax.engine import prefetch, protocol
from cvs_jax.engine.cadence import CallReader
from cvs_jax.methods.seams import SessionBatches


class RunData(Protocol):
    """What the loaders read of a run (``context.RunContext``): the loader fields of its config, its mesh
    and its data."""

    config: ml_collections.ConfigDict
    mesh: jax.sharding.Mesh
    proto: protocol.Protocol


class SessionSteps(Protocol):
    """What the loaders read of a session (``phases.SessionView``)."""

    # read-only here, so frozen dataclasses fit
    @property
    def batches(self) -> SessionBatches: ...  # the method's batch policy's plan: batch(epoch, i) -> dataset indices

    @property
    def steps_per_epoch(self) -> int: ...

    @property
    def total_steps(self) -> int: ...


def batch_loader(ctx: RunData, view: SessionSteps, start: int) -> Iterable[dict]:
    """This process's rows of the session's batches from step ``start`` on, read ahead of the step by
    ``data.loader_threads`` threads, or, for a split streamed from its records, decoded by
    ``data.loader_workers`` processes when > 0 (grain keeps their order either way).  Each batch is a pure
    function of (seed, session, epoch, step), so a resumed run starts here with no iterator state, and
    the batches are the same for any thread or worker count.  With one process the next batches are
    already on the devices (``distributed.global_batch`` of them is a no-op)."""
    read = batch_reader(ctx, view)
    return _loader(ctx, read, start, view.total_steps, distributed.batch_sharding(ctx.mesh))


def batch_reader(ctx: RunData, view: SessionSteps) -> prefetch.BatchReader:
    """``step -> batch``: this process's rows of the session's batch ``step``."""
    lo, hi = distributed.process_slice(ctx.config.train.batch_size, ctx.mesh)  # each process loads only its rows
    return prefetch.BatchReader(
        ctx.proto.dataset.train, ctx.proto.train_labels, view.batches, view.steps_per_epoch, lo, hi
    )


def call_loader(ctx: RunData, readers: list, calls: list[tuple[int, int]], *, members_axis: bool):
    """The batches of ``calls`` (``cadence.calls``), each call's steps stacked ``[n, B, ...]`` (and the
    members' ``[N, n, B, ...]`` with ``members_axis``), read ahead and placed on the devices like
    ``batch_loader``'s, sharded over the batch axis."""
    read = CallReader(readers, calls, steps_axis=True, members_axis=members_axis)
    lead = 2 if members_axis else 1
    return _loader(ctx, read, 0, len(calls), _stacked_sharding(ctx.mesh, lead))


def _stacked_sharding(mesh, lead: int) -> NamedSharding:
    return NamedSharding(mesh, P(*([None] * lead), distributed.DATA_AXIS))


def _loader(ctx: RunData, read: Callable[[int], dict], start: int, stop: int, sharding) -> Iterable[dict]:
    c = ctx.config
    split = ctx.proto.dataset.train
    threads = c.data.loader_threads
    workers = prefetch.worker_count(split, c.data.loader_workers)
    options = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=2 * threads)
    ds = prefetch.in_workers(grain.MapDataset.range(start, stop).map(read).to_iter_dataset(options), workers)
    if jax.process_count() > 1:  # global_batch assembles the global arrays from host rows
        return ds
    return prefetch.DevicePrefetch(ds, sharding, depth=2)


def global_stacked(batch: dict, mesh, lead: int) -> dict:
    """The global arrays of a stacked batch (``lead`` leading axes before the batch axis) from this
    process's rows; with one process they are already on the devices (a no-op)."""
    if jax.process_count() == 1:
        return jax.device_put(batch, _stacked_sharding(mesh, lead))
    sharding = _stacked_sharding(mesh, lead)

    def make(x):
        x = np.asarray(x)
        global_shape = x.shape[:lead] + (x.shape[lead] * _process_share(mesh),) + x.shape[lead + 1 :]
        return jax.make_array_from_process_local_data(sharding, x, global_shape)

    return jax.tree.map(make, batch)


def _process_share(mesh) -> int:
    """Global batch rows per row this process loads (the processes load equal slices)."""
    return mesh.devices.size // len([d for d in mesh.devices.flat if d.process_index == jax.process_index()])
