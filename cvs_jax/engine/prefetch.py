"""Reading the training batches ahead of the step: the batch reader that grain runs (in this
process's threads or in worker processes), and the device prefetch that puts the next batches on the
devices in a background thread while the current step runs.

``BatchReader`` is what the workers receive: a picklable, top-level callable holding only the split
(an in-RAM ``sources.Split`` or a ``records.StoreSplit``, which reopens its file lazily), the labels,
the session's batch policy and this process's rows; no JAX object, no run context.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any, Iterable, Iterator

import numpy as np

_PUT_POLL_S = 0.1  # how often a blocked producer checks whether the consumer went away


class BatchReader:
    """``step -> {"images": uint8 [rows, H, W, C], "labels": int32 [rows]}``: rows ``lo:hi`` of the
    session's global batch ``step`` (``batches.batch(epoch, i)``, a pure function of seed, session,
    epoch and step), so every worker and every resumed run reads the same pixels for a step."""

    def __init__(self, split, labels: np.ndarray, batches, steps_per_epoch: int, lo: int, hi: int):
        self.split, self.labels, self.batches = split, labels, batches
        self.steps_per_epoch, self.lo, self.hi = int(steps_per_epoch), int(lo), int(hi)

    def indices(self, step: int) -> np.ndarray:
        """The dataset indices of this process's rows of batch ``step``."""
        return self.batches.batch(*divmod(int(step), self.steps_per_epoch))[self.lo : self.hi]

    def __call__(self, step: int) -> dict:
        b = self.indices(step)
        return {"images": self.split.read(b), "labels": self.labels[b].astype(np.int32)}


def worker_count(split, requested: int) -> int:
    """The decode processes to use: ``requested`` for a split streamed from its records, 0 for a split
    decoded into RAM (gathering rows needs no decode, and each worker would get its own copy of it)."""
    requested = int(requested or 0)
    if requested < 0:
        from cvs_jax.errors import ConfigError

        raise ConfigError(f"data.loader_workers={requested}: use 0 (threads only) or a positive process count.")
    return 0 if isinstance(getattr(split, "images", None), np.ndarray) else requested


def in_workers(ds, workers: int):
    """``ds`` (a grain ``IterDataset`` of a ``BatchReader`` map) read by ``workers`` processes (none: ``ds``).
    Grain slices the steps over the workers round-robin and interleaves them back, so the batches and
    their order are those of ``ds``; an error in a worker is raised by ``next`` in this process."""
    if not workers:
        return ds
    import grain
    from absl import flags

    if not flags.FLAGS.is_parsed():  # grain reads its absl flags when it starts workers (a library caller)
        flags.FLAGS.mark_as_parsed()
    options = grain.MultiprocessingOptions(num_workers=int(workers), per_worker_buffer_size=2)
    return ds.mp_prefetch(options, worker_init_fn=exit_with_parent)


def exit_with_parent(worker_index: int, worker_count: int) -> None:
    """Run in each worker process: it exits when the training process is gone, also after a kill -9
    that gave it no chance to stop its workers (they would otherwise decode on as orphans)."""
    del worker_index, worker_count
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _plain(x: Any) -> Any:
    """A batch leaf as an array this process owns: grain's worker outputs live in shared memory that is
    unlinked when their numpy wrapper dies, and a CPU device may keep aliasing host memory."""
    return np.array(x) if type(x) is not np.ndarray and isinstance(x, np.ndarray) else x


def _put(q: queue.Queue, item, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=_PUT_POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _fill(source: Iterable, sharding, q: queue.Queue, stop: threading.Event) -> None:
    """The producer thread: next batch, on the devices, ready; an error (or the end) is queued once."""
    import jax

    it = iter(source)
    try:
        while not stop.is_set():
            try:
                batch = next(it)
            except StopIteration:
                _put(q, ("end", None), stop)
                return
            batch = jax.block_until_ready(jax.device_put(jax.tree.map(_plain, batch), sharding))
            if not _put(q, ("batch", batch), stop):
                return
    except Exception as e:  # handed to the consumer and raised there as it is
        _put(q, ("error", e), stop)
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()  # grain's worker processes end here, not at garbage collection


class DevicePrefetch(Iterator):
    """Iterates ``source`` with up to ``depth`` batches already placed on the devices with ``sharding``
    by a background thread, so the host reads batch t+1 while step t runs.  The batches, their order and
    the end are the source's; an error raised while reading is raised by ``next`` (same exception)."""

    def __init__(self, source: Iterable, sharding, depth: int = 2):
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, int(depth)))
        self._stop = threading.Event()
        self._done = False
        # the thread holds the queue and the event, not ``self``: dropping the iterator stops it
        self._thread = threading.Thread(
            target=_fill, args=(source, sharding, self._queue, self._stop), name="device-prefetch", daemon=True
        )
        self._thread.start()

    def __iter__(self) -> "DevicePrefetch":
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        kind, value = self._queue.get()
        if kind == "batch":
            return value
        self._done = True
        self._thread.join()
        if kind == "end":
            raise StopIteration
        raise value

    def close(self) -> None:
        """Stops the thread (and the source's workers) without reading the remaining batches."""
        self._done = True
        self._stop.set()
        while True:  # free a producer blocked on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)

    def __del__(self):
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()  # the thread notices within _PUT_POLL_S and closes the source itself
