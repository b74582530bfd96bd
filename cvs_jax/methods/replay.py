"""Replay memory: iCaRL herding as in the official CVS code, reservoir sampling, and Rainbow Memory's
uncertainty-based selection as in the author's Rainbow-Memory fork.

Source (the official ivclab/CVS code):
``utils/train_utils.py::icarl`` / ``addNewExemplars`` and ``train.py`` 116-125,
152-156, 379-391. After each session the pool = the session's gallery set
(eval transform) ∪ the previous exemplars is re-herded per class with quota
``floor(buffer / #classes in pool)``, on L2-normalised embeddings of the
session's best-val model.

This runs once per session on the host, so it is plain numpy; randomness comes from the caller's
seeded ``np.random.Generator``.
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


def reservoir_update(memory_ids, seen: int, stream_ids, budget: int, rng: np.random.Generator):
    """Reservoir sampling (Vitter's algorithm R) of a stream into a memory of ``budget`` slots.

    Every stream item seen so far is in the memory with probability budget/seen, whatever
    the session it came from (the RWalk memory of the Rainbow-Memory code base).
    Returns ``(memory_ids, seen)``.
    """
    mem = list(np.asarray(memory_ids))
    for item in np.asarray(stream_ids):
        if len(mem) < budget:
            mem.append(item)
        else:
            j = int(rng.integers(0, seen + 1))
            if j < budget:
                mem[j] = item
        seen += 1
    return np.asarray(mem, dtype=np.asarray(stream_ids).dtype), seen


def _class_quota(labels: np.ndarray, budget: int) -> tuple[np.ndarray, int]:
    """The classes of the candidates and the per-class quota ``budget // #classes``."""
    classes = np.unique(labels)
    if budget < classes.size:
        raise ValueError(f"memory_budget={budget} must be at least the number of classes seen, N={classes.size}")
    return classes, int(budget) // max(classes.size, 1)


def stride_rows(uncertainty, labels, budget: int) -> np.ndarray:
    """The fork's per-class rule (``finetune.py uncertainty_sampling``): quota = budget // #classes; a
    class with <= quota candidates keeps them all; otherwise its candidates are sorted by uncertainty in
    **ascending** order (pandas ``sort_values`` default: most certain first) and every
    ``(len // quota)``-th is taken from the first one on, the first ``quota`` of those.  So the
    memory spans the ranking from the most certain candidate towards the uncertain end; the last pick
    has rank ``(quota - 1) * (len // quota)``, so the most uncertain candidates beyond it are never
    taken (up to half of the class when ``len < 2 * quota``).

    Ties keep the candidates' order (stable sort). Returns candidate rows, by class (ascending).
    """
    unc = np.asarray(uncertainty, np.float64)
    lab = np.asarray(labels).reshape(-1)
    classes, quota = _class_quota(lab, budget)
    rows = []
    for c in classes:
        members = np.flatnonzero(lab == c)
        if members.size <= quota:
            rows.append(members)
            continue
        ranked = members[np.argsort(unc[members], kind="stable")]
        rows.append(ranked[:: members.size // quota][:quota])
    return np.concatenate(rows) if rows else np.zeros((0,), np.int64)


def spread_rows(uncertainty, labels, budget: int) -> np.ndarray:
    """Earlier cvs-jax rule: per class, ``budget // #classes`` candidates evenly spaced (``linspace``)
    along the ascending uncertainty ranking, both ends included. Returns candidate rows, by class."""
    unc = np.asarray(uncertainty, np.float64)
    lab = np.asarray(labels).reshape(-1)
    classes, quota = _class_quota(lab, budget)
    rows = []
    for c in classes:
        members = np.flatnonzero(lab == c)
        ranked = members[np.argsort(unc[members], kind="stable")]
        if ranked.size <= quota:
            rows.append(ranked)
        else:
            rows.append(ranked[np.unique(np.linspace(0, ranked.size - 1, quota).round().astype(int))])
    return np.concatenate(rows) if rows else np.zeros((0,), np.int64)


def random_class_rows(labels, budget: int, rng: np.random.Generator) -> np.ndarray:
    """The fork's first-task memory (``equal_class_sampling``): per class ``min(quota, len)`` candidates
    drawn at random without replacement, quota = budget // #classes. Returns candidate rows, by class."""
    lab = np.asarray(labels).reshape(-1)
    classes, quota = _class_quota(lab, budget)
    rows = []
    for c in classes:
        members = np.flatnonzero(lab == c)
        rows.append(rng.choice(members, size=min(quota, members.size), replace=False))
    return np.concatenate(rows).astype(np.int64) if rows else np.zeros((0,), np.int64)


def refill_rows(chosen, num_candidates: int, budget: int, rng: np.random.Generator) -> np.ndarray:
    """The fork's "breaking the equilibrium": the ``budget - len(chosen)`` unused slots (classes with
    fewer candidates than the quota, the floor of ``budget // #classes``) are filled with candidates
    drawn at random, without replacement, from those not chosen; all of them when fewer remain (the fork
    then keeps every candidate). Returns ``chosen`` followed by the drawn rows."""
    chosen = np.asarray(chosen, np.int64)
    remaining = np.setdiff1d(np.arange(num_candidates), chosen)  # candidate order
    k = min(int(budget) - chosen.size, remaining.size)
    if k <= 0:
        return chosen
    return np.concatenate([chosen, rng.choice(remaining, size=k, replace=False).astype(np.int64)])


UNCERTAINTY_SELECTIONS = ("stride", "spread")


def uncertainty_select(uncertainty, labels, source_ids, budget: int, *, selection: str = "stride", refill_rng=None):
    """Rainbow Memory's diversity-aware selection over the candidates (previous session + memory).

    ``selection="stride"``: the fork's rule (:func:`stride_rows`); ``"spread"``: evenly spaced along
    the ranking (:func:`spread_rows`). ``refill_rng``: a ``np.random.Generator`` fills the unused slots
    at random (:func:`refill_rows`, the fork); ``None`` leaves them empty.

    Returns ``(selected_source_ids, selected_labels)`` ordered by class then rank, refills last.
    """
    lab = np.asarray(labels).reshape(-1)
    ids = np.asarray(source_ids)
    if selection == "stride":
        rows = stride_rows(uncertainty, lab, budget)
    elif selection == "spread":
        rows = spread_rows(uncertainty, lab, budget)
    else:
        raise ValueError(f"selection={selection!r} is unknown; choose one of {UNCERTAINTY_SELECTIONS}")
    if refill_rng is not None:
        rows = refill_rows(rows, lab.shape[0], budget, refill_rng)
    return ids[rows], lab[rows]


def random_class_select(labels, source_ids, budget: int, rng: np.random.Generator, *, refill: bool = True):
    """The fork's first-task memory: random equal shares per class (:func:`random_class_rows`), then
    the unused slots refilled at random (:func:`refill_rows`) when ``refill``.

    Returns ``(selected_source_ids, selected_labels)``: by class, refills last.
    """
    lab = np.asarray(labels).reshape(-1)
    rows = random_class_rows(lab, budget, rng)
    if refill:
        rows = refill_rows(rows, lab.shape[0], budget, rng)
    return np.asarray(source_ids)[rows], lab[rows]


def prediction_uncertainty(predictions: np.ndarray) -> np.ndarray:
    """Rainbow's uncertainty from ``predictions[T, N]`` (labels predicted under T perturbations):
    1 - (votes of the most-voted label) / T (the fork's ``variance_ratio``)."""
    preds = np.asarray(predictions)
    t, n = preds.shape
    votes = np.zeros(n)
    for i in range(n):
        votes[i] = np.bincount(preds[:, i]).max()
    return 1.0 - votes / t
