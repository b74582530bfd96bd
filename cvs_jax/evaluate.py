"""Retrieval metric: recall@K of queries against a gallery by exact cosine search.

Equivalent to the official faiss ``IndexFlatIP`` search on L2-normalised vectors
(spec §5): recall@K is the fraction of queries for which at least one of the K
most similar gallery rows carries the query's label.  The search is one jitted
matmul + ``top_k`` per chunk of queries, so memory stays bounded by
``chunk x gallery`` scores.  Gallery rows are padded to a multiple of
``gallery_bucket`` (padded rows score -inf) so that a growing gallery recompiles
only when it crosses a bucket boundary.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np


def _normalize(x):
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


@functools.partial(jax.jit, static_argnames=("k",))
def _topk_labels(queries, gallery, gallery_labels, gallery_valid, k: int):
    scores = _normalize(queries) @ _normalize(gallery).T
    scores = jnp.where(gallery_valid[None, :], scores, -jnp.inf)
    _, idx = jax.lax.top_k(scores, k)
    return gallery_labels[idx]


def _pad_rows(x: np.ndarray, rows: int, fill=0):
    if x.shape[0] == rows:
        return x
    pad = np.full((rows - x.shape[0],) + x.shape[1:], fill, dtype=x.dtype)
    return np.concatenate([x, pad])


def topk_labels(query_emb, gallery_emb, gallery_labels, k: int, *, chunk: int = 1024,
                gallery_bucket: int = 4096) -> np.ndarray:
    """Labels of the ``k`` nearest gallery rows (cosine) for every query, ``[Q, k]``."""
    gallery_emb = np.asarray(gallery_emb, np.float32)
    gallery_labels = np.asarray(gallery_labels, np.int32)
    n = gallery_emb.shape[0]
    if n == 0:
        raise ValueError("the gallery is empty: nothing to search")
    k_eff = min(k, n)
    rows = -(-n // gallery_bucket) * gallery_bucket
    g = jnp.asarray(_pad_rows(gallery_emb, rows))
    gl = jnp.asarray(_pad_rows(gallery_labels, rows, fill=-1))
    valid = jnp.asarray(np.arange(rows) < n)
    query_emb = np.asarray(query_emb, np.float32)
    out = []
    for start in range(0, query_emb.shape[0], chunk):
        q = query_emb[start:start + chunk]
        qp = _pad_rows(q, chunk) if q.shape[0] < chunk else q
        out.append(np.asarray(_topk_labels(jnp.asarray(qp), g, gl, valid, k_eff))[: q.shape[0]])
    labels = np.concatenate(out) if out else np.zeros((0, k_eff), np.int32)
    if k_eff < k:  # fewer gallery rows than k: the missing ranks can never match.
        labels = np.concatenate([labels, np.full((labels.shape[0], k - k_eff), -1, np.int32)], axis=1)
    return labels


def recall_at_k(query_emb, query_labels, gallery_emb, gallery_labels,
                ks: Sequence[int] = (1, 2, 4), *, chunk: int = 1024) -> dict[int, float]:
    """``{k: fraction of queries with a same-label row among their k nearest}``."""
    query_labels = np.asarray(query_labels)
    if query_labels.shape[0] == 0:
        raise ValueError("no queries to evaluate")
    nearest = topk_labels(query_emb, gallery_emb, gallery_labels, max(ks), chunk=chunk)
    hits = nearest == query_labels[:, None]
    return {int(k): float(np.mean(np.any(hits[:, :k], axis=1))) for k in ks}


def average_recall(per_session: Sequence[dict[int, float]]) -> dict[int, float]:
    """AR@K: the mean over sessions of the per-session test recall@K (spec §5)."""
    ks = per_session[0].keys()
    return {k: float(np.mean([r[k] for r in per_session])) for k in ks}
