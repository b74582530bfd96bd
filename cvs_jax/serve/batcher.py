"""Dynamic batching: one worker thread runs what touches the model and the index, one job at a time.

Concurrent searches are gathered for at most ``max_wait_s`` after the first arrives (or until
``max_images`` images are waiting, or every request the server is reading has arrived: ``arriving``
counts them, so a lone query never waits) and answered by one embed and one top-K call.  Other work (an
add's embedding, integrating added rows, the switch to a new model) is queued as a call and runs on
the same thread between batches, so a batch runs start to end on one model and one index: a query in
flight finishes on the model it started with.

A lone search (``now``: nothing queued, running or arriving beside it) runs on the caller's thread
instead, under the same lock the worker holds for each batch and call: the hop to the worker and back
cost a lone query 0.12 ms of its 0.81 ms in-process here (2-core CPU, the benchmark's tiny run).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import queue
import threading
import time
from typing import Any, Callable, Iterator

LONE = 8  # a search runs on the caller's thread only after this many single-image batches in a row


@dataclasses.dataclass
class _Call:
    fn: Callable[[], Any]
    future: concurrent.futures.Future


@dataclasses.dataclass
class _Item:
    payload: Any
    size: int
    future: concurrent.futures.Future


class Batcher:
    """``submit(payload, size)`` -> a future of ``process(payloads)[i]``; ``call(fn)`` -> a future of ``fn()``."""

    def __init__(self, process: Callable[[list[Any]], list[Any]], *, max_wait_s: float, max_images: int):
        self._process = process
        self._max_wait_s = max_wait_s
        self._max_images = max_images
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self.batch_sizes: list[int] = []  # images per processed batch (for metrics), most recent last
        self._arriving = 0  # requests being read that will submit a search (``arriving``)
        self._arriving_lock = threading.Lock()
        self._busy = threading.Lock()  # held while a batch or a call runs (the worker's or ``now``'s)
        self._holder: int | None = None  # the thread holding ``_busy`` (``holds_lock``)
        self._thread = threading.Thread(target=self._loop, name="batcher", daemon=True)
        self._thread.start()

    def submit(self, payload: Any, size: int) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put(_Item(payload, size, future))
        return future

    @contextlib.contextmanager
    def arriving(self) -> Iterator[None]:
        """Around a request that will submit a search: a batch waits for it only while it is counted."""
        with self._arriving_lock:
            self._arriving += 1
        try:
            yield
        finally:
            with self._arriving_lock:
                self._arriving -= 1

    def now(self, payload: Any, size: int) -> tuple[bool, Any]:
        """``(True, process([payload])[0])`` run here when this search is alone (no other request arriving,
        nothing queued, no batch or call running, and the last ``LONE`` batches were one image each: under
        load, a query run on the event loop's thread would hold back the requests not read yet);
        ``(False, None)`` otherwise: ``submit`` it."""
        if self._arriving > 1 or any(n > 1 for n in self.batch_sizes[-LONE:]) or not self._queue.empty():
            return False, None  # others are around, or were lately: the worker batches them
        if not self._busy.acquire(blocking=False):
            return False, None
        self._holder = threading.get_ident()
        try:
            self._record(size)
            return True, self._process([payload])[0]
        finally:
            self._holder = None
            self._busy.release()

    @contextlib.contextmanager
    def _holding(self) -> Iterator[None]:
        with self._busy:
            self._holder = threading.get_ident()
            try:
                yield
            finally:
                self._holder = None

    def holds_lock(self) -> bool:
        """Whether the calling thread runs a batch or a call now (what searches wait for): a compile
        seen here is one a search waits on (tests count them)."""
        return self._holder == threading.get_ident()

    def _record(self, images: int) -> None:
        """Keeps the last 1,000 batch sizes (``/metrics``, and ``now``'s look at the recent traffic)."""
        self.batch_sizes = (self.batch_sizes + [images])[-1000:]

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put(_Call(fn, future))
        return future

    def close(self) -> None:
        self._stop.set()
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        pending = None
        while not self._stop.is_set():
            job = pending if pending is not None else self._queue.get()
            pending = None
            if job is None:
                continue
            if isinstance(job, _Call):
                with self._holding():
                    _run(job.future, job.fn)
                continue
            batch, images = [job], job.size
            deadline = time.monotonic() + self._max_wait_s
            while images < self._max_images:
                wait = deadline - time.monotonic() if len(batch) < self._arriving else 0  # others coming?
                try:
                    nxt = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if not isinstance(nxt, _Item) or images + nxt.size > self._max_images:
                    pending = nxt  # a call, or a search that would overflow: after this batch
                    break
                batch.append(nxt)
                images += nxt.size
            self._record(images)
            try:
                with self._holding():
                    results = self._process([item.payload for item in batch])
            except BaseException as e:  # noqa: BLE001 -- every waiting request learns it, the loop goes on
                for item in batch:
                    item.future.set_exception(e)
                continue
            for item, result in zip(batch, results):
                item.future.set_result(result)


def _run(future: concurrent.futures.Future, fn: Callable[[], Any]) -> None:
    try:
        future.set_result(fn())
    except BaseException as e:  # noqa: BLE001 -- handed to the caller
        future.set_exception(e)
