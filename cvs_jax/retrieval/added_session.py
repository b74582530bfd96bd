"""The next session from the labelled images added to a run (``update --from_added``).

The rows that ``search --add`` and the server's ``/add`` stored since the last such session (their
files and labels) are laid out as a folder of class folders, ``<workdir>/from_added/session-<S>/<class>/
<file>`` (hard links to the stored files where the file system allows, else copies), with
``rows.json`` naming the added rows it used; ``update`` then trains on that folder exactly as
``update --data`` trains on any folder: same inventory, split, plan, method, replay and recipe.  One
place decides how a folder becomes a session; this module only decides which images form the folder.

A row's class is the name it was added with (``additions.resolve``), so a name the run has not seen
becomes a class folder like any other and the session learns it as a new class, as ``update --data``
learns a new class folder.

"Since the last session": the added rows no earlier ``--from_added`` session used (``rows.json`` of
the folders in ``data.updates``), in the order added; rows added while a session trains belong to
the next one.  A class with one labelled image among them is deferred, not refused: its image stays
pending (not in ``rows.json``) for a later session, so a lone photo of a rare class does not block the
others; a session is refused only when no class is left.  The added rows themselves are left as they
are (their stored embeddings are never rewritten).  A refused request removes the folder it made:
nothing in the workdir changes.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
from typing import NamedTuple

from cvs_jax.config import stored
from cvs_jax.data import folder_inventory, stores
from cvs_jax.errors import ConfigError, DataError
from cvs_jax.retrieval import additions
from cvs_jax.rundir import paths, run_files

FOLDER = paths.FROM_ADDED
ROWS_FILE = folder_inventory.FOLDER_RECORD  # beside the class folders; the inventory skips it
MIN_PER_CLASS = 2  # a class with one image has nothing left to train on once its test query is drawn


def folder_of(workdir: str, session: int) -> str:
    """The folder of session ``session`` (1-based) made from added rows."""
    return os.path.join(os.path.abspath(workdir), FOLDER, f"session-{session}")


def is_added_folder(workdir: str, folder: str) -> bool:
    return os.path.dirname(os.path.abspath(folder)) == os.path.join(os.path.abspath(workdir), FOLDER)


def used_rows(workdir: str, updates: list[str]) -> set[int]:
    """The added rows (their places in the order added) that earlier ``--from_added`` sessions used:
    ``rows.json``'s ``rows`` (half-open ranges), or all of ``first..end-1`` in a file without them (one
    written before classes were deferred, when a session used every row up to its end)."""
    used: set[int] = set()
    for folder in updates:
        if is_added_folder(workdir, folder):  # its rows.json is written before the folder is recorded
            record = run_files.read_json(os.path.join(folder, ROWS_FILE), fields=("first", "end"))
            try:
                used.update(r for a, b in record.get("rows", [[record["first"], record["end"]]]) for r in range(a, b))
            except (TypeError, ValueError):
                raise run_files.damaged(os.path.join(folder, ROWS_FILE), "holds rows that are not ranges") from None
    return used


def _ranges(rows: list[int]) -> list[list[int]]:
    """Sorted rows as half-open ``[first, end]`` ranges of consecutive rows."""
    out: list[list[int]] = []
    for r in sorted(rows):
        if out and out[-1][1] == r:
            out[-1][1] = r + 1
        else:
            out.append([r, r + 1])
    return out


def _class_names(workdir: str) -> list[str]:
    return list(run_files.read_json(paths.protocol_file(workdir), fields=("class_names",))["class_names"])


def labelled_pending(
    workdir: str, updates: list[str], embed_dim: int, at_least: int = 0, added: additions.Added | None = None
) -> int:
    """``--learn_after``'s count: the labelled added images the next session would learn from (``pending``'s
    ``rows``; 0 when it refuses).  Deferred lone images and forced rows the run holds do not count, so
    adds that leave only those pending do not start (and see refused) a session each.  ``at_least``: the
    count the caller compares with; while the labelled rows not yet used (a bound read from the added rows
    alone) are fewer, the bound is returned, so that not every labelled add reads the run's stores.
    ``added``: the added rows as stored now (a server's copy, labels as stored), else read."""
    added = additions.read(workdir, embed_dim) if added is None else added
    done = used_rows(workdir, updates)
    labels, names = added.gallery.labels, added.names
    bound = sum(1 for r in range(len(added)) if r not in done and (labels[r] >= 0 or names[r]))
    if bound < at_least:
        return bound
    try:
        return len(pending(workdir, updates, embed_dim, added).rows)
    except DataError:
        return 0


class Pending(NamedTuple):
    """The next session from the adds.  ``used``: the added rows it takes (in the order added), recorded in
    its ``rows.json``: those it learns from, those it leaves out and the unlabelled ones; ``rows``: the
    ones it learns from, ``(class name, stored file)``; ``left_out``: ``(stored file, where its bytes
    already are)`` of the labelled ones ``leave_out`` takes out; ``deferred``: ``(class name, stored file)``
    of the lone images of a class, not in ``used``: they wait for a later session."""

    used: list[int]
    rows: list[tuple[str, str]]
    left_out: list[tuple[str, str]]
    deferred: list[tuple[str, str]]


def pending(workdir: str, updates: list[str], embed_dim: int, added: additions.Added | None = None) -> Pending:
    """The added rows not yet used and what the next session makes of them.  A class with fewer than
    ``MIN_PER_CLASS`` images is deferred; refuses (``DataError``) when none is labelled, none is left once
    ``leave_out`` has taken out images the run holds, or every class left has one image.  ``added``: the
    added rows as stored now (labels as stored), else read."""
    added = additions.read(workdir, embed_dim) if added is None else added
    done = used_rows(workdir, updates)
    waiting = [r for r in range(len(added)) if r not in done]
    if not waiting:
        raise DataError(
            f"no image was added to {workdir} since the last session ({len(added)} added row(s), all used); add "
            f"labelled images (POST /add?label=NAME or search --add with --label) first."
        )
    added = additions.resolve(added, _class_names(workdir))  # labels by name: new names are new classes
    names = additions.class_list(added, _class_names(workdir))
    labelled = [r for r in waiting if added.gallery.labels[r] >= 0]
    if not labelled:
        raise DataError(
            f"the {len(waiting)} image(s) added since the last session have no label, so no session can learn "
            f"from them; add images with a label (POST /add?label=NAME)."
        )
    kept, left_out = leave_out(workdir, added, labelled)
    if not kept:
        raise DataError(
            f"the {len(labelled)} labelled image(s) added since the last session are all in the run already "
            f"(added with force; e.g. {left_out[0][0]} = {left_out[0][1]}): no session can learn from them; "
            f"add new labelled images."
        )
    named = {r: names[int(added.gallery.labels[r])] for r in kept}
    counts = collections.Counter(named.values())
    lone = sorted(name for name, n in counts.items() if n < MIN_PER_CLASS)
    rows = [(named[r], added.sources[r]) for r in kept if named[r] not in lone]
    if not rows:
        which = f"class {lone[0]!r} has" if len(lone) == 1 else f"classes {', '.join(map(repr, lone))} have"
        raise DataError(
            f"{which} 1 image among the labelled images added and not yet learnt ({_counts(counts)}"
            + (f"; {len(left_out)} left out, their bytes in the run already" if left_out else "")
            + f"), and no class has more; a class needs at least {MIN_PER_CLASS}: add another image of it, "
            f"or wait for more."
        )
    wait = {r for r in kept if named[r] in lone}
    deferred = [(named[r], added.sources[r]) for r in kept if r in wait]
    return Pending([r for r in waiting if r not in wait], rows, left_out, deferred)


def leave_out(workdir: str, added: additions.Added, labelled: list[int]) -> tuple[list[int], list[tuple[str, str]]]:
    """``(rows kept, [(stored file, where its bytes already are)])``: a row added with force whose bytes a
    session of the run already holds (a test query, an image learnt before), or an earlier row of this
    session under the same class holds, is left out.  ``update`` refuses a folder holding an image the run
    holds, and an added row cannot be taken out: such a row blocked every later session.  It stays an added
    row, searchable as before."""
    stored = stores.store_digests(run_config(workdir), only={added.digests[r] for r in labelled})
    seen: dict[tuple[int, str], str] = {}
    kept, out = [], []
    for r in labelled:
        digest, source = added.digests[r], added.sources[r]
        where = (stored.get(digest) or seen.get((int(added.gallery.labels[r]), digest))) if digest else None
        if where is not None:
            out.append((source, where))
            continue
        if digest:
            seen[(int(added.gallery.labels[r]), digest)] = source
        kept.append(r)
    return kept, out


def _counts(counts: collections.Counter) -> str:
    return ", ".join(f"{name}: {n}" for name, n in sorted(counts.items()))


def describe(rows: list[tuple[str, str]]) -> str:
    """``"N labelled image(s) (class: n, ...)"``, for messages."""
    return f"{len(rows)} labelled image(s) ({_counts(collections.Counter(name for name, _ in rows))})"


def deferred_note(deferred: list[tuple[str, str]]) -> str:
    """The ``note:`` line that says which lone images wait for a later session, and why."""
    return (
        f"note: {describe(deferred)} wait for a later session: a class needs at least {MIN_PER_CLASS} images "
        f"(add another image of it, and the next session learns it; e.g. {deferred[0][1]})."
    )


def make_folder(workdir: str, session: int, used: list[int], rows: list[tuple[str, str]]) -> str:
    """Lays the rows out as class folders (hard links, else copies) and writes ``rows.json`` (``first``,
    ``end``: the span of the added rows ``used``, ``rows``: those rows as ranges); returns the folder.
    Files of one class that share a name (``IMG_0001.JPG`` from two cameras) are kept as ``IMG_0001-2.JPG``
    and so on, in the order added (they refused the session, for good); a name that is not UTF-8 (a
    latin-1 ``café.jpg`` added with ``search --add``) is kept with U+FFFD for its odd bytes, as the folder's
    inventory takes UTF-8 names only.  On any failure the folders it
    made are removed."""
    files = [(name, source if os.path.isabs(source) else os.path.join(workdir, source)) for name, source in rows]
    gone = [path for _, path in files if not os.path.isfile(path)]
    if gone:  # before anything is made: nothing in the workdir changes
        raise DataError(
            f"{len(gone)} added image(s) are no longer where they were added, e.g. {gone[0]}: search --add keeps an "
            f"image's path, not its file; put the images back there (a run moved to another machine needs the "
            f"folders its adds came from), then run update --from_added again."
        )
    folder = folder_of(workdir, session)
    if os.path.exists(folder):
        shutil.rmtree(folder)  # left by a request refused or killed before its session was recorded
    made = folder if os.path.isdir(os.path.dirname(folder)) else os.path.dirname(folder)
    try:
        for name, path in files:
            base = os.fsencode(os.path.basename(path)).decode("utf-8", "replace")  # a latin-1 name, as UTF-8
            target = _free_name(os.path.join(folder, name, base))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            try:
                os.link(path, target)
            except OSError:
                shutil.copyfile(path, target)
        with open(os.path.join(folder, ROWS_FILE), "w") as f:
            json.dump({"first": min(used), "end": max(used) + 1, "rows": _ranges(used)}, f)
    except BaseException:
        shutil.rmtree(made, ignore_errors=True)
        raise
    return folder


def _free_name(target: str) -> str:
    """``target``, or ``<stem>-<n><ext>`` with the smallest n >= 2 that no file has."""
    stem, ext = os.path.splitext(target)
    n = 2
    while os.path.exists(target):
        target, n = f"{stem}-{n}{ext}", n + 1
    return target


def run_config(workdir: str):
    """The run's recorded config (what the child's ``update`` will continue), read without the training
    stack: the server asks it for the updates so far and the embedding width."""
    if not os.path.exists(paths.config_file(workdir)):
        raise ConfigError(
            f"{workdir} holds no cvs_jax run (config.json is missing); start one with python -m cvs_jax.main."
        )
    return stored.stored_config(workdir)


def completed_sessions(workdir: str) -> int:
    """Sessions the run has completed (``results.json``'s per-session records)."""
    empty = {"per_session": []}
    return len(run_files.read_json(paths.results_file(workdir), fields=("per_session",), missing=empty)["per_session"])
