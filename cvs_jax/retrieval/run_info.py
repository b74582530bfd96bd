"""What a run holds, as ``python -m cvs_jax.info --json`` prints it and the server's ``/info`` answers:
the classes, the sessions, the compatibility matrix, AR@K and the record stores (sessions 1-based)."""

from __future__ import annotations

import os

import numpy as np

from cvs_jax.config import recipe
from cvs_jax.data import stores
from cvs_jax.errors import UserError
from cvs_jax.retrieval import compatibility, run_reader, run_rows
from cvs_jax.rundir import paths, run_files


def _stores(run: run_reader.Run) -> list[str] | None:
    """The record stores the run's images are read from (None: standard TFDS data, or a store is gone)."""
    try:
        return stores.store_dirs(run.config.data)
    except (UserError, OSError):
        return None


def term_summary(metrics_path: str) -> dict[int, dict[str, dict]]:
    """Per session (1-based): each logged loss term's mean over the session's epochs, its epochs and those
    where it was exactly 0 (a term 0 in every epoch, e.g. LCE's L_bound with a saturated clamp, did nothing)."""
    out: dict[int, dict[str, dict]] = {}
    for r in run_files.read_metrics(metrics_path):
        if "epoch" not in r or "session" not in r:
            continue
        for k, v in r.items():
            if k.startswith("L_") and isinstance(v, (int, float)):
                t = out.setdefault(int(r["session"]), {}).setdefault(k, {"sum": 0.0, "epochs": 0, "zero_epochs": 0})
                t["sum"] += v
                t["epochs"] += 1
                t["zero_epochs"] += int(v == 0)
    for terms in out.values():
        for t in terms.values():
            t["mean"] = t.pop("sum") / t["epochs"]
    return out


def learnt(entry: dict, sessions_completed: int) -> bool:
    """Whether a class of ``describe_run``'s ``classes`` is learnt: it first arrived in a completed session, or
    only added rows carry it (no session of first arrival); else the plan holds it for a later session."""
    return (entry["first_session"] or 0) <= sessions_completed


def describe_run(run: run_reader.Run) -> dict:
    """``describe`` of a run already read (a server's, with the rows added since)."""
    workdir = run.workdir
    results = run_files.read_json(paths.results_file(workdir), fields=("per_session",), missing={})
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
    terms = term_summary(paths.metrics_file(workdir))
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
                "memory_rows": r.get("memory_rows"),  # replay rows it trained with (absent in older runs)
                "loss_terms": terms.get(s + 1, {}),  # per term: mean over epochs, epochs, zero_epochs
            }
        )
    return {
        "workdir": os.path.abspath(workdir),
        "method": run.config.method,
        "dataset": run.protocol.get("dataset"),
        "setup": run.protocol.get("setup"),
        "sessions_completed": run.gallery_session + 1,
        # the classes of the completed sessions (and those only added rows carry); "classes" lists the plan's
        "classes_learnt": sum(learnt(x, run.gallery_session + 1) for x in classes),
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
        # why the model's weights cannot be read (search, export and serve refuse the run), None when they can
        "model_problem": run.model_problem(),
        "query_map": run.config.retrieval.query_map,
        "query_map_sessions": sorted(s + 1 for s in run.query_maps),
    }
