"""The one owner of a run directory's layout: every file and folder a run keeps, by name.

    <workdir>/
      .lock                          the writer's lock (``workdir.py``)
      config.json                    the run's config (``workdir.py``; read back by ``stored_config``)
      protocol.json                  the session plan and class names (``engine/context.py``)
      metrics.jsonl, tensorboard/    what a person watches (``run_log.py``)
      results.json, *.png            the end of a run (``engine/reporting.py``)
      report.html                    the run on one page, rewritten after every session (``reports/run_page.py``)
      population.json                a population's members (``engine/runner.py``)
      checkpoints/sessions/<s>/      after session s: model, gallery part, memory, importance (``run_state.py``)
      checkpoints/progress/<step>/   rolling mid-session checkpoints (``engine/train_loop.py``)
      checkpoints/query_maps/<s>.npz the query map of model s to model s - 1 (``retrieval.query_map``;
                                     written before session s's checkpoint, ``retrieval/query_maps.py``)
      checkpoints/additions/<n>/     rows added by ``python -m cvs_jax.search --add`` (or ``serve``'s /add): one
                                     segment per add or merge (``retrieval/additions.py``)
      checkpoints/additions.json     the chain: which segments hold the added rows, and how many there are
      checkpoints/additions.lock     the lock of whoever writes the additions (``workdir.hold_additions``)
      checkpoints/served.json        the sessions a server last served (model, gallery, pin), for its restart
                                     (``serve/state.py``)
      checkpoints/shared_session.json  ``compare`` copied session 1 here from another entry (which one), so the
                                     entry starts without config.json (``engine/comparison.py``; removed once
                                     config.json is written, ``config/recorded.py``)
      uploads/<sha256>.<ext>         images added through ``python -m cvs_jax.serve`` (their rows' sources)
      from_added/session-<S>/        the folder session S learnt from added rows, with ``rows.json``
                                     (``retrieval/added_session.py``; in ``data.updates``: see ``here``)
      profile/                       a jax.profiler trace of ``--config.profile_steps=a:b`` (``engine/profiling.py``)
      previous-<time>/               a run moved aside by ``--config.overwrite=True``

Every module that reads or writes one of these asks this module for its path.
"""

from __future__ import annotations

import os

LOCK = ".lock"
CONFIG = "config.json"
PROTOCOL = "protocol.json"
METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"
RESULTS = "results.json"
REPORT = "report.html"
# A comparison's folder (``python -m cvs_jax.compare``): its tables, and their page.
COMPARISON = "comparison.json"
COMPARISON_REPORT = "comparison.html"
POPULATION = "population.json"
CHECKPOINTS = "checkpoints"
SESSIONS = os.path.join(CHECKPOINTS, "sessions")
PROGRESS = os.path.join(CHECKPOINTS, "progress")
ADDITIONS = os.path.join(CHECKPOINTS, "additions")
QUERY_MAPS = os.path.join(CHECKPOINTS, "query_maps")
ADDITIONS_LOCK = os.path.join(CHECKPOINTS, "additions.lock")
ADDITIONS_CHAIN = os.path.join(CHECKPOINTS, "additions.json")
SERVED = os.path.join(CHECKPOINTS, "served.json")
COMPAT_COUNTS = os.path.join(CHECKPOINTS, "compatibility_counts.json")
COMPAT_QUERIES = os.path.join(CHECKPOINTS, "compatibility_queries.npz")
SHARED_SESSION = os.path.join(CHECKPOINTS, "shared_session.json")
UPLOADS = "uploads"
FROM_ADDED = "from_added"
FROM_ADDED_RECORD = "rows.json"  # a from_added folder's record of the added rows it used
PROFILE = "profile"
# Checkpoint folders whose numbered step directories make a workdir hold a run.
CHECKPOINT_DIRS = (SESSIONS, PROGRESS)


def _under_workdir(*parts: str, doc: str):
    def path(workdir: str) -> str:
        return os.path.join(workdir, *parts)

    path.__doc__ = doc
    return path


config_file = _under_workdir(CONFIG, doc="The run's config.json.")
protocol_file = _under_workdir(PROTOCOL, doc="The run's protocol.json (session plan, class names).")
metrics_file = _under_workdir(METRICS, doc="The run's metrics.jsonl.")
results_file = _under_workdir(RESULTS, doc="The run's results.json.")
report_file = _under_workdir(REPORT, doc="The run's report.html (``python -m cvs_jax.report``).")
population_file = _under_workdir(POPULATION, doc="A population's population.json.")
sessions_dir = _under_workdir(SESSIONS, doc="Session checkpoints: ``<s>/`` after session s (0-based).")
progress_dir = _under_workdir(PROGRESS, doc="Rolling mid-session checkpoints, numbered by run step.")
additions_dir = _under_workdir(ADDITIONS, doc="Rows added by ``python -m cvs_jax.search --add``.")
additions_chain = _under_workdir(
    ADDITIONS_CHAIN, doc="The added rows' chain: the segments of ``additions/`` that hold them, in row order."
)
additions_lock = _under_workdir(ADDITIONS_LOCK, doc="The lock of the additions' writer (not the run's lock).")
served_file = _under_workdir(SERVED, doc="The model, gallery and pinned sessions a server last served (its restart).")
shared_session_file = _under_workdir(
    SHARED_SESSION, doc="compare's mark of a session 1 copied from another entry (an entry without config.json yet)."
)
compat_counts_file = _under_workdir(
    COMPAT_COUNTS, doc="The compatibility matrix's and flips' counts so far, by model (``engine.compat_counts``)."
)
compat_queries_file = _under_workdir(
    COMPAT_QUERIES, doc="The newest model's embeddings of the probe queries, by arrival (``engine.compat_counts``)."
)
uploads_dir = _under_workdir(UPLOADS, doc="Images added through the server, named by their SHA-256.")
profile_dir = _under_workdir(PROFILE, doc="The jax.profiler trace of ``--config.profile_steps``.")


def session_dir(workdir: str, s: int) -> str:
    """The checkpoint written after session ``s`` (0-based; 0 is the session ``compare`` shares)."""
    return os.path.join(workdir, SESSIONS, str(s))


def query_map_file(workdir: str, s: int) -> str:
    """The query map fitted after session ``s`` (0-based, s >= 1): model s's space to model s - 1's."""
    return os.path.join(workdir, QUERY_MAPS, f"{s}.npz")


def here(workdir: str, folder: str) -> str:
    """``folder`` (one of the run's ``data.updates``) where it lies now.  ``config.json`` records a
    from-added folder by its absolute path, ``<old workdir>/from_added/session-<S>``; a run moved or
    copied elsewhere (``mv``, ``cp -r``, rsync, another mount) holds it as ``<workdir>/from_added/session-<S>``.
    It is taken from there when that folder has a ``rows.json`` and the recorded one is gone or has the
    same ``rows.json`` (a folder is never rewritten once its session trains): a copy then counts its own
    sessions' rows, not the original's.  Any other folder (a user's, outside the run) is as recorded."""
    parent, name = os.path.split(os.path.normpath(folder))
    if os.path.basename(parent) != FROM_ADDED or not name.startswith("session-"):
        return folder
    mine = os.path.join(os.path.abspath(workdir), FROM_ADDED, name)
    if mine == os.path.normpath(folder) or not os.path.isfile(os.path.join(mine, FROM_ADDED_RECORD)):
        return folder
    try:
        with open(os.path.join(folder, FROM_ADDED_RECORD), "rb") as f:
            recorded = f.read()
    except OSError:  # the recorded folder is gone (the run moved) or unreadable
        return mine
    with open(os.path.join(mine, FROM_ADDED_RECORD), "rb") as f:
        return mine if f.read() == recorded else folder  # else another run's folder, given to update --data
