"""Search a trained run's gallery with image files, or add images to it.

    python -m cvs_jax.search --workdir DIR --images a.png b.jpg [--k 5] [--json]
    python -m cvs_jax.search --workdir DIR --images new/*.png --add [--label CLASS]
    python -m cvs_jax.search --workdir DIR --images a.png b.jpg --html hits.html [--label CLASS]

Example: ``python -m cvs_jax.search --workdir workdirs/demo --images query.png --k 3``.
(``--images`` takes the files after it, or repeat it: ``--images a.png --images b.jpg``; a folder
stands for every image file below it, in name order: ``--images photos/day3/test``.)

Queries are embedded by the model a server of the run serves (``retrieval.gate.served_model``): the
newest completed session's, unless the compatibility gate kept that session out (``update``'s last
line says so) or a server pinned another (a line on stderr then names the model and why);
``--session N`` (1-based) or ``--session newest`` picks one.  They are searched by cosine similarity
against the whole gallery of the newest session: the rows of every session (each embedded by its own session's model,
never re-extracted) plus the rows added with ``--add``.  A query is prepared as the
gallery images were stored (shorter side resized, centre crop) and embedded exactly as
the gallery rows were.  Each hit shows its source file, class, the session in which its
image arrived and the session whose model embedded it (sessions 1-based).

``--add --label CLASS`` embeds the images with that model and appends them (under
``checkpoints/additions``); it never changes the session checkpoints.  Without ``--label`` the rows
are unlabelled (class ``?``); images whose bytes are already in the run are refused unless ``--force``.
Searching reads a run at any time, also while it trains: it reads only finalized
checkpoints and writes nothing in the workdir.  ``--add`` holds the additions' lock (not the run's:
rows are added while ``update`` trains), so it waits for no one and is refused while another
``--add`` (or a server's ``/add``) writes them; its rows are on disk (fsync'd) when it returns.  A
problem to fix ends with one ``error: ...`` line and exit status 2; an unreadable query is reported
that way and the other queries are answered.

``--html OUT.html`` also writes the hits as pictures: one self-contained page (thumbnails embedded),
a row per query (the query, then its hits, with class, score, arrival and model session under each;
a hit of the query's class marked when that class is known: ``--label``, else the query's folder
name); an unreadable query gets its row with the reason (``cvs_jax/reports/search_page.py``).  When
queries' classes are known, the page and the command's last line give how many found their class at
top-1 ("top-1 of the query's class: 14 of 84").

The run reader (``Run``, ``Network``, ``prepare``) is ``cvs_jax.retrieval.run_reader``, shared with
``cvs_jax.export``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from absl import flags

from cvs_jax import cli
from cvs_jax.errors import NotWritableError, SearchError, UserError
from cvs_jax.reports import columns, search_page
from cvs_jax.reports import html as html_lib
from cvs_jax.retrieval import gate
from cvs_jax.retrieval.run_reader import Run, check_is_run, load_each, load_images
from cvs_jax.rundir import workdir as workdir_lib

_COLUMNS = (  # header, hit key, right-aligned
    ("rank", "rank", True),
    ("score", "score", True),
    ("class", "class_name", False),
    ("label", "label", True),
    ("arrived in session", "arrival_session", True),
    ("model of session", "model_session", True),
    ("source", "source", False),
)


def format_hits(query: str, run: Run, hits: list[dict]) -> str:
    """One query's hits as a table (sessions 1-based)."""
    cells = [[f"{h[key]:.4f}" if key == "score" else str(h[key]) for _, key, _ in _COLUMNS] for h in hits]
    widths = [max([len(head)] + [columns.width(row[i]) for row in cells]) for i, (head, _, _) in enumerate(_COLUMNS)]

    def line(values):
        text = "  ".join(columns.pad(v, w, right=right) for v, w, (_, _, right) in zip(values, widths, _COLUMNS))
        return "  " + text.rstrip()

    head = f"{query}  (model of session {run.session + 1}, gallery {len(run.rows)} rows)"
    return "\n".join([head, line([h for h, _, _ in _COLUMNS])] + [line(row) for row in cells])


def write_html(path: str, run: Run, queries, images: dict, found: dict, failed: dict, label, k: int) -> None:
    """The hits as pictures (``reports/search_page.py``): thumbnails of the queries as prepared and of
    the hit rows' stored images."""
    rows = [h["row"] for p in queries if p in found for h in found[p]]
    pictures = dict(zip(rows, run.row_images(rows)))
    out = []
    for p in queries:
        if p in failed:
            out.append({"query": p, "class_name": None, "image": None, "error": str(failed[p]), "hits": []})
            continue
        hits = [dict(h, image=pictures[h["row"]]) for h in found[p]]
        known = search_page.query_class(p, label, run.class_names)
        out.append({"query": p, "class_name": known, "image": images[p], "error": None, "hits": hits})
    page = search_page.render(out, workdir=run.workdir, model_session=run.session + 1, gallery_rows=len(run.rows), k=k)
    try:
        html_lib.write(path, page)
    except OSError as e:
        raise SearchError(f"--html {path}: cannot write it ({e.strerror}); choose another path.") from e
    summary = search_page.summary(out)
    print(f"wrote {path}" + (f" ({summary})" if summary else ""), file=sys.stderr)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """The command's flags (defined when it runs, so that tests can import every entry point together)."""
    flags.DEFINE_string("workdir", None, "The --workdir of a run of python -m cvs_jax.main.", flag_values=flag_values)
    flags.DEFINE_multi_string(
        "images",
        [],
        "Image files (PNG/JPEG): --images a.png b.jpg, or repeat the flag; a folder: every image file below it.",
        flag_values=flag_values,
    )
    flags.DEFINE_integer("k", 5, "Gallery rows to print per query.", flag_values=flag_values)
    flags.DEFINE_boolean("add", False, "Add the images to the gallery instead of searching.", flag_values=flag_values)
    flags.DEFINE_string(
        "label",
        None,
        "Class name or label of the images added with --add (without it they are unlabelled: label -1, class ?); "
        "with --html, the class of every query (hits of it are marked; default: each query's folder name).",
        flag_values=flag_values,
    )
    flags.DEFINE_boolean(
        "force",
        False,
        "With --add: add images whose bytes are already in the run (refused otherwise: a duplicate row).",
        flag_values=flag_values,
    )
    flags.DEFINE_boolean(
        "json",
        False,
        "Print JSON instead of tables: a list with one object per query (query, model_session, hits).",
        flag_values=flag_values,
    )
    flags.DEFINE_string(
        "html",
        None,
        "Also write the hits as pictures to this HTML file (one self-contained page; opens from disk).",
        flag_values=flag_values,
    )
    flags.DEFINE_string(
        "session",
        None,
        gate.SESSION_HELP.format(what="embeds the queries (and --add's images)"),
        flag_values=flag_values,
    )
    flags.mark_flags_as_required(["workdir"], flag_values=flag_values)


@cli.command
def main(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> int:
    """``argv``: what absl left after the flags (program name, then further image files)."""
    fv = flag_values
    cli.quiet_logging()  # orbax logs every file it reads at INFO
    kwargs: dict[str, Any] = {"force": True} if fv.force else {}
    if fv.html is not None:
        kwargs["html"] = fv.html
    if fv.session is not None:
        kwargs["session"] = fv.session
    return search_or_add(
        fv.workdir,
        list(fv.images) + list(argv[1:]),
        k=fv.k,
        add=fv.add,
        label=fv.label,
        as_json=fv.json,
        **kwargs,
    )


def expand_folders(paths: list[str]) -> list[str]:
    """``paths`` with each folder replaced by the image files below it (``IMAGE_EXTENSIONS``, hidden
    files left out), in name order; a folder without any is refused."""
    from cvs_jax.data.folder_inventory import IMAGE_EXTENSIONS  # pylint: disable=g-import-not-at-top

    out = []
    for p in paths:
        if not os.path.isdir(p):
            out.append(p)
            continue
        found = sorted(
            os.path.join(folder, name)
            for folder, dirs, names in os.walk(p)
            for name in names
            if name.lower().endswith(IMAGE_EXTENSIONS)
            and not name.startswith(".")
            and not any(part.startswith(".") for part in os.path.relpath(folder, p).split(os.sep) if part != ".")
        )
        if not found:
            raise SearchError(
                f"--images {p} is a folder without image files ({', '.join(IMAGE_EXTENSIONS)}); pass image files "
                f"or a folder that holds some."
            )
        out += found
    return out


def search_or_add(
    workdir: str,
    paths: list[str],
    *,
    k: int = 5,
    add: bool = False,
    label: str | None = None,
    as_json: bool = False,
    force: bool = False,
    session: str | None = None,
    html: str | None = None,
) -> int:
    """The command: prints the hits (or adds the images); returns the exit status.  An unreadable query
    is reported (``error: ...``, exit status 2) and the others are answered; ``--add`` adds all or none."""
    try:
        paths = expand_folders(paths)
        if not paths:
            raise SearchError("no images given; pass image files with --images a.png b.jpg.")
        if k < 1:
            raise SearchError(f"--k={k}: ask for at least one gallery row per query.")
        if html is not None and add:
            raise SearchError("--html shows search hits; it does not go with --add.")
        if html is not None and not os.path.isdir(os.path.dirname(os.path.abspath(html))):
            raise SearchError(f"--html {html}: its folder does not exist; create it or choose another path.")
        check_is_run(workdir)  # before the lock, which would create the folder
        model, note = gate.model_for(workdir, session)  # said once the images are taken (one line for an error)
        if add:
            with workdir_lib.hold_additions(workdir):  # additions are written: one writer at a time
                run = Run(workdir, for_add=True, model_session=model)
                _, name = run.label_and_name(label, new=True)  # a new name is a new class
                new_class = bool(name) and name not in run.class_names
                images = load_images(paths, run.image_shape)
                dup = [] if force else run.duplicates(paths)
                if dup:
                    raise SearchError(
                        f"{len(dup)} of the images are already in the run (same bytes), e.g. {dup[0][0]} = "
                        f"{dup[0][1]}; each would be a second gallery row of one image. Leave them out, or pass "
                        f"--force to add them anyway."
                    )
                try:
                    run.add(images, paths, label)
                except NotWritableError as e:  # a full disk: the step is not taken, the previous one holds the rows
                    raise NotWritableError(f"{e} Nothing was added; the rows added before are kept.", e.cause) from e
            if note is not None:
                print(note, file=sys.stderr)
            if label is None:
                print(
                    f"note: the {len(paths)} added rows are unlabelled (label -1, class ?); pass --label CLASS to "
                    f"label images when adding them.",
                    file=sys.stderr,
                )
            if new_class:
                print(
                    f"note: {name!r} is a new class ({len(run.class_names)} classes now): its rows are searchable "
                    f"under that name, and the next update --from_added learns it.",
                    file=sys.stderr,
                )
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
        run = Run(workdir, model_session=model)
        if html is not None and label is not None:
            run.label_of(label)  # an unknown class is refused before any work
        images, failed = load_each(paths, run.image_shape)
        if note is not None and len(failed) < len(paths):
            print(note, file=sys.stderr)
        answered = [p for p in paths if p not in failed]
        found = dict(zip(answered, run.search(images, k))) if answered else {}
        if html is not None:
            write_html(html, run, paths, dict(zip(answered, images)), found, failed, label, k)
        for p in paths:
            if p in failed:
                cli.report(failed[p])
        if as_json:
            out = [
                {"query": p, "error": str(failed[p])}
                if p in failed
                else {"query": p, "model_session": run.session + 1, "hits": found[p]}
                for p in paths
            ]
            print(json.dumps(out, indent=1))
        elif answered:
            print("\n\n".join(format_hits(p, run, found[p]) for p in answered))
        return 2 if failed else 0
    except UserError as e:  # a problem the user must fix: one line, no traceback; anything else is a bug
        return cli.report(e)


if __name__ == "__main__":
    cli.run(main, define_flags)
