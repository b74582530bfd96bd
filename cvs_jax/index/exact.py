"""Exact top-K in the process: ``retrieval.topk``'s jitted, device-sharded evaluator, whose results
are the project's search (``search``, ``Run.search``) for the same rows.

Rows live on the devices in segments (``topk.ShardedGallery`` with a ``base`` offset), merged into one
running top-K per query exactly as ``topk.topk_indices_blocked`` merges disk blocks: ties break by the
lowest position, as in one gallery. An ``add`` grows the last segment while it is under one scan block
(re-placing at most ``gallery_block`` rows) and opens a new one after, so a growing gallery neither
copies all its rows again nor recompiles per added row.

A segment smaller than one scan block is scanned in a block of its own power-of-two size (at least
``SMALL_BLOCK``): a lone query on a 43-row gallery took 198 us at 4,096 rows per step and 56 us at 512
here (2-core CPU, ``search_chunk`` and its fetch), which is most of what serve's answer spent beyond the
network's own.  Scores do not depend on the block (the same dot per row), and ties still break by position.
A new segment shape is compiled for every query shape searched so far, so that the few doublings of a
growing tail never compile inside a search; and a server compiles them in ``prepare`` before the ``add``,
beside serving (``add`` itself runs between two batches, under the lock every search needs: a compile
there held searches for up to 57 s when a gallery passed 512 rows).  ``warm`` compiles a query shape and
k for the segments held, also beside serving.
"""

from __future__ import annotations

import numpy as np

from cvs_jax.index.base import RowIds, empty_results, padded
from cvs_jax.retrieval import topk

SMALL_BLOCK = 512  # the scan block of a segment under one full block (its rows rounded up to a power of two)


class ExactIndex:
    """Exact cosine top-K (``retrieval.topk``) over every row held."""

    def __init__(self, dim: int, *, mesh=None, gallery_block: int | None = None, query_chunk: int = 1024):
        """``gallery_block``: rows per device per scan step (None: ``topk.default_block``, by device kind)."""
        self._ids = RowIds(dim)
        self._mesh, self._chunk = mesh, int(query_chunk)
        self._block = topk.resolve_block(gallery_block, mesh)
        self._rows = np.zeros(0, np.int64)  # row id of each position
        self._tail = np.zeros((0, dim), np.float32)  # the last segment's embeddings (while it may grow)
        self._segments: list[topk.ShardedGallery] = []
        self._searched: set[tuple[int, int]] = set()  # (query chunk rows, k) of every search so far
        self._shapes: set[tuple[int, int]] = set()  # (rows per device, scan block) of the segments made

    @property
    def gallery_block(self) -> int:
        return self._block

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, rows, embeddings, arrival_session, model_session) -> None:
        rows, emb, _, _ = self._ids.new(rows, embeddings, arrival_session, model_session)
        if not rows.size:
            return
        base = self._rows.size
        self._rows = np.concatenate([self._rows, rows])
        if 0 < self._tail.shape[0] < self._block:  # grow the last segment
            self._segments.pop()
            base -= self._tail.shape[0]
            emb = np.concatenate([self._tail, emb])
        segment = self._segment(emb, base)
        self._segments.append(segment)
        self._tail = emb if emb.shape[0] < self._block else emb[:0]
        self._compile(segment, self._k_run)  # only for a shape ``prepare`` did not compile

    def _segment(self, emb: np.ndarray, base: int) -> topk.ShardedGallery:
        small = min(self._block, max(SMALL_BLOCK, topk.pow2(emb.shape[0])))
        return topk.ShardedGallery(emb, mesh=self._mesh, gallery_block=small, base=base)

    def _compile(self, segment: topk.ShardedGallery, k_run) -> None:
        """Compiles ``segment``'s shape for every (query rows, k) searched so far, once per shape."""
        if (segment.rows_per_dev, segment.scan_block) in self._shapes:
            return
        for rows, k in list(self._searched):
            zeros = next(topk.query_chunks(np.zeros((rows, self._ids.dim), np.float32), rows, segment.mesh))
            segment.search_chunk(zeros.array, k_run(k))
        self._shapes.add((segment.rows_per_dev, segment.scan_block))

    def prepare(self, counts) -> None:
        """Compiles, beside serving, what adding ``counts`` rows (one ``add`` per entry, in order) will
        search with: the segment shapes they make and each searched (query rows, k) on them, so that the
        ``add`` itself, run under the searches' lock, compiles nothing.  Reads the index; changes nothing
        a search reads."""
        tail, total = self._tail.shape[0], self._rows.size
        for n in counts:
            if n <= 0:
                continue
            total += n
            size = tail + n if 0 < tail < self._block else n
            segment = self._segment(np.zeros((size, self._ids.dim), np.float32), 0)
            self._compile(segment, lambda k, total=total: min(topk.pow2(min(int(k), total)), total))
            tail = size if size < self._block else 0

    def warm(self, query_rows: int, k: int) -> None:
        """Compiles a search of ``query_rows`` queries (a bucket) for ``k`` on the segments held, beside
        serving (the searches to come then find it compiled; later segment shapes get it in ``prepare``)."""
        if not self._segments:
            return
        k_run = self._k_run(k)
        for segment in list(self._segments):
            zeros = next(topk.query_chunks(np.zeros((query_rows, self._ids.dim), np.float32), query_rows, segment.mesh))
            segment.search_chunk(zeros.array, k_run)
        self._searched.add((query_rows, k_run))

    def _k_run(self, k: int) -> int:
        """The k a search runs with: ``k`` (at most the rows held) rounded up to a power of two, so that
        one compile serves every k of its bucket; the first ``k`` of its answer are the top ``k`` (the same
        order: score, then position)."""
        return min(topk.pow2(min(int(k), self._rows.size)), self._rows.size)

    def search(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        q = self._ids.queries(queries, k)
        if not self._segments or not q.shape[0]:
            return empty_results(q.shape[0], k)
        k_eff, k_run = min(int(k), self._rows.size), self._k_run(k)
        scores, idx = [], []
        for chunk in topk.query_chunks(q, self._chunk, self._segments[0].mesh):
            self._searched.add((chunk.array.shape[0], k_run))
            vals = ids = None
            for segment in self._segments:
                vals, ids = segment.search_chunk(chunk.array, k_run, vals, ids)
            scores.append(np.asarray(vals)[: chunk.rows, :k_eff])
            idx.append(np.asarray(ids)[: chunk.rows, :k_eff])
        idx = topk.checked_indices(np.concatenate(idx), self._rows.size)
        return padded(np.concatenate(scores), self._rows[idx], int(k))
