"""What a run holds, as ``python -m cvs_jax.info --json`` prints it and the server's ``/info`` answers:
the classes, the sessions, the compatibility matrix, AR@K and the record stores (sessions 1-based)."""

from __future__ import annotations

import json
import os

import numpy as np

from cvs_jax.config import recipe
from cvs_jax.errors import UserError
from cvs_jax.retrieval import compatibility, run_reader, run_rows
from cvs_jax.rundir import paths


def _stores(run: run_reader.Run) -> list[str] | None:
    """The record stores the run's images are read from (None: standard TFDS data, or a store is gone)."""
    from cvs_jax.data import sources  # pylint: disable=g-import-not-at-top  # tensorflow_datasets

    try:
        return sources.store_dirs(run.config.data)
    except (UserError, OSError):
        return None


def describe_run(run: run_reader.Run) -> dict:
    """``describe`` of a run already read (a server's, with the rows added since)."""
    workdir = run.workdir
    results = {}
    path = paths.results_file(workdir)
    if os.path.exists(path):
        with open(path) as f:
            results = json.load(f)
    rows, names = run.rows, run.class_names
    classes = []
    for label, name in enumerate(names):
        mine = rows.labels == label
        first = [s for s, sess in enumerate(run.protocol["sessions"]) if label in sess["new_classes"]]
        classes.append(
            {
                "class_name": name,
                "label": label,
                "gallery_rows": int(mine.sum()),
                "first_session": (first[0] + 1) if first else None,
            }
        )
    per_session = dict(enumerate(results.get("per_session", [])))  # in session order (numbered from 1 since)
    sessions = []
    for s, sess in enumerate(run.protocol["sessions"]):
        done = s <= run.gallery_session
        r = per_session.get(s, {})
        sessions.append(
            {
                "session": s + 1,
                "completed": bool(done),
                "new_images": sess["train"],
                "trained_on_images": run_rows.trained_on(r) if r else None,
                "val_queries": sess["val"],
                "new_classes": [names[c] for c in sess["new_classes"] if c < len(names)],
                "classes_seen": sess["num_outputs"],
                "gallery_rows_by_its_model": int(np.sum(rows.model == s)) if done else 0,
                "recall": r.get("recall"),
                # the session's recipe: the run's train.lr / train.epochs, or what its update set
                "lr": recipe.session_lr(run.config, s),
                "epochs": recipe.session_epochs(run.config, s),
                "map": r.get("map"),
            }
        )
    return {
        "workdir": os.path.abspath(workdir),
        "method": run.config.method,
        "dataset": run.protocol.get("dataset"),
        "setup": run.protocol.get("setup"),
        "sessions_completed": run.gallery_session + 1,
        "gallery_rows": len(rows),
        "added_rows": len(run.added),
        "classes": classes,
        "sessions": sessions,
        "record_stores": _stores(run),
        "compatibility_recall1": results.get("compatibility_recall1"),
        "negative_flip_rate": results.get("negative_flip_rate"),
        "compatibility_bc_points": compatibility.bc_points(results),
        "average_recall": results.get("average_recall"),
        "average_map": results.get("average_map"),  # absent in runs written before mAP was recorded
        # AC with a tie counted as a failure (iamcl2r) and as a pass (CoReS); they differ only on ties
        "compatibility_ac": compatibility.average_compatibility(results.get("compatibility_recall1") or []),
        "compatibility_ac_ties_pass": compatibility.average_compatibility(
            results.get("compatibility_recall1") or [], ties="pass"
        ),
        "query_map": run.config.retrieval.query_map,
        "query_map_sessions": sorted(s + 1 for s in run.query_maps),
    }
