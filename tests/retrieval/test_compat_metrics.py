"""The compatibility summaries beside AR@K (AC, AM, negative flips) against hand-computed values."""

import numpy as np
import pytest

from cvs_jax.retrieval import compatibility
from cvs_jax.rundir.gallery import Gallery, GalleryPart

# row i: model of session i; column j: gallery rows of session j (None: a model never searches a later part)
M = [
    [0.60, None, None],
    [0.65, 0.70, None],
    [0.50, 0.70, 0.80],
]


def test_average_compatibility_by_hand():
    # pairs (i, j): (1, 0) 0.65 > 0.60 yes; (2, 0) 0.50 > 0.60 no; (2, 1) 0.70 > 0.70 no (strict): 1 of 3
    assert compatibility.average_compatibility(M) == pytest.approx(1 / 3)
    assert compatibility.average_compatibility([[0.5]]) is None  # one session: no update to judge
    # a pair with a missing entry is left out, not counted as incompatible
    assert compatibility.average_compatibility([[0.5, None], [None, 0.7]]) is None
    assert compatibility.average_compatibility([[0.5, None], [0.6, 0.7]]) == 1.0


def test_average_multimodel_accuracy_by_hand():
    # the six entries on and below the diagonal
    assert compatibility.average_multimodel_accuracy(M) == pytest.approx((0.6 + 0.65 + 0.7 + 0.5 + 0.7 + 0.8) / 6)
    assert compatibility.average_multimodel_accuracy([[None]]) is None


def test_the_summaries_are_printed_under_the_matrix():
    """AC in %, as AM beside it, the run page and compare's tables show it (it was a share, 0.33, here alone);
    the tie-passing count too (pair (2, 1) ties: 2 of 3 pass)."""
    text = compatibility.format_matrix(M)
    assert "AC 33.3 % (of later-model / earlier-part pairs" in text and "AM 65.8 %" in text
    assert "; 66.7 % if a tie with the part's own model passes" in text
    assert "AC" not in compatibility.format_matrix([[0.5]])


def test_negative_flip_rate_by_hand():
    old = [True, True, False, False, True]
    new = [True, False, True, False, False]
    assert compatibility.negative_flip_rate(old, new) == pytest.approx(2 / 5)  # queries 1 and 4


def test_negative_flips_of_each_update():
    """Two sessions' parts in 2-d; model 1 moves class 1's query away from its rows: one flip of two."""
    e = np.eye(2, dtype=np.float32)
    part0 = GalleryPart(e[[0, 1]], np.array([0, 1], np.int32), np.array([0, 1]), session=0)
    part1 = GalleryPart(e[[0]], np.array([2], np.int32), np.array([2]), session=1)
    gallery = Gallery([part0, part1], 2)
    labels = np.array([0, 1, 2])  # class 2 has no rows before session 1: left out of the first update
    queries = {0: e[[0, 1, 0]], 1: np.array([[1, 0], [1, 0.1], [1, 0]], np.float32)}
    flips = compatibility.negative_flips(2, gallery, lambda i: queries[i], labels)
    assert flips == [pytest.approx(0.5)]
