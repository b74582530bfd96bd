"""The seam every gallery index implements, and what all of them share.

An index holds gallery rows under their row ids (int64, the gallery's row numbers), each with the
session its image arrived in and the session of the model that embedded it. Scores are the project's
search similarity (``retrieval.topk``): cosine, i.e. the inner product of L2-normalised rows
(``x / max(|x|, 1e-12)``), higher is better. Rows are never re-embedded, so ``add`` skips row ids the
index already holds: a caller may pass the whole gallery after each update and only new rows go in.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike

from cvs_jax.errors import IndexBackendError


@runtime_checkable
class Index(Protocol):
    def add(
        self, rows: np.ndarray, embeddings: np.ndarray, arrival_session: np.ndarray, model_session: np.ndarray
    ) -> None:
        """Adds rows ``int64 [N]`` with embeddings ``float32 [N, D]`` and sessions ``int [N]``; row ids
        already held are skipped."""
        ...

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(scores float32 [Q, k], rows int64 [Q, k])``, best first; -inf / -1 past the rows held."""
        ...

    def __len__(self) -> int:
        """Rows held."""
        ...


def normalized(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length as ``retrieval.topk`` scales them (float32, contiguous)."""
    x = np.asarray(x, np.float32)
    return np.ascontiguousarray(x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12))


def empty_results(q: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full((q, k), -np.inf, np.float32), np.full((q, k), -1, np.int64)


class RowIds:
    """The row ids an index holds, and the checks of what ``add`` and ``search`` are given."""

    def __init__(self, dim: int):
        if dim < 1:
            raise IndexBackendError(f"an index of dimension {dim}: pass the embedding dimension (>= 1).")
        self.dim = int(dim)
        self._sorted = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return int(self._sorted.size)

    def new(self, rows, embeddings, arrival_session, model_session):
        """The checked columns, only the rows not held yet (first occurrence of a repeated id), which
        are then held."""
        rows = np.asarray(rows)
        emb = np.asarray(embeddings, np.float32)
        arrival, model = np.asarray(arrival_session), np.asarray(model_session)
        n = rows.shape[0] if rows.ndim == 1 else -1
        if n < 0 or emb.shape != (n, self.dim) or arrival.shape != (n,) or model.shape != (n,):
            raise IndexBackendError(
                f"add() got rows {rows.shape}, embeddings {emb.shape}, sessions {arrival.shape} and "
                f"{model.shape}: pass rows [N], embeddings [N, {self.dim}] and sessions [N]."
            )
        if n and (not np.issubdtype(rows.dtype, np.integer) or rows.min() < 0):
            raise IndexBackendError("add() row ids must be non-negative integers (the gallery's row numbers).")
        if not np.isfinite(emb).all():
            raise IndexBackendError("add() embeddings contain NaN/inf; check the model that embedded them.")
        rows = rows.astype(np.int64)
        _, first = np.unique(rows, return_index=True)
        keep = np.sort(first)
        keep = keep[~self._held(rows[keep])]
        self._insert(rows[keep])
        return rows[keep], emb[keep], arrival[keep].astype(np.int64), model[keep].astype(np.int64)

    def hold(self, rows: ArrayLike) -> None:
        """Marks rows as held that were added elsewhere (an index reopened from its store)."""
        rows = np.unique(np.asarray(rows, np.int64))
        self._insert(rows[~self._held(rows)])

    def release(self, rows: np.ndarray) -> None:
        """Forgets rows a failed write did not store, so that the next ``add`` of them writes them."""
        self._sorted = self._sorted[~np.isin(self._sorted, np.asarray(rows, np.int64))]

    def _held(self, rows: np.ndarray) -> np.ndarray:
        """Which of ``rows`` are held: a binary search in the sorted ids, O(n log N)."""
        if not self._sorted.size:
            return np.zeros(rows.shape, bool)
        pos = np.searchsorted(self._sorted, rows)
        return (pos < self._sorted.size) & (self._sorted[np.minimum(pos, self._sorted.size - 1)] == rows)

    def _insert(self, rows: np.ndarray) -> None:
        """Adds unique ids not held yet, keeping the ids sorted: one O(N) copy.  ``np.union1d`` re-sorts
        (hashes) every held id: 0.66 s for one added row at 1M rows on this 2-core host, against
        under 10 ms for this insert (``benchmarks/serve.py``'s 'add 1 row ms' column)."""
        if rows.size:
            rows = np.sort(rows)
            self._sorted = np.insert(self._sorted, np.searchsorted(self._sorted, rows), rows)

    def queries(self, queries, k: int) -> np.ndarray:
        q = np.asarray(queries, np.float32)
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise IndexBackendError(f"search() got queries of shape {q.shape}: pass float32 [Q, {self.dim}].")
        if int(k) < 1:
            raise IndexBackendError(f"search() got k={k}: pass k >= 1.")
        return q


def padded(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``scores``/``rows`` ``[Q, k' <= k]`` widened to k columns with -inf / -1; a row < 0 scores -inf."""
    out_s, out_r = empty_results(rows.shape[0], k)
    w = min(k, rows.shape[1])
    out_s[:, :w], out_r[:, :w] = scores[:, :w], rows[:, :w]
    out_s[out_r < 0] = -np.inf
    return out_s, out_r
