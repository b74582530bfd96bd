"""What a run holds: ``python -m cvs_jax.info --workdir W [--json]``.

Example: ``python -m cvs_jax.info --workdir workdirs/demo`` (``--json`` for a script to read).

Reads the workdir only (``config.json``, ``protocol.json``, ``results.json`` and the gallery of the
newest completed session, as ``search`` reads it; no dataset, no photo folder):

* the classes, with their gallery rows and the session each first arrived in;
* the sessions: training images, new classes, the gallery rows its model embedded, recall@1;
* the compatibility matrix (recall@1 of the model of session i on the gallery rows of session j: where
  forgetting shows) and the AR@K so far;
* the record stores its images are read from (what to keep when cleaning ``<data_dir>/cvs_records``).

Sessions are numbered from 1.  A problem to fix ends with one ``error: ...`` line and exit status 2.
"""

from __future__ import annotations

import json
import os

import numpy as np
from absl import flags

from cvs_jax import cli
from cvs_jax.errors import UserError
from cvs_jax.retrieval import compatibility, run_reader
from cvs_jax.rundir import paths


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    flags.DEFINE_string("workdir", None, "The --workdir of a run of python -m cvs_jax.main.", flag_values=flag_values)
    flags.DEFINE_boolean("json", False, "Print JSON instead of text.", flag_values=flag_values)
    flags.mark_flags_as_required(["workdir"], flag_values=flag_values)


def _stores(run: run_reader.Run) -> list[str] | None:
    """The record stores the run's images are read from (None: standard TFDS data, or a store is gone)."""
    from cvs_jax.data import sources  # pylint: disable=g-import-not-at-top  # tensorflow_datasets

    try:
        return sources.store_dirs(run.config.data)
    except (UserError, OSError):
        return None


def describe(workdir: str) -> dict:
    """The run's classes, sessions, compatibility matrix and AR@K (sessions 1-based)."""
    return describe_run(run_reader.Run(workdir))


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
        done = s <= run.session
        r = per_session.get(s, {})
        sessions.append(
            {
                "session": s + 1,
                "completed": bool(done),
                "train_images": sess["train"],
                "val_queries": sess["val"],
                "new_classes": [names[c] for c in sess["new_classes"] if c < len(names)],
                "classes_seen": sess["num_outputs"],
                "gallery_rows_by_its_model": int(np.sum(rows.model == s)) if done else 0,
                "recall": r.get("recall"),
            }
        )
    return {
        "workdir": os.path.abspath(workdir),
        "method": run.config.method,
        "dataset": run.protocol.get("dataset"),
        "setup": run.protocol.get("setup"),
        "sessions_completed": run.session + 1,
        "gallery_rows": len(rows),
        "added_rows": len(run.added),
        "classes": classes,
        "sessions": sessions,
        "record_stores": _stores(run),
        "compatibility_recall1": results.get("compatibility_recall1"),
        "average_recall": results.get("average_recall"),
    }


def format_info(info: dict) -> str:
    c = info["classes"]
    lines = [
        f"{info['workdir']}: {info['method']} on {info['dataset']} ({info['setup']}), "
        f"{info['sessions_completed']} of {len(info['sessions'])} session(s) completed, {len(c)} classes, "
        f"gallery {info['gallery_rows']} rows ({info['added_rows']} added with search --add)",
        "",
        "classes (gallery rows, session of first arrival):",
    ]
    width = max([len(x["class_name"]) for x in c] + [5])
    lines += [f"  {x['class_name']:<{width}}  {x['gallery_rows']:>6}  {x['first_session'] or '-'}" for x in c]
    lines += ["", "sessions:"]
    for s in info["sessions"]:
        recall = s["recall"] or {}
        r1 = f"R@1 {100 * recall['1']:.1f}%" if "1" in recall else "not completed"
        new = ", ".join(s["new_classes"][:8]) + (", ..." if len(s["new_classes"]) > 8 else "")
        lines.append(
            f"  session {s['session']}: {s['train_images']} training images, new classes: {new or '-'}; "
            f"{s['gallery_rows_by_its_model']} gallery rows embedded by its model; {r1}"
        )
    if info["record_stores"]:
        lines += ["", "record stores (the images, prepared once; the folders are no longer needed):"]
        lines += [f"  {store}" for store in info["record_stores"]]
    lines += ["", compatibility.format_matrix(info["compatibility_recall1"])]
    if info["average_recall"]:
        lines.append("AR@K: " + ", ".join(f"AR@{k} {100 * v:.2f}%" for k, v in info["average_recall"].items()))
    return "\n".join(lines)


@cli.command
def main(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> int:
    cli.quiet_logging()
    if len(argv) > 1:
        raise UserError(f"unexpected arguments {' '.join(argv[1:])}; pass --workdir (and --json).")
    info = describe(flag_values.workdir)
    print(json.dumps(info, indent=1, ensure_ascii=False) if flag_values.json else format_info(info))
    return 0


if __name__ == "__main__":
    cli.run(main, define_flags)
