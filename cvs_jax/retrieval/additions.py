"""The rows added to a run's gallery (``search --add``, the server's ``/add``): read and appended.

They live in ``checkpoints/additions`` as **segments**: each add writes one orbax step holding only its own
rows (embeddings, labels and the session of the model that embedded them, one part per session), with its
first row, each row's source, the SHA-256 of its image's bytes (the duplicate-bytes rule) and the class name
it was added with.  ``checkpoints/additions.json``, the **chain**, lists the segments that hold the rows in
row order (``[step, first row, rows]`` each) and the count of rows.  An add writes its segment (orbax writes
a temporary folder and renames it; ``fsync_tree``), then the chain (a new file, fsync'd, renamed over the
old): only then is it acknowledged, so an acknowledged row survives a ``kill -9`` or a power cut, and a kill
before leaves a segment the chain does not name, which no reader reads and the next writer removes.  Row
numbers are positions in the chain, so a row keeps its number (and its id) for the life of the run.

**Merging** (tiered): after an add, when at least ``FANOUT - 1`` newest segments together reach the rows of
the segment before them, it and all of them are merged into one segment (``merge_from``).  Every segment but
the newest ``FANOUT - 1`` then holds more rows than all newer ones together, so a read touches at most
``log2(rows / smallest add) + FANOUT`` segments, and a row is rewritten only when its segment at least doubles.
One add in about four merges (with ``FANOUT`` 2, every other add did: twice the steps written for the same
bound).  An add of 16 rows writes 6.4 kB and takes about the same time at 100,000 rows as at 1,000,000 (0.17
and 0.24 s p50 on a busy 2-core host, where the layout before wrote 12.8 and 128.6 MB in 0.39 and 2.70 s;
BENCHMARKS.md, "The added-rows store"); the add that completes a doubling rewrites every row it merges,
inline, under the additions' lock (2.84 s at 1,000,000 rows, once per doubling).  A merge writes the merged
segment first (fsync'd), then the chain that names it in place of the ones it covers, then removes those: a
kill at any point leaves one chain holding every acknowledged row once (a reader that lost a race with the
removal reads the new chain).

A chain that names a segment that is gone or damaged (a gap) is refused (``UnreadableCheckpointError``,
naming the folder), never read as fewer rows: the chain's count also catches a deleted newest segment.
Without ``additions.json`` (deleted by hand) the chain is rebuilt from what each segment records.

**Older layouts** read as they were: each step of the layout before segments held every added row (item
``rows``, one part, or one part per session); its newest step is the chain's base segment at the first
append.  A segment's tree is item ``segment``: a cvs-jax before segments reads the newest step as all the rows
and finds no ``rows`` item in a segment, so it refuses the store (it reports that step as damaged) rather
than read the newest segment as every row.

A row's label is its class *name*: the stored integer label is read only for rows added before names
were kept.  A name the run has not seen yet (``/add?label=NEW``) is a new class at once: ``resolve``
numbers the names against the protocol's class list read now, the new ones after it in the order first
added, so a row's label stays right when a session (``update --from_added``) grows the class list and
gives that class the place its plan decides.

No training run writes here, so additions have their own lock (``workdir.hold_additions``), which the
caller of ``append`` holds: rows can be added while ``update`` trains.  Readers never write.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import numpy as np

from cvs_jax.errors import CheckpointError, UnreadableCheckpointError
from cvs_jax.rundir import faults, paths, run_files
from cvs_jax.rundir.checkpoint import Checkpoints, Reader
from cvs_jax.rundir.gallery import Gallery, GalleryPart

log = logging.getLogger(__name__)

_KEY = "part{:05d}"
_ROWS = "rows"  # the tree of a step of the layout before segments (every added row)
_SEGMENT = "segment"  # the tree of a segment (its own rows); older code reads only ``rows``
LAYOUT = "segments"
FANOUT = 4  # a merge takes at least this many segments: 1 add in ~4 merges (binary merging, 2: every other)
_RETRIES = 8  # chains replaced (merges) while one read ran, before the reader gives up


@dataclasses.dataclass(frozen=True)
class Segment:
    """One step of ``checkpoints/additions`` in the chain: rows ``first`` .. ``first + count - 1``."""

    step: int
    first: int
    count: int

    @property
    def end(self) -> int:
        return self.first + self.count


@dataclasses.dataclass(frozen=True)
class Added:
    """The added rows as stored (``step``: the chain's newest segment, None: nothing added yet)."""

    gallery: Gallery
    sources: list[str]  # absolute path of each row's image
    digests: list[str]  # SHA-256 (hex) of each row's image bytes ("": added before digests were kept)
    step: int | None
    names: list[str]  # each row's class name ("": unlabelled, or added before names were kept)
    segments: tuple[Segment, ...] = ()  # the chain they were read from or written as

    def __len__(self) -> int:
        return len(self.sources)


def _empty(embed_dim: int) -> Added:
    return Added(Gallery.empty(embed_dim), [], [], None, [])


def _parts(rows: dict) -> list[GalleryPart]:
    if "embeddings" in rows:  # one part (the layout before per-session parts)
        return [GalleryPart.from_dict(rows)]
    return [GalleryPart.from_dict(rows[key]) for key in sorted(rows)]


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


# --- the chain ----------------------------------------------------------------------------------------


def _load_chain(workdir: str) -> tuple[Segment, ...] | None:
    """The chain ``additions.json`` records (None: no such file, a store of the layout before segments)."""
    path = paths.additions_chain(workdir)
    record = run_files.read_json(path, fields=("rows", "segments"), missing=None)
    if record is None:
        return None
    try:
        chain = tuple(Segment(int(s), int(a), int(n)) for s, a, n in record["segments"])
        rows = int(record["rows"])
    except (TypeError, ValueError):
        raise run_files.damaged(path, "holds segments that are not [step, first row, rows]") from None
    starts = [0] + [s.end for s in chain[:-1]]
    if [s.first for s in chain] != starts or any(s.count < 1 for s in chain) or (chain[-1].end if chain else 0) != rows:
        raise run_files.damaged(path, f"does not list segments that hold rows 0 to {rows - 1} one after another")
    return chain


def _write_chain(workdir: str, chain: tuple[Segment, ...]) -> None:
    """``additions.json`` replaced whole and durably (fsync'd file, renamed, folder fsync'd)."""
    path = paths.additions_chain(workdir)
    record = {
        "layout": LAYOUT,
        "rows": chain[-1].end if chain else 0,
        "segments": [[s.step, s.first, s.count] for s in chain],
    }
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


def _listed_steps(directory: str) -> list[int]:
    """The finalized steps, from a listing (orbax names a step's folder by its number once it is complete)."""
    try:
        return sorted(int(n) for n in os.listdir(directory) if n.isdigit())
    except FileNotFoundError:
        return []


def newest_step(workdir: str) -> int | None:
    """The step of the newest segment the chain names (what a server polls: one small file), or for a store
    without a chain, its newest step from a directory listing."""
    try:
        chain = _load_chain(workdir)
    except run_files.DamagedFileError:
        chain = None  # its readers refuse it; the watcher reads it and logs why
    if chain:
        return max(s.step for s in chain)
    steps = _listed_steps(paths.additions_dir(workdir))
    return steps[-1] if steps else None


# --- reading ------------------------------------------------------------------------------------------


def _restore(checkpoints: Checkpoints, step: int) -> tuple[list[GalleryPart], dict]:
    folder = os.path.join(checkpoints.directory, str(step))
    item = _ROWS if os.path.isdir(os.path.join(folder, _ROWS)) else _SEGMENT
    items = checkpoints.restore(step, {item: None})  # UnreadableCheckpointError: damaged or missing files
    return _parts(items[item]), items["meta"]


def _span(meta: dict) -> tuple[int, int]:
    return int(meta.get("first", 0)), len(meta["sources"])  # a step before segments holds rows 0..n-1


def _slice_parts(parts, start: int, stop: int, *, coalesce: bool = True) -> list[GalleryPart]:
    """Rows ``start`` .. ``stop - 1`` of ``parts`` (taken as one run of rows): views of the parts, or with
    ``coalesce`` consecutive rows of one session copied into one part (a segment being written)."""
    out: list[GalleryPart] = []
    lo = 0
    for p in parts:
        a, b = max(start - lo, 0), min(stop - lo, len(p))
        lo += len(p)
        if a >= b:
            continue
        piece = (
            p if (a, b) == (0, len(p)) else GalleryPart(p.embeddings[a:b], p.labels[a:b], p.source_ids[a:b], p.session)
        )
        if coalesce and out and out[-1].session == piece.session:
            last = out.pop()
            piece = GalleryPart(
                np.concatenate([last.embeddings, piece.embeddings]),
                np.concatenate([last.labels, piece.labels]),
                np.concatenate([last.source_ids, piece.source_ids]),
                piece.session,
            )
        out.append(piece)
    return out


class _Unread(Exception):
    """A segment of ``chain`` that is gone (``cause`` None), damaged, or not the rows the chain says."""

    def __init__(self, chain: tuple[Segment, ...], segment: Segment, why: str, cause: Exception | None = None):
        super().__init__(why)
        self.chain, self.segment, self.why, self.cause = chain, segment, why, cause


def _rows_text(first: int, count: int) -> str:
    return f"row {first}" if count == 1 else f"rows {first} to {first + count - 1}"


def _gap(workdir: str, e: _Unread) -> UnreadableCheckpointError:
    """The one message for such a segment: its folder, its rows, what to do."""
    seg = e.segment
    folder = os.path.join(paths.additions_dir(workdir), str(seg.step))
    rows = _rows_text(seg.first, seg.count)
    then = ""
    if seg == e.chain[-1]:  # the newest: the rows before it can go on alone
        move = "" if e.why == "is gone" else f"move that folder out of {paths.additions_dir(workdir)} and "
        then = (
            f" To go on without the added {rows} (added last), {move}delete {paths.additions_chain(workdir)}: "
            "the chain is then rebuilt from the other segments."
        )
    if e.cause is not None:  # Checkpoints.restore's message names the folder and says what to do
        return UnreadableCheckpointError(f"{e.cause} It holds the added {rows}.{then}")
    return UnreadableCheckpointError(
        f"the added {rows} cannot be read: {folder} {e.why}. Nothing was changed; restore that folder from a "
        f"backup (added rows are never made again).{then}"
    )


def _from_chain(workdir: str, checkpoints: Checkpoints, chain, embed_dim: int, held: Added | None) -> Added:
    """The rows of ``chain``; those of ``held`` (a prefix of them, read before) are not read again."""
    keep = len(held) if held is not None and len(held) <= chain[-1].end else 0
    parts = _slice_parts(held.gallery.parts, 0, keep, coalesce=False) if held is not None and keep else []
    sources = list(held.sources[:keep]) if held is not None else []
    digests = list(held.digests[:keep]) if held is not None else []
    names = list(held.names[:keep]) if held is not None else []
    for seg in chain:
        if seg.end <= keep:
            continue
        if not os.path.isdir(os.path.join(checkpoints.directory, str(seg.step))):
            raise _Unread(chain, seg, "is gone")
        try:
            seg_parts, meta = _restore(checkpoints, seg.step)
        except UnreadableCheckpointError as e:
            raise _Unread(chain, seg, "is damaged", e) from e
        if _span(meta) != (seg.first, seg.count):
            a, n = _span(meta)
            raise _Unread(chain, seg, f"holds rows {a} to {a + n - 1}, not these")
        skip = max(keep - seg.first, 0)
        parts += _slice_parts(seg_parts, skip, seg.count, coalesce=False)
        n = len(meta["sources"])
        sources += list(meta["sources"])[skip:]
        digests += list(meta.get("digests", [""] * n))[skip:]
        names += list(meta.get("names", [""] * n))[skip:]
    return Added(Gallery(parts, embed_dim), sources, digests, max(s.step for s in chain), names, chain)


def _without_chain(workdir: str, checkpoints: Checkpoints, embed_dim: int) -> Added:
    """A store with no ``additions.json``: the layout before segments (its newest step holds every row), or
    segments whose chain file was deleted (the chain rebuilt from what each records)."""
    steps = _listed_steps(checkpoints.directory)
    if not steps:
        return _empty(embed_dim)
    if os.path.isdir(os.path.join(checkpoints.directory, str(steps[-1]), _ROWS)):
        try:
            parts, meta = _restore(checkpoints, steps[-1])
        except UnreadableCheckpointError as e:
            if len(steps) < 2:
                raise
            previous = os.path.join(checkpoints.directory, str(steps[-2]))
            raise UnreadableCheckpointError(
                f"{e} To go on without the rows added last, move that folder out of {checkpoints.directory}: "
                f"{previous} holds the rows added before them."
            ) from e
        base = Segment(steps[-1], 0, len(meta["sources"]))
        n = base.count
        return Added(
            Gallery(parts, embed_dim),
            list(meta["sources"]),
            list(meta.get("digests", [""] * n)),
            base.step,
            list(meta.get("names", [""] * n)),
            (base,) if n else (),
        )
    spans = {s: _span(checkpoints.restore(s, {})["meta"]) for s in steps}
    chain, at = [], 0
    while True:
        starting = [(n, s) for s, (a, n) in spans.items() if a == at and n > 0]
        if not starting:
            break
        n, s = max(starting)  # the widest: a merged segment over the ones a kill left beside it
        chain.append(Segment(s, at, n))
        at += n
    beyond = sorted(s for s, (a, n) in spans.items() if a > at)
    if beyond:
        raise UnreadableCheckpointError(
            f"the added rows from {at} on cannot be read: no segment of {checkpoints.directory} holds row {at}, "
            f"and {os.path.join(checkpoints.directory, str(beyond[0]))} holds later ones. Nothing was changed; "
            "restore the missing folder from a backup (added rows are never made again)."
        )
    log.warning(
        "%s is missing: the chain of added rows was rebuilt from the segments of %s (%d rows)",
        paths.additions_chain(workdir),
        checkpoints.directory,
        at,
    )
    return _from_chain(workdir, checkpoints, tuple(chain), embed_dim, None) if chain else _empty(embed_dim)


def _read(workdir: str, checkpoints: Checkpoints, embed_dim: int, held: Added | None) -> Added:
    for _ in range(_RETRIES):
        chain = _load_chain(workdir)
        try:
            if chain is None:
                return _without_chain(workdir, checkpoints, embed_dim)
            return _from_chain(workdir, checkpoints, chain, embed_dim, held) if chain else _empty(embed_dim)
        except _Unread as e:
            if chain is not None and _load_chain(workdir) != chain:
                continue  # a merge replaced the chain (and removed that segment) while it was read
            raise _gap(workdir, e) from e.cause
    raise CheckpointError(
        f"the added rows of {checkpoints.directory} changed {_RETRIES} times while they were read; try again."
    )


def read(workdir: str, embed_dim: int, held: Added | None = None) -> Added:
    """The added rows, read without writing anything (safe beside a writer).  ``held``: the rows as read
    before (a prefix of what is stored: rows are only appended), so that only the newer segments are read."""
    directory = paths.additions_dir(workdir)
    if not os.path.isdir(directory):
        return _empty(embed_dim)
    reader = Reader(directory, max_to_keep=None)
    try:
        return _read(workdir, reader, embed_dim, held)
    finally:
        reader.close()


# --- writing ------------------------------------------------------------------------------------------


class Store:
    """The additions' writer: the segments' checkpoints and the chain (the caller holds
    ``workdir.hold_additions``)."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.checkpoints = Checkpoints(paths.additions_dir(workdir), max_to_keep=None)  # merges remove steps

    @property
    def directory(self) -> str:
        return self.checkpoints.directory

    def close(self) -> None:
        self.checkpoints.close()


def writer(workdir: str) -> Store:
    """The additions' store, to append to (the caller holds ``workdir.hold_additions``)."""
    return Store(workdir)


def read_for_append(store: Store, embed_dim: int, held: Added | None = None) -> Added:
    """The stored rows, to append to.  A damaged or missing segment stops the add
    (``UnreadableCheckpointError``: nothing moved, nothing added): appending past it would give the next
    rows the numbers of the ones lost.  Writes nothing (an add refused after it leaves every file)."""
    try:
        return _read(store.workdir, store.checkpoints, embed_dim, held)
    except UnreadableCheckpointError as e:
        raise UnreadableCheckpointError(f"{e} Nothing was added.") from e


def _next_step(store: Store, chain: tuple[Segment, ...]) -> int:
    return max(_listed_steps(store.directory) + [s.step for s in chain] + [-1]) + 1


def _save(store: Store, step: int, parts: list[GalleryPart], first: int, sources, digests, names) -> None:
    store.checkpoints.save(
        step,
        {_SEGMENT: {_KEY.format(i): p.as_dict() for i, p in enumerate(parts)}},
        {"layout": LAYOUT, "first": first, "sources": list(sources), "digests": list(digests), "names": list(names)},
    )
    fsync_tree(os.path.join(store.directory, str(step)))


def append(
    store: Store,
    added: Added,
    embeddings: np.ndarray,
    labels: np.ndarray,
    names: list[str],
    sources: list[str],
    digests: list[str],
    session: int,
) -> Added:
    """``added`` (what ``read_for_append`` read, or the last ``append`` returned, under the same hold of the
    lock) plus the new rows (embedded by the model of ``session``; ``names``: their class names, ""
    unlabelled), written as a new durable segment, merged (module docstring); returns what is now stored."""
    chain = _load_chain(store.workdir)
    if chain is None and added.segments:  # the layout before segments: its newest step is the base
        _write_chain(store.workdir, added.segments)
    elif chain is not None and chain != added.segments:
        raise RuntimeError("the added rows changed since they were read: read_for_append them under the lock")
    named = {s.step for s in added.segments}
    left = [step for step in _listed_steps(store.directory) if step not in named]
    if left:  # what a kill left: a segment the chain never named, or ones a merge covered
        store.checkpoints.remove(left)
    new = GalleryPart(
        np.asarray(embeddings, np.float32),
        np.asarray(labels, np.int32),
        np.full(len(sources), -1, np.int64),
        session,
    )
    first, step = len(added), _next_step(store, added.segments)
    _save(store, step, [new], first, sources, digests, names)
    faults.maybe_fail("additions_segment")  # written, not yet in the chain: never acknowledged
    segments = added.segments + (Segment(step, first, len(sources)),)
    _write_chain(store.workdir, segments)  # from here the rows are acknowledged
    out = Added(
        Gallery(list(added.gallery.parts) + [new], added.gallery.embed_dim),
        added.sources + list(sources),
        added.digests + list(digests),
        step,
        added.names + list(names),
        segments,
    )
    return _merged(store, out)


def merge_from(chain: tuple[Segment, ...]) -> int | None:
    """The oldest segment of ``chain`` that at least ``FANOUT - 1`` newer segments reach together (in rows):
    it and every newer one are merged into one; None: none.  Each segment but the newest ``FANOUT - 1`` then
    holds more rows than all newer ones together, so a chain has at most ``log2(rows / smallest add) +
    FANOUT`` segments, and a row is rewritten when its segment at least doubles."""
    tail, found = 0, None
    for i in range(len(chain) - 1, 0, -1):
        tail += chain[i].count
        if len(chain) - i >= FANOUT - 1 and tail >= chain[i - 1].count:
            found = i - 1
    return found


def _merged(store: Store, added: Added) -> Added:
    """``added`` with its newest segments merged into one when ``merge_from`` says so: the merged segment is
    written (fsync'd), the chain names it, then the segments it covers are removed."""
    j = merge_from(added.segments)
    if j is None:
        return added
    first, end = added.segments[j].first, len(added)
    tail = _slice_parts(added.gallery.parts, first, end)
    step = _next_step(store, added.segments)
    faults.fail_while_writing("additions_merge", store.directory)
    _save(store, step, tail, first, added.sources[first:], added.digests[first:], added.names[first:])
    segments = added.segments[:j] + (Segment(step, first, end - first),)
    _write_chain(store.workdir, segments)
    faults.maybe_fail("additions_merged")  # named in the chain, the covered ones not yet removed
    store.checkpoints.remove([s.step for s in added.segments[j:]])
    fsync_dir(store.directory)
    head = _slice_parts(added.gallery.parts, 0, first, coalesce=False)
    return dataclasses.replace(
        added, gallery=Gallery(head + tail, added.gallery.embed_dim), step=step, segments=segments
    )


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
