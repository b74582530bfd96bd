"""The stored compatibility counts (``engine.compat_counts``): the matrix and the flips they give equal the
ones counted from scratch over every probe query (``retrieval.compatibility``), an update embeds only the
queries that arrived since with the earlier models, and whatever changed under a stored count is counted
again."""

from __future__ import annotations

import json
import os
import types

import numpy as np
import pytest

from cvs_jax.engine import compat_counts
from cvs_jax.retrieval import compatibility
from cvs_jax.retrieval.query_maps import QueryMap
from cvs_jax.rundir import paths
from cvs_jax.rundir.gallery import Gallery, GalleryPart

DIM, PIXELS = 8, 12


class _Embed:
    """A model's "network" is a matrix: an image (a vector) times it; counts the rows it embeds."""

    def __init__(self):
        self.rows = 0

    def place(self, variables):
        return variables

    def __call__(self, variables, images, placed=False):
        images = np.asarray(images)
        self.rows += len(images)
        return (images @ variables["params"]["net"]["w"]).astype(np.float32)


class _Proto:
    """Session s's test queries: the test images of the classes seen by s that arrived by s."""

    def __init__(self, sessions, test_labels, test_sessions, images, first_class_session):
        self.plan = types.SimpleNamespace(num_sessions=sessions)
        self.test_labels, self.arrive, self.images = test_labels, test_sessions, images
        self.seen = first_class_session

    def test_queries(self, s):
        return np.flatnonzero((self.arrive <= s) & (self.seen[self.test_labels] <= s))

    def test_images(self, idx):
        return self.images[idx]


def _world(seed=0, sessions=4, maps=False, returning=True):
    """A run of ``sessions``: 2 new classes a session (class 0 returns in every session), 3 test images of
    each class a session from its first (``returning=False``: in its first session only); each model a random
    matrix, each part embedded by its model."""
    rng = np.random.default_rng(seed)
    classes = 2 * sessions
    first_class_session = np.arange(classes) // 2
    test_labels, test_sessions = [], []
    for s in range(sessions):
        for c in range(classes):
            if first_class_session[c] == s or (returning and first_class_session[c] < s):
                test_labels += [c] * 3
                test_sessions += [s] * 3
    test_labels, test_sessions = np.asarray(test_labels, np.int32), np.asarray(test_sessions)
    centres = rng.normal(size=(classes, PIXELS))
    images = centres[test_labels] + 0.9 * rng.normal(size=(len(test_labels), PIXELS))
    weights = [rng.normal(size=(PIXELS, DIM)) for _ in range(sessions)]
    parts = []
    for s in range(sessions):
        labels = np.asarray([0] * 3 + [2 * s] * 4 + [2 * s + 1] * 4, np.int32)
        rows = (centres[labels] + 0.9 * rng.normal(size=(len(labels), PIXELS))) @ weights[s]
        parts.append(GalleryPart(rows.astype(np.float32), labels, np.arange(len(labels)), s))
    query_maps = {}
    if maps:
        for s in range(1, sessions):
            query_maps[s] = QueryMap(np.eye(DIM) + 0.3 * rng.normal(size=(DIM, DIM)), rng.normal(size=DIM), "affine")
    proto = _Proto(sessions, test_labels, test_sessions, images, first_class_session)
    return proto, parts, weights, query_maps


def _ctx(workdir, proto):
    return types.SimpleNamespace(workdir=str(workdir), proto=proto, embed=_Embed(), trunk=None)


def _state(parts, query_maps):
    return types.SimpleNamespace(gallery=Gallery(parts, DIM), query_maps=query_maps)


def _restore(weights):
    return lambda i: {"params": {"net": {"w": weights[i]}, "head": np.zeros((3, DIM))}, "batch_stats": {}}


def _at(proto, sessions):
    """The run as it stood after ``sessions`` sessions (the queries and classes of those sessions)."""
    return _Proto(sessions, proto.test_labels, proto.arrive, proto.images, proto.seen)


def _from_scratch(proto, parts, weights, query_maps):
    """The matrix and flips over every probe query, each model embedding all of them."""
    last = proto.plan.num_sessions - 1
    idx = proto.test_queries(last)
    queries = {i: proto.test_images(idx) @ weights[i] for i in range(last + 1)}
    gallery, maps = Gallery(parts, DIM), query_maps or None
    labels = proto.test_labels[idx]
    return (
        compatibility.compatibility_matrix(last + 1, gallery, queries.__getitem__, labels, maps),
        compatibility.negative_flips(last + 1, gallery, queries.__getitem__, labels, maps),
    )


def _count(tmp_path, proto, parts, weights, query_maps):
    """``(matrix, flips, rows embedded, the line it prints)`` of one finish reading and writing the stored counts."""
    ctx = _ctx(tmp_path, proto)
    sessions = proto.plan.num_sessions
    state = _state([p for p in parts if p.session < sessions], {k: m for k, m in query_maps.items() if k < sessions})
    matrix, flips, said = compat_counts.count(ctx, state, _restore(weights))
    return matrix, flips, ctx.embed.rows, said


def _check(got, want):
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1] == want[1]


@pytest.mark.parametrize("maps", [False, True])
def test_an_update_embeds_only_what_arrived_since_with_the_earlier_models(tmp_path, maps):
    proto, parts, weights, query_maps = _world(maps=maps)
    last = proto.plan.num_sessions - 1
    earlier = _at(proto, last)
    # the newest part as a session leaves it in memory (the dataset's int64 labels; a checkpoint stores int32)
    fresh = parts[: last - 1] + [
        GalleryPart(p.embeddings, p.labels.astype(np.int64), p.source_ids, p.session) for p in parts[last - 1 :]
    ]
    got = _count(tmp_path, earlier, fresh, weights, query_maps)
    _check(got, _from_scratch(earlier, parts, weights, {k: m for k, m in query_maps.items() if k < last}))
    assert got[2] == last * len(earlier.test_queries(last - 1))  # from scratch: every model, every query

    got = _count(tmp_path, proto, parts, weights, query_maps)
    _check(got, _from_scratch(proto, parts, weights, query_maps))
    queries = proto.test_queries(last)
    arrived = len(queries) - len(earlier.test_queries(last - 1))
    # the new model embeds them all, the earlier ones the new arrival; the one before the new model reads back
    # its embeddings of the others, which the finish before stored, for the new update's flips
    assert arrived > 0 and got[2] == last * arrived + len(queries)
    assert f"({len(queries) - arrived} more read from compatibility_queries.npz)" in got[3]
    assert not np.isnan(got[0][last - 1]).all()

    assert f"{len(queries)} probe queries x {last + 1} models; {got[2]} query embeddings (" in got[3]
    assert f"the counts of {last} models read" in got[3]

    again = _count(tmp_path, proto, parts, weights, query_maps)  # nothing new: nothing embedded
    _check(again, got)
    assert again[2] == 0 and f"the counts of {last + 1} models read" in again[3]


def test_earlier_models_embed_nothing_when_only_new_classes_arrive(tmp_path):
    """Session 4 brings test images of its new classes only: no part the earlier models score holds them."""
    proto, parts, weights, query_maps = _world(seed=7, returning=False)
    last = proto.plan.num_sessions - 1
    _count(tmp_path, _at(proto, last), parts, weights, query_maps)
    got = _count(tmp_path, proto, parts, weights, query_maps)
    _check(got, _from_scratch(proto, parts, weights, query_maps))
    queries, arrived = len(proto.test_queries(last)), len(proto.test_queries(last)) - len(proto.test_queries(last - 1))
    # the new model all of them; the one before it reads back the others for the new update's flips
    assert arrived > 0 and got[2] == queries and f"({queries - arrived} more read from" in got[3]


def test_a_model_trained_again_is_counted_again(tmp_path):
    """Session 1's model replaced (e.g. the session trained again after a rollback): its row and the two
    updates it takes part in are counted from the start; the others are read."""
    proto, parts, weights, query_maps = _world(seed=1)
    _count(tmp_path, proto, parts, weights, query_maps)
    other = list(weights)
    other[1] = np.random.default_rng(5).normal(size=weights[1].shape)
    got = _count(tmp_path, proto, parts, other, query_maps)
    _check(got, _from_scratch(proto, parts, other, query_maps))
    # model 1's row (all queries), and model 0 and 2's queries for the flips of updates 1 and 2
    assert got[2] == 3 * len(proto.test_queries(proto.plan.num_sessions - 1))
    stale = _from_scratch(proto, parts, weights, query_maps)
    assert not np.array_equal(got[0][1], stale[0][1])  # the test can tell the stale counts from the new


def test_a_changed_part_is_counted_again(tmp_path):
    proto, parts, weights, query_maps = _world(seed=2)
    _count(tmp_path, proto, parts, weights, query_maps)
    changed = list(parts)
    p = parts[1]
    changed[1] = GalleryPart(p.embeddings[::-1].copy(), p.labels, p.source_ids, p.session)  # rows relabelled
    got = _count(tmp_path, proto, changed, weights, query_maps)
    _check(got, _from_scratch(proto, changed, weights, query_maps))
    assert got[2] > 0
    assert not np.array_equal(got[0], _from_scratch(proto, parts, weights, query_maps)[0], equal_nan=True)


def test_queries_that_arrive_otherwise_are_counted_again(tmp_path):
    """An update after which some of session 1's test images count as arriving in session 3 (a test split
    read otherwise): the counts through session 3's arrivals are no longer those of its first three."""
    proto, parts, weights, query_maps = _world(seed=3)
    last = proto.plan.num_sessions - 1
    _count(tmp_path, _at(proto, last), parts, weights, query_maps)
    moved = _Proto(proto.plan.num_sessions, proto.test_labels, proto.arrive.copy(), proto.images, proto.seen)
    moved.arrive[np.flatnonzero(moved.arrive == 1)[:4]] = last
    got = _count(tmp_path, moved, parts, weights, query_maps)
    _check(got, _from_scratch(moved, parts, weights, query_maps))
    # no count read: every model embeds every query, but the one before the new model reads back its embeddings
    # of the arrivals that did not change (sessions 0 and 2)
    same = sum(len(c.idx) for c in compat_counts.arrivals(moved, last) if c.session in (0, 2))
    assert got[2] == 4 * len(moved.test_queries(last)) - same and f"({same} more read from" in got[3]


@pytest.mark.parametrize(
    "damage",
    [
        lambda f: f.write("{not json"),
        lambda f: json.dump({"version": 1, "rows": {"0": {"counts": "x"}}, "flips": []}, f),
        lambda f: json.dump({"version": 99}, f),
    ],
)
def test_a_damaged_file_is_counted_again(tmp_path, damage):
    proto, parts, weights, query_maps = _world(seed=4)
    want = _count(tmp_path, proto, parts, weights, query_maps)
    path = paths.compat_counts_file(str(tmp_path))
    with open(path) as f:
        stored = json.load(f)
    for wrong in ({"0": [1]}, {"x": [1, 1]}):  # digests that match and counts of the wrong shape
        for entry in stored["rows"].values():
            entry["counts"] = wrong
        with open(path, "w") as f:
            json.dump(stored, f)
        got = _count(tmp_path, proto, parts, weights, query_maps)
        _check(got, want[:2])
    with open(path, "w") as f:
        damage(f)
    got = _count(tmp_path, proto, parts, weights, query_maps)
    _check(got, want[:2])
    assert got[2] == want[2]


def test_counts_that_cannot_be_stored_are_said_and_change_nothing(tmp_path):
    proto, parts, weights, query_maps = _world(seed=6)
    blocked = paths.compat_counts_file(str(tmp_path))
    os.makedirs(blocked)  # a folder where the file goes: the rename fails
    got = _count(tmp_path, proto, parts, weights, query_maps)
    _check(got, _from_scratch(proto, parts, weights, query_maps))
    assert "(not stored: " in got[3]
    assert os.listdir(os.path.dirname(blocked)) == [os.path.basename(blocked)]  # no temporary file left


def test_stored_embeddings_are_read_only_for_their_model_and_whole(tmp_path):
    """The newest model's embeddings that a finish stores are read back by the next one for that model alone
    (its weights' digest), and only from a whole file: a model trained again since, or a damaged file, embeds
    its queries anew."""
    proto, parts, weights, query_maps = _world(seed=8)
    last = proto.plan.num_sessions - 1
    want = _from_scratch(proto, parts, weights, query_maps)
    read = tmp_path / "read"  # the file is read: wrong embeddings under the right digests give other flips
    _count(read, _at(proto, last), parts, weights, query_maps)
    with np.load(paths.compat_queries_file(str(read))) as f:
        stored = {k: -v if k.startswith("arrival_") else v for k, v in f.items()}
    with open(paths.compat_queries_file(str(read)), "wb") as f:
        np.savez(f, **stored)
    assert _count(read, proto, parts, weights, query_maps)[1] != want[1]

    for case in ("retrained", "damaged"):
        d = tmp_path / case
        _count(d, _at(proto, last), parts, weights, query_maps)
        other = list(weights)
        if case == "retrained":
            other[last - 1] = np.random.default_rng(9).normal(size=weights[last - 1].shape)
        else:
            with open(paths.compat_queries_file(str(d)), "r+b") as f:
                f.truncate(100)
        got = _count(d, proto, parts, other, query_maps)
        _check(got, _from_scratch(proto, parts, other, query_maps))
        assert "more read from" not in got[3], case
