"""The fixed d-simplex head: its rows against the reference ``dsimplex()``, its width check, its logits and
loss, and that training never moves it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvs_jax.engine.train_step import make_optimizer
from cvs_jax.errors import ConfigError
from cvs_jax.models.simplex_head import SimplexHead, check_simplex_width, dsimplex, optimizer_labels, simplex_rows


def _reference_dsimplex(num_classes):
    """cores model.py dsimplex, torch ops replaced by numpy one for one (float32 as torch.zeros)."""
    n = num_classes - 1
    t = np.zeros((n + 1, n), np.float32)
    t[:-1, :] = np.eye(n)
    val = (1.0 - np.sqrt(1.0 + np.array([n], np.float32))) / n
    t[-1, :] += val
    t += -np.mean(t, axis=0)
    t /= np.linalg.norm(t, ord=2, axis=1, keepdims=True) + 1e-8
    return t


@pytest.mark.parametrize("k", [2, 3, 10, 100])
def test_rows_are_unit_with_pairwise_cosine_minus_one_over_k_minus_one(k):
    w = dsimplex(k)
    assert w.shape == (k, k - 1)
    np.testing.assert_allclose(np.linalg.norm(w, axis=1), 1.0, atol=1e-7)
    gram = w @ w.T
    off = gram[~np.eye(k, dtype=bool)]
    np.testing.assert_allclose(off, -1.0 / (k - 1), atol=1e-7)
    np.testing.assert_allclose(w.sum(axis=0), 0.0, atol=1e-7)  # centred: the rows sum to zero
    np.testing.assert_allclose(w, _reference_dsimplex(k), atol=1e-6)


def test_the_head_holds_the_simplex_in_the_first_k_minus_one_columns():
    head = SimplexHead()
    arrays = head.init(jax.random.PRNGKey(0), 5, 8)
    assert set(arrays) == set(head.keys) == {"head"}
    w = np.asarray(arrays["head"])
    assert w.shape == (5, 8) and w.dtype == np.float32
    np.testing.assert_allclose(w[:, :4], dsimplex(5), atol=1e-7)
    assert np.all(w[:, 4:] == 0)
    # nothing random: another key gives the same rows
    np.testing.assert_array_equal(np.asarray(head.init(jax.random.PRNGKey(1), 5, 8)["head"]), w)


def test_a_narrow_embedding_is_refused_with_the_width_it_needs():
    check_simplex_width(99, 100)  # CoReS: 100 rows, 99-d features
    with pytest.raises(ConfigError, match=r"model.embed_dim=128 is too narrow.*200 rows.*>= 199"):
        check_simplex_width(128, 200)  # Tiny-ImageNet's 200 classes at the demo width
    with pytest.raises(ConfigError, match=">= 199"):
        simplex_rows(200, 128)
    with pytest.raises(ConfigError):
        check_simplex_width(98, 100)


def test_logits_are_raw_dot_products_and_the_loss_masks_no_row():
    head = SimplexHead()
    arrays = head.init(jax.random.PRNGKey(0), 6, 7)
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(9, 7)).astype(np.float32) * 3
    labels = rng.integers(0, 6, size=9).astype(np.int32)
    w = np.asarray(arrays["head"], np.float64)
    logits = np.float64(emb) @ w.T  # fc2(z): no normalisation, no temperature
    np.testing.assert_allclose(np.asarray(head.logits(arrays, emb)), logits, rtol=1e-5, atol=1e-5)
    m = logits.max(1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(1, keepdims=True))
    want = -np.mean(logp[np.arange(9), labels])  # nn.CrossEntropyLoss over all K rows
    for valid in (2, 6):  # the classes seen so far do not mask rows, as in the references
        assert float(head.loss(arrays, emb, labels, jnp.int32(valid))) == pytest.approx(want, rel=1e-5)


def test_reversed_labels_are_iamcl2rs_target_transform():
    k = 6
    head, rev = SimplexHead(), SimplexHead(reverse_labels=True)
    arrays = head.init(jax.random.PRNGKey(0), k, 5)
    rng = np.random.default_rng(1)
    emb = rng.normal(size=(8, 5)).astype(np.float32)
    labels = rng.integers(0, k, size=8).astype(np.int32)
    plain = np.asarray(head.logits(arrays, emb))
    # iamcl2r: CrossEntropy(z W^T, K - 1 - y); column y of the reversed head is row K - 1 - y
    np.testing.assert_allclose(np.asarray(rev.logits(arrays, emb)), plain[:, ::-1], atol=1e-6)
    flipped = float(head.loss(arrays, emb, k - 1 - labels, None))
    assert float(rev.loss(arrays, emb, labels, None)) == pytest.approx(flipped, rel=1e-6)


def test_never_grown_or_reset():
    head = SimplexHead()
    arrays = head.init(jax.random.PRNGKey(0), 5, 6)
    again = head.at_session_start(arrays, jax.random.PRNGKey(3), 2, 4)
    np.testing.assert_array_equal(np.asarray(again["head"]), np.asarray(arrays["head"]))
    with pytest.raises(ValueError, match="6 classes in a simplex of 5 rows"):
        head.at_session_start(arrays, jax.random.PRNGKey(3), 2, 6)


def test_the_head_gets_zero_updates_under_an_optimizer_step():
    head = SimplexHead()
    params = {"net": {"w": jnp.ones((6, 6)) * 0.1}, **head.init(jax.random.PRNGKey(0), 5, 6)}
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(8, 6)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 5, size=8), jnp.int32)

    def loss(p):
        return head.loss({"head": p["head"]}, x @ p["net"]["w"], labels, None)

    grads = jax.grad(loss)(params)
    assert float(jnp.abs(grads["head"]).max()) == 0.0  # the logits read the rows through stop_gradient
    base = jax.tree.map(lambda _: "train", params)
    tx = make_optimizer(momentum=0.9, nesterov=True, weight_decay=5e-4, labels=optimizer_labels(head, base))
    state = tx.init(params)
    p = params
    for _ in range(3):
        updates, state = tx.update(jax.grad(loss)(p), state, p)
        p = jax.tree.map(lambda a, u: a + 0.1 * u, p, updates)
    np.testing.assert_array_equal(np.asarray(p["head"]), np.asarray(params["head"]))
    assert float(jnp.abs(p["net"]["w"] - params["net"]["w"]).max()) > 0  # the network did train
    # why the label is needed: without it, weight decay alone shrinks the rows
    plain = make_optimizer(momentum=0.9, nesterov=True, weight_decay=5e-4)
    updates, _ = plain.update(jax.grad(loss)(params), plain.init(params), params)
    assert float(jnp.abs(updates["head"]).max()) > 0
    # a trainable head's labels are left as they are
    assert optimizer_labels(type("Cosine", (), {"keys": ("head",)})(), base) == base
