"""``POST /sessions``: the next session from the labelled adds, trained by a child process beside serving.

The child is ``python -m cvs_jax.update --workdir W --from_added`` (``retrieval.added_session``): it takes the
run's one-writer lock itself, so a session already training elsewhere (another child, an ``update``
by hand) is refused by it as by any writer.  The server refuses a second start while its own child
lives (409), and the cheap refusals (nothing labelled added, every class with one image) before any
child starts (400); lone images of a class wait for a later session (the answer's ``deferred``).  The
child runs in its own process group and outlives the server; when it completes, the server's poll
finds the new session and the compatibility gate decides the switch.

Progress (``GET /sessions/current``, the ``cvs_session_*`` gauges of ``/metrics``, the page) is read from
the child's log, ``<workdir>/from_added/child.log``: the newest ``epoch E/N step S ... loss=L`` line
``update`` prints, and the newest ``ETA h:mm:ss`` of its progress lines less the seconds since the log
last grew when that line is the newest (the child's estimate of the training left; scoring, the new
model's one pass over its gallery rows and test queries, is not in it).  ``scoring`` is the stretch
after ``session S: embedding ...``, when training is over.  The images and classes are those the
session learns from, counted when it starts (the pending added rows, or the folder of a resumed one).
"""

from __future__ import annotations

import collections
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time

from cvs_jax.errors import UserError, WorkdirBusyError
from cvs_jax.retrieval import added_session, additions
from cvs_jax.rundir import workdir as workdir_lib

log = logging.getLogger("cvs_jax.serve")
PROGRESS = re.compile(r"session (\d+)/\d+ epoch (\d+)/(\d+) step (\d+) .*?loss=(\S+)")
ETA = re.compile(r"ETA (\d+):(\d\d):(\d\d)$")
SCORING = re.compile(r"^  session \d+: embedding ")
STATES = ("idle", "training", "scoring", "done", "failed")


ACCEPT_WAIT_S = 300.0  # POST /sessions waits this long at most for the child to accept or refuse its plan


class Busy(Exception):
    """A session is already training (409)."""


class SessionRefused(UserError):
    """The child refused the session when it checked its plan (400), e.g. too few images for a batch."""


class SessionJob:
    """The server's one child session: started, watched, described."""

    def __init__(self, workdir: str, learn_after: int | None = None):
        self.workdir = workdir
        self.learn_after = learn_after
        self.log_path = os.path.join(workdir, added_session.FOLDER, "child.log")
        self._child: subprocess.Popen | None = None
        self._learns: collections.Counter = collections.Counter()  # class -> images of the session started
        self._lock = threading.Lock()
        self._adopted: tuple[int, int] | None = None  # (pid, session) of a child an earlier server started
        self._deferred: dict | None = None  # class -> lone images the session started left for a later one

    def start(self, wait_s: float = ACCEPT_WAIT_S) -> dict:
        """Starts the child after the refusals a request can be told at once, then waits (at most ``wait_s``)
        until the child has checked its plan: a refusal it finds there (too few images for a batch, ...)
        is raised as this request's (``UserError``, one line, nothing changed: ``update`` removes the folder
        it made).  Raises ``Busy`` while a session trains."""
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
            folder = added_session.folder_of(self.workdir, done + 1)
            answer: dict = {}
            if bool(updates) and updates[-1] == folder:  # resuming a killed session: its folder's images
                learns = _folder_counts(folder)
            else:
                plan = added_session.pending(self.workdir, updates, int(config.model.embed_dim))  # or refuses
                learns = collections.Counter(name for name, _ in plan.rows)
                answer["deferred"] = dict(collections.Counter(name for name, _ in plan.deferred))
            made = not os.path.isdir(os.path.dirname(self.log_path))
            os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
            with open(self.log_path, "wb") as log:
                cmd = [sys.executable, "-m", "cvs_jax.update", "--workdir", self.workdir, "--from_added"]
                child = subprocess.Popen(
                    cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
                )
            refusal = self._accepted(child, folder, wait_s)
            if refusal is not None:  # the workdir as it was: the refused child's log goes too
                os.remove(self.log_path)
                if made:
                    os.rmdir(os.path.dirname(self.log_path))
                raise SessionRefused(refusal)
            self._child, self._learns, self._adopted = child, learns, None
            self._deferred = answer.get("deferred")
            return {"state": "training", "pid": child.pid, "session": done + 1, **answer}

    def _accepted(self, child: subprocess.Popen, folder: str, wait_s: float) -> str | None:
        """Waits until ``config.json`` records ``folder`` (``update`` checked the session's plan and took it),
        the child ends, or ``wait_s`` passes; the child's ``error:`` line when it refused, else None."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            code = child.poll()
            if code is not None:
                if code == 0:
                    return None
                errors = [line for line in self._log_text().splitlines() if line.startswith("error:")]
                return errors[-1].removeprefix("error: ") if errors else f"the session's process ended with {code}"
            try:
                if folder in added_session.run_config(self.workdir).data.updates:
                    return None
            except (UserError, OSError, ValueError):  # config.json being replaced: read it again
                pass
            time.sleep(0.1)
        return None  # still planning: watched from GET /sessions/current

    def after_add(self, added: additions.Added | None = None) -> bool:
        """``--learn_after N``: starts the session once it would learn from N labelled images
        (``added_session.labelled_pending``: lone images of a class wait, uncounted) and none trains;
        whether it started (a refusal waits for more adds).  ``added``: the added rows as stored now (the
        server's copy, ``Served.added_now``), else read from the run."""
        if self.learn_after is None or (self._child is not None and self._child.poll() is None):
            return False  # (the app calls this with learn_after set)
        config = added_session.run_config(self.workdir)
        updates, dim = list(config.data.updates), int(config.model.embed_dim)
        pending = added_session.labelled_pending(self.workdir, updates, dim, at_least=self.learn_after, added=added)
        if pending < self.learn_after:
            return False
        try:
            self.start(wait_s=0)  # the add is answered now; a refusal shows in GET /sessions/current
        except (Busy, UserError) as e:
            log.warning("--learn_after %d: %d labelled images pending, not started: %s", self.learn_after, pending, e)
            return False
        return True

    def current(self) -> dict:
        """``state`` (``STATES``: idle while this server started none), ``pid``, ``images`` and ``classes`` the
        session learns from, and what the log tells: ``session``, ``epoch``, ``epochs``, ``step``, ``loss``,
        ``seconds_left`` (module docstring), ``error`` (the child's ``error:`` line) when failed."""
        child = self._child or self._orphan()
        if child is None:
            return {"state": "idle", "summary": summary({"state": "idle"})}
        code = child.poll()
        text = self._log_text()
        lines = text.splitlines()
        if code is None:
            state = "scoring" if any(SCORING.match(line) for line in lines) else "training"
        else:
            state = "done" if code == 0 else "failed"
        out: dict = {"state": state, "pid": child.pid, "images": sum(self._learns.values())}
        out["classes"] = len(self._learns)
        if self._deferred is not None and child is self._child:
            out["deferred"] = self._deferred
        found = PROGRESS.findall(text)
        if found:
            s, epoch, epochs, step, loss = found[-1]
            out.update(session=int(s), epoch=int(epoch), epochs=int(epochs), step=int(step), loss=_float(loss))
        out["seconds_left"] = 0 if state == "done" else self._seconds_left(lines) if state == "training" else None
        if state == "failed":
            errors = [line for line in lines if line.startswith("error:")]
            out["error"] = errors[-1] if errors else f"the session's process ended with status {code}"
        out["summary"] = summary(out)
        return out

    def _orphan(self) -> "_Orphan | None":
        """A ``--from_added`` child that an earlier server of this workdir started (one killed while it
        trained) and that holds the run's lock now, or that this server saw holding it: watched by its pid,
        its end read from ``results.json`` (done when its session completed, else failed)."""
        if self._adopted is None:
            held = workdir_lib.holder(self.workdir) or {}
            command, pid = str(held.get("command", "")), held.get("pid")
            if "--from_added" not in command or not isinstance(pid, int) or held.get("host") != socket.gethostname():
                return None  # no lock, an update by hand, or a process on another host (no /proc of it here)
            session = added_session.completed_sessions(self.workdir) + 1
            self._adopted = (pid, session)
            self._learns = _folder_counts(added_session.folder_of(self.workdir, session))
        return _Orphan(*self._adopted, self.workdir)

    def _seconds_left(self, lines: list[str]) -> float | None:
        """The newest ETA the child printed, less the time since the log last grew when it is the last line."""
        for i in range(len(lines) - 1, -1, -1):
            m = ETA.search(lines[i].rstrip())
            if m is None:
                continue
            eta = 3600 * int(m.group(1)) + 60 * int(m.group(2)) + int(m.group(3))
            if i == len(lines) - 1:
                try:
                    eta -= time.time() - os.path.getmtime(self.log_path)
                except OSError:
                    pass
            return round(max(eta, 0.0), 1)
        return None  # no estimate yet (the first steps, the compile)

    def _log_text(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""


class _Orphan:
    """A child this server did not start, as ``current`` asks a ``Popen``: ``pid`` and ``poll()``."""

    def __init__(self, pid: int, session: int, workdir: str):
        self.pid, self.session, self.workdir = pid, session, workdir

    def poll(self) -> int | None:
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    return None  # running (a zombie left by a killed server is not)
        except (OSError, IndexError):
            pass
        return 0 if added_session.completed_sessions(self.workdir) >= self.session else 1


def summary(current: dict) -> str:
    """``current()`` in one line, as the page shows it."""
    state = current["state"]
    if state == "idle":
        return "No session is learning from the adds (POST /sessions starts one)."
    which = f"Session {current['session']}" if "session" in current else "The next session"
    what = f"{current['images']} added images of {current['classes']} classes"
    if state == "failed":
        return f"{which} failed: {current['error']}"
    if state == "done":
        return f"{which} learnt from {what}; the gate decides whether its model is served."
    if state == "scoring":
        return f"{which} has trained on {what}; its model is embedding its rows and scoring its test queries."
    progress = f", epoch {current['epoch']}/{current['epochs']}, loss {current['loss']}" if "epoch" in current else ""
    left = current["seconds_left"]
    eta = f", about {left:.0f} s of training left" if left is not None else ", starting (no estimate yet)"
    return f"{which} is learning from {what}{progress}{eta}."


def _folder_counts(folder: str) -> collections.Counter:
    """class -> images of a session's folder of class folders (``added_session.make_folder``)."""
    out: collections.Counter = collections.Counter()
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        if os.path.isdir(os.path.join(folder, name)):
            out[name] = len(os.listdir(os.path.join(folder, name)))
    return out


def gauges(current: dict) -> tuple[dict, dict]:
    """``/metrics``' view of ``current()``: (gauges name -> (help, value), the state as a labelled gauge);
    a field ``current`` lacks (no estimate yet, no progress line) has no gauge."""
    fields = {
        "session": "The session being trained (1-based).",
        "epoch": "The session's newest completed epoch.",
        "epochs": "The session's epochs.",
        "step": "The session's newest step.",
        "loss": "The session's loss at its newest epoch.",
        "images": "Labelled added images the session learns from.",
        "classes": "Classes among them.",
        "seconds_left": "Estimated seconds of training left (the child's ETA).",
    }
    present = [key for key in fields if current.get(key) is not None]
    out = {f"cvs_session_{key}": (fields[key], float(current[key])) for key in present}
    states = {state: int(state == current["state"]) for state in STATES}
    return out, {"cvs_session_state": ("The session's state (1: the current one).", "state", states)}


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
