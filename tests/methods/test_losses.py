"""Losses vs. small numpy references written from the spec (Sec. 3, 7)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvs_jax.methods import losses

SEEDS = [0, 1, 2, 3]
TOL = dict(rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------
# numpy references (loops, float64)
# ----------------------------------------------------------------------------


def np_norm(x):
    x = np.asarray(x, np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def np_softmax_loss(emb, w, labels, temperature=0.05):
    e, wn = np_norm(emb), np_norm(w)
    out = []
    for i in range(e.shape[0]):
        z = np.array([e[i] @ wn[k] for k in range(wn.shape[0])]) / temperature
        lse = np.log(np.sum(np.exp(z - z.max()))) + z.max()
        out.append(lse - z[labels[i]])
    return np.mean(out)


def np_triplet(new, old, labels, margin=0.1, squared=False, eps=1e-6):
    a, o = np_norm(new), np_norm(old)
    n = a.shape[0]
    terms = []
    for i in range(n):
        best, neg = np.inf, None
        for j in range(n):  # torch.cdist mining, first index wins ties
            if labels[j] != labels[i]:
                dij = np.sqrt(np.sum((a[i] - o[j]) ** 2))
                if dij < best:
                    best, neg = dij, j
        if neg is None:
            continue
        if squared:
            dp, dn = np.sum((a[i] - o[i]) ** 2), np.sum((a[i] - o[neg]) ** 2)
        else:
            dp = np.sqrt(np.sum((a[i] - o[i] + eps) ** 2))
            dn = np.sqrt(np.sum((a[i] - o[neg] + eps) ** 2))
        terms.append(max(0.0, dp - dn + margin))
    return float(np.mean(terms)) if terms else 0.0


def np_coherence(emb, labels, centers, mask, per_batch=False):
    e = np_norm(emb)
    n = e.shape[0]
    total, count = 0.0, 0
    for i in range(n):
        if mask[labels[i]]:
            total += np.sum((np.asarray(centers[labels[i]], np.float64) - e[i]) ** 2)
            count += 1
    denom = n if per_batch else count
    return total / denom if count else 0.0


def rand_batch(seed, n=None, d=None, k=6):
    rng = np.random.default_rng(seed)
    n = n or int(rng.integers(8, 17))
    d = d or int(rng.integers(4, 17))
    new = rng.normal(size=(n, d)).astype(np.float32)
    old = rng.normal(size=(n, d)).astype(np.float32)
    labels = rng.integers(0, k, size=n).astype(np.int32)
    labels[1] = labels[0]  # guarantee repeated labels
    return rng, new, old, labels


softmax_jit = jax.jit(losses.normalized_softmax_loss)
triplet_jit = jax.jit(losses.neighbor_session_triplet_loss, static_argnames=("squared",))
coherence_jit = jax.jit(losses.inter_session_coherence_loss, static_argnames=("per_batch",))
# the trainer differentiates inside jit; do the same here (also much faster than eager)
softmax_grad_w = jax.jit(jax.grad(losses.normalized_softmax_loss, argnums=1))
triplet_vg = jax.jit(jax.value_and_grad(losses.neighbor_session_triplet_loss, argnums=(0, 1)))
coherence_vg = jax.jit(jax.value_and_grad(losses.inter_session_coherence_loss), static_argnames=("per_batch",))
coherence_grad_centers = jax.jit(jax.grad(losses.inter_session_coherence_loss, argnums=2))


# ----------------------------------------------------------------------------
# l2_normalize / cosine logits
# ----------------------------------------------------------------------------


def test_l2_normalize_matches_torch_semantics_and_zero_row():
    x = np.array([[3.0, 4.0], [0.0, 0.0], [1e-14, 0.0]], np.float32)
    y = np.asarray(losses.l2_normalize(jnp.asarray(x)))
    np.testing.assert_allclose(y[0], [0.6, 0.8], rtol=1e-6)
    np.testing.assert_array_equal(y[1], [0.0, 0.0])  # x / eps, no NaN
    np.testing.assert_allclose(y[2], [1e-2, 0.0], rtol=1e-5)  # max(||x||, 1e-12)
    g = jax.jit(jax.grad(lambda v: jnp.sum(losses.l2_normalize(v))))(jnp.asarray(x))
    assert np.all(np.isfinite(np.asarray(g)))


def test_cosine_logits():
    _, e, w, _ = rand_batch(0)
    np.testing.assert_allclose(np.asarray(losses.cosine_logits(e, w)), np_norm(e) @ np_norm(w).T, **TOL)


# ----------------------------------------------------------------------------
# L_c
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_normalized_softmax_matches_numpy(seed):
    rng, emb, _, labels = rand_batch(seed)
    w = rng.uniform(-1 / np.sqrt(128), 1 / np.sqrt(128), size=(7, emb.shape[1])).astype(np.float32)
    got = float(softmax_jit(emb, w, labels))
    np.testing.assert_allclose(got, np_softmax_loss(emb, w, labels), **TOL)


@pytest.mark.parametrize("seed", SEEDS)
def test_normalized_softmax_valid_classes_equals_truncated_head(seed):
    rng, emb, _, _ = rand_batch(seed)
    k_alloc, k_seen = 10, 4
    w = rng.normal(size=(k_alloc, emb.shape[1])).astype(np.float32)
    labels = rng.integers(0, k_seen, size=emb.shape[0]).astype(np.int32)
    masked = float(softmax_jit(emb, w, labels, valid_classes=jnp.int32(k_seen)))
    trunc = float(softmax_jit(emb, w[:k_seen], labels))
    np.testing.assert_allclose(masked, trunc, **TOL)
    np.testing.assert_allclose(masked, np_softmax_loss(emb, w[:k_seen], labels), **TOL)
    gw = np.asarray(softmax_grad_w(emb, w, labels, valid_classes=k_seen))
    assert np.all(np.isfinite(gw))
    np.testing.assert_array_equal(gw[k_seen:], 0.0)  # unseen rows get no gradient


# ----------------------------------------------------------------------------
# L_m
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("squared", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_triplet_matches_numpy(seed, squared):
    _, new, old, labels = rand_batch(seed)
    got = float(triplet_jit(new, old, labels, squared=squared))
    np.testing.assert_allclose(got, np_triplet(new, old, labels, squared=squared), **TOL)


@pytest.mark.parametrize("seed", SEEDS)
def test_triplet_close_models_matches_numpy(seed):
    # Old model ~ new model (the typical session start): small positive distances.
    rng, new, _, labels = rand_batch(seed)
    old = new + 0.3 * rng.normal(size=new.shape).astype(np.float32)
    got = float(triplet_jit(new, old, labels, margin=0.5))
    np.testing.assert_allclose(got, np_triplet(new, old, labels, margin=0.5), **TOL)


def test_triplet_single_label_is_zero_without_nan():
    _, new, old, _ = rand_batch(0, n=10)
    labels = np.full(10, 3, np.int32)
    val, (g, _) = triplet_vg(new, old, labels)
    assert float(val) == 0.0
    assert np.all(np.isfinite(np.asarray(g)))


def test_triplet_gradients_only_reach_new_embeddings():
    _, new, old, labels = rand_batch(2, n=12, d=8)
    assert np_triplet(new, old, labels) > 0  # hinges active
    _, (g_new, g_old) = triplet_vg(new, old, labels)
    np.testing.assert_array_equal(np.asarray(g_old), 0.0)
    assert np.abs(np.asarray(g_new)).max() > 1e-3
    # identical new/old (exact copy at session start): finite thanks to eps
    _, (g, _) = triplet_vg(new, new, labels)
    assert np.all(np.isfinite(np.asarray(g)))


# ----------------------------------------------------------------------------
# L_d and centres
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("per_batch", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_coherence_matches_numpy(seed, per_batch):
    rng, emb, _, labels = rand_batch(seed, k=6)
    d = emb.shape[1]
    gal = rng.normal(size=(40, d)).astype(np.float32)
    gal_lab = rng.integers(0, 4, size=40)
    centers, mask = losses.class_centers(gal, gal_lab, num_classes=6)
    got = float(coherence_jit(emb, labels, centers, mask, per_batch=per_batch))
    np.testing.assert_allclose(got, np_coherence(emb, labels, centers, mask, per_batch=per_batch), **TOL)


def test_coherence_mask_excludes_samples_and_centers_not_renormalised():
    emb = np.array([[1, 0, 0, 0], [0, 2, 0, 0], [0, 0, 0, 5]], np.float32)
    labels = np.array([0, 1, 2])
    centers = np.array([[0.5, 0, 0, 0], [0, 0, 0, 0], [9, 9, 9, 9]], np.float32)
    mask = np.array([True, True, False])
    got = float(losses.inter_session_coherence_loss(emb, labels, centers, mask))
    # sample 0: (0.5-1)^2 = 0.25 ; sample 1: 1 ; sample 2 excluded -> mean 0.625
    np.testing.assert_allclose(got, 0.625, rtol=1e-6)
    got_pb = float(losses.inter_session_coherence_loss(emb, labels, centers, mask, per_batch=True))
    np.testing.assert_allclose(got_pb, 1.25 / 3, rtol=1e-6)


def test_coherence_all_masked_is_exact_zero_with_finite_grad():
    _, emb, _, labels = rand_batch(1, k=3)
    centers = np.ones((3, emb.shape[1]), np.float32)
    mask = np.zeros(3, bool)
    for pb in (False, True):
        val, g = coherence_vg(emb, labels, centers, mask, per_batch=pb)
        assert float(val) == 0.0
        g = np.asarray(g)
        assert np.all(np.isfinite(g)) and np.all(g == 0.0)


def test_coherence_centers_get_no_gradient():
    _, emb, _, labels = rand_batch(3, k=3)
    centers = np.full((3, emb.shape[1]), 0.2, np.float32)
    g = coherence_grad_centers(emb, labels, centers, np.ones(3, bool))
    np.testing.assert_array_equal(np.asarray(g), 0.0)


def _hand_gallery():
    # rows normalise to: [.6,.8] [0,1] [1,0] | [1,0] [0,1] [0,-1] [-1,0]
    feats = np.array([[3, 4], [0, 2], [5, 0], [2, 0], [0, 7], [0, -3], [-1, 0]], np.float32)
    labels = np.array([0, 0, 1, 0, 1, 2, 2]).reshape(-1, 1)  # official [N,1] layout
    sessions = np.array([0, 0, 0, 1, 1, 1, 1])
    return feats, labels, sessions


def test_class_centers_pooled_hand_example():
    feats, labels, _ = _hand_gallery()
    centers, mask = losses.class_centers(feats, labels, num_classes=4)
    assert centers.dtype == np.float32 and mask.dtype == bool
    want = np.array([[1.6 / 3, 1.8 / 3], [0.5, 0.5], [-0.5, -0.5], [0.0, 0.0]])
    np.testing.assert_allclose(centers, want, atol=1e-7)
    np.testing.assert_array_equal(mask, [True, True, True, False])


def test_class_centers_per_session_hand_example():
    feats, labels, sessions = _hand_gallery()
    centers, mask = losses.class_centers(feats, labels, num_classes=4, gallery_sessions=sessions, per_session_mean=True)
    # class 0: mean(mean([.6,.8],[0,1]) = [.3,.9], [1,0]) = [.65,.45]
    want = np.array([[0.65, 0.45], [0.5, 0.5], [-0.5, -0.5], [0.0, 0.0]])
    np.testing.assert_allclose(centers, want, atol=1e-7)
    np.testing.assert_array_equal(mask, [True, True, True, False])
    with pytest.raises(ValueError):
        losses.class_centers(feats, labels, num_classes=4, per_session_mean=True)
