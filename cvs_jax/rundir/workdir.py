"""One writer per workdir; remember the config, refuse to mix runs, move old runs aside.

``open_run(config, workdir)`` holds the workdir for one run:

* **The lock.**  Process 0 takes an exclusive ``flock`` on ``<workdir>/.lock`` before it
  reads or writes anything else there.  A second live process is refused with
  ``WorkdirBusyError`` naming the holder (host, pid, start time, command; written into
  the file).  The kernel drops the lock when its process dies, so a run killed with
  ``kill -9`` (or a lost machine) never blocks its rerun.  In a multi-host run only
  process 0 locks, and its outcome is broadcast so every process stops when it is refused.
* **The config.**  The first run writes ``config.json``.  A later run with a different
  config (apart from fields that do not change results, e.g. paths or logging) is refused
  once the workdir holds a checkpoint, unless ``overwrite=True``, which moves the
  existing run into ``previous-<time>/`` — saved checkpoints and galleries are never
  deleted.  A workdir without any checkpoint (a start that failed, e.g. on a data check)
  takes the new config.

``hold(workdir)`` is the lock alone (``compare`` over its whole directory).
Reading a run (plain ``search``) needs no lock.  The rows added to a gallery (``search --add``, the
server's ``/add``) have their own lock, ``hold_additions``: no run ever writes them, so they are added
while ``update`` trains, one writer at a time.
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
import ml_collections
import numpy as np

from configs import base as base_config
from cvs_jax.errors import ConfigError, UserError, WorkdirBusyError
from cvs_jax.methods import registry
from cvs_jax.rundir import paths

LOCK_NAME = paths.LOCK
# Fields that may change between a run and its resumption.
OPERATIONAL = (
    "overwrite",
    "data.data_dir",
    "data.manual_dir",
    "data.on_corrupt",  # refusing or skipping undecodable images never changes a session that trained
    "data.in_memory_limit_mb",
    "data.loader_threads",
    "data.loader_workers",
    "train.eval_batch_size",
    "train.checkpoint_every_steps",
    "log_every_steps",
    "distributed.multihost",
)
# Keys added after runs were recorded without them, with the value that reproduces what those runs did.
ADDED_KEYS = {"model.head": "cosine"}  # before model.head existed, every method trained the cosine head
# Checkpoint folders whose numbered step directories make a workdir hold a run.
CHECKPOINT_DIRS = paths.CHECKPOINT_DIRS


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _comparable(config_dict: dict) -> dict:
    flat = _flatten(json.loads(json.dumps(config_dict)))  # tuples -> lists, as stored
    return {k: v for k, v in flat.items() if k not in OPERATIONAL}


def has_checkpoint(workdir: str) -> bool:
    """True when ``workdir`` holds a saved step (a numbered directory of the session or progress checkpoints)."""
    for sub in CHECKPOINT_DIRS:
        d = os.path.join(workdir, sub)
        if os.path.isdir(d) and any(n.isdigit() and os.path.isdir(os.path.join(d, n)) for n in os.listdir(d)):
            return True
    return False


def _with_added_keys(config_dict: dict) -> dict:
    """``config_dict`` with every ``ADDED_KEYS`` entry it lacks set to the value its run used."""
    out = json.loads(json.dumps(config_dict))
    for dotted, value in ADDED_KEYS.items():
        *path, last = dotted.split(".")
        node = out
        for key in path:
            node = node.setdefault(key, {})
        node.setdefault(last, value)
    return out


def _lay_over(defaults: dict, stored: dict, prefix: str, unknown: list[str]) -> dict:
    out = dict(defaults)
    for key, value in stored.items():
        if key not in defaults:
            unknown.append(prefix + key)
        elif isinstance(value, dict) and isinstance(defaults[key], dict):
            out[key] = _lay_over(defaults[key], value, f"{prefix}{key}.", unknown)
        else:
            out[key] = value
    return out


def over_defaults(stored: dict, where: str) -> ml_collections.ConfigDict:
    """``stored`` (a run's recorded config) laid over today's defaults (``configs.base.get_config()``):
    every recorded value is the run's, a field added since keeps its one default (or, for
    ``ADDED_KEYS``, the value the run used).  A recorded field that no longer exists is refused."""
    unknown: list[str] = []
    merged = _lay_over(base_config.get_config().to_dict(), _with_added_keys(stored), "", unknown)
    if unknown:
        raise ConfigError(
            f"{where} records field(s) this version of cvs_jax no longer has: {', '.join(sorted(unknown))}; "
            "the run was made by another version: read it with that version, or start a new run."
        )
    return ml_collections.ConfigDict(merged)


def stored_config(workdir: str) -> ml_collections.ConfigDict:
    """The run's ``config.json`` laid over today's defaults (``over_defaults``): what search and update
    read of a run."""
    path = paths.config_file(workdir)
    with open(path) as f:
        return over_defaults(json.load(f), path)


def _write_config(path: str, current: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(current, f, indent=2)
    os.replace(tmp, path)  # never a half-written config.json


def _move_aside(workdir: str) -> str:
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


def _extends(stored, current) -> bool:
    stored, current = list(stored or []), list(current or [])
    return len(current) > len(stored) and current[: len(stored)] == stored


def prepare(config: ml_collections.ConfigDict, workdir: str) -> None:
    """Checks ``config`` against the workdir's ``config.json`` and records it (call with the lock held)."""
    os.makedirs(workdir, exist_ok=True)
    path = paths.config_file(workdir)
    current = config.to_dict()
    if os.path.exists(path):
        with open(path) as f:
            stored = json.load(f)
        a, b = _comparable(stored), _comparable(current)
        # a field added since the run was recorded takes the value that run used (ADDED_KEYS) or its one
        # default, as stored_config reads it: a run recorded by an earlier version resumes
        since = {**_flatten(base_config.get_config().to_dict()), **ADDED_KEYS}
        a.update({k: since[k] for k in b if k not in a and k in since})
        if "model.head" in b:
            # the head the run trains with, "official" resolved for the method (a run recorded before
            # model.head existed trained the cosine head: it resumes under "official" for cvs, not for ewc)
            official = registry.get_method(config).official_head
            for flat in (a, b):
                flat["model.head"] = official if flat["model.head"] == "official" else flat["model.head"]
        diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        if diff == ["data.updates"] and _extends(a.get("data.updates"), b.get("data.updates")):
            diff = []  # python -m cvs_jax.update adds a folder (one session) to the run
        if not diff:
            _write_config(path, current)
            return
        shown = ", ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in diff[:5]) + (", ..." if len(diff) > 5 else "")
        if not has_checkpoint(workdir):
            print(f"{workdir} holds no checkpoint of its earlier config ({shown}); config.json now records this one")
        elif "data.updates" in diff and not config.overwrite:
            raise ConfigError(
                f"workdir {workdir} holds a run extended by python -m cvs_jax.update (data.updates: "
                f"{a.get('data.updates')!r}); continue it with python -m cvs_jax.update --workdir {workdir} "
                f"--data NEW_FOLDER, or use another --workdir."
            )
        elif not config.overwrite:
            raise ConfigError(
                f"workdir {workdir} holds a run with a different config ({shown}); use another --workdir, "
                f"or pass --config.overwrite=True to move that run into {workdir}/previous-<time>/."
            )
        else:
            print(f"moved the previous run in {workdir} to {_move_aside(workdir)}")
    _write_config(path, current)


# ---------------------------------------------------------------- the lock
def _holder() -> dict:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
    }


def _busy(workdir: str, fd: int) -> WorkdirBusyError:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        holder = json.loads(os.read(fd, 1 << 16).decode() or "{}")
    except (OSError, ValueError):
        holder = {}
    host, pid = holder.get("host", "an unknown host"), holder.get("pid", "?")
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


def _lock(workdir: str, name: str = LOCK_NAME, wait_s: float = 0.0) -> int:
    """Takes ``<workdir>/<name>`` (waiting at most ``wait_s``); returns its descriptor, or raises
    ``WorkdirBusyError``."""
    _make_folder(os.path.dirname(os.path.join(workdir, name)))
    fd = os.open(os.path.join(workdir, name), os.O_RDWR | os.O_CREAT, 0o644)
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
            error = _busy(workdir, fd) if busy else None
            os.close(fd)
            if error is not None:
                raise error from None
            raise
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(_holder()).encode())
    os.fsync(fd)
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
        try:
            fd = _lock(workdir)
            if then is not None:
                then()
        except Exception as e:  # reported to the other processes before it is raised here
            error = e
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
def hold_additions(workdir: str, wait_s: float = 0.0) -> Iterator[None]:
    """The additions' lock (``paths.ADDITIONS_LOCK``), waiting at most ``wait_s`` for another adder:
    not the run's lock, which a training ``update`` holds for hours."""
    fd = _lock(workdir, paths.ADDITIONS_LOCK, wait_s)
    try:
        yield
    finally:
        _unlock(fd)


@contextlib.contextmanager
def open_run(
    config: ml_collections.ConfigDict, workdir: str, check: Callable[[], None] | None = None
) -> Iterator[None]:
    """Holds the workdir for one run: the lock first, then ``check`` (the data checks: a refusal
    leaves every file of the workdir as it was), then the config check (see the module docstring)."""

    def then() -> None:
        if check is not None:
            check()
        prepare(config, workdir)

    with _held(workdir, then):
        yield
