"""What a run holds: ``python -m cvs_jax.info --workdir W [--json]``.

Example: ``python -m cvs_jax.info --workdir workdirs/demo`` (``--json`` for a script to read).

Reads the workdir only (``config.json``, ``protocol.json``, ``results.json`` and the gallery of the
newest completed session, as ``search`` reads it; no dataset, no photo folder).  The newest model's weights are
not needed: when they cannot be read (damaged files), ``info`` still answers and says so in one ``warning:`` line
(``model_problem`` in ``--json``), while ``search``, ``export`` and ``serve`` refuse the run.  It shows:

* the classes, with their gallery rows and the session each first arrived in (a run stopped mid-protocol:
  the classes learnt so far, of those its plan holds);
* the sessions: new training images and the images trained on (replay included), new classes, the
  gallery rows its model embedded, recall@1, the replay rows, and each loss term's mean over the
  session's epochs (a term 0 in every epoch is marked inactive: LCE's L_bound when its clamp saturates);
* the compatibility matrix (recall@1 of the model of session i on the gallery rows of session j: where
  forgetting shows; its queries differ from the sessions' R@1), its summaries BC (points), AC, AM and
  NFR, and the AR@K so far;
* the record stores its images are read from (what to keep when cleaning ``<data_dir>/cvs_records``).

When the model ``search``, ``export`` and a starting server use is not the newest session's (the compatibility
gate kept later sessions out, or a server pinned it: ``retrieval.gate.served_model``), a ``note:`` line under the
first says which and why.  Sessions are numbered from 1.  A problem to fix ends with one ``error: ...`` line
and exit status 2.
"""

from __future__ import annotations

import json

from absl import flags

from cvs_jax import cli
from cvs_jax.errors import UserError
from cvs_jax.reports import columns
from cvs_jax.retrieval import compatibility, gate, run_info, run_reader


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    flags.DEFINE_string("workdir", None, "The --workdir of a run of python -m cvs_jax.main.", flag_values=flag_values)
    flags.DEFINE_boolean("json", False, "Print JSON instead of text.", flag_values=flag_values)
    flags.mark_flags_as_required(["workdir"], flag_values=flag_values)


def describe(workdir: str) -> dict:
    """What ``--json`` prints (``retrieval/run_info.py``, shared with the server's ``/info``), with the model
    ``search``, ``export`` and a server starting on the run use (``served_model_session``, 1-based; its
    ``served_model_note`` when that is not the newest session's)."""
    run = run_reader.Run(workdir)
    choice = gate.served_model(workdir, run.gallery_session)
    return {
        **run_info.describe_run(run),
        "served_model_session": choice.model + 1,
        "served_model_note": gate.note(choice, run.gallery_session, subject="search, export and serve use"),
    }


def format_info(info: dict) -> str:
    c, done = info["classes"], info["sessions_completed"]
    lines = [
        f"{info['workdir']}: {info['method']} on {info['dataset']} ({info['setup']}), "
        f"{done} of {len(info['sessions'])} session(s) completed, {_classes(info)}, "
        f"gallery {info['gallery_rows']} rows ({info['added_rows']} added by search --add or the server's /add)",
    ]
    served = info.get("served_model_session", done)
    if info["model_problem"] and served == done:
        lines.append(
            f"warning: the model of session {done} cannot be read, so python -m cvs_jax.search, export and serve "
            f"refuse this run until it is restored (the gallery and the results below are read without it): "
            f"{info['model_problem']}"
        )
    elif info["model_problem"]:
        lines.append(
            f"warning: the model of session {done} cannot be read, so search and export refuse --session {done} "
            f"until it is restored (by default they and serve use the model of session {served}, below): "
            f"{info['model_problem']}"
        )
    if info.get("served_model_note"):
        lines.append(info["served_model_note"])
    lines += [
        "",
        "classes (gallery rows, session of first arrival):",
    ]
    width = max([columns.width(x["class_name"]) for x in c] + [5])
    for x in c:
        first = x["first_session"] or "-"
        later = "" if run_info.learnt(x, done) else " (planned: not learnt yet)"
        lines.append(f"  {columns.pad(x['class_name'], width)}  {x['gallery_rows']:>6}  {first}{later}")
    lines += ["", "sessions:"]
    for s in info["sessions"]:
        recall = s["recall"] or {}
        r1 = f"R@1 {100 * recall['1']:.1f}%" if "1" in recall else "not completed"
        if s["map"] is not None:
            r1 += f", mAP {100 * s['map']:.1f}%"
        new = ", ".join(s["new_classes"][:8]) + (", ..." if len(s["new_classes"]) > 8 else "")
        seen = "" if s["trained_on_images"] is None else f" ({s['trained_on_images']} trained on, replay included)"
        lines.append(
            f"  session {s['session']}: {s['new_images']} new training images{seen}, new classes: {new or '-'}; "
            f"{s['gallery_rows_by_its_model']} gallery rows embedded by its model; {r1}; "
            f"lr {s['lr']:g}, {s['epochs']} epochs"
            + ("" if s.get("memory_rows") is None else f"; {s['memory_rows']} replay rows")
        )
        if s.get("loss_terms"):
            lines.append("    loss terms (mean over epochs): " + format_terms(s["loss_terms"]))
    if info["record_stores"]:
        lines += ["", "record stores (the images, prepared once; the folders are no longer needed):"]
        lines += [f"  {store}" for store in info["record_stores"]]
    lines += ["", compatibility.format_matrix(info["compatibility_recall1"], info["negative_flip_rate"])]
    if info["average_recall"]:
        lines.append("AR@K: " + ", ".join(f"AR@{k} {100 * v:.2f}%" for k, v in info["average_recall"].items()))
    if info["average_map"] is not None:
        lines.append(f"mAP (mean over sessions): {100 * info['average_map']:.2f}%")
    if info["query_map"] != "none":
        lines.append(
            f"query maps: {info['query_map']}, fitted after sessions {info['query_map_sessions'] or '-'}; search and "
            "the numbers above score older gallery parts with the newest model's queries mapped into their space"
        )
    return "\n".join(lines)


def _classes(info: dict) -> str:
    """``8 classes``; for a run stopped mid-protocol ``4 classes learnt so far, of 8 planned``: the plan's count
    alone read as what the gallery holds."""
    planned = len(info["classes"])
    learnt = info.get("classes_learnt", planned)
    return f"{planned} classes" if learnt == planned else f"{learnt} classes learnt so far, of {planned} planned"


def format_terms(terms: dict) -> str:
    """``L_c 0.5123, L_bound 0 (0 in all 6 epochs: inactive)``."""
    cells = []
    for name, t in terms.items():
        cell = f"{name} {t['mean']:.4g}"
        if t["zero_epochs"] == t["epochs"]:
            cell += f" (0 in all {t['epochs']} epochs: inactive)"
        elif t["zero_epochs"]:
            cell += f" (0 in {t['zero_epochs']} of {t['epochs']} epochs)"
        cells.append(cell)
    return ", ".join(cells)


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
