"""The compatibility matrix and the negative flips on a hand-made gallery, against numpy brute force."""

from __future__ import annotations

import numpy as np
import pytest

from cvs_jax.retrieval import compatibility, topk
from cvs_jax.rundir.gallery import Gallery, GalleryPart

SESSIONS, DIM = 3, 6


def _gallery(repeat: int = 1):
    """Three sessions' parts whose classes overlap (class 1 in every session, class 2 in sessions 0 and 2),
    each embedded at random; queries of every class embedded by each model at random.  ``repeat``: each
    part's labels that many times over (5 x ``repeat`` rows a part)."""
    rng = np.random.default_rng(7)
    labels = [np.tile(lab, repeat) for lab in ([0, 0, 1, 1, 2], [1, 1, 3, 3, 3], [2, 1, 4, 4, 2])]
    parts = [
        GalleryPart(rng.normal(size=(len(lab), DIM)).astype(np.float32), lab.astype(np.int32), np.arange(len(lab)), s)
        for s, lab in enumerate(labels)
    ]
    query_labels = np.repeat(np.arange(5), 4).astype(np.int32)
    queries = [rng.normal(size=(len(query_labels), DIM)).astype(np.float32) for _ in range(SESSIONS)]
    return Gallery(parts, DIM), queries, query_labels


def _top1(q, rows, labels):
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    rn = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return labels[np.argmax(qn @ rn.T, axis=1)]


def _reference_matrix(gallery, queries, query_labels, rows_of):
    m = np.full((SESSIONS, SESSIONS), np.nan)
    for i in range(SESSIONS):
        for j in range(i + 1):
            parts = [p for p in gallery.parts if rows_of(p.session, j)]
            labels = np.concatenate([p.labels for p in parts])
            keep = np.isin(query_labels, labels)
            rows = np.concatenate([p.embeddings for p in parts])
            m[i, j] = np.mean(_top1(queries[i][keep], rows, labels) == query_labels[keep])
    return m


@pytest.mark.parametrize("repeat", [1, 60])  # 5 and 300 rows a part (blocks of 128, 512 and 1,024 rows)
def test_matrix_column_j_is_session_j_rows_alone(repeat):
    gallery, queries, query_labels = _gallery(repeat)
    got = compatibility.compatibility_matrix(SESSIONS, gallery, lambda i: queries[i], query_labels)
    want = _reference_matrix(gallery, queries, query_labels, lambda s, j: s == j)
    np.testing.assert_allclose(got[np.tril_indices(SESSIONS)], want[np.tril_indices(SESSIONS)], atol=1e-6)
    assert np.isnan(got[np.triu_indices(SESSIONS, 1)]).all()
    # the test can tell the rows of session j from the rows up to session j on this gallery
    cumulative = _reference_matrix(gallery, queries, query_labels, lambda s, j: s <= j)
    assert not np.allclose(cumulative[np.tril_indices(SESSIONS)], want[np.tril_indices(SESSIONS)])


@pytest.mark.parametrize("repeat", [1, 60])
def test_negative_flips_are_model_i_minus_1_vs_i_on_the_rows_before_i(repeat):
    gallery, queries, query_labels = _gallery(repeat)
    got = compatibility.negative_flips(SESSIONS, gallery, lambda i: queries[i], query_labels)
    for i in range(1, SESSIONS):
        parts = [p for p in gallery.parts if p.session < i]
        labels = np.concatenate([p.labels for p in parts])
        rows = np.concatenate([p.embeddings for p in parts])
        keep = np.isin(query_labels, labels)
        old, new = (_top1(queries[s][keep], rows, labels) == query_labels[keep] for s in (i - 1, i))
        assert got[i - 1] == np.mean(old & ~new)


def test_each_part_is_searched_with_a_block_fitted_to_its_rows(monkeypatch):
    """The matrix and the flips search small galleries, (T + 1) T / 2 + T - 1 of them for T sessions: padded to
    the default block (4,096 rows on a CPU) a 5-row part scored 4,096 rows (``compatibility.part_block``)."""
    searched = []
    real = topk.topk_indices

    def spy(query_emb, gallery_emb, k, **kw):
        searched.append((len(gallery_emb), kw["gallery_block"]))
        return real(query_emb, gallery_emb, k, **kw)

    monkeypatch.setattr(topk, "topk_indices", spy)
    for repeat in (1, 60):
        gallery, queries, query_labels = _gallery(repeat)
        compatibility.compatibility_matrix(SESSIONS, gallery, lambda i: queries[i], query_labels)
        compatibility.negative_flips(SESSIONS, gallery, lambda i: queries[i], query_labels)
    # 6 matrix entries and 2 updates x 2 models per gallery
    assert sorted(set(searched)) == [(5, 128), (10, 128), (300, 512), (600, 1024)]
    assert len(searched) == 2 * (6 + 4)
    assert compatibility.part_block(np.zeros((5000, 2))) == topk.default_block()
