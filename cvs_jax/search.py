"""Search a trained run's gallery with image files, or add images to it.

    python -m cvs_jax.search --workdir DIR --images a.png b.jpg [--k 5] [--json]
    python -m cvs_jax.search --workdir DIR --images new/*.png --add [--label CLASS]

(``--images`` takes the files after it, or repeat it: ``--images a.png --images b.jpg``.)

Queries are embedded by the newest session's selected model (the run's last
completed session checkpoint) and searched by cosine similarity against the whole
gallery: the rows of every session (each embedded by its own session's model,
never re-extracted) plus the rows added with ``--add``.  A query is prepared as the
gallery images were stored (``_resize.to_stored``) and embedded by the gallery's own
path (``Network``).  Each hit shows its source file, class, the session in which its
image arrived and the session whose model embedded it (sessions 1-based).

``--add`` embeds the images with the newest model and appends them, persisted with
orbax under ``checkpoints/additions``; it never changes the session checkpoints.
Searching reads a run at any time, also while it trains: it reads only finalized
checkpoints and writes nothing (``_Reader``).  ``--add`` holds the workdir's lock, so it
waits for no one and is refused while a run (or another ``--add``) writes there.  A
problem to fix ends with one ``error: ...`` line and exit status 2.

The run reader (``Run``, ``Network``, ``prepare``) is ``cvs_jax.retrieval.run_reader``, shared with
``cvs_jax.export``.
"""

from __future__ import annotations

import json

from absl import flags

from cvs_jax import cli
from cvs_jax.errors import SearchError, UserError
from cvs_jax.retrieval.run_reader import Network as Network  # re-exported: the command's library
from cvs_jax.retrieval.run_reader import Run as Run
from cvs_jax.retrieval.run_reader import arrival_sessions as arrival_sessions
from cvs_jax.retrieval.run_reader import check_is_run as check_is_run
from cvs_jax.retrieval.run_reader import load_images as load_images
from cvs_jax.retrieval.run_reader import prepare as prepare
from cvs_jax.rundir import workdir as workdir_lib

_COLUMNS = (  # header, hit key, right-aligned
    ("rank", "rank", True),
    ("score", "score", True),
    ("class", "class", False),
    ("label", "label", True),
    ("arrived in session", "arrival_session", True),
    ("model of session", "model_session", True),
    ("source", "source", False),
)


def format_hits(query: str, run: Run, hits: list[dict]) -> str:
    """One query's hits as a table (sessions 1-based)."""
    cells = [[f"{h[key]:.4f}" if key == "score" else str(h[key]) for _, key, _ in _COLUMNS] for h in hits]
    widths = [max([len(head)] + [len(row[i]) for row in cells]) for i, (head, _, _) in enumerate(_COLUMNS)]

    def line(values):
        text = "  ".join(v.rjust(w) if right else v.ljust(w) for v, w, (_, _, right) in zip(values, widths, _COLUMNS))
        return "  " + text.rstrip()

    head = f"{query}  (model of session {run.session + 1}, gallery {len(run.rows)} rows)"
    return "\n".join([head, line([h for h, _, _ in _COLUMNS])] + [line(row) for row in cells])


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """The command's flags (defined when it runs, so that tests can import every entry point together)."""
    flags.DEFINE_string("workdir", None, "The --workdir of a run of python -m cvs_jax.main.", flag_values=flag_values)
    flags.DEFINE_multi_string(
        "images", [], "Image files (PNG/JPEG): --images a.png b.jpg, or repeat the flag.", flag_values=flag_values
    )
    flags.DEFINE_integer("k", 5, "Gallery rows to print per query.", flag_values=flag_values)
    flags.DEFINE_boolean("add", False, "Add the images to the gallery instead of searching.", flag_values=flag_values)
    flags.DEFINE_string("label", None, "Class name or label of the images added with --add.", flag_values=flag_values)
    flags.DEFINE_boolean(
        "json",
        False,
        "Print JSON instead of tables: a list with one object per query (query, model_session, hits).",
        flag_values=flag_values,
    )
    flags.mark_flags_as_required(["workdir"], flag_values=flag_values)


def main(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> int:
    """``argv``: what absl left after the flags (program name, then further image files)."""
    fv = flag_values
    cli.quiet_logging()  # orbax logs every file it reads at INFO
    return search_or_add(
        fv.workdir, list(fv.images) + list(argv[1:]), k=fv.k, add=fv.add, label=fv.label, as_json=fv.json
    )


def search_or_add(
    workdir: str, paths: list[str], *, k: int = 5, add: bool = False, label: str | None = None, as_json: bool = False
) -> int:
    """The command: prints the hits (or adds the images); returns the exit status."""
    try:
        if not paths:
            raise SearchError("no images given; pass image files with --images a.png b.jpg.")
        if k < 1:
            raise SearchError(f"--k={k}: ask for at least one gallery row per query.")
        if add:
            check_is_run(workdir)  # before the lock, which would create the folder
            with workdir_lib.hold(workdir):  # additions are written: one writer at a time
                run = Run(workdir, for_add=True)
                run.add(load_images(paths, run.image_shape), paths, run.label_of(label))
            if as_json:
                print(
                    json.dumps({"added": len(paths), "model_session": run.session + 1, "gallery_rows": len(run.rows)})
                )
            else:
                print(
                    f"added {len(paths)} images to the gallery of {workdir} (model of session "
                    f"{run.session + 1}); gallery now {len(run.rows)} rows"
                )
            return 0
        run = Run(workdir)
        results = run.search(load_images(paths, run.image_shape), k)
        if as_json:
            out = [{"query": p, "model_session": run.session + 1, "hits": h} for p, h in zip(paths, results)]
            print(json.dumps(out, indent=1))
        else:
            print("\n\n".join(format_hits(p, run, h) for p, h in zip(paths, results)))
        return 0
    except UserError as e:  # a problem the user must fix: one line, no traceback; anything else is a bug
        return cli.report(e)


if __name__ == "__main__":
    define_flags()
    cli.run(main)
