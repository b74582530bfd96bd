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
    return _ap_of_scores(jnp.matmul(q, g.T, precision=jax.lax.Precision.HIGHEST), q_labels, g_labels)


@jax.jit
def _scores_ap(scores: jax.Array, q_labels: jax.Array, g_labels: jax.Array) -> jax.Array:
    return _ap_of_scores(scores, q_labels, g_labels)


def _ap_of_scores(scores: jax.Array, q_labels: jax.Array, g_labels: jax.Array) -> jax.Array:
    order = jnp.argsort(-scores, axis=1, stable=True)  # best first, ties by gallery index
    rel = (g_labels[order] == q_labels[:, None]).astype(jnp.float32)
    ranks = jnp.arange(1, scores.shape[1] + 1, dtype=jnp.float32)
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


def mapped_mean_average_precision(query_emb, query_labels, parts, maps, model_session: int, *, chunk: int = 256):
    """mAP when each gallery part is scored with the queries mapped down to its session (``query_maps``):
    ``parts`` = ``[(session j, rows [N_j, D], labels [N_j])]`` in gallery order; the cosine scores of the
    mapped queries against each part's rows are ranked together (ties by gallery row).  None: no query has
    a relevant row."""
    from cvs_jax.retrieval import query_maps  # pylint: disable=g-import-not-at-top (query_maps imports topk)

    g_labels = jnp.asarray(np.concatenate([np.asarray(p[2]).reshape(-1) for p in parts]).astype(np.int32))
    if g_labels.shape[0] == 0:
        raise ValueError("the gallery is empty: nothing to rank")
    rows = {i: _normalize(p[1]) for i, p in enumerate(parts)}
    q_labels = np.asarray(query_labels).reshape(-1).astype(np.int32)
    out = np.empty(q_labels.shape[0], np.float64)
    for start in range(0, q_labels.shape[0], chunk):
        sl = slice(start, start + chunk)
        n = q_labels[sl].shape[0]
        mapped = query_maps.map_queries(maps, np.asarray(query_emb)[sl], model_session, [p[0] for p in parts])
        scores = np.concatenate([_normalize(mapped[p[0]]) @ rows[i].T for i, p in enumerate(parts)], axis=1)
        pad = chunk - n
        scores = np.concatenate([scores, np.zeros((pad, scores.shape[1]), np.float32)])
        lc = np.concatenate([q_labels[sl], np.full(pad, -1, np.int32)])
        out[sl] = np.asarray(_scores_ap(jnp.asarray(scores, jnp.float32), jnp.asarray(lc), g_labels))[:n]
    out = out[~np.isnan(out)]
    return float(np.mean(out)) if out.size else None
