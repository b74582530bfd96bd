"""One writer per workdir: the lock, and moving an old run aside.

``config.recorded.open_run(config, workdir)`` holds the workdir for one run (``held`` here):

* **The lock.**  Process 0 takes an exclusive ``flock`` on ``<workdir>/.lock`` before it
  reads or writes anything else there.  A second live process is refused with
  ``WorkdirBusyError`` naming the holder (host, pid, start time, command; written into
  the file).  The kernel drops the lock when its process dies, so a run killed with
  ``kill -9`` (or a lost machine) never blocks its rerun.  In a multi-host run only
  process 0 locks, and its outcome is broadcast so every process stops when it is refused.
* **The config.**  ``config.recorded`` checks it against the run's ``config.json`` under the
  lock (``write_config``, ``move_aside`` and ``has_checkpoint`` here are its storage steps).

``hold(workdir)`` is the lock alone (``compare`` over its whole directory).
Reading a run (plain ``search``) needs no lock; ``check_not_busy`` asks whether a live process holds it.
A refused start leaves the file system as it was: a workdir folder created for the lock is removed again.
The rows added to a gallery (``search --add``, the server's ``/add``) have their own lock,
``hold_additions``: no run ever writes them, so they are added while ``update`` trains, one writer at a time.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from typing import Callable, Iterator

import jax
import numpy as np

from cvs_jax.errors import ConfigError, NotWritableError, UserError, WorkdirBusyError, not_writable
from cvs_jax.rundir import paths

LOCK_NAME = paths.LOCK
# Checkpoint folders whose numbered step directories make a workdir hold a run.
CHECKPOINT_DIRS = paths.CHECKPOINT_DIRS


def has_checkpoint(workdir: str) -> bool:
    """True when ``workdir`` holds a saved step (a numbered directory of the session or progress checkpoints)."""
    for sub in CHECKPOINT_DIRS:
        d = os.path.join(workdir, sub)
        if os.path.isdir(d) and any(n.isdigit() and os.path.isdir(os.path.join(d, n)) for n in os.listdir(d)):
            return True
    return False


def write_config(path: str, current: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(current, f, indent=2)
    os.replace(tmp, path)  # never a half-written config.json


def move_aside(workdir: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside, n = os.path.join(workdir, f"previous-{stamp}"), 1
    while os.path.exists(aside):
        n += 1
        aside = os.path.join(workdir, f"previous-{stamp}-{n}")
    os.makedirs(aside)
    for name in os.listdir(workdir):
        if not name.startswith("previous-") and name != LOCK_NAME:
            os.rename(os.path.join(workdir, name), os.path.join(aside, name))
    return aside


# ---------------------------------------------------------------- the lock
def _holder() -> dict:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
    }


def _busy(workdir: str, fd: int, name: str = LOCK_NAME) -> WorkdirBusyError:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        holder = json.loads(os.read(fd, 1 << 16).decode() or "{}")
    except (OSError, ValueError):
        holder = {}
    host, pid = holder.get("host", "an unknown host"), holder.get("pid", "?")
    if name == paths.ADDITIONS_LOCK:  # no command line (it names folders: the server answers this) and no resume
        return WorkdirBusyError(
            f"another add (pid {pid} on {host}) has been writing the added rows of {workdir} for longer than this "
            f"add waits; nothing was added: rerun this add when it is done."
        )
    return WorkdirBusyError(
        f"{workdir} is in use by pid {pid} on {host} (started {holder.get('started', '?')}: "
        f"{holder.get('command', '?')}); wait for it to finish, or stop it (kill {pid} on {host}) and rerun "
        f"to resume from its last checkpoint. python -m cvs_jax.search can read a live run at any time."
    )


def _make_folder(workdir: str) -> None:
    """Creates the workdir, or says in one line why it cannot be one (a file there, no permission): a
    mistyped path is the user's to fix, not a traceback."""
    try:
        os.makedirs(workdir, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UserError(
            f"--workdir {workdir} is a file (or lies under one), not a folder; pass a new or existing folder."
        ) from None
    except PermissionError:
        raise UserError(
            f"--workdir {workdir} cannot be created: permission denied; pass a folder you can write."
        ) from None
    except OSError as e:  # a read-only file system, no space left
        refusal = not_writable(e, workdir)
        if refusal is None:
            raise
        raise refusal from None


_NOT_WRITABLE = {  # errno -> (cause, fix)
    errno.EROFS: ("it is on a read-only file system", "mount it read-write"),
    errno.EACCES: ("this user may not write into it", "give this user write access to it"),
}


def check_writable(workdir: str) -> None:
    """Refuses a run folder this process cannot write into (a read-only mount, a run of another user), in one
    line naming it, before a command that adds to it or trains it does anything: ``update`` prepared the new
    images' record store and ``search --add`` read the run first, then stopped on the lock file.  A folder
    not made yet is the lock's to create (``_make_folder`` refuses its own way).  Readers never call this:
    ``search``, ``info``, ``export`` and ``serve``'s searches work on a read-only run."""
    if not os.path.isdir(workdir):
        return
    if os.statvfs(workdir).f_flag & os.ST_RDONLY:
        code = errno.EROFS
    elif not os.access(workdir, os.W_OK | os.X_OK):
        code = errno.EACCES
    else:
        return
    cause, fix = _NOT_WRITABLE[code]
    raise NotWritableError(
        f"{workdir} is not writable ({cause}): adding to a run or training it writes into it, while search, "
        f"info, export and serve's searches read it as it is. Copy the run to a writable folder (cp -r) or "
        f"{fix}, then rerun.",
        cause,
    )


def _missing_folders(workdir: str) -> list[str]:
    """The folders ``_make_folder`` would create, deepest first (what a refused start removes again)."""
    out, path = [], os.path.abspath(workdir)
    while path and not os.path.exists(path):
        out.append(path)
        parent = os.path.dirname(path)
        path = parent if parent != path else ""
    return out


def _remove_created(created: list[str]) -> None:
    """Removes the lock file and the folders a refused start created, where nothing else was written."""
    if not created:
        return
    with contextlib.suppress(OSError):
        os.remove(os.path.join(created[0], LOCK_NAME))
    for folder in created:
        try:
            os.rmdir(folder)
        except OSError:  # something else is there now: leave it
            return


def holder(workdir: str) -> dict | None:
    """What the live process holding ``workdir``'s lock wrote of itself (``host``, ``pid``, ``started``,
    ``command``), None when no live process holds it; takes nothing."""
    try:
        check_not_busy(workdir)
        return None
    except WorkdirBusyError:
        pass
    try:
        with open(os.path.join(workdir, LOCK_NAME)) as f:
            return json.loads(f.read() or "{}")
    except (OSError, ValueError):
        return {}


def check_not_busy(workdir: str) -> None:
    """Raises ``WorkdirBusyError`` (naming the holder) when a live process holds ``workdir``'s lock; takes
    nothing (a free lock is released at once).  For commands that check a run before they lock it."""
    try:
        fd = os.open(os.path.join(workdir, LOCK_NAME), os.O_RDONLY)
    except OSError:  # no lock file (never started) or not readable here: the lock itself decides later
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise _busy(workdir, fd) from None
        raise
    finally:
        os.close(fd)  # releases a shared lock taken here


def _lock(workdir: str, name: str = LOCK_NAME, wait_s: float = 0.0) -> int:
    """Takes ``<workdir>/<name>`` (waiting at most ``wait_s``); returns its descriptor, or raises
    ``WorkdirBusyError``."""
    _make_folder(os.path.dirname(os.path.join(workdir, name)))
    check_writable(workdir)
    try:
        fd = os.open(os.path.join(workdir, name), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:  # a read-only workdir: one line before anything else is tried (was a traceback)
        refusal = not_writable(e)
        if refusal is None:
            raise
        raise refusal from None
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as e:
            busy = e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
            if busy and time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            error = _busy(workdir, fd, name) if busy else None
            os.close(fd)
            if error is not None:
                raise error from None
            raise
    try:
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(_holder()).encode())
        os.fsync(fd)
    except OSError as e:  # a full disk: one line naming the file before any work (was "cannot write a file")
        os.close(fd)
        refusal = not_writable(e, os.path.join(workdir, name))
        if refusal is None:
            raise
        raise refusal from None
    return fd


def _unlock(fd: int) -> None:
    try:
        os.ftruncate(fd, 0)  # the file stays (unlinking it would let two processes lock two files)
    finally:
        os.close(fd)  # releases the flock


# What process 0 broadcasts: 0 = the workdir is held, else the kind of refusal.
_OUTCOMES = {WorkdirBusyError: 1, ConfigError: 2, UserError: 3}


def _outcome(error: BaseException | None) -> int:
    if error is None:
        return 0
    for kind, code in _OUTCOMES.items():
        if isinstance(error, kind):
            return code
    return 4


def _agree(workdir: str, error: BaseException | None) -> None:
    """Multi-host: every process learns process 0's outcome; the others raise if it was refused."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    code = int(np.asarray(multihost_utils.broadcast_one_to_all(np.int32(_outcome(error)))))
    if jax.process_index() == 0 or code == 0:
        return
    message = f"process 0 could not open {workdir} (see its output)"
    kind = {v: k for k, v in _OUTCOMES.items()}.get(code)
    raise kind(message) if kind is not None else RuntimeError(message)


@contextlib.contextmanager
def _held(workdir: str, then: Callable[[], None] | None = None) -> Iterator[None]:
    fd, error = None, None
    if jax.process_index() == 0:
        created = _missing_folders(workdir)
        try:
            fd = _lock(workdir)
            if then is not None:
                then()
        except Exception as e:  # reported to the other processes before it is raised here
            error = e
            if fd is not None:
                _unlock(fd)
                fd = None
            _remove_created(created)
    try:
        _agree(workdir, error)
        if error is not None:
            raise error
        yield
    finally:
        if fd is not None:
            _unlock(fd)


@contextlib.contextmanager
def hold(workdir: str) -> Iterator[None]:
    """The workdir's lock alone, for the whole with-block (see the module docstring)."""
    with _held(workdir):
        yield


@contextlib.contextmanager
def held(workdir: str, then: Callable[[], None]) -> Iterator[None]:
    """The workdir's lock, then ``then()`` under it (a refusal there releases the lock and is raised on
    every process): ``config.recorded.open_run`` checks the data and the config this way."""
    with _held(workdir, then):
        yield


ADD_WAIT_S = 30.0  # how long an add waits for another adder (an add takes about a second)


@contextlib.contextmanager
def hold_additions(workdir: str, wait_s: float | None = None) -> Iterator[None]:
    """The additions' lock (``paths.ADDITIONS_LOCK``), waiting at most ``wait_s`` (``ADD_WAIT_S``) for
    another adder: not the run's lock, which a training ``update`` holds for hours.  ``search --add``
    refused at once when another add ran: parallel adds (``xargs -P4``) lost all but one."""
    fd = _lock(workdir, paths.ADDITIONS_LOCK, ADD_WAIT_S if wait_s is None else wait_s)
    try:
        yield
    finally:
        _unlock(fd)
