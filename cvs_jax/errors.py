"""The one error boundary: problems a user must fix, as opposed to bugs.

Every entry point (``main``, ``compare``, ``search``, ``summarize``, ``update``) catches
``UserError`` (and a write the file system refuses, ``not_writable``) only: it prints one
``error: ...`` line (what is wrong and how to fix it) and exits with status 2.  Any other
exception is a bug or an environment failure and keeps its traceback.
"""

from __future__ import annotations

import errno


class UserError(Exception):
    """A problem the user must fix; the message names it and the fix."""


class ConfigError(UserError):
    """A configuration field is wrong (field, problem, fix)."""


class DataError(UserError):
    """The dataset files are missing, unreadable or do not fit the setup."""


class SplitError(DataError):
    """A session split (official files or the generator) cannot be built from the data."""


class DatasetNotFoundError(DataError):
    """The files a dataset is built from (or its prepared copy) are missing.

    The message names the dataset, the directory that was searched and the fix.
    """


class SourceMismatchError(DataError):
    """A prepared dataset in `data_dir` was built from different source files."""


class WeightsError(UserError):
    """Pretrained weights are missing or unreadable."""


class SearchError(UserError):
    """A search request names no run, an unreadable image or an unknown label."""


class NonFiniteError(UserError):
    """A loss or an embedding became NaN/inf; nothing after the last good checkpoint was written."""


class DivergedError(NonFiniteError):
    """A loss or gradient norm exploded while finite (``train_loop._Watch``): recorded as a diverged run."""


class CheckpointError(UserError):
    """A checkpoint cannot be used as it is (structure mismatch, permissions, I/O); nothing was moved."""


class IndexBackendError(UserError):
    """An index backend is unknown or not installed, or is given rows that do not fit it."""


class IndexUnavailableError(IndexBackendError):
    """The index's server cannot be reached now (a Milvus server down): the request may be retried later;
    the server answers 503."""


class UnreadableCheckpointError(CheckpointError):
    """A checkpoint's files are damaged or incomplete (``Checkpoints.restore`` refuses it; nothing was moved)."""


class WorkdirBusyError(UserError):
    """Another live process is writing the workdir."""


class NotWritableError(UserError):
    """The file system refuses a write a command must make (read-only, no permission, no space left): the
    user's to fix, not a bug.  ``cause`` says why without the path: the server answers it 503 naming no
    folder (it is its operator's to fix)."""

    def __init__(self, message: str, cause: str):
        super().__init__(message)
        self.cause = cause


_DENIED = ("use", "permission denied", "give this user access to it, or pass another path")  # a read or a write
_WRITE_REFUSALS = {  # errno -> (verb, cause, fix)
    errno.EROFS: ("write", "a read-only file system", "pass a folder on a writable one, or mount it read-write"),
    errno.EACCES: _DENIED,
    errno.EPERM: _DENIED,
    errno.ENOSPC: ("write", "no space left on its disk", "free some, or pass a folder on another disk, then rerun"),
    errno.EDQUOT: ("write", "this user's disk quota used up", "free some space, then rerun"),
    errno.ENOTDIR: ("use", "a file in its path where a folder should be", "pass another path"),
}


def not_writable(error: OSError, path: str | None = None) -> NotWritableError | None:
    """``error`` as one line naming the path, the cause and its fix when it is one of the file system's
    refusals a user fixes (``_WRITE_REFUSALS``: read-only, permission, no space, a file in the path); None
    for any other ``OSError`` (an I/O error, a bug), which keeps its traceback."""
    refusal = _WRITE_REFUSALS.get(error.errno) if isinstance(error.errno, int) else None
    if refusal is None:
        return None
    verb, cause, fix = refusal
    where = error.filename if error.filename is not None else path
    return NotWritableError(f"cannot {verb} {where if where is not None else 'a file'} ({cause}); {fix}.", cause)
