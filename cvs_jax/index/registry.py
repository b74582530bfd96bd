"""The index backends by name (``--index``), and how close an approximate one is to exact search."""

from __future__ import annotations

import numpy as np

from cvs_jax.errors import IndexBackendError
from cvs_jax.index.base import Index

INDEXES = ("exact", "faiss-hnsw", "faiss-ivf", "milvus")


def make_index(kind: str, dim: int, generation: int = 0, **options) -> Index:
    """A new (or, for Milvus, reopened) index of ``dim``-dimensional rows. ``generation``: the session
    whose re-embedding the gallery is (``joint``; 0 for a gallery that only appends): a store that
    outlives the process keeps each in a collection of its own, an index in memory is new anyway.
    Options by kind: ``exact``: mesh, gallery_block, query_chunk; ``faiss-hnsw``: m, ef_construction,
    ef_search; ``faiss-ivf``: nlist, nprobe; ``milvus``: uri (required), collection, token, index_type,
    index_params, search_params, timeout_s."""
    if kind == "exact":
        from cvs_jax.index.exact import ExactIndex

        return ExactIndex(dim, **options)
    if kind == "faiss-hnsw":
        from cvs_jax.index.faiss_backends import HNSWIndex

        return HNSWIndex(dim, **options)
    if kind == "faiss-ivf":
        from cvs_jax.index.faiss_backends import IVFIndex

        return IVFIndex(dim, **options)
    if kind == "milvus":
        from cvs_jax.index.milvus import MilvusIndex

        if not options.get("uri"):
            raise IndexBackendError("--index milvus needs --milvus-uri (a local file for Milvus Lite, or http://...).")
        return MilvusIndex(dim, generation=generation, **options)
    raise IndexBackendError(f"unknown index {kind!r}; pass one of {', '.join(INDEXES)}.")


def measured_recall(index: Index, exact: Index, queries: np.ndarray, k: int) -> float:
    """recall@k of ``index`` against exact search: the mean, over ``queries``, of the fraction of the
    exact top-k rows (those that exist) that ``index``'s top-k also returns. 1.0 for an exact index."""
    _, want = exact.search(queries, k)
    _, got = index.search(queries, k)
    hits = [np.isin(w[w >= 0], g[g >= 0]).sum() for w, g in zip(want, got)]
    total = int((want >= 0).sum())
    return float(np.sum(hits) / total) if total else 1.0
