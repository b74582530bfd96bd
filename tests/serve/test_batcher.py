"""The batcher's lone-query path (``Batcher.now``): it runs a search on the caller's thread only when
the search is alone and the traffic has been lone lately, and never beside a batch or a call (a switch
cannot happen under a query in flight)."""

from __future__ import annotations

import threading
import time

from cvs_jax.serve.batcher import LONE, Batcher


def _until(condition, what: str, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen in {seconds} s"
        time.sleep(0.001)


def _batcher(log: list | None = None, gate: threading.Event | None = None) -> Batcher:
    def process(payloads):
        if gate is not None:
            gate.wait(10)
        if log is not None:
            log.append(("batch", threading.current_thread().name, list(payloads)))
        return [p * 10 for p in payloads]

    return Batcher(process, max_wait_s=0.001, max_images=16)


def test_a_lone_search_runs_here_and_answers_as_the_worker_does():
    log: list = []
    b = _batcher(log)
    with b.arriving():
        done, got = b.now(3, 1)
    assert (done, got) == (True, 30)
    assert log == [("batch", threading.current_thread().name, [3])]  # on this thread, not the worker's
    with b.arriving():
        assert b.submit(3, 1).result(5) == got
    b.close()


def test_not_alone_means_the_worker_batches_it():
    b = _batcher()
    with b.arriving(), b.arriving():  # another request is being read
        assert b.now(1, 1) == (False, None)
    b.batch_sizes = [1] * (LONE - 1) + [4]  # a batch of 4 lately: the traffic is not lone
    with b.arriving():
        assert b.now(1, 1) == (False, None)
    b.batch_sizes = [4] + [1] * LONE  # LONE lone batches since: lone again
    with b.arriving():
        assert b.now(1, 1) == (True, 10)
    b.close()


def test_never_beside_a_running_call_or_ahead_of_a_queued_one():
    b = _batcher()
    gate, started = threading.Event(), threading.Event()
    running = b.call(lambda: (started.set(), gate.wait(10)))  # e.g. a switch to a new model
    assert started.wait(5)
    with b.arriving():
        assert b.now(1, 1) == (False, None)  # the call holds the batcher
    queued = b.call(lambda: "after")
    with b.arriving():
        assert b.now(1, 1) == (False, None)  # a queued call goes first
    gate.set()
    assert queued.result(5) == "after" and running.result(5) == (None, True)
    b.close()


def test_a_call_waits_for_a_lone_search_in_flight():
    gate, order = threading.Event(), []
    b = _batcher(order, gate)
    answered = []

    def lone():
        with b.arriving():
            answered.append(b.now(2, 1))

    t = threading.Thread(target=lone)
    t.start()
    _until(b._busy.locked, "the lone search holding the batcher (at the gate)")
    switched = b.call(lambda: order.append(("call",)))
    assert not switched.done()
    gate.set()
    switched.result(5)
    t.join(5)
    assert answered == [(True, 20)] and [e[0] for e in order] == ["batch", "call"]
    b.close()


def test_not_ahead_of_work_the_worker_has_not_taken_yet():
    b = _batcher()
    b.close()  # the worker stops: what is queued now stays queued, with the batcher free
    b.submit(5, 1)
    with b.arriving():
        assert b.now(1, 1) == (False, None)  # the queued search goes first, batched by the worker


def test_never_beside_a_batch_the_worker_runs():
    gate = threading.Event()
    b = _batcher(gate=gate)
    batch = b.submit(4, 1)
    _until(b._busy.locked, "the worker holding the batcher for the batch (at the gate)")
    with b.arriving():
        assert b.now(1, 1) == (False, None)
    gate.set()
    assert batch.result(5) == 40
    b.close()
