"""Exact cosine top-K over the gallery held on the device: the server's default index.

The server searches through one object with this interface (other backends keep it):

* ``add(rows: int64[N], embeddings: float32[N, D], arrival_session: int[N], model_session: int[N])``:
  raw (un-normalised) rows under the caller's row keys, with the sessions each carries;
* ``search(queries: float32[Q, D], k) -> (scores float32[Q, k], rows int64[Q, k])``, best first, ties
  to the row added first; ``-1`` rows (score ``-inf``) where the index holds fewer than ``k``;
* ``len(index)``: the rows held.

This one is the evaluator's search (``topk.ShardedGallery``: the same jitted block scan, merge and
tie rule as ``search`` and training's recall), on a gallery padded to a capacity that doubles, so that
added rows are written in place and neither an add nor a search recompiles per row; queries are padded
to a few bucket sizes and ``k`` to a power of two (one compile per bucket).
"""

from __future__ import annotations

import numpy as np

from cvs_jax.retrieval import topk

QUERY_BUCKETS = (1, 4, 16, 64, 256)


def bucket(n: int, buckets=QUERY_BUCKETS) -> int:
    """The smallest bucket holding ``n`` (past the largest: its multiples)."""
    for b in buckets:
        if n <= b:
            return b
    return -(-n // buckets[-1]) * buckets[-1]


class ExactIndex:
    def __init__(self, dim: int):
        self.dim = int(dim)
        self._keys = np.zeros(0, np.int64)
        self._arrival = np.zeros(0, np.int32)
        self._model = np.zeros(0, np.int32)
        self._gallery: topk.ShardedGallery | None = None

    def __len__(self) -> int:
        return int(self._keys.shape[0])

    def add(self, rows, embeddings, arrival_session, model_session) -> None:
        embeddings = np.asarray(embeddings, np.float32).reshape(-1, self.dim)
        if embeddings.shape[0] == 0:
            return
        if self._gallery is None:
            self._gallery = topk.ShardedGallery(embeddings)
        else:
            self._gallery.append(embeddings)
        self._keys = np.concatenate([self._keys, np.asarray(rows, np.int64)])
        self._arrival = np.concatenate([self._arrival, np.asarray(arrival_session, np.int32)])
        self._model = np.concatenate([self._model, np.asarray(model_session, np.int32)])

    def search(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        queries = np.asarray(queries, np.float32).reshape(-1, self.dim)
        q = queries.shape[0]
        scores = np.full((q, k), -np.inf, np.float32)
        rows = np.full((q, k), -1, np.int64)
        if self._gallery is None or q == 0:
            return scores, rows
        k_run = 1 << max(k - 1, 0).bit_length()  # k in powers of two: one compile each
        s, i = self._gallery.topk(queries, k_run, chunk=bucket(q))
        kept = min(k, s.shape[1])
        scores[:, :kept] = s[:, :kept]
        rows[:, :kept] = self._keys[i[:, :kept]]
        return scores, rows
