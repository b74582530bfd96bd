"""Every index backend against exact search: the same top-k on a small gallery, the same after adding
in two steps, -1 / -inf past the rows held, and rows already held never inserted again."""

from __future__ import annotations

import numpy as np
import pytest

from cvs_jax.errors import IndexBackendError
from cvs_jax.index import registry
from cvs_jax.index.exact import ExactIndex
from cvs_jax.retrieval import topk

DIM, N, K = 16, 600, 5
GENEROUS = {  # parameters under which an approximate index is exact on this small gallery
    "exact": {},
    "faiss-hnsw": {"m": 16, "ef_construction": 400, "ef_search": 600},
    "faiss-ivf": {"nlist": 8, "nprobe": 8},  # every cluster probed
    "milvus": {"index_type": "FLAT"},
}


def _milvus_options(tmp_path) -> dict:
    pytest.importorskip("pymilvus", reason="pymilvus is not installed (pip install pymilvus milvus-lite)")
    pytest.importorskip("milvus_lite", reason="milvus-lite is not installed (pip install milvus-lite)")
    tmp_path.mkdir(parents=True, exist_ok=True)
    return {"uri": str(tmp_path / "milvus.db")}


def make(kind, tmp_path, **options):
    if kind == "milvus":
        options = {**_milvus_options(tmp_path), **options}
    return registry.make_index(kind, DIM, **{**GENEROUS[kind], **options})


@pytest.fixture(scope="module")
def gallery():
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(N, DIM)).astype(np.float32) * rng.uniform(0.5, 3, (N, 1)).astype(np.float32)
    rows = rng.permutation(np.arange(N, dtype=np.int64) * 3 + 1000)  # ids are not positions
    arrival = rng.integers(0, 3, N)
    model = arrival + rng.integers(0, 2, N)
    queries = emb[rng.choice(N, 20, replace=False)] + rng.normal(size=(20, DIM)).astype(np.float32) * 0.3
    queries = np.concatenate([queries, rng.normal(size=(20, DIM)).astype(np.float32)])
    return rows, emb, arrival, model, queries


def brute_force(rows, emb, queries, k):
    """numpy: cosine of normalised rows, best first, ties by position."""
    g = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    s = q @ g.T
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(s, order, 1), rows[order]


def test_exact_equals_brute_force_and_todays_search(gallery):
    rows, emb, arrival, model, queries = gallery
    index = ExactIndex(DIM)
    index.add(rows, emb, arrival, model)
    scores, got = index.search(queries, K)
    assert scores.dtype == np.float32 and got.dtype == np.int64 and got.shape == (len(queries), K)
    want_s, want_r = brute_force(rows, emb, queries, K)
    np.testing.assert_array_equal(got, want_r)
    np.testing.assert_allclose(scores, want_s, rtol=0, atol=1e-5)
    today_s, today_i = topk.topk_indices(queries, emb, K)  # what search and Run.search call
    np.testing.assert_array_equal(got, rows[today_i])
    np.testing.assert_array_equal(scores, today_s)


def test_exact_grows_over_several_segments_as_one_gallery(gallery):
    rows, emb, arrival, model, queries = gallery
    small = ExactIndex(DIM, gallery_block=64)  # 600 rows in segments of 64-row blocks, grown piece by piece
    for part in np.array_split(np.arange(N), [10, 30, 100, 101, 400]):
        small.add(rows[part], emb[part], arrival[part], model[part])
    scores, got = small.search(queries, K)
    today_s, today_i = topk.topk_indices(queries, emb, K)
    np.testing.assert_array_equal(got, rows[today_i])
    np.testing.assert_allclose(scores, today_s, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", registry.INDEXES)
def test_topk_equals_exact_and_adding_in_two_steps_equals_once(kind, gallery, tmp_path):
    rows, emb, arrival, model, queries = gallery
    exact = make("exact", tmp_path)
    exact.add(rows, emb, arrival, model)
    want_s, want_r = exact.search(queries, K)
    once = make(kind, tmp_path / "once")
    once.add(rows, emb, arrival, model)
    assert len(once) == N
    s1, r1 = once.search(queries, K)
    np.testing.assert_array_equal(r1, want_r)
    np.testing.assert_allclose(s1, want_s, rtol=0, atol=1e-5)
    assert registry.measured_recall(once, exact, queries, K) == 1.0
    twice = make(kind, tmp_path / "twice")
    half = N // 2
    twice.add(rows[:half], emb[:half], arrival[:half], model[:half])
    twice.add(rows[half:], emb[half:], arrival[half:], model[half:])
    s2, r2 = twice.search(queries, K)
    np.testing.assert_array_equal(r2, r1)
    np.testing.assert_allclose(s2, s1, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", registry.INDEXES)
def test_fewer_rows_than_k_pad_with_minus_one(kind, gallery, tmp_path):
    rows, emb, arrival, model, queries = gallery
    index = make(kind, tmp_path)
    s, r = index.search(queries[:2], 4)  # empty
    assert (r == -1).all() and np.isneginf(s).all() and s.shape == (2, 4)
    index.add(rows[:3], emb[:3], arrival[:3], model[:3])
    s, r = index.search(queries[:2], 5)
    assert s.shape == r.shape == (2, 5)
    assert (r[:, 3:] == -1).all() and np.isneginf(s[:, 3:]).all()
    assert all(sorted(row[:3]) == sorted(rows[:3]) for row in r) and np.isfinite(s[:, :3]).all()


@pytest.mark.parametrize("kind", registry.INDEXES)
def test_rows_already_held_are_not_added_again(kind, gallery, tmp_path):
    rows, emb, arrival, model, queries = gallery
    index = make(kind, tmp_path)
    index.add(rows[:100], emb[:100], arrival[:100], model[:100])
    index.add(rows[:150], emb[:150] * -1, arrival[:150], model[:150])  # 100 held (other vectors: ignored) + 50 new
    assert len(index) == 150
    if kind == "milvus":
        assert index.count() == 150
    _, got = index.search(emb[:100], 1)
    np.testing.assert_array_equal(got[:, 0], rows[:100])  # the held rows kept their first vectors
    scores, _ = index.search(-emb[:100], 1)
    assert (scores[:, 0] < 0.99).all()  # and the ignored vectors are nowhere


def test_milvus_reopened_inserts_only_new_rows_and_keeps_sessions(gallery, tmp_path):
    rows, emb, arrival, model, queries = gallery
    first = make("milvus", tmp_path)
    first.add(rows[:200], emb[:200], arrival[:200], model[:200])
    first.close()
    again = make("milvus", tmp_path)  # a restarted server: the collection in the same file
    assert len(again) == again.count() == 200
    again.add(rows, emb, arrival, model)  # the whole gallery after an update: only 400 rows go in
    assert len(again) == again.count() == N
    got = again._client.query("cvs_gallery", filter=f"row in [{int(rows[5])}, {int(rows[450])}]", output_fields=["*"])
    by_row = {g["row"]: g for g in got}
    for i in (5, 450):
        assert (by_row[rows[i]]["arrival_session"], by_row[rows[i]]["model_session"]) == (arrival[i], model[i])
    with pytest.raises(IndexBackendError, match="dim"):
        registry.make_index("milvus", DIM + 1, uri=str(tmp_path / "milvus.db"))


def test_milvus_rows_a_failed_write_left_out_go_in_at_the_next_add(gallery, tmp_path, monkeypatch):
    """A server down during ``add`` (a replica's poll): the rows are not held, so the next add writes them."""
    from cvs_jax.errors import IndexUnavailableError

    rows, emb, arrival, model, _ = gallery
    index = make("milvus", tmp_path)
    index.add(rows[:10], emb[:10], arrival[:10], model[:10])
    real = index._client.upsert  # noqa: SLF001

    def down(*args, **kwargs):
        raise ConnectionError("connection refused")

    monkeypatch.setattr(index._client, "upsert", down)  # noqa: SLF001
    with pytest.raises(IndexUnavailableError, match="did not answer"):
        index.add(rows[:30], emb[:30], arrival[:30], model[:30])
    assert len(index) == 10
    monkeypatch.setattr(index._client, "upsert", real)  # noqa: SLF001
    index.add(rows[:30], emb[:30], arrival[:30], model[:30])
    assert len(index) == index.count() == 30
    _, got = index.search(emb[10:30], 1)
    np.testing.assert_array_equal(got[:, 0], rows[10:30])


def test_milvus_a_re_embedded_gallery_has_a_collection_of_its_own(gallery, tmp_path):
    """``joint``: the same ids with other vectors go to ``<name>_g<session>``, the older collection keeps
    its own; ``drop_generations_before`` drops only this gallery's older ones (not another collection
    whose name merely starts alike)."""
    rows, emb, arrival, model, _ = gallery
    made = {g: make("milvus", tmp_path, collection="photos", generation=g) for g in (0, 1, 2)}
    other = make("milvus", tmp_path, collection="photos_g0_other")
    for g, index in [*made.items(), ("other", other)]:
        index.add(rows[:50], emb[:50] if g == 0 else -emb[:50], arrival[:50], model[:50])
    assert [made[g].collection for g in (0, 1, 2)] == ["photos", "photos_g1", "photos_g2"]
    for g, sign in ((0, 1), (2, -1)):
        scores, got = made[g].search(sign * emb[:50], 1)
        np.testing.assert_array_equal(got[:, 0], rows[:50])
        np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-5)
    assert made[2].drop_generations_before(1) == ["photos"]
    client = made[2]._client  # noqa: SLF001
    assert sorted(client.list_collections()) == ["photos_g0_other", "photos_g1", "photos_g2"]
    assert made[2].drop_generations_before(1) == [] and made[2].count() == 50


def test_measured_recall_catches_a_coarse_index(gallery, tmp_path):
    """One probed cluster of 12 misses true neighbours: measured recall says so, and equals a count by hand."""
    rows, emb, arrival, model, queries = gallery
    exact, coarse = make("exact", tmp_path), registry.make_index("faiss-ivf", DIM, nlist=12, nprobe=1)
    for index in (exact, coarse):
        index.add(rows, emb, arrival, model)
    recall = registry.measured_recall(coarse, exact, queries, K)
    _, want = exact.search(queries, K)
    _, got = coarse.search(queries, K)
    by_hand = np.mean([len(set(w) & set(g)) / K for w, g in zip(want, got)])
    assert recall == pytest.approx(by_hand) and recall < 0.9
    assert registry.measured_recall(exact, exact, queries, K) == 1.0


def test_bad_input_names_the_fix(gallery):
    rows, emb, arrival, model, _ = gallery
    with pytest.raises(IndexBackendError, match="unknown index 'annoy'; pass one of exact, faiss-hnsw"):
        registry.make_index("annoy", DIM)
    with pytest.raises(IndexBackendError, match="needs --milvus-uri"):
        registry.make_index("milvus", DIM)
    index = ExactIndex(DIM)
    with pytest.raises(IndexBackendError, match=r"embeddings \[N, 16\]"):
        index.add(rows[:3], emb[:3, :8], arrival[:3], model[:3])
    with pytest.raises(IndexBackendError, match=r"float32 \[Q, 16\]"):
        index.search(emb[:2, :4], 3)
    assert len(index) == 0


def test_the_scan_block_follows_the_device_kind_and_never_changes_the_answer(gallery):
    """CPUs scan 4,096 rows per step, GPUs 65,536 (fewer, larger steps: BENCHMARKS.md); both are exact."""
    import types

    assert topk.default_block() == topk.DEFAULT_BLOCK  # this machine's devices: CPUs
    assert ExactIndex(DIM).gallery_block == topk.DEFAULT_BLOCK
    gpu = types.SimpleNamespace(devices=np.array([types.SimpleNamespace(platform="gpu")], dtype=object))
    assert topk.default_block(gpu) == topk.GPU_BLOCK
    rows, emb, arrival, model, queries = gallery
    scores, got = topk.topk_indices(queries, emb, K, gallery_block=topk.GPU_BLOCK)  # the GPU's step, run here
    want_s, want_r = brute_force(rows, emb, queries, K)
    np.testing.assert_array_equal(rows[got], want_r)
    np.testing.assert_allclose(scores, want_s, rtol=0, atol=1e-5)


def test_a_small_segment_scans_a_small_block_and_its_shapes_compile_in_add_not_in_search(gallery):
    """Under one scan block a segment is scanned in its own power-of-two block (at least SMALL_BLOCK):
    a lone query on a small gallery no longer pays for 4,096 padded rows.  The answer is the CLI's search
    to the last bit, and a query shape searched before never compiles in a search after an add."""
    from cvs_jax import distributed
    from cvs_jax.index.exact import SMALL_BLOCK

    rows, emb, arrival, model, queries = gallery
    index = ExactIndex(DIM)
    index.add(rows[:10], emb[:10], arrival[:10], model[:10])
    assert index._segments[-1].scan_block == SMALL_BLOCK
    index.search(queries[:1], K)  # the shapes a server warms at its start
    index.search(queries, K)
    index.add(rows[10:], emb[10:], arrival[10:], model[10:])  # 600 rows: the tail's block doubles to 1024
    segment = index._segments[-1]
    assert (segment.scan_block, segment.rows_per_dev) == (1024, 1024) and len(index._segments) == 1
    fn = topk._search_fn(distributed.data_mesh(), K, 1024, 1024, topk.DEFAULT_PRECISION)
    compiled = fn._cache_size()
    scores, got = index.search(queries, K)
    index.search(queries[:1], K)
    assert fn._cache_size() == compiled  # both were compiled in add
    today_s, today_i = topk.topk_indices(queries, emb, K)  # the CLI's search, at the full 4,096-row block
    np.testing.assert_array_equal(got, rows[today_i])
    np.testing.assert_array_equal(scores, today_s)


def test_every_k_of_a_power_of_two_bucket_shares_one_compile_and_answers_exactly(gallery):
    """k runs rounded up to a power of two (5, 6, 7 and 8 compile once); the answer is the top k."""
    from cvs_jax import distributed

    rows, emb, arrival, model, queries = gallery
    index = ExactIndex(DIM)
    index.add(rows, emb, arrival, model)
    segment = index._segments[0]
    fn = topk._search_fn(distributed.data_mesh(), 8, segment.rows_per_dev, segment.scan_block, topk.DEFAULT_PRECISION)
    index.search(queries, 5)
    compiled = fn._cache_size()
    for k in (6, 7, 8):
        scores, got = index.search(queries, k)
        want_s, want_r = brute_force(rows, emb, queries, k)
        np.testing.assert_array_equal(got, want_r)
        np.testing.assert_allclose(scores, want_s, rtol=0, atol=1e-5)
    assert fn._cache_size() == compiled
