"""Approximate top-K with faiss on a CPU, for galleries too big to scan exactly per query.

* ``faiss-hnsw``: an HNSW graph (``IndexHNSWFlat``, inner product on normalised rows = cosine). No
  training; rows go in one by one, so a growing gallery costs nothing extra. Parameters: ``m`` (graph
  degree), ``ef_construction``, ``ef_search`` (recall against speed at query time).
* ``faiss-ivf``: an inverted file (``IndexIVFFlat``): the rows are split over ``nlist`` clusters and a
  query scans ``nprobe`` of them. Its clusters are trained once, on the rows of the first ``add`` (the
  gallery a server starts with); later rows are assigned to them and never move. ``nlist`` defaults to
  about 4 sqrt(N) of that first add, at most N / 39 (faiss's minimum of training points per cluster).

Neither is exact: ``registry.measured_recall`` says how close to exact search one is on a gallery.
Scores are the exact cosine of the rows returned (faiss's ``Flat`` storage keeps the vectors).
"""

from __future__ import annotations

import numpy as np

from cvs_jax.errors import IndexBackendError
from cvs_jax.index.base import RowIds, empty_results, normalized, padded


def _faiss():
    try:
        import faiss
    except ImportError as e:  # faiss-cpu is in the dev and bench extras
        raise IndexBackendError(f"the faiss indexes need faiss ({e}); pip install faiss-cpu.") from None
    return faiss


class _FaissIndex:
    def __init__(self, dim: int):
        self._ids = RowIds(dim)
        self._index = None

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, rows, embeddings, arrival_session, model_session) -> None:
        rows, emb, _, _ = self._ids.new(rows, embeddings, arrival_session, model_session)
        if rows.size:
            x = normalized(emb)
            if self._index is None:
                self._index = self._build(x)
            self._index.add_with_ids(x, rows)

    def search(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        q = self._ids.queries(queries, k)
        if self._index is None or not q.shape[0]:
            return empty_results(q.shape[0], k)
        scores, rows = self._index.search(normalized(q), min(int(k), len(self)))
        return padded(scores.astype(np.float32), rows.astype(np.int64), int(k))

    def _build(self, first_rows: np.ndarray):
        raise NotImplementedError


class HNSWIndex(_FaissIndex):
    """``faiss-hnsw``: ``IndexHNSWFlat`` under row ids (``IndexIDMap``)."""

    def __init__(self, dim: int, *, m: int = 32, ef_construction: int = 200, ef_search: int = 128):
        super().__init__(dim)
        self.m, self.ef_construction, self.ef_search = int(m), int(ef_construction), int(ef_search)

    def _build(self, first_rows):
        faiss = _faiss()
        graph = faiss.IndexHNSWFlat(self._ids.dim, self.m, faiss.METRIC_INNER_PRODUCT)
        graph.hnsw.efConstruction, graph.hnsw.efSearch = self.ef_construction, self.ef_search
        self._inner = graph  # the id map refers to it: keep it alive
        return faiss.IndexIDMap(graph)


class IVFIndex(_FaissIndex):
    """``faiss-ivf``: ``IndexIVFFlat`` with an inner-product quantizer, trained on the first add."""

    def __init__(self, dim: int, *, nlist: int | None = None, nprobe: int = 16):
        super().__init__(dim)
        self.nlist, self.nprobe = nlist, int(nprobe)

    def _build(self, first_rows):
        faiss = _faiss()
        n = first_rows.shape[0]
        nlist = self.nlist if self.nlist is not None else int(round(4 * np.sqrt(n)))
        nlist = max(1, min(int(nlist), n // 39 or 1))
        quantizer = faiss.IndexFlatIP(self._ids.dim)
        ivf = faiss.IndexIVFFlat(quantizer, self._ids.dim, nlist, faiss.METRIC_INNER_PRODUCT)
        ivf.cp.seed = 0  # the same clusters for the same rows
        ivf.train(first_rows)
        ivf.nprobe = min(self.nprobe, nlist)
        self.nlist = nlist
        self._inner = (quantizer, ivf)  # the indexes above refer to them: keep them alive
        return faiss.IndexIDMap(ivf)
