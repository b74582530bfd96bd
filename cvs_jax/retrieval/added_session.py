"""The next session from the labelled images added to a run (``update --from_added``).

The rows that ``search --add`` and the server's ``/add`` stored since the last such session (their
files and labels) are laid out as a folder of class folders, ``<workdir>/from_added/session-<S>/<class>/
<file>`` (hard links to the stored files where the file system allows, else copies), with
``rows.json`` naming the added rows it holds; ``update`` then trains on that folder exactly as
``update --data`` trains on any folder: same inventory, split, plan, method, replay and recipe.  One
place decides how a folder becomes a session; this module only decides which images form the folder.

A row's class is the name it was added with (``additions.resolve``), so a name the run has not seen
becomes a class folder like any other and the session learns it as a new class, as ``update --data``
learns a new class folder.

"Since the last session": the added rows no earlier ``--from_added`` session used (``rows.json`` of
the folders in ``data.updates``), in the order added; rows added while a session trains belong to
the next one.  The added rows themselves are left as they are (their stored embeddings are never
rewritten).  A refused request removes the folder it made: nothing in the workdir changes.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
from typing import NamedTuple

from cvs_jax.config import stored
from cvs_jax.data import folder_inventory
from cvs_jax.errors import ConfigError, DataError
from cvs_jax.retrieval import additions
from cvs_jax.rundir import paths

FOLDER = "from_added"
ROWS_FILE = folder_inventory.FOLDER_RECORD  # beside the class folders; the inventory skips it
MIN_PER_CLASS = 2  # a class with one image has nothing left to train on once its test query is drawn


def folder_of(workdir: str, session: int) -> str:
    """The folder of session ``session`` (1-based) made from added rows."""
    return os.path.join(os.path.abspath(workdir), FOLDER, f"session-{session}")


def is_added_folder(workdir: str, folder: str) -> bool:
    return os.path.dirname(os.path.abspath(folder)) == os.path.join(os.path.abspath(workdir), FOLDER)


def used_rows(workdir: str, updates: list[str]) -> int:
    """How many added rows (in the order added) earlier ``--from_added`` sessions used."""
    used = 0
    for folder in updates:
        path = os.path.join(folder, ROWS_FILE)
        if is_added_folder(workdir, folder) and os.path.exists(path):
            with open(path) as f:
                used = max(used, int(json.load(f)["end"]))
    return used


def _class_names(workdir: str) -> list[str]:
    with open(paths.protocol_file(workdir)) as f:
        return list(json.load(f)["class_names"])


def labelled_pending(workdir: str, updates: list[str], embed_dim: int) -> int:
    """How many labelled added rows no session has used yet (``--learn_after``'s count)."""
    added = additions.read(workdir, embed_dim)
    return int((added.gallery.labels[used_rows(workdir, updates) :] >= 0).sum()) if len(added) else 0


class Pending(NamedTuple):
    """The added rows ``first..end-1`` not yet used; ``rows``: the labelled ones the session learns from,
    ``(class name, stored file)``; ``left_out``: ``(stored file, where its bytes already are)`` of the
    labelled ones it does not (``leave_out``)."""

    first: int
    end: int
    rows: list[tuple[str, str]]
    left_out: list[tuple[str, str]]


def pending(workdir: str, updates: list[str], embed_dim: int) -> Pending:
    """The added rows not yet used and the labelled ones among them.  Refuses (``DataError``) when none is
    labelled (or left once ``leave_out`` has taken out images the run holds) or a class has one image."""
    added = additions.read(workdir, embed_dim)
    first, end = used_rows(workdir, updates), len(added)
    if end <= first:
        raise DataError(
            f"no image was added to {workdir} since the last session ({first} added row(s), all used); add "
            f"labelled images (POST /add?label=NAME or search --add with --label) first."
        )
    added = additions.resolve(added, _class_names(workdir))  # labels by name: new names are new classes
    names = additions.class_list(added, _class_names(workdir))
    labels = added.gallery.labels[first:end]
    labelled = [first + i for i, label in enumerate(labels) if label >= 0]
    if not labelled:
        raise DataError(
            f"the {end - first} image(s) added since the last session have no label, so no session can learn "
            f"from them; add images with a label (POST /add?label=NAME)."
        )
    kept, left_out = leave_out(workdir, added, labelled)
    rows = [(names[int(added.gallery.labels[r])], added.sources[r]) for r in kept]
    if not rows:
        raise DataError(
            f"the {len(labelled)} labelled image(s) added since the last session are all in the run already "
            f"(added with force; e.g. {left_out[0][0]} = {left_out[0][1]}): no session can learn from them; "
            f"add new labelled images."
        )
    counts = collections.Counter(name for name, _ in rows)
    single = sorted(name for name, n in counts.items() if n < MIN_PER_CLASS)
    if single:
        raise DataError(
            f"class {single[0]!r} has 1 image among those added since the last session ({_counts(counts)}"
            + (f"; {len(left_out)} left out, their bytes in the run already" if left_out else "")
            + f"); a class needs at least {MIN_PER_CLASS}: add another image of it, or wait for more."
        )
    return Pending(first, end, rows, left_out)


def leave_out(workdir: str, added: additions.Added, labelled: list[int]) -> tuple[list[int], list[tuple[str, str]]]:
    """``(rows kept, [(stored file, where its bytes already are)])``: a row added with force whose bytes a
    session of the run already holds (a test query, an image learnt before), or an earlier row of this
    session under the same class holds, is left out.  ``update`` refuses a folder holding an image the run
    holds, and an added row cannot be taken out: such a row blocked every later session.  It stays an added
    row, searchable as before."""
    from cvs_jax.data import sources  # pylint: disable=g-import-not-at-top  # tensorflow_datasets

    stored = sources.store_digests(run_config(workdir), only={added.digests[r] for r in labelled})
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


def make_folder(workdir: str, session: int, first: int, end: int, rows: list[tuple[str, str]]) -> str:
    """Lays the rows out as class folders (hard links, else copies) and writes ``rows.json``; returns it.
    Files of one class that share a name (``IMG_0001.JPG`` from two cameras) are kept as ``IMG_0001-2.JPG``
    and so on, in the order added (they refused the session, for good); a name that is not UTF-8 (a
    latin-1 ``café.jpg`` added with ``search --add``) is kept with U+FFFD for its odd bytes, as the folder's
    inventory takes UTF-8 names only.  On any failure the folders it
    made are removed."""
    folder = folder_of(workdir, session)
    if os.path.exists(folder):
        shutil.rmtree(folder)  # left by a request refused or killed before its session was recorded
    made = folder if os.path.isdir(os.path.dirname(folder)) else os.path.dirname(folder)
    try:
        for name, source in rows:
            path = source if os.path.isabs(source) else os.path.join(workdir, source)
            base = os.fsencode(os.path.basename(path)).decode("utf-8", "replace")  # a latin-1 name, as UTF-8
            target = _free_name(os.path.join(folder, name, base))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            try:
                os.link(path, target)
            except OSError:
                shutil.copyfile(path, target)
        with open(os.path.join(folder, ROWS_FILE), "w") as f:
            json.dump({"first": first, "end": end}, f)
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
    try:
        with open(paths.results_file(workdir)) as f:
            return len(json.load(f).get("per_session", []))
    except FileNotFoundError:
        return 0
