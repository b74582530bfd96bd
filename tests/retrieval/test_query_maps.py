"""Query maps: each kind recovers what it is built for, chains compose, parts get their own chain."""

import numpy as np
import pytest

from cvs_jax.retrieval import compatibility, query_maps, topk
from cvs_jax.retrieval.query_maps import QueryMap, chain, fit_query_map, map_queries
from cvs_jax.rundir.gallery import Gallery, GalleryPart


def _unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _rotation(d, seed):
    q, r = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, d)))
    return q * np.sign(np.diag(r))


def test_procrustes_recovers_an_exact_rotation():
    d = 6
    new = _unit(np.random.default_rng(0).normal(size=(50, d)))
    rot = _rotation(d, 1)
    old = new @ rot  # the old model's space is the new one rotated
    m = fit_query_map("procrustes", new * 3.0, old)  # any scale: rows are normalised before fitting
    np.testing.assert_allclose(m.matrix, rot, atol=1e-10)
    np.testing.assert_allclose(m.bias, 0.0)
    np.testing.assert_allclose(m.apply(new), old, atol=1e-10)
    np.testing.assert_allclose(m.matrix @ m.matrix.T, np.eye(d), atol=1e-10)  # orthogonal


def test_affine_recovers_an_exact_affine_map_and_mean_shift_a_translation():
    rng = np.random.default_rng(2)
    d = 5
    # unit rows in the first d - 1 coordinates, then shifted along the last one and rotated: every target
    # row has the same norm, so the normalised targets are still an exact affine function of the rows
    new = np.concatenate([_unit(rng.normal(size=(40, d - 1))), np.zeros((40, 1))], axis=1)
    shift, rot = 0.5 * np.eye(d)[-1], _rotation(d, 3)
    target = (new + shift) @ rot / np.sqrt(1 + 0.25)
    m = fit_query_map("affine", new, target)
    np.testing.assert_allclose(m.apply(new), target, atol=1e-10)
    fresh = np.concatenate([_unit(rng.normal(size=(6, d - 1))), np.zeros((6, 1))], axis=1)
    np.testing.assert_allclose(m.apply(fresh), (fresh + shift) @ rot / np.sqrt(1.25), atol=1e-10)
    np.testing.assert_allclose(m.bias, shift @ rot / np.sqrt(1.25), atol=1e-10)
    # Procrustes cannot fit the shift: its residual stays
    assert np.abs(fit_query_map("procrustes", new, target).apply(new) - target).max() > 0.05
    drift = rng.normal(size=d) * 0.01
    old_shifted = _unit(rng.normal(size=(40, d)))
    new_shifted = old_shifted + drift
    ms = fit_query_map("mean_shift", new_shifted, old_shifted)
    want = -np.mean(_unit(new_shifted) - old_shifted, axis=0)  # QDC: q' = q - mean(new - old)
    np.testing.assert_allclose(ms.bias, want, atol=1e-12)
    np.testing.assert_array_equal(ms.matrix, np.eye(d))


def test_none_is_the_identity_and_unknown_kinds_are_refused():
    x = np.random.default_rng(3).normal(size=(4, 3))
    m = fit_query_map("none", x, x + 1)
    np.testing.assert_array_equal(m.apply(x), x)
    with pytest.raises(ValueError, match="'slerp' is unknown"):
        fit_query_map("slerp", x, x)
    with pytest.raises(ValueError, match="same shape"):
        fit_query_map("procrustes", x, x[:3])
    assert query_maps.KINDS == ("none", "procrustes", "affine", "mean_shift")


def _maps(d, sessions, seed):
    rng = np.random.default_rng(seed)
    out = {}
    for s in range(1, sessions):
        kind = ["procrustes", "affine", "mean_shift"][s % 3]
        x = _unit(rng.normal(size=(30, d)))
        y = _unit(x @ (np.eye(d) + 0.3 * rng.normal(size=(d, d))) + 0.1 * rng.normal(size=d))
        out[s] = fit_query_map(kind, x, y)
    return out


def test_a_composed_chain_equals_mapping_step_by_step():
    d = 4
    maps = _maps(d, 4, 4)
    q = np.random.default_rng(5).normal(size=(7, d))
    step = q
    for s in (3, 2, 1):  # model 3 -> 2 -> 1 -> 0
        step = maps[s].apply(step)
    np.testing.assert_allclose(chain(maps, 3, 0, d).apply(q), step, atol=1e-10)
    np.testing.assert_allclose(chain(maps, 3, 2, d).apply(q), maps[3].apply(q), atol=1e-12)
    np.testing.assert_array_equal(chain(maps, 2, 2, d).apply(q), q)  # the model's own part: untouched
    with pytest.raises(ValueError, match="later session"):
        chain(maps, 1, 2, d)
    with pytest.raises(KeyError, match="session 2"):
        chain({3: maps[3]}, 3, 1, d)


def test_each_gallery_part_gets_the_chain_down_to_its_session():
    d = 4
    maps = _maps(d, 3, 6)
    q = np.random.default_rng(7).normal(size=(5, d)) * 4
    per_part = map_queries(maps, q, 2, [0, 2, 1, 0])
    assert sorted(per_part) == [0, 1, 2]
    qn = _unit(q)  # the query is normalised once, before the chain
    np.testing.assert_allclose(per_part[2], qn, atol=1e-6)
    np.testing.assert_allclose(per_part[1], maps[2].apply(qn), atol=1e-6)
    np.testing.assert_allclose(per_part[0], maps[1].apply(maps[2].apply(qn)), atol=1e-6)
    assert per_part[0].dtype == np.float32


def test_an_exported_older_model_takes_newer_parts_as_they_are():
    """``export`` of a model older than the newest session (the gate kept the newest out): its chain to each
    part it precedes, and the identity for the parts a newer model made, as a server pinned to it searches."""
    d = 4
    maps = _maps(d, 3, 8)
    chains = query_maps.map_chains(maps, 1, [0, 1, 2])
    q = np.random.default_rng(9).normal(size=(3, d))
    np.testing.assert_allclose(q @ chains["matrix_1"] + chains["bias_1"], maps[1].apply(q), atol=1e-10)
    for j in (2, 3):  # its own part, and part 2's rows of model 2
        np.testing.assert_array_equal(chains[f"matrix_{j}"], np.eye(d))
        np.testing.assert_array_equal(chains[f"bias_{j}"], np.zeros(d))


def test_a_map_round_trips_through_npz(tmp_path):
    m = _maps(3, 2, 8)[1]
    path = str(tmp_path / "query_map_1.npz")
    m.save(path)
    back = QueryMap.load(path)
    np.testing.assert_array_equal(back.matrix, m.matrix)
    np.testing.assert_array_equal(back.bias, m.bias)
    assert back.kind == m.kind == "affine"


def _two_models(seed=9, d=8, classes=6):
    """Session 0's model embeds in a rotated space, session 1's in the plain one; classes 0-2 are stored
    by session 0, classes 3-5 by session 1.  Returns the gallery, the queries per model and their labels."""
    rng = np.random.default_rng(seed)
    centres = _unit(rng.normal(size=(classes, d))) * 3
    rot = _rotation(d, seed + 1)
    g_labels = np.repeat(np.arange(classes), 5)
    g = centres[g_labels] + rng.normal(size=(len(g_labels), d))
    old_part = g_labels < 3
    parts = [
        GalleryPart((g[old_part] @ rot).astype(np.float32), g_labels[old_part], np.arange(15), 0),
        GalleryPart(g[~old_part].astype(np.float32), g_labels[~old_part], np.arange(15, 30), 1),
    ]
    q_labels = np.repeat(np.arange(classes), 4)
    q = centres[q_labels] + rng.normal(size=(len(q_labels), d))
    pairs = _unit(rng.normal(size=(40, d)))  # images both models embed
    maps = {1: fit_query_map("procrustes", pairs, pairs @ rot)}
    return Gallery(parts, d), {0: q @ rot, 1: q}, q_labels, maps, rot


def test_mapped_search_without_maps_is_the_plain_search():
    gallery, queries, q_labels, _, _ = _two_models()
    identity = {1: fit_query_map("none", queries[1], queries[1])}
    got = query_maps.mapped_topk_labels(queries[1], gallery, identity, 1, 4)
    want = topk.topk_labels(queries[1], gallery.embeddings, gallery.labels, 4)
    np.testing.assert_array_equal(got, want)
    small = Gallery([gallery.parts[0]], gallery.embed_dim)  # fewer rows than k: -1 past the rows
    assert (query_maps.mapped_topk_labels(queries[1], small, identity, 1, 20)[:, 15:] == -1).all()


def test_maps_change_recall_only_where_they_apply():
    gallery, queries, q_labels, maps, rot = _two_models()
    plain = compatibility.compatibility_matrix(2, gallery, queries.__getitem__, q_labels)
    mapped = compatibility.compatibility_matrix(2, gallery, queries.__getitem__, q_labels, maps=maps)
    assert mapped[0, 0] == plain[0, 0] and mapped[1, 1] == plain[1, 1]  # each model on its own rows
    assert plain[1, 0] < 0.7 and mapped[1, 0] == pytest.approx(plain[0, 0])  # the rotation undone
    # the whole gallery: with the map, the search is the one of a gallery stored in the new space
    old = gallery.parts[0]
    back = GalleryPart((old.embeddings @ rot.T).astype(np.float32), old.labels, old.source_ids, old.session)
    unrotated = Gallery([back, gallery.parts[1]], 8)
    oracle = topk.topk_labels(queries[1], unrotated.embeddings, unrotated.labels, 4)
    np.testing.assert_array_equal(query_maps.mapped_topk_labels(queries[1], gallery, maps, 1, 4), oracle)
    identity = {1: query_maps.identity(8)}
    with_maps = query_maps.mapped_recall_at_k(queries[1], q_labels, gallery, maps, 1, ks=(1, 4))
    without = query_maps.mapped_recall_at_k(queries[1], q_labels, gallery, identity, 1, ks=(1, 4))
    assert with_maps[1] > without[1]
