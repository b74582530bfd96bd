"""Orbax checkpoints: one per completed session, plus rolling mid-session ones.

``sessions/<s>``: after session s — the selected model, optimizer state, the
gallery and run metadata (results so far, replay memory).  Kept forever.
``progress/<n>``: inside a session every ``train.checkpoint_every_steps`` steps
and after each epoch's validation — the training state, the best model so far
and the epoch's running sums.  Only the last two are kept.

Saves are atomic (orbax writes a temporary directory and renames it), so a crash
while writing leaves the previous checkpoint as the latest.  Restoring tells three
failures apart (``classify_restore_error``):

* damaged files (truncated or undecodable data, missing pieces): ``restore_latest``
  moves the checkpoint aside to ``unreadable-<step>-<time>`` (never deleted) and
  uses the previous one;
* a structure mismatch between the code's template and the stored tree (checked
  from the stored metadata before any array is read), a permission error or a
  transient I/O error: ``errors.CheckpointError``, nothing is moved;
* anything else orbax raises that is not recognisably damaged files also stops with
  ``CheckpointError`` and moves nothing: a good checkpoint is never set aside on a guess.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import re
import shutil
import time
from typing import Any, Callable, Container

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint._src import asyncio_utils

from cvs_jax.errors import CheckpointError, NotWritableError, UnreadableCheckpointError, not_writable
from cvs_jax.rundir import faults, tensorstore_json

tensorstore_json.install()  # orbax reads every array through tensorstore's leaking to_json(): see there

_EMPTY = "__empty__"
_META = "meta"
_PYTREE_METADATA_FILE = "_METADATA"  # orbax's per-item tree metadata (PYTREE_METADATA_FILE)
_JSON_FILE = "metadata"  # JsonCheckpointHandler's default file name
_MAX_LISTED = 12  # mismatching tree paths named in one message

UNREADABLE, UNAVAILABLE, UNRECOGNISED = "unreadable", "unavailable", "unrecognised"

# errno values that mean "the files may be fine, the storage is not reachable right now / for this user".
_UNAVAILABLE_ERRNOS = {
    getattr(errno, name)
    for name in (
        "EACCES EPERM EROFS EIO ENOSPC EDQUOT ETIMEDOUT ESTALE EAGAIN EBUSY EINTR ENOMEM EMFILE ENFILE ENOLCK "
        "ECONNRESET ECONNREFUSED ECONNABORTED EHOSTUNREACH ENETUNREACH ENETDOWN ENOTCONN EREMOTEIO"
    ).split()
    if hasattr(errno, name)
}
# tensorstore raises ValueError('<STATUS_CODE>: ...'); these codes are about access or the
# storage service, not about the bytes of the checkpoint.
_UNAVAILABLE_CODES = (
    "PERMISSION_DENIED",
    "UNAUTHENTICATED",
    "UNAVAILABLE",
    "DEADLINE_EXCEEDED",
    "RESOURCE_EXHAUSTED",
    "ABORTED",
    "CANCELLED",
)
_UNAVAILABLE_TEXT = (
    "permission denied",
    "operation not permitted",
    "read-only file system",
    "input/output error",
    "no space left",
    "disk quota exceeded",
    "stale file handle",
    "timed out",
    "too many open files",
    "resource temporarily unavailable",
    "connection reset",
)
# codes and texts of damaged or missing checkpoint files (as seen from orbax 0.12 / tensorstore: a
# truncated data file gives OUT_OF_RANGE "Requested byte range ... is not valid for value of size", a
# clobbered b-tree node "Error decoding ...: Data corruption detected", a chunk with bytes written over it
# FAILED_PRECONDITION "ZSTD_decompressStream() failed", a missing file NOT_FOUND, a truncated manifest
# DATA_LOSS "Error decoding manifest").
_UNREADABLE_CODES = ("DATA_LOSS", "OUT_OF_RANGE", "NOT_FOUND")
_UNREADABLE_TEXT = (
    "error decoding",
    "decompress",  # zstd: "ZSTD_decompressStream() failed: Unknown frame descriptor" (bytes written over a chunk)
    "data corruption",
    "corrupt",
    "checksum",
    "not valid for value of size",
    "does not exist",
    "unexpected end",
    "truncated",
    "was not found in the checkpoint",
)


class _Unreadable(Exception):
    """Internal: damaged or missing files (restore_latest moves the checkpoint aside and falls back)."""


def _chain(exc: BaseException | None) -> list[BaseException]:
    out, seen = [], set()
    while exc is not None and id(exc) not in seen and len(out) < 16:
        out.append(exc)
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return out


def classify_restore_error(exc: BaseException) -> str:
    """Why reading a checkpoint failed: ``UNREADABLE``, ``UNAVAILABLE`` or ``UNRECOGNISED``.

    Only ``UNREADABLE`` (the checkpoint's own bytes are damaged or missing) justifies moving a
    checkpoint aside and training again from the previous one.  Anything that may leave the files
    intact must stop instead: moving a good checkpoint aside silently throws work away (a code/template
    mismatch once did exactly that).  orbax and tensorstore wrap errors, so the whole
    ``__cause__``/``__context__`` chain and the messages are inspected:

    * ``UNAVAILABLE`` (checked first, it wins over everything): ``PermissionError`` or any ``OSError``
      with errno EACCES/EPERM/EIO/ENOSPC/ETIMEDOUT/ESTALE/...; a tensorstore ``ValueError`` whose status
      code is PERMISSION_DENIED/UNAVAILABLE/DEADLINE_EXCEEDED/RESOURCE_EXHAUSTED/... or which carries such
      an ``os_error_code``; or a message saying so ("Permission denied", "Input/output error", ...).
    * ``UNREADABLE``: ``FileNotFoundError``/``NotADirectoryError`` (missing pieces), ``json``/unicode
      decode errors (a truncated ``_METADATA`` or JSON item), tensorstore DATA_LOSS/OUT_OF_RANGE/NOT_FOUND
      or a decoding/corruption message, and this module's own missing-piece checks.
    * ``UNRECOGNISED``: everything else (e.g. an orbax ``ValueError`` about the tree); treated like
      ``UNAVAILABLE`` by the callers: stop, move nothing.
    """
    chain = _chain(exc)
    for e in chain:
        if isinstance(e, PermissionError) or (isinstance(e, OSError) and e.errno in _UNAVAILABLE_ERRNOS):
            return UNAVAILABLE
        msg = str(e)
        m = re.search(r"os_error_code='?(\d+)", msg)
        if m and int(m.group(1)) in _UNAVAILABLE_ERRNOS:
            return UNAVAILABLE
        if msg.split(":", 1)[0].strip() in _UNAVAILABLE_CODES or any(t in msg.lower() for t in _UNAVAILABLE_TEXT):
            return UNAVAILABLE
    for e in chain:
        if isinstance(e, (_Unreadable, FileNotFoundError, NotADirectoryError, json.JSONDecodeError, UnicodeError)):
            return UNREADABLE
        msg = str(e)
        if msg.split(":", 1)[0].strip().strip("'\"") in _UNREADABLE_CODES or any(
            t in msg.lower() for t in _UNREADABLE_TEXT
        ):
            return UNREADABLE
    return UNRECOGNISED


_DRAIN_S = 60.0  # how long a failed orbax operation waits for its other reads and writes still in flight


def _run_on_a_new_loop_draining_a_failure(coro):
    """orbax's ``asyncio_utils._run_sync_via_new_loop`` (runs one operation on an event loop of its own, then
    closes it), except that an operation that fails first lets its other reads and writes finish (at most
    ``_DRAIN_S``) and keeps their errors to itself.

    A restore that fails on damaged array data used to close the loop at the first failed read, with the others
    still in flight: each then completed into the closed loop, and Python printed a "RuntimeError: Event loop is
    closed" traceback per read, or asyncio logged "Task exception was never retrieved" for a second damaged
    array, after the command's one ``error:`` line and while the process exited: ``search`` on a session
    checkpoint with 4,900 bytes written over its largest array file printed 2 to 40 such lines in 6 of 20 runs,
    and in 0 of 20 with this (the same 20 damaged copies, old and new interleaved).  The first error is raised
    as before; a success runs exactly as orbax's.  Ctrl-C is not delayed (no draining)."""
    loop = asyncio.new_event_loop()
    failed = False

    def report(loop, context) -> None:  # what asyncio reports of the loop's tasks (when they are collected)
        if not failed:  # after a failure: the failed operation's other reads, whose results nobody wants
            loop.default_exception_handler(context)

    loop.set_exception_handler(report)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    except Exception:
        failed = True
        try:
            in_flight = asyncio.all_tasks(loop)
        except RuntimeError:  # asyncio's task set changed under another thread's loop (see orbax's runner): no wait
            in_flight = set()
        if in_flight:
            loop.run_until_complete(asyncio.wait(in_flight, timeout=_DRAIN_S))
        raise
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def _drain_failed_operations() -> None:
    """Installs ``_run_on_a_new_loop_draining_a_failure`` as orbax's runner of an operation (once per process;
    where this orbax version lacks it, nothing changes: ``tests/rundir/test_damaged_files.py`` notices)."""
    if getattr(asyncio_utils, "_run_sync_via_new_loop", None) is not None:
        asyncio_utils._run_sync_via_new_loop = _run_on_a_new_loop_draining_a_failure


_drain_failed_operations()


# orbax's ERROR logs (with tracebacks) of a failure in its background threads, which it also raises to whoever
# waits for the operation (``Checkpoints.save``, ``close``: one ``error:`` line)
_RAISED_TO_THE_WAITER = (
    "_SignalingThread.run() raised an exception",
    "Handler Commit operations or the Commit callback in background save thread",
    "Save Finalize thread (save_finalize) failed",
)


class _RaisedToTheWaiter(logging.Filter):
    """Drops orbax's logs of an exception in its background threads (``_RAISED_TO_THE_WAITER``): orbax keeps
    that exception and raises it to the waiter, here ``Checkpoints``, which reports it in one line.  A full disk
    printed about 200 lines of them above the ``error:`` line of ``search --add``, 400 above ``update``'s."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 -- a record whose arguments do not fit its format: kept as it is
            return True
        return not any(marker in message for marker in _RAISED_TO_THE_WAITER)


logging.getLogger("absl").addFilter(_RaisedToTheWaiter())


def write_refusal(exc: BaseException, path: str) -> NotWritableError | None:
    """A write the file system refused somewhere in ``exc``'s chain (an ``OSError``, or tensorstore's error
    carrying ``os_error_code``) as ``errors.not_writable``'s one line naming ``path``; None for anything else."""
    for e in _chain(exc):
        code = e.errno if isinstance(e, OSError) else None
        m = re.search(r"os_error_code='?(\d+)", str(e))
        code = code if code is not None else (int(m.group(1)) if m else None)
        if code is not None:
            refusal = not_writable(OSError(code, os.strerror(code)), path)
            if refusal is not None:
                return refusal
    return None


def _key_name(k) -> str:
    for attr in ("key", "name", "idx"):  # DictKey / FlattenedIndexKey, GetAttrKey, SequenceKey
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def _leaves(tree) -> dict[str, Any]:
    """tree path ("a/b/0") -> leaf; orbax stores namedtuples/dataclasses as dicts and tuples as lists,
    so paths are compared by their names only."""
    return {"/".join(_key_name(k) for k in path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _absent(path: str, other: dict[str, Any]) -> str:
    """The shortest prefix of ``path`` that ``other`` has nothing under (a whole missing subtree is named once)."""
    parts = path.split("/")
    for i in range(1, len(parts) + 1):
        prefix = "/".join(parts[:i])
        if not any(q == prefix or q.startswith(prefix + "/") for q in other):
            return prefix
    return path


def structure_differences(item: str, stored, template) -> list[str]:
    """The tree paths where ``template`` (the code's) and ``stored`` (a checkpoint's tree metadata, or its
    ``_leaves``: flattening them again gives the same paths) differ."""
    have, want = _leaves(stored), _leaves(template)
    if list(have) == [_EMPTY]:  # an empty tree is stored as a marker
        have = {}
    out: dict[str, str] = {}
    for p in sorted(set(have) | set(want)):
        if p not in want:
            q = _absent(p, want)
            out[q] = "in the checkpoint, not in the code"
        elif p not in have:
            q = _absent(p, have)
            out[q] = "in the code, not in the checkpoint"
        else:
            s, t = have[p], want[p]
            s_shape, t_shape = tuple(getattr(s, "shape", None) or ()), tuple(np.shape(t))
            s_dtype, t_dtype = getattr(s, "dtype", None), getattr(t, "dtype", None)  # Python scalars: no dtype
            if s_shape != t_shape:
                out[p] = f"shape {s_shape} in the checkpoint, {t_shape} in the code"
            elif s_dtype is not None and t_dtype is not None and np.dtype(s_dtype) != np.dtype(t_dtype):
                out[p] = f"dtype {np.dtype(s_dtype)} in the checkpoint, {np.dtype(t_dtype)} in the code"
    return [f"{item}/{p}: {what}" if p else f"{item}: {what}" for p, what in out.items()]


def _host_target(leaf):
    """What a host leaf of a template is read as: an array is given as an empty one of its shape and dtype,
    a scalar as itself. orbax reads such an array as a numpy array as it reads a ``jax.ShapeDtypeStruct``
    without a sharding, but without reading the checkpoint's tree metadata again to look for one
    (``Checkpoints._stored_leaves`` has the measurement)."""
    return np.empty(leaf.shape, leaf.dtype) if isinstance(leaf, np.ndarray) else ocp.utils.to_shape_dtype_struct(leaf)


def _stat(path: str) -> None:
    """Raise _Unreadable if ``path`` is missing; a PermissionError (unreadable parent) propagates.

    (orbax reports a directory it may not list as "does not exist"; ``os.stat`` tells the two apart.)
    """
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError) as e:
        raise _Unreadable(f"missing {path}") from e


class Checkpoints:
    """A directory of numbered checkpoints, each holding pytree items and one JSON item."""

    def __init__(
        self,
        directory: str,
        *,
        max_to_keep: int | None,
        log: Callable[[str], None] = print,
        asynchronous: bool = False,
    ):
        """``max_to_keep``: keep the newest N checkpoints (orbax ``LatestN``); None keeps all.
        ``asynchronous``: ``save`` returns once the trees are on the host and orbax writes them in the
        background (training goes on); the next save, every read and ``close`` wait for it first. A kill
        before it finishes loses only that checkpoint (its temporary folder is never taken for one)."""
        self._dir = os.path.abspath(directory)
        self._log = log
        self._max_to_keep = max_to_keep
        self._asynchronous = asynchronous
        self._metadata: dict[str, tuple[tuple[int, int, int], dict[str, Any]]] = {}  # _stored_leaves
        self._mgr = self._open()
        if asynchronous and faults.armed_at_all():  # the crash tests' kill points come after the save
            faults.settle_before_kill(lambda: self._mgr.wait_until_finished())

    def _open(self) -> ocp.CheckpointManager:
        policies = ocp.checkpoint_managers
        keep = (
            policies.preservation_policy.PreserveAll()
            if self._max_to_keep is None
            else policies.LatestN(n=self._max_to_keep)
        )
        return ocp.CheckpointManager(
            self._dir,
            options=ocp.CheckpointManagerOptions(
                preservation_policy=keep,
                create=True,
                enable_async_checkpointing=self._asynchronous,
                cleanup_tmp_directories=True,
            ),
        )

    @property
    def directory(self) -> str:
        return self._dir

    def steps(self) -> list[int]:
        self._mgr.wait_until_finished()
        return sorted(self._mgr.all_steps())

    def save(self, step: int, trees: dict[str, Any], meta: dict) -> None:
        """Writes checkpoint ``step``; a write the file system refuses (a full disk, read-only, no permission),
        now or in the asynchronous save before it, is ``errors.NotWritableError`` naming the folder (tensorstore
        reports a full disk as ``ValueError("RESOURCE_EXHAUSTED: ... [os_error_code='28']")``: a traceback
        before).  The step is then not taken: orbax's temporary folder is never read as a checkpoint and is
        removed by the next writer, which resumes from the previous step."""
        try:
            self._mgr.wait_until_finished()  # one save at a time: the previous one is on disk before the next
            # orbax refuses empty containers; an empty dict is stored as a marker and restored as {}.
            args: dict[str, Any] = {  # the trees, and the JSON meta below
                k: ocp.args.StandardSave(jax.device_get(v) if v else {_EMPTY: np.zeros((1,), np.int8)})
                for k, v in trees.items()
            }
            args[_META] = ocp.args.JsonSave(meta)
            self._mgr.save(step, args=ocp.args.Composite(**args), force=True)
            if not self._asynchronous:
                self._mgr.wait_until_finished()
        except Exception as e:  # noqa: BLE001 -- orbax/tensorstore raise many types; a refused write is told apart
            refusal = write_refusal(e, self._dir)
            if refusal is None:
                raise
            raise refusal from e

    def delete(self, step: int) -> None:
        """Removes checkpoint ``step`` (a population drops the newer progress step that only some of its
        members wrote before a kill, so that all of them write it again from their common step)."""
        self._mgr.wait_until_finished()
        self._mgr.delete(step)

    def remove(self, steps) -> None:
        """Removes the folders of ``steps``, also ones that another process wrote (orbax's ``delete`` knows
        only the steps this manager listed), then lists the folder again."""
        self._mgr.wait_until_finished()
        for step in steps:
            try:
                shutil.rmtree(os.path.join(self._dir, str(step)))
            except FileNotFoundError:
                pass
        self._mgr.reload()

    def stored_shape(self, step: int, item: str, path: str) -> tuple[int, ...] | None:
        """The shape stored at ``path`` ("a/b") of ``item`` in checkpoint ``step`` (its metadata only;
        None when absent or unreadable): what a template must match, e.g. a head grown since."""
        try:
            leaf = self._stored_leaves(step, item).get(path)
        except Exception:  # noqa: BLE001 -- a damaged checkpoint: restore_latest reports it
            return None
        return None if leaf is None else tuple(getattr(leaf, "shape", None) or ())

    def _stored_leaves(self, step: int, item: str) -> dict[str, Any]:
        """``_leaves`` of orbax's tree metadata of ``item`` in checkpoint ``step``, read once per version of its
        file (its inode, size and mtime): ``stored_shape`` and ``_check`` both read it for a model's restore, and
        the end of every session restores each earlier session's model for the compatibility matrix (T restores
        per session). With ``_host_target`` a restore of a 21-session photo run's models (``:cpu_pretrained``)
        took 75 ms instead of 131 (each alone ~106-110 ms; ``benchmarks/model_restore.py``)."""
        where = os.path.join(self._dir, str(step), item)
        st = os.stat(os.path.join(where, _PYTREE_METADATA_FILE))
        version = (st.st_ino, st.st_size, st.st_mtime_ns)
        known = self._metadata.get(where)
        if known is None or known[0] != version:
            handler = ocp.StandardCheckpointHandler()
            try:
                stored = handler.metadata(epath.Path(where))
            finally:
                handler.close()
            known = self._metadata[where] = (version, _leaves(getattr(stored, "tree", stored)))
        return known[1]

    def _check(self, step: int, templates: dict[str, Any]) -> None:
        """Before any array is read: every piece is present and each templated item's stored tree
        (orbax's tree metadata) has the template's paths, shapes and dtypes.

        Raises _Unreadable (missing piece), CheckpointError (mismatch) or whatever reading the
        metadata raised (classified by the caller)."""
        path = os.path.join(self._dir, str(step))
        _stat(os.path.join(path, _META, _JSON_FILE))
        diffs = []
        for item, template in templates.items():
            _stat(os.path.join(path, item, _PYTREE_METADATA_FILE))
            stored = self._stored_leaves(step, item)
            if template is not None:
                diffs += structure_differences(item, stored, template)
        if diffs:
            listed = "; ".join(diffs[:_MAX_LISTED]) + (
                f"; and {len(diffs) - _MAX_LISTED} more" if len(diffs) > _MAX_LISTED else ""
            )
            raise CheckpointError(
                f"checkpoint {path} does not fit this code: {listed}. Nothing was moved. The run was made by a "
                "different code version or config: rerun with the version and config that wrote it, or use "
                "another --workdir."
            )

    def _restore(self, step: int, templates: dict[str, Any]) -> dict[str, Any]:
        """Check, then read; every failure is a CheckpointError or (damaged files) _Unreadable."""
        self._mgr.wait_until_finished()
        path = os.path.join(self._dir, str(step))
        try:
            self._check(step, templates)
            args: dict[str, Any] = {  # the trees, and the JSON meta below
                k: ocp.args.StandardRestore(
                    None if t is None or not jax.tree.leaves(t) else jax.tree.map(_host_target, jax.device_get(t))
                )
                for k, t in templates.items()
            }
            args[_META] = ocp.args.JsonRestore()
            out = self._mgr.restore(step, args=ocp.args.Composite(**args))
        except (CheckpointError, _Unreadable):  # a mismatch, or a piece found missing by _check
            raise
        except Exception as e:  # noqa: BLE001 -- orbax/tensorstore raise many types; classified below
            kind = classify_restore_error(e)
            what = f"{type(e).__name__}: {str(e)[:300]}"
            if kind == UNREADABLE:
                raise _Unreadable(what) from e
            raise CheckpointError(
                f"checkpoint {path} cannot be read now ({what}). Nothing was moved: "
                + (
                    "the files may be intact; fix the permissions or the storage (space, mount, network) and rerun."
                    if kind == UNAVAILABLE
                    else "this error is not recognised as damaged files. If they are damaged, move that folder "
                    "aside yourself and rerun to use the previous checkpoint."
                )
            ) from e

        def value(k):
            t, v = templates.get(k), out[k]
            if t is not None and not jax.tree.leaves(t):  # nothing stored beyond the structure
                return t
            return {} if isinstance(v, dict) and _EMPTY in v else v

        return {k: value(k) for k in list(templates) + [_META]}

    def restore(self, step: int, templates: dict[str, Any]) -> dict[str, Any]:
        """One specific checkpoint (no fallback, nothing is ever moved).

        Raises ``UnreadableCheckpointError`` (a ``CheckpointError``) for damaged or missing files and
        ``CheckpointError`` for a structure mismatch, a permission or an I/O error."""
        try:
            return self._restore(step, templates)
        except _Unreadable as e:
            raise UnreadableCheckpointError(
                f"checkpoint {os.path.join(self._dir, str(step))} cannot be read ({e}); its files are damaged or "
                "incomplete. Nothing was moved: restore that folder from a backup."
            ) from e

    def restore_latest(
        self, templates: dict[str, Any], steps: Container[int] | None = None
    ) -> tuple[int, dict[str, Any]] | None:
        """The newest readable checkpoint as (step, items); ones with damaged files are moved aside.

        ``templates`` maps item name -> a pytree with the expected structure (or None
        for items restored as saved, e.g. plain numpy dicts).  ``steps`` limits the
        search to a range of checkpoint numbers (e.g. one session's).  A structure mismatch,
        a permission or an I/O error raises ``CheckpointError`` and moves nothing.
        """
        for step in reversed(self.steps()):
            if steps is not None and step not in steps:
                continue
            try:
                return step, self._restore(step, templates)
            except _Unreadable as e:
                aside = os.path.join(self._dir, f"unreadable-{step}-{int(time.time())}")
                self._log(
                    f"warning: checkpoint {os.path.join(self._dir, str(step))} cannot be read "
                    f"({str(e)[:200]}); moved it to {aside} and falling back to the previous checkpoint."
                )
                self._mgr.close()
                os.rename(os.path.join(self._dir, str(step)), aside)
                self._mgr = self._open()
        return None

    def close(self) -> None:
        try:
            self._mgr.wait_until_finished()  # an asynchronous save in flight is on disk before the run ends
        except Exception as e:  # noqa: BLE001 -- that save's refused write (a full disk), as ``save`` says it
            refusal = write_refusal(e, self._dir)
            if refusal is None:
                raise
            raise refusal from e
        finally:
            self._mgr.close()


class Reader(Checkpoints):
    """Checkpoints opened to read only: no folder is created, and orbax's clean-up of unfinished
    ``<step>.orbax-checkpoint-tmp*`` folders is off (such a folder may be the training run's save in
    progress: a reader must neither delete it nor read it; orbax lists finalized steps only)."""

    def _open(self) -> ocp.CheckpointManager:
        return ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                preservation_policy=ocp.checkpoint_managers.preservation_policy.PreserveAll(),
                create=False,
                enable_async_checkpointing=False,
                cleanup_tmp_directories=False,
            ),
        )
