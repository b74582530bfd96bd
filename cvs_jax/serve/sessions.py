"""``POST /sessions``: the next session from the labelled adds, trained by a child process beside serving.

The child is ``python -m cvs_jax.update --workdir W --from_added`` (``retrieval.added_session``): it takes the
run's one-writer lock itself, so a session already training elsewhere (another child, an ``update``
by hand) is refused by it as by any writer.  The server refuses a second start while its own child
lives (409), and the cheap refusals (nothing labelled added, a class with one image) before any
child starts (400).  The child runs in its own process group and outlives the server; when it
completes, the server's poll finds the new session and the compatibility gate decides the switch.

Progress (``GET /sessions/current``) is read from the child's log, ``<workdir>/from_added/child.log``:
the newest ``epoch E/N step S ... loss=L`` line ``update`` prints.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading

from cvs_jax.errors import UserError, WorkdirBusyError
from cvs_jax.retrieval import added_session
from cvs_jax.rundir import workdir as workdir_lib

log = logging.getLogger("cvs_jax.serve")
PROGRESS = re.compile(r"session (\d+)/\d+ epoch (\d+)/(\d+) step (\d+) .*?loss=(\S+)")


class Busy(Exception):
    """A session is already training (409)."""


class SessionJob:
    """The server's one child session: started, watched, described."""

    def __init__(self, workdir: str, learn_after: int | None = None):
        self.workdir = workdir
        self.learn_after = learn_after
        self.log_path = os.path.join(workdir, added_session.FOLDER, "child.log")
        self._child: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def start(self) -> dict:
        """Starts the child after the refusals a request can be told at once; raises ``Busy`` or a ``UserError``."""
        with self._lock:
            if self._child is not None and self._child.poll() is None:
                raise Busy(f"a session is already training (process {self._child.pid}); GET /sessions/current.")
            config = added_session.run_config(self.workdir)
            try:
                workdir_lib.check_not_busy(self.workdir)  # an update by hand (or an orphaned child) holds the run
            except WorkdirBusyError as e:
                raise Busy(f"a session is already training: {e}") from e
            done = added_session.completed_sessions(self.workdir)
            updates = list(config.data.updates)
            resuming = bool(updates) and updates[-1] == added_session.folder_of(self.workdir, done + 1)
            if not resuming:
                added_session.pending(self.workdir, updates, int(config.model.embed_dim))  # raises its refusal
            os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
            with open(self.log_path, "wb") as log:
                cmd = [sys.executable, "-m", "cvs_jax.update", "--workdir", self.workdir, "--from_added"]
                self._child = subprocess.Popen(
                    cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
                )
            return {"state": "training", "pid": self._child.pid, "session": done + 1}

    def after_add(self) -> bool:
        """``--learn_after N``: starts the session once N labelled images are pending and none trains;
        whether it started (a refusal, e.g. a class with one image, waits for more adds)."""
        if self._child is not None and self._child.poll() is None:
            return False
        config = added_session.run_config(self.workdir)
        pending = added_session.labelled_pending(self.workdir, list(config.data.updates), int(config.model.embed_dim))
        if self.learn_after is None or pending < self.learn_after:  # the app calls this with it set
            return False
        try:
            self.start()
        except (Busy, UserError) as e:
            log.warning("--learn_after %d: %d labelled images pending, not started: %s", self.learn_after, pending, e)
            return False
        return True

    def current(self) -> dict:
        """``state``: idle (none started by this server), training, done or failed; and the progress read."""
        child = self._child
        if child is None:
            return {"state": "idle"}
        code = child.poll()
        out: dict = {"state": "training" if code is None else "done" if code == 0 else "failed", "pid": child.pid}
        text = self._log_text()
        found = PROGRESS.findall(text)
        if found:
            s, epoch, epochs, step, loss = found[-1]
            out.update(session=int(s), epoch=int(epoch), epochs=int(epochs), step=int(step), loss=_float(loss))
        if code not in (None, 0):
            errors = [line for line in text.splitlines() if line.startswith("error:")]
            out["error"] = errors[-1] if errors else f"the session's process ended with status {code}"
        return out

    def _log_text(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
