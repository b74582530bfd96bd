"""Replay memory: iCaRL herding as in the official CVS code.

Source (``shared/spec/reference-implementation.md`` Sec. 4):
``utils/train_utils.py::icarl`` / ``addNewExemplars`` and ``train.py`` 116-125,
152-156, 379-391. After each session the pool = the session's gallery set
(eval transform) ∪ the previous exemplars is re-herded per class with quota
``floor(buffer / #classes in pool)``, on L2-normalised embeddings of the
session's best-val model.

This runs once per session on the host, so it is plain numpy.
"""

from __future__ import annotations

import numpy as np


def _normalize_rows(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """``F.normalize(x, p=2, dim=1)`` in numpy."""
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norm, eps).astype(x.dtype)


def herding_select(embeddings, m: int) -> np.ndarray:
    """Official ``addNewExemplars``: greedy herding on L2-normalised rows.

    μ = mean of the normalised rows (not re-normalised). Step k = 1..m picks, among
    the rows not yet picked, the z minimising ||μ − (S + z)/k||_2 with S the sum of
    the picked rows; ties go to the lowest row index (``np.argmin`` over the
    remaining rows in their original order, as after the official ``np.delete``).
    Stops when the rows run out, so ``m >= n`` returns a permutation of all rows.

    Returns int64 row indices in pick order. Arithmetic stays in the input's float
    dtype (the official code works in float32); integer input is promoted to float64.
    """
    z = np.asarray(embeddings)
    if not np.issubdtype(z.dtype, np.floating):
        z = z.astype(np.float64)
    if z.ndim != 2:
        raise ValueError("embeddings must be [n, d]")
    n = z.shape[0]
    steps = min(int(m), n)
    if steps <= 0:
        return np.zeros((0,), np.int64)
    z = _normalize_rows(z)
    mu = np.mean(z, axis=0)
    s = np.zeros_like(mu)
    taken = np.zeros((n,), bool)
    picks = np.empty((steps,), np.int64)
    for k in range(steps):
        dist = np.linalg.norm(mu - (s + z) / (k + 1), axis=1)
        dist[taken] = np.inf
        idx = int(np.argmin(dist))
        picks[k] = idx
        taken[idx] = True
        s = s + z[idx]
    return picks


def rebuild_memory(embeddings, labels, source_ids, budget: int):
    """Official ``icarl``: re-herd the whole pool per class with quota
    ``floor(budget / number of distinct classes in the pool)``.

    ``embeddings`` [N,d] (raw or normalised), ``labels`` [N], ``source_ids`` [N]
    (whatever identifies a stored item: dataset index, file name, ...). Within a
    class, rows keep the order they have in the pool, which only matters for tie
    breaks (official pool order: session gallery, then previous exemplars).

    Returns ``(selected_source_ids, selected_labels)`` ordered by class (ascending),
    then pick order. The total never exceeds ``budget`` (classes with fewer items
    than the quota keep all of them). Raises ``ValueError`` if ``budget`` is
    smaller than the number of classes (the quota would be 0).
    """
    emb = np.asarray(embeddings)
    lab = np.asarray(labels).reshape(-1)
    ids = np.asarray(source_ids)
    if emb.ndim != 2 or emb.shape[0] != lab.shape[0] or ids.shape[0] != lab.shape[0]:
        raise ValueError("embeddings [N,d], labels [N] and source_ids [N] must agree in N")
    classes = np.unique(lab)
    num_classes = int(classes.size)
    budget = int(budget)
    if budget < num_classes:
        raise ValueError(
            f"memory_budget={budget} must be at least the number of classes seen, "
            f"N={num_classes} (otherwise the per-class quota floor(budget/N) is 0)"
        )
    if num_classes == 0:
        return ids[:0], lab[:0]
    quota = budget // num_classes
    sel_rows = []
    for c in classes:
        rows = np.flatnonzero(lab == c)
        sel_rows.append(rows[herding_select(emb[rows], quota)])
    order = np.concatenate(sel_rows)
    return ids[order], lab[order]
