"""What a person watches and plots: progress lines with ETA, ``metrics.jsonl`` and TensorBoard.

Every scalar record goes to ``metrics.jsonl`` (one JSON object per line: easy to load
with pandas) and to TensorBoard event files under ``tensorboard/`` (written with
tensorboardX, which needs no TensorFlow), with the run's cumulative step as x-axis.
Only process 0 prints and writes, so multi-host runs stay readable.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import time
from typing import Iterator

import jax

from cvs_jax.errors import not_writable
from cvs_jax.rundir import paths, run_files

_WRITERS = itertools.count()  # TensorBoard writers opened by this process


@contextlib.contextmanager
def _naming(path: str) -> Iterator[None]:
    """A write the file system refuses (a full disk) as one line naming ``path``: a failed append or
    TensorBoard's flush names no file ("cannot write a file")."""
    try:
        yield
    except OSError as e:
        refusal = not_writable(e, path)
        if refusal is None:
            raise
        raise refusal from e


class RunLog:
    def __init__(self, workdir: str):
        self._path = paths.metrics_file(workdir)
        self._main = jax.process_index() == 0
        self._tb_dir = os.path.join(workdir, paths.TENSORBOARD)
        self._tb = self._tensorboard() if self._main else None

    def _tensorboard(self, purge_step: int | None = None):
        """The TensorBoard writer; ``purge_step``: TensorBoard hides the events of earlier files at that
        global step and after (a killed run's steps that the resumed run writes again)."""
        from tensorboardX import SummaryWriter

        # one file per writer (pid and count: two writers in one second must not share a file name;
        # TensorBoard reads the files in name order)
        suffix = f".{os.getpid()}.{next(_WRITERS):03d}"
        return SummaryWriter(self._tb_dir, flush_secs=30, purge_step=purge_step, filename_suffix=suffix)

    def write(self, *, global_step: int, **record) -> None:
        """Appends one JSON line (session, epoch, step and scalar metrics) and its TB scalars."""
        if not self._main or self._tb is None:  # the writer exists on the main process only
            return
        record["time"] = round(time.time(), 3)
        with _naming(self._path), open(self._path, "a") as f:
            f.write(json.dumps(record) + "\n")
        with _naming(self._tb_dir):
            for k, v in record.items():
                if k not in ("session", "epoch", "step", "time") and isinstance(v, (int, float)):
                    self._tb.add_scalar(k, v, global_step)

    def close(self) -> None:
        if self._tb is not None:
            with _naming(self._tb_dir):
                self._tb.close()

    def truncate(self, *, session: int, step: int, global_step: int | None = None) -> None:
        """Drops records written after (session, step) by a run that crashed, so a resumed
        run's ``metrics.jsonl`` equals an uninterrupted one's; with ``global_step`` (the run step of
        that point) TensorBoard hides its events after it too (a new event file with a purge step).
        TensorBoard's events never run ahead of ``metrics.jsonl`` (both are written together, the
        events flushed later), so nothing to drop here means nothing to hide there."""
        if not self._main or not os.path.exists(self._path):
            return
        records = run_files.read_metrics(self._path)  # a line cut short by the crash is dropped
        limit = (session, step)
        kept = [r for r in records if (r.get("session", 0), r.get("step", 0)) <= limit]
        with open(self._path, "rb") as f:
            lines = sum(1 for line in f if line.strip())
        if len(kept) != lines:
            tmp = self._path + ".tmp"
            with open(tmp, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in kept)
            os.replace(tmp, self._path)
            if global_step is not None and self._tb is not None:  # the main process's writer
                self._tb.close()
                self._tb = self._tensorboard(purge_step=global_step + 1)

    def print(self, message: str) -> None:
        if self._main:
            print(message, flush=True)


def format_eta(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h:d}:{m:02d}:{s:02d}"
