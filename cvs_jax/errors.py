"""The one error boundary: problems a user must fix, as opposed to bugs.

Every entry point (``main``, ``compare``, ``search``, ``summarize``, ``update``) catches
``UserError`` only: it prints one ``error: ...`` line (what is wrong and how to fix it)
and exits with status 2.  Any other exception is a bug or an environment failure and
keeps its traceback.
"""

from __future__ import annotations


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
