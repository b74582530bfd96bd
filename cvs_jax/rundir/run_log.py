"""What a person watches and plots: progress lines with ETA, ``metrics.jsonl`` and TensorBoard.

Every scalar record goes to ``metrics.jsonl`` (one JSON object per line: easy to load
with pandas) and to TensorBoard event files under ``tensorboard/`` (written with
tensorboardX, which needs no TensorFlow), with the run's cumulative step as x-axis.
Only process 0 prints and writes, so multi-host runs stay readable.
"""

from __future__ import annotations

import json
import os
import time

import jax

from cvs_jax.rundir import paths


class RunLog:
    def __init__(self, workdir: str):
        self._path = paths.metrics_file(workdir)
        self._main = jax.process_index() == 0
        self._tb = None
        if self._main:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(os.path.join(workdir, paths.TENSORBOARD), flush_secs=30)

    def write(self, *, global_step: int, **record) -> None:
        """Appends one JSON line (session, epoch, step and scalar metrics) and its TB scalars."""
        if not self._main:
            return
        record["time"] = round(time.time(), 3)
        with open(self._path, "a") as f:
            f.write(json.dumps(record) + "\n")
        for k, v in record.items():
            if k not in ("session", "epoch", "step", "time") and isinstance(v, (int, float)):
                self._tb.add_scalar(k, v, global_step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()

    def truncate(self, *, session: int, step: int) -> None:
        """Drops records written after (session, step) by a run that crashed, so a resumed
        run's ``metrics.jsonl`` equals an uninterrupted one's."""
        if not self._main or not os.path.exists(self._path):
            return
        with open(self._path) as f:
            records = [json.loads(line) for line in f if line.strip()]
        limit = (session, step)
        kept = [r for r in records if (r["session"], r["step"]) <= limit]
        if len(kept) != len(records):
            tmp = self._path + ".tmp"
            with open(tmp, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in kept)
            os.replace(tmp, self._path)

    def print(self, message: str) -> None:
        if self._main:
            print(message, flush=True)


def format_eta(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h:d}:{m:02d}:{s:02d}"
