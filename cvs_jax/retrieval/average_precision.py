"""mAP beside recall@K: the mean over queries of the average precision of the full cosine ranking.

For a query with R relevant gallery rows (same label), AP = (1/R) sum over the ranks k that hold a
relevant row of precision@k, on the whole gallery ranked by cosine similarity, ties in the order of
the gallery rows (the lowest index first, as ``topk``'s search).  Queries without a relevant row have
no AP and are left out of the mean (as the compatibility matrix leaves out queries whose class has no
row in a part).  The ranking is exact: the scores of a chunk of queries against every row are held at
once (``chunk x N``), fine for the demo and Tiny-ImageNet galleries, not for a 10M-row one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


@jax.jit
def _chunk_ap(q: jax.Array, q_labels: jax.Array, g: jax.Array, g_labels: jax.Array) -> jax.Array:
    scores = jnp.matmul(q, g.T, precision=jax.lax.Precision.HIGHEST)
    order = jnp.argsort(-scores, axis=1, stable=True)  # best first, ties by gallery index
    rel = (g_labels[order] == q_labels[:, None]).astype(jnp.float32)
    ranks = jnp.arange(1, g.shape[0] + 1, dtype=jnp.float32)
    hits = jnp.sum(rel, axis=1)
    ap = jnp.sum(rel * jnp.cumsum(rel, axis=1) / ranks, axis=1) / jnp.maximum(hits, 1.0)
    return jnp.where(hits > 0, ap, jnp.nan)


def _normalize(x) -> np.ndarray:
    x = np.asarray(x, np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def average_precisions(query_emb, query_labels, gallery_emb, gallery_labels, *, chunk: int = 256) -> np.ndarray:
    """AP of every query [Q] (NaN: no relevant row in the gallery)."""
    g = jnp.asarray(_normalize(gallery_emb))
    g_labels = jnp.asarray(np.asarray(gallery_labels).reshape(-1), jnp.int32)
    if g.shape[0] == 0:
        raise ValueError("the gallery is empty: nothing to rank")
    q = _normalize(query_emb)
    q_labels = np.asarray(query_labels).reshape(-1).astype(np.int32)
    out = np.empty(q.shape[0], np.float64)
    for start in range(0, q.shape[0], chunk):
        rows = slice(start, start + chunk)
        n = q[rows].shape[0]
        pad = chunk - n  # one compiled shape per gallery size
        qc = np.concatenate([q[rows], np.zeros((pad, q.shape[1]), np.float32)])
        lc = np.concatenate([q_labels[rows], np.full(pad, -1, np.int32)])
        out[rows] = np.asarray(_chunk_ap(jnp.asarray(qc), jnp.asarray(lc), g, g_labels))[:n]
    return out


def mean_average_precision(query_emb, query_labels, gallery_emb, gallery_labels, *, chunk: int = 256) -> float | None:
    """mAP over the queries that have a relevant row; None when none has."""
    ap = average_precisions(query_emb, query_labels, gallery_emb, gallery_labels, chunk=chunk)
    ap = ap[~np.isnan(ap)]
    return float(np.mean(ap)) if ap.size else None
