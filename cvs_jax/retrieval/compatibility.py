"""Backward-compatibility matrix: how well model i searches the gallery rows made by session j.

Entry [i, j] (i >= j) is recall@1 of test queries embedded by the selected model of
session i against only the gallery rows added in session j (still embedded by model
j), for the queries whose class has rows in that part.  The diagonal is ordinary
same-model retrieval; entries below it measure backward compatibility, the property
CVS is built for.  Entries i < j (a model searching a future gallery) are NaN.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from cvs_jax.retrieval import query_maps, topk
from cvs_jax.retrieval.query_maps import QueryMap
from cvs_jax.rundir.gallery import Gallery, RowConcat

MIN_PART_BLOCK = 128


def part_block(rows) -> int:
    """The scan block for searching one gallery part: its rows rounded up to a power of two (at least
    ``MIN_PART_BLOCK``), at most the default block.  The matrix and the flips search (T + 1) T / 2 + T - 1
    small galleries for T sessions, at the end of every session; padded to the CPU's 4,096-row block, one
    search of 312 queries in a 40-row part took 6.6 ms, with a 128-row block 0.8 ms.  Measured by
    ``benchmarks/compat_matrix.py`` (40 rows a session, same results): 3.3x faster at 52 and 104 sessions
    (4.4 -> 1.4 s and 22.0 -> 6.6 s).  Each part size crossing a power of two compiles once."""
    return min(topk.default_block(), topk.pow2(max(len(rows), MIN_PART_BLOCK)))


def _part_rows(gallery: Gallery, sessions) -> tuple[RowConcat, np.ndarray] | None:
    """The rows (and their labels) of the parts made in ``sessions``, or None when there are none."""
    parts = [p for p in gallery.parts if p.session in sessions]
    if not parts:
        return None
    return RowConcat([p.embeddings for p in parts]), np.concatenate([p.labels for p in parts])


class FirstParts:
    """The first session whose gallery part holds each class: whether a part made in sessions <= i holds any of
    some queries' classes, in O(queries).  Looking through every earlier part for each model was O(T^2) per
    matrix: 1.97-2.11 s against 5-6 ms for 365 sessions of three classes whose newest arrival holds only new
    ones (a one-off timing on this 2-core host, same answers)."""

    def __init__(self, gallery: Gallery):
        labels = np.concatenate([p.labels for p in gallery.parts] or [np.zeros(0, np.int64)]).astype(np.int64)
        sessions = np.concatenate([np.full(len(p), p.session) for p in gallery.parts] or [np.zeros(0, np.int64)])
        self._first = np.full(int(labels.max(initial=-1)) + 1, np.iinfo(np.int64).max)
        np.minimum.at(self._first, labels[labels >= 0], sessions[labels >= 0])

    def any_by(self, labels: np.ndarray, i: int) -> bool:
        """Whether a part of a session <= i holds a class of ``labels`` (model i's row scores one of them)."""
        labels = np.asarray(labels, np.int64)
        known = labels[(labels >= 0) & (labels < len(self._first))]
        return bool((self._first[known] <= i).any())


def row_counts(
    i: int, gallery: Gallery, queries: np.ndarray, query_labels: np.ndarray, maps: Mapping[int, QueryMap] | None = None
) -> dict[int, tuple[int, int]]:
    """Model i's row of the matrix as counts, ``{j: (queries right at top 1, queries scored)}`` for each part
    j <= i that holds a class of the queries: ``queries`` are model i's embeddings of ``query_labels``' images.
    Counts of disjoint sets of queries add up to the counts of their union (``engine.compat_counts``)."""
    out = {}
    for j in range(i + 1):
        found = _part_rows(gallery, {j})
        if found is None:
            continue
        rows, labels = found
        keep = np.isin(query_labels, np.unique(labels))
        if not keep.any():
            continue
        qj = queries if maps is None else query_maps.map_queries(maps, queries, i, [j])[j]
        top = topk.topk_labels(qj[keep], rows, labels, 1, gallery_bucket=part_block(rows))[:, 0]
        out[j] = (int(np.sum(top == query_labels[keep])), int(keep.sum()))
    return out


def compatibility_matrix(
    num_sessions: int,
    gallery: Gallery,
    embed_queries: Callable[[int], np.ndarray],
    query_labels: np.ndarray,
    maps: Mapping[int, QueryMap] | None = None,
) -> np.ndarray:
    """``embed_queries(i)`` embeds all ``query_labels``' images with the model of session i.  ``maps``
    (``query_maps``, by session): model i's queries reach part j through the chain i -> ... -> j."""
    m = np.full((num_sessions, num_sessions), np.nan)
    first = FirstParts(gallery)
    for i in range(num_sessions):
        if first.any_by(query_labels, i):
            for j, (hits, n) in row_counts(i, gallery, embed_queries(i), query_labels, maps).items():
                m[i, j] = hits / n
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


# results.json's key of BC (``mean_drop`` in recall@1 points, as shown everywhere); runs written before it
# held the fraction under ``compatibility_mean_drop``, which ``bc_points`` still reads.
BC_KEY = "compatibility_bc_points"
_OLD_BC_KEY = "compatibility_mean_drop"


def bc_points(results: dict) -> float | None:
    """BC of a ``results.json`` in recall@1 points (an older file's fraction converted)."""
    if BC_KEY in results:
        return results[BC_KEY]
    old = results.get(_OLD_BC_KEY)
    return None if old is None else 100 * old


def mean_flips(flips) -> float | None:
    """The mean negative-flip rate over a run's updates (``negative_flips``; updates without a query left out)."""
    values = [v for v in flips or () if v is not None]
    return float(np.mean(values)) if values else None


# What the matrix's queries are, said wherever its diagonal is shown beside a session's R@1.
QUERIES_NOTE = (
    "its queries are the last session's test queries of part j's classes, searched against part j's rows alone; "
    "a session's R@1 searches that session's test queries against the whole gallery of the time, so the "
    "diagonal can differ from it"
)


def _lower(matrix) -> np.ndarray:
    return np.asarray([[np.nan if v is None else v for v in row] for row in matrix], np.float64)


AC_TIE_RULES = ("fail", "pass")  # a tie M[i, j] == M[j, j]: iamcl2r fails the pair, CoReS and CL2R pass it


def average_compatibility(matrix, ties: str = "fail") -> float | None:
    """AC, the share of model updates that are empirically compatible (Biondi et al., "CL2R: Compatible
    Lifelong Learning Representations", ACM TOMM 2023, after Shen et al., "Towards Backward-Compatible
    Representation Learning", CVPR 2020): over the pairs j < i, the mean of 1[M[i, j] > M[j, j]] (model i
    searches part j's rows better than part j's own model did). 1: every later model is compatible with
    every earlier gallery. Pairs with a missing entry (no query of the part's classes) are left out
    (the paper divides by all T(T-1)/2 pairs); None when no pair is left.

    ``ties``: what a pair with M[i, j] == M[j, j] counts as.  ``"fail"`` is miccunifi/iamcl2r
    (``compatibility_metrics.py`` 8: a pair fails on ``<=``); ``"pass"`` is NiccoBiondi/cores-compatibility
    ``src/cores/metrics.py`` 9 and CompatibleLifelongRepresentation ``src/cl2r/metrics.py`` 9 (fails on ``<``)."""
    if ties not in AC_TIE_RULES:
        raise ValueError(f"ties={ties!r}; choose one of {list(AC_TIE_RULES)}")
    m = _lower(matrix)
    beats = np.greater if ties == "fail" else np.greater_equal
    wins = [beats(m[i, j], m[j, j]) for i in range(m.shape[0]) for j in range(i) if not np.isnan(m[i, j] + m[j, j])]
    return float(np.mean(wins)) if wins else None


def average_compatibility_rules(matrix) -> dict[str, float | None]:
    """AC under both tie rules: ``{"ties_fail": iamcl2r's, "ties_pass": CoReS/CL2R's}``; they differ only
    when an entry equals its diagonal (recall@1 on small parts ties often)."""
    return {f"ties_{rule}": average_compatibility(matrix, rule) for rule in AC_TIE_RULES}


def average_multimodel_accuracy(matrix) -> float | None:
    """AM (CL2R, as above): the mean of M[i, j] over j <= i, every model on every gallery it searches
    (the paper's 2 / (T(T+1)) sum; missing entries left out). None when the matrix is empty."""
    m = _lower(matrix)
    vals = [m[i, j] for i in range(m.shape[0]) for j in range(i + 1) if not np.isnan(m[i, j])]
    return float(np.mean(vals)) if vals else None


def negative_flip_rate(old_correct, new_correct) -> float:
    """The share of queries the old model answered right and the new model wrong (Yan et al.,
    "Positive-Congruent Training: Towards Regression-Free Model Updates", CVPR 2021, Eq. 1)."""
    old, new = np.asarray(old_correct, bool), np.asarray(new_correct, bool)
    return float(np.mean(old & ~new))


def flip_counts(
    i: int,
    gallery: Gallery,
    old: np.ndarray,
    new: np.ndarray,
    query_labels: np.ndarray,
    maps: Mapping[int, QueryMap] | None = None,
) -> tuple[int, int] | None:
    """The update from model i-1 to model i as counts, ``(queries right before and wrong after, queries
    scored)``: ``old`` and ``new`` are the two models' embeddings of ``query_labels``' images, searched against
    the rows before session i (parts of sessions < i, each embedded by its own model), the queries whose
    class has such rows.  None: no such query.  Counts of disjoint sets of queries add up."""
    found = _part_rows(gallery, set(range(i)))
    if found is None:
        return None
    rows, labels = found
    keep = np.isin(query_labels, np.unique(labels))
    if not keep.any():
        return None
    if maps is None:
        block = part_block(rows)
        top = [topk.topk_labels(q[keep], rows, labels, 1, gallery_bucket=block)[:, 0] for q in (old, new)]
    else:
        before = Gallery([p for p in gallery.parts if p.session < i], gallery.embed_dim)
        top = [query_maps.mapped_topk_labels(q[keep], before, maps, s, 1)[:, 0] for q, s in ((old, i - 1), (new, i))]
    right = [t == query_labels[keep] for t in top]
    return int(np.sum(right[0] & ~right[1])), int(keep.sum())


def negative_flips(
    num_sessions: int,
    gallery: Gallery,
    embed_queries: Callable[[int], np.ndarray],
    query_labels: np.ndarray,
    maps: Mapping[int, QueryMap] | None = None,
) -> list[float | None]:
    """NFR of each update, entry i-1 for models i-1 -> i: top-1 correctness of the queries whose class has
    rows in the gallery as it stood before session i (parts of sessions < i, each embedded by its own
    model), searched by model i-1 and then by model i against those same rows (``negative_flip_rate``).
    None: no such query.  ``maps`` (``query_maps``, by session): each model's queries reach part j through
    its chain to j."""
    out: list[float | None] = []
    for i in range(1, num_sessions):
        found = _part_rows(gallery, set(range(i)))
        if found is None or not np.isin(query_labels, np.unique(found[1])).any():
            out.append(None)
            continue
        counts = flip_counts(i, gallery, embed_queries(i - 1), embed_queries(i), query_labels, maps)
        out.append(None if counts is None else counts[0] / counts[1])
    return out


def format_matrix(matrix, flips=None) -> str:
    """The compatibility matrix as a table in % (row i: model of session i; column j: gallery rows of
    session j; ``-``: no entry), then its summaries BC (points), AC, AM and (``flips``: the run's
    ``negative_flip_rate``) NFR, in % as everywhere a person reads them."""
    if not matrix:
        return "compatibility: not computed yet (written when a run or update finishes)"
    n = len(matrix)
    head = "        " + "".join(f"{'rows S' + str(j + 1):>10}" for j in range(n))
    lines = ["compatibility (recall@1 in %; row: model of session i, column: gallery rows of session j):", head]
    for i, row in enumerate(matrix):
        cells = "".join(f"{'-' if v is None else f'{100 * v:.1f}':>10}" for v in row)
        lines.append(f"{'model S' + str(i + 1):<8}{cells}")
    lines.append(f"({QUERIES_NOTE})")
    bc, ac, am = mean_drop(matrix), average_compatibility(matrix), average_multimodel_accuracy(matrix)
    nfr = mean_flips(flips)
    summary = [] if bc is None else [f"BC {100 * bc:+.2f} points (newer models on old rows minus the rows' own model)"]
    if ac is not None:
        ac_pass = average_compatibility(matrix, ties="pass")  # never None where ac is not: the same pairs
        ties = ""
        if ac_pass is not None and ac_pass != ac:
            ties = f"; {100 * ac_pass:.1f} % if a tie with the part's own model passes, as CoReS counts"
        summary.append(  # in %, as AM and NFR beside it and compare's tables (results.json holds the share)
            f"AC {100 * ac:.1f} % (of later-model / earlier-part pairs, the later model beating the part's own model "
            f"on its rows{ties})"
        )
    if am is not None and n > 1:
        summary.append(f"AM {100 * am:.1f} % (every model on every part it searches)")
    if nfr is not None:
        summary.append(f"NFR {100 * nfr:.1f} % (queries right before an update and wrong after, mean over updates)")
    if summary:
        lines.append(", ".join(summary))
    return "\n".join(lines)
