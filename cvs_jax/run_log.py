"""What a person watches and plots: progress lines with ETA, and ``metrics.jsonl``.

Only process 0 prints and writes, so multi-host runs stay readable.
"""

from __future__ import annotations

import json
import os
import time

import jax


class RunLog:
    def __init__(self, workdir: str):
        self._path = os.path.join(workdir, "metrics.jsonl")
        self._main = jax.process_index() == 0

    def write(self, **record) -> None:
        """Appends one JSON line (session, epoch, step and scalar metrics)."""
        if self._main:
            record["time"] = round(time.time(), 3)
            with open(self._path, "a") as f:
                f.write(json.dumps(record) + "\n")

    def print(self, message: str) -> None:
        if self._main:
            print(message, flush=True)


def format_eta(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h:d}:{m:02d}:{s:02d}"
