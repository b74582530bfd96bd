"""Backward-compatibility matrix: how well model i searches the gallery rows made by session j.

Entry [i, j] (i >= j) is recall@1 of test queries embedded by the selected model of
session i against only the gallery rows added in session j (still embedded by model
j), for the queries whose class has rows in that part.  The diagonal is ordinary
same-model retrieval; entries below it measure backward compatibility, the property
CVS is built for.  Entries i < j (a model searching a future gallery) are NaN.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from cvs_jax.retrieval import topk
from cvs_jax.retrieval.gallery import Gallery, RowConcat


def compatibility_matrix(
    num_sessions: int, gallery: Gallery, embed_queries: Callable[[int], np.ndarray], query_labels: np.ndarray
) -> np.ndarray:
    """``embed_queries(i)`` embeds all ``query_labels``' images with the model of session i."""
    m = np.full((num_sessions, num_sessions), np.nan)
    for i in range(num_sessions):
        q = None
        for j in range(i + 1):
            parts = [p for p in gallery.parts if p.session == j]
            if not parts:
                continue
            labels = np.concatenate([p.labels for p in parts])
            keep = np.isin(query_labels, np.unique(labels))
            if not keep.any():
                continue
            q = embed_queries(i) if q is None else q
            m[i, j] = topk.recall_at_k(
                q[keep], query_labels[keep], RowConcat([p.embeddings for p in parts]), labels, ks=(1,)
            )[1]
    return m


def mean_drop(matrix) -> float | None:
    """The backward-compatibility summary reported beside AR@K: the mean over old gallery parts j
    of (mean over newer models i > j of M[i, j]) − M[j, j], i.e. how much recall@1 on part j's rows
    a newer model loses against part j's own model (0: fully compatible; negative: rows lost).
    Entries that are None/NaN (no query of the part's classes) are left out; None when no pair is
    left (one session)."""
    m = np.asarray([[np.nan if v is None else v for v in row] for row in matrix], np.float64)
    per_part = []
    for j in range(m.shape[0]):
        newer = m[j + 1 :, j]
        newer = newer[~np.isnan(newer)]
        if newer.size and not np.isnan(m[j, j]):
            per_part.append(newer.mean() - m[j, j])
    return float(np.mean(per_part)) if per_part else None


def format_matrix(matrix) -> str:
    """The compatibility matrix as a table in % (row i: model of session i; column j: gallery rows of
    session j; ``-``: no entry)."""
    if not matrix:
        return "compatibility: not computed yet (written when a run or update finishes)"
    n = len(matrix)
    head = "        " + "".join(f"{'rows S' + str(j + 1):>10}" for j in range(n))
    lines = ["compatibility (recall@1 in %; row: model of session i, column: gallery rows of session j):", head]
    for i, row in enumerate(matrix):
        cells = "".join(f"{'-' if v is None else f'{100 * v:.1f}':>10}" for v in row)
        lines.append(f"{'model S' + str(i + 1):<8}{cells}")
    return "\n".join(lines)
