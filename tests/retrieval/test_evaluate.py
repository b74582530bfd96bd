"""recall@K of the jitted evaluator against a brute-force numpy search."""

import numpy as np
import pytest

from cvs_jax.errors import NonFiniteError
from cvs_jax.retrieval import topk


def brute_force_recall(q, ql, g, gl, ks):
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    gn = g / np.linalg.norm(g, axis=1, keepdims=True)
    sims = qn @ gn.T
    out = {}
    for k in ks:
        hits = 0
        for i in range(len(q)):
            # stable ordering: highest similarity first, lower index first on ties
            order = sorted(range(len(g)), key=lambda j: (-sims[i, j], j))[:k]
            hits += any(gl[j] == ql[i] for j in order)
        out[k] = hits / len(q)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recall_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    g = rng.normal(size=(300, 16)).astype(np.float32)
    gl = rng.integers(0, 7, size=300)
    q = rng.normal(size=(130, 16)).astype(np.float32)
    ql = rng.integers(0, 7, size=130)
    got = topk.recall_at_k(q, ql, g, gl, ks=(1, 2, 4), chunk=32)  # several chunks + a ragged one
    want = brute_force_recall(q, ql, g, gl, (1, 2, 4))
    assert got == pytest.approx(want, abs=1e-12)
    assert got[1] <= got[2] <= got[4]


def test_scale_invariance_and_exact_match():
    rng = np.random.default_rng(3)
    g = rng.normal(size=(50, 8)).astype(np.float32)
    gl = np.arange(50)
    # each query is a scaled copy of gallery row i: cosine search must find row i first.
    q = g[:20] * rng.uniform(0.1, 10, size=(20, 1)).astype(np.float32)
    assert topk.recall_at_k(q, gl[:20], g, gl, ks=(1,))[1] == 1.0


def test_small_gallery_and_padding_rows_never_match():
    g = np.eye(3, dtype=np.float32)
    gl = np.array([0, 1, 2])
    q = -np.eye(3, dtype=np.float32)  # every real row has negative similarity; padding must still lose
    labels = topk.topk_labels(q, g, gl, k=4)
    assert labels.shape == (3, 4)
    assert set(labels[:, :3].ravel()) <= {0, 1, 2}
    assert (labels[:, 3] == -1).all()
    r = topk.recall_at_k(q, np.array([5, 5, 5]), g, gl)
    assert r == {1: 0.0, 2: 0.0, 4: 0.0}


def test_average_recall():
    ar = topk.average_recall([{1: 0.5, 2: 0.7}, {1: 0.3, 2: 0.4}])
    assert ar == pytest.approx({1: 0.4, 2: 0.55})


# ---------------------------------------------------------------- sharded / blocked search
def _stable_topk(q, g, k):
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    gn = g / np.linalg.norm(g, axis=1, keepdims=True)
    return np.argsort(-(qn @ gn.T), axis=1, kind="stable")[:, :k]


def test_ties_go_to_the_lowest_gallery_index_across_scan_blocks():
    rng = np.random.default_rng(4)
    base = rng.normal(size=(40, 8)).astype(np.float32)
    g = np.concatenate([base, base, base])  # rows i, i+40, i+80: exact copies, exactly tied scores
    q = base[:10] + 0.01 * rng.normal(size=(10, 8)).astype(np.float32)
    for block in (16, 64, 4096):  # the copies fall in different scan blocks, or in one
        _, idx = topk.topk_indices(q, g, 3, gallery_block=block)
        assert np.array_equal(idx[:, 0], np.arange(10)), block
        assert np.array_equal(idx[:, 1:], np.stack([np.arange(10) + 40, np.arange(10) + 80], 1)), block


def test_block_size_and_query_chunk_do_not_change_results():
    rng = np.random.default_rng(5)
    g = rng.normal(size=(1000, 12)).astype(np.float32)
    q = rng.normal(size=(77, 12)).astype(np.float32)
    ref_s, ref_i = topk.topk_indices(q, g, 6, gallery_block=128)
    assert np.array_equal(ref_i, _stable_topk(q, g, 6))
    for block, chunk in ((128, 1024), (128, 10), (256, 77), (1000, 1024)):
        s, i = topk.topk_indices(q, g, 6, gallery_block=block, chunk=chunk)
        assert np.array_equal(i, ref_i), (block, chunk)
        if (block, chunk) == (128, 1024):  # the same matmul shapes: bitwise the same scores
            assert np.array_equal(s, ref_s)
        np.testing.assert_allclose(s, ref_s, atol=1e-6)  # other shapes: the last bit may differ


def test_blocked_search_from_a_memory_mapped_npy_equals_in_memory(tmp_path):
    rng = np.random.default_rng(6)
    g = rng.normal(size=(2500, 16)).astype(np.float32)
    gl = rng.integers(0, 9, size=2500).astype(np.int32)
    q = rng.normal(size=(90, 16)).astype(np.float32)
    ql = rng.integers(0, 9, size=90)
    np.save(tmp_path / "g.npy", g)
    np.save(tmp_path / "gl.npy", gl)
    s_mem, i_mem = topk.topk_indices(q, g, 4, gallery_block=256, chunk=32)
    for block_rows in (256, 700, 5000):  # several blocks, a ragged last block, one block
        s, i = topk.topk_indices_blocked(
            q, str(tmp_path / "g.npy"), 4, block_rows=block_rows, gallery_block=256, chunk=32
        )
        # same rows; scores equal up to rounding (bit-equal on CPU; on a GPU the matmul algorithm
        # depends on the block shape, which moved a score by 1 ulp on an H100)
        assert np.array_equal(i, i_mem), block_rows
        np.testing.assert_allclose(s, s_mem, rtol=1e-6, atol=1e-6)
    got = topk.recall_at_k_blocked(
        q, ql, str(tmp_path / "g.npy"), str(tmp_path / "gl.npy"), ks=(1, 2, 4), block_rows=700
    )
    assert got == topk.recall_at_k(q, ql, g, gl, ks=(1, 2, 4))
    assert got == pytest.approx(brute_force_recall(q, ql, g, gl, (1, 2, 4)), abs=1e-12)


class _TensorStoreLike:
    """Row slices come back as futures-of-arrays, like TensorStore (``x[a:b].read().result()``)."""

    def __init__(self, a):
        self._a, self.shape, self.dtype = a, a.shape, a.dtype
        self.reads = []

    def __getitem__(self, item):
        self.reads.append((item.start, item.stop))
        a = self._a

        class _Future:
            def read(self):
                return self

            def result(self):
                return a[item]

        return _Future()


def test_blocked_search_reads_each_row_once_from_an_array_like():
    rng = np.random.default_rng(8)
    g = rng.normal(size=(1000, 8)).astype(np.float32)
    q = rng.normal(size=(20, 8)).astype(np.float32)
    store = _TensorStoreLike(g)
    _, idx = topk.topk_indices_blocked(q, store, 3, block_rows=300, gallery_block=64)
    assert np.array_equal(idx, _stable_topk(q, g, 3))
    assert sorted(store.reads) == [(0, 320), (320, 640), (640, 960), (960, 1000)]  # block_rows -> multiple of 64


def test_blocked_search_with_fewer_rows_than_k():
    g = np.eye(3, dtype=np.float32)
    labels = topk.recall_at_k_blocked(
        -np.eye(3, dtype=np.float32), np.array([0, 1, 2]), g, np.array([5, 5, 5]), ks=(1, 4)
    )
    assert labels == {1: 0.0, 4: 0.0}
    _, idx = topk.topk_indices_blocked(np.eye(3, dtype=np.float32), g, 5)
    assert idx.shape == (3, 3) and np.array_equal(idx[:, 0], [0, 1, 2])


def test_explicit_mesh_and_no_recompile_while_the_gallery_grows_within_a_block():
    from cvs_jax import distributed

    mesh = distributed.data_mesh()
    rng = np.random.default_rng(9)
    q = rng.normal(size=(5, 8)).astype(np.float32)
    fn = topk._search_fn(mesh, 2, 512, 512, topk.DEFAULT_PRECISION)
    before = fn._cache_size()
    for n in (100, 300, 512):  # one 512-row block holds them all: the same compiled search
        g = rng.normal(size=(n, 8)).astype(np.float32)
        _, idx = topk.topk_indices(q, g, 2, mesh=mesh, gallery_block=512, chunk=8)
        assert np.array_equal(idx, _stable_topk(q, g, 2))
    assert fn._cache_size() - before <= 1


def test_row_concat_streams_like_a_concatenation():
    from cvs_jax.rundir.gallery import RowConcat

    rng = np.random.default_rng(5)
    a = rng.normal(size=(70, 8)).astype(np.float32)
    b = rng.normal(size=(45, 8)).astype(np.float32)
    labels = rng.integers(0, 5, size=115)
    q = rng.normal(size=(30, 8)).astype(np.float32)
    ql = rng.integers(0, 5, size=30)
    view = RowConcat([a, np.zeros((0, 8), np.float32), b])
    np.testing.assert_array_equal(view[60:80], np.concatenate([a, b])[60:80])
    whole = topk.recall_at_k(q, ql, np.concatenate([a, b]), labels)
    streamed = topk.recall_at_k_blocked(q, ql, view, labels, block_rows=32)
    assert streamed == whole


def test_nan_embeddings_are_named_instead_of_returning_padding_rows():
    rng = np.random.default_rng(3)
    g = rng.normal(size=(20, 8)).astype(np.float32)
    q = rng.normal(size=(5, 8)).astype(np.float32)
    bad_g = g.copy()
    bad_g[:] = np.nan
    bad_q = q.copy()
    bad_q[2] = np.nan
    for query, gallery in ((q, bad_g), (bad_q, g)):
        with pytest.raises(NonFiniteError, match="NaN/inf"):
            topk.topk_indices(query, gallery, 4)
        with pytest.raises(NonFiniteError, match="NaN/inf"):
            topk.recall_at_k_blocked(query, np.zeros(5), gallery, np.zeros(20), ks=(1, 4))
    _, idx = topk.topk_indices(q, g, 4)  # finite inputs: real rows only
    assert idx.max() < 20
