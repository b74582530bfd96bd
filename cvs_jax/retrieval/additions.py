"""The rows added to a run's gallery (``search --add``, the server's ``/add``): read and appended.

They live in ``checkpoints/additions``: each write is a new orbax step holding every added row (one
part per model session, in the order added, so older rows keep the session of the model that embedded
them), with each row's source, the SHA-256 of its image's bytes (the duplicate-bytes rule) and the class
name it was added with.  orbax
writes a step into a temporary folder and renames it when complete, and ``append`` then fsyncs the
step's files and folders: when it returns, the rows survive a ``kill -9`` or a power cut, and a process
killed before that leaves the previous step as the newest (no partial row is ever read).

A row's label is its class *name*: the stored integer label is read only for rows added before names
were kept.  A name the run has not seen yet (``/add?label=NEW``) is a new class at once: ``resolve``
numbers the names against the protocol's class list read now, the new ones after it in the order first
added, so a row's label stays right when a session (``update --from_added``) grows the class list and
gives that class the place its plan decides.

No training run writes here, so additions have their own lock (``workdir.hold_additions``), which the
caller of ``append`` holds: rows can be added while ``update`` trains.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from cvs_jax.errors import UnreadableCheckpointError
from cvs_jax.rundir import paths
from cvs_jax.rundir.checkpoint import Checkpoints, Reader
from cvs_jax.rundir.gallery import Gallery, GalleryPart

_KEY = "part{:05d}"


@dataclasses.dataclass(frozen=True)
class Added:
    """The added rows as stored at one step (``step`` None: nothing added yet)."""

    gallery: Gallery
    sources: list[str]  # absolute path of each row's image
    digests: list[str]  # SHA-256 (hex) of each row's image bytes ("": added before digests were kept)
    step: int | None
    names: list[str]  # each row's class name ("": unlabelled, or added before names were kept)

    def __len__(self) -> int:
        return len(self.sources)


def _from_stored(stored: tuple[int, dict] | None, embed_dim: int) -> Added:
    if stored is None:
        return Added(Gallery.empty(embed_dim), [], [], None, [])
    step, items = stored
    rows = items["rows"]
    if "embeddings" in rows:  # one part (the layout before per-session parts)
        parts = [GalleryPart.from_dict(rows)]
    else:
        parts = [GalleryPart.from_dict(rows[key]) for key in sorted(rows)]
    sources = list(items["meta"]["sources"])
    digests = list(items["meta"].get("digests", [""] * len(sources)))
    names = list(items["meta"].get("names", [""] * len(sources)))
    return Added(Gallery(parts, embed_dim), sources, digests, step, names)


def class_list(added: Added, class_names: list[str]) -> list[str]:
    """The run's classes as the added rows see them: ``class_names`` (the protocol's), then each name only
    added rows carry, in the order first added."""
    out, known = list(class_names), set(class_names)
    for name in added.names:
        if name and name not in known:
            known.add(name)
            out.append(name)
    return out


def resolve(added: Added, class_names: list[str]) -> Added:
    """``added`` with each named row's label its name's place in ``class_list`` (the stored label for the
    rows added before names were kept, and -1 for unlabelled ones)."""
    if not any(added.names):
        return added
    index = {name: i for i, name in enumerate(class_list(added, class_names))}
    parts, start = [], 0
    for p in added.gallery.parts:
        names = added.names[start : start + len(p)]
        labels = np.asarray([index[n] if n else int(x) for n, x in zip(names, p.labels)], np.int32)
        parts.append(dataclasses.replace(p, labels=labels))
        start += len(p)
    return dataclasses.replace(added, gallery=Gallery(parts, added.gallery.embed_dim))


def newest_step(workdir: str) -> int | None:
    """The newest finalized step, from a directory listing alone (what a server polls; orbax names a
    step's folder by its number only once it is complete)."""
    try:
        names = os.listdir(paths.additions_dir(workdir))
    except FileNotFoundError:
        return None
    steps = [int(n) for n in names if n.isdigit()]
    return max(steps) if steps else None


def read(workdir: str, embed_dim: int) -> Added:
    """The added rows, read without writing anything (safe beside a writer)."""
    directory = paths.additions_dir(workdir)
    if not os.path.isdir(directory):
        return _from_stored(None, embed_dim)
    r = Reader(directory, max_to_keep=None)
    steps = r.steps()
    return _from_stored((steps[-1], r.restore(steps[-1], {"rows": None})) if steps else None, embed_dim)


def writer(workdir: str) -> Checkpoints:
    """The additions' checkpoints, to append to (the caller holds ``workdir.hold_additions``)."""
    return Checkpoints(paths.additions_dir(workdir), max_to_keep=2)


def read_for_append(checkpoints: Checkpoints, embed_dim: int) -> Added:
    """The newest step, to append to.  A damaged one stops the add (``UnreadableCheckpointError``: nothing
    moved, nothing added), unlike a training run's restore, which falls back to the previous checkpoint and
    trains again: each step holds every added row, so appending to the previous one dropped the rows of the
    newest adds for good (no run can make them again)."""
    steps = checkpoints.steps()
    if not steps:
        return _from_stored(None, embed_dim)
    try:
        return _from_stored((steps[-1], checkpoints.restore(steps[-1], {"rows": None})), embed_dim)
    except UnreadableCheckpointError as e:
        if len(steps) < 2:
            raise
        previous = os.path.join(checkpoints.directory, str(steps[-2]))
        raise UnreadableCheckpointError(
            f"{e} Nothing was added. To go on without the rows added last, move that folder out of "
            f"{checkpoints.directory}: {previous} holds the rows added before them."
        ) from e


def append(
    checkpoints: Checkpoints,
    added: Added,
    embeddings: np.ndarray,
    labels: np.ndarray,
    names: list[str],
    sources: list[str],
    digests: list[str],
    session: int,
) -> Added:
    """``added`` plus the new rows (embedded by the model of ``session``; ``names``: their class names, ""
    unlabelled), written as a new durable step; returns what is now stored."""
    new = GalleryPart(
        np.asarray(embeddings, np.float32),
        np.asarray(labels, np.int32),
        np.full(len(sources), -1, np.int64),
        session,
    )
    parts = list(added.gallery.parts)
    if parts and parts[-1].session == session:
        last = parts.pop()
        new = GalleryPart(
            np.concatenate([last.embeddings, new.embeddings]),
            np.concatenate([last.labels, new.labels]),
            np.concatenate([last.source_ids, new.source_ids]),
            session,
        )
    parts.append(new)
    all_sources = added.sources + list(sources)
    all_digests = added.digests + list(digests)
    all_names = added.names + list(names)
    steps = checkpoints.steps()
    step = (max(steps) + 1) if steps else 0
    checkpoints.save(
        step,
        {"rows": {_KEY.format(i): p.as_dict() for i, p in enumerate(parts)}},
        {"sources": all_sources, "digests": all_digests, "names": all_names},
    )
    fsync_tree(os.path.join(checkpoints.directory, str(step)))
    return Added(Gallery(parts, added.gallery.embed_dim), all_sources, all_digests, step, all_names)


def fsync_tree(path: str) -> None:
    """fsyncs every file and folder under ``path``, then ``path``'s parent (its name in it)."""
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(root)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
