"""Synthetic added rows for the added-rows store's tests and benchmark, and the store as the code before
segments wrote it (each step holding every added row), to read old runs against.

Row ``r`` of a sequence is recognisable from its values alone: its embedding is ``r + [0, 1/dim, ...]``, its
source ``/photos/r.png``, its digest ``r`` in hex, so that a test compares a store read back with what was
added, row by row.

    python -m cvs_jax.testing.added_rows WORKDIR DIM SIZE,SIZE,...

appends batches of those sizes through ``additions.append`` under the additions' lock, one ``acked <rows>``
line after each append returns: what a kill test may count on (``CVS_JAX_FAULT`` kills it in the middle).
"""

from __future__ import annotations

import sys

import numpy as np

from cvs_jax.retrieval import additions
from cvs_jax.rundir import paths
from cvs_jax.rundir import workdir as workdir_lib
from cvs_jax.rundir.checkpoint import Checkpoints, Reader
from cvs_jax.rundir.gallery import Gallery, GalleryPart

NAMES = ("ant", "bee", "")


def batch(first: int, n: int, dim: int) -> dict:
    """Rows ``first`` .. ``first + n - 1``: ``additions.append``'s arguments but the store, rows and session."""
    r = np.arange(first, first + n)
    return {
        "embeddings": (r[:, None] + np.arange(dim)[None, :] / dim).astype(np.float32),
        "labels": np.asarray([i % 5 - 1 for i in r], np.int32),
        "names": [NAMES[i % 3] for i in r],
        "sources": [f"/photos/{i}.png" for i in r],
        "digests": [f"{i:064x}" for i in r],
    }


def expected(sizes: list[int], sessions: list[int], dim: int) -> dict:
    """What a store holds after adds of ``sizes`` rows by the models of ``sessions``: every column, in order."""
    rows = batch(0, sum(sizes), dim)
    rows["sessions"] = np.repeat(np.asarray(sessions, np.int32), sizes)
    return rows


def columns(added: additions.Added) -> dict:
    """``added``'s rows as ``expected`` gives them."""
    g = added.gallery
    return {
        "embeddings": np.asarray(g.embeddings),
        "labels": g.labels,
        "names": added.names,
        "sources": added.sources,
        "digests": added.digests,
        "sessions": g.sessions,
    }


def append_batches(workdir: str, dim: int, sizes: list[int], sessions: list[int], say=None) -> additions.Added:
    """Appends batches of ``sizes`` rows (embedded by ``sessions``' models) as a server or ``search --add``
    does, one lock and one store kept across them; ``say(rows)`` after each append returns."""
    with workdir_lib.hold_additions(workdir):
        store = additions.writer(workdir)
        try:
            added = additions.read_for_append(store, dim)
            for n, session in zip(sizes, sessions):
                b = batch(len(added), n, dim)
                added = additions.append(
                    store, added, b["embeddings"], b["labels"], b["names"], b["sources"], b["digests"], session
                )
                if say is not None:
                    say(len(added))
        finally:
            store.close()
    return added


def legacy_append(workdir: str, dim: int, sizes: list[int], sessions: list[int], *, one_part: bool = False) -> None:
    """Adds as the code before segments did (0f6fe06's ``additions.append``): each add a new step holding
    every row, one part per model session (``one_part``: the older layout, one part of every row), the
    newest 2 steps kept."""
    store = Checkpoints(paths.additions_dir(workdir), max_to_keep=2)
    try:
        total = 0
        for step, (n, session) in enumerate(zip(sizes, sessions)):
            total += n
            rows = expected(sizes[: step + 1], sessions[: step + 1], dim)
            if one_part:
                tree = GalleryPart(rows["embeddings"], rows["labels"], np.full(total, -1, np.int64), session).as_dict()
            else:
                tree, start = {}, 0
                for s in _runs(rows["sessions"]):
                    part = GalleryPart(
                        rows["embeddings"][start : start + s[1]],
                        rows["labels"][start : start + s[1]],
                        np.full(s[1], -1, np.int64),
                        s[0],
                    )
                    tree[f"part{len(tree):05d}"] = part.as_dict()
                    start += s[1]
            meta = {"sources": rows["sources"], "digests": rows["digests"], "names": rows["names"]}
            store.save(step, {"rows": tree}, meta)
    finally:
        store.close()


def _runs(sessions: np.ndarray) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s in sessions.tolist():
        if out and out[-1][0] == s:
            out[-1] = (s, out[-1][1] + 1)
        else:
            out.append((s, 1))
    return out


def legacy_read(workdir: str, dim: int) -> Gallery:
    """What the code before segments read: the newest step's ``rows`` (raises, as it did, on a segment)."""
    reader = Reader(paths.additions_dir(workdir), max_to_keep=None)
    try:
        steps = reader.steps()
        rows = reader.restore(steps[-1], {"rows": None})["rows"]
    finally:
        reader.close()
    parts = (
        [GalleryPart.from_dict(rows)]
        if "embeddings" in rows
        else [GalleryPart.from_dict(rows[k]) for k in sorted(rows)]
    )
    return Gallery(parts, dim)


if __name__ == "__main__":
    workdir, dim, sizes = sys.argv[1], int(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")]
    append_batches(workdir, dim, sizes, [0] * len(sizes), say=lambda rows: print(f"acked {rows}", flush=True))
