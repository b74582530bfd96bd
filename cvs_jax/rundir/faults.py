"""Fault injection for the crash-and-resume tests: ``CVS_JAX_FAULT=<point>:<n>``.

When the variable is set, the process kills itself with SIGKILL (like ``kill -9``,
no clean-up) at the n-th time it passes the named point.  Points: ``step`` (after a
training step), ``validation`` (between embedding the gallery and the queries),
``progress_write`` / ``session_write`` (while orbax writes a mid-session or
session-end checkpoint, i.e. with a partial temporary directory on disk); in the added rows' store
(``retrieval/additions.py``): ``additions_segment`` (an add's segment durable, the chain not yet
naming it), ``additions_merge`` (while a merged segment is written), ``additions_merged`` (the chain
names the merged segment, the ones it covers not yet removed).
Unset, every call is a no-op.

A kill first lets the asynchronous checkpoint saves already in flight finish (``settle_before_kill``):
"killed after the checkpoint at step k" then means after it is on disk, as with synchronous saves;
``progress_write`` still kills its own write in the middle.
"""

from __future__ import annotations

import os
import signal
import threading
import time

_counts: dict[str, int] = {}
_settle: list = []  # callables that finish the asynchronous saves in flight (``Checkpoints``)


def armed_at_all() -> bool:
    return bool(os.environ.get("CVS_JAX_FAULT"))


def settle_before_kill(fn) -> None:
    """``fn()`` runs before ``maybe_fail`` kills the process (registered only while a fault is armed)."""
    _settle.append(fn)


def _armed(point: str) -> bool:
    spec = os.environ.get("CVS_JAX_FAULT", "")
    if not spec:
        return False
    name, _, n = spec.partition(":")
    if name != point:
        return False
    _counts[point] = _counts.get(point, 0) + 1
    return _counts[point] == int(n or 1)


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def maybe_fail(point: str) -> None:
    if _armed(point):
        for fn in _settle:
            fn()
        _kill()


def fail_while_writing(point: str, directory: str) -> None:
    """If armed, kills the process as soon as a temporary checkpoint directory appears (the saves already
    in flight finish first: the kill falls in this write, as with synchronous saves)."""
    if not _armed(point):
        return
    for fn in _settle:
        fn()

    def watch():
        deadline = time.time() + 60
        while time.time() < deadline:
            if os.path.isdir(directory) and any("tmp" in d for d in os.listdir(directory)):
                _kill()
            time.sleep(0.0005)

    threading.Thread(target=watch, daemon=True).start()
