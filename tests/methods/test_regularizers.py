"""EWC penalty and EWC++ running Fisher on a tiny 2-layer MLP vs. direct numpy computation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvs_jax.methods import regularizers as rg

TOL = dict(rtol=1e-5, atol=1e-6)
NAMES = ("w1", "b1", "w2", "b2")


# ----------------------------------------------------------------------------
# tiny model: x[3] -> tanh(4) -> logits[3]; plain jnp, params as a dict pytree
# ----------------------------------------------------------------------------


def init(seed):
    r = np.random.RandomState(seed)
    return {
        "w1": (0.7 * r.randn(3, 4)).astype(np.float32),
        "b1": (0.1 * r.randn(4)).astype(np.float32),
        "w2": (0.7 * r.randn(4, 3)).astype(np.float32),
        "b2": (0.1 * r.randn(3)).astype(np.float32),
    }


def data(seed, n=6):
    r = np.random.RandomState(100 + seed)
    return r.randn(n, 3).astype(np.float32), r.randint(0, 3, size=n).astype(np.int32)


def example_loss(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    z = h @ params["w2"] + params["b2"]
    return -jax.nn.log_softmax(z)[y]


def batch_loss(params, xs, ys):
    return jnp.mean(jax.vmap(example_loss, in_axes=(None, 0, 0))(params, xs, ys))


GRAD1 = jax.jit(jax.grad(example_loss))
GRADB = jax.jit(jax.grad(batch_loss))


def np_grad(params, x, y):
    """Hand-written backprop of the tiny MLP (float64), independent of jax.grad."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    x = np.asarray(x, np.float64)
    h = np.tanh(x @ p["w1"] + p["b1"])
    z = h @ p["w2"] + p["b2"]
    e = np.exp(z - z.max())
    prob = e / e.sum()
    dz = prob.copy()
    dz[y] -= 1.0
    da = (p["w2"] @ dz) * (1.0 - h * h)
    return {"w1": np.outer(x, da), "b1": da, "w2": np.outer(h, dz), "b2": dz}


def to_np(tree):
    return {k: np.asarray(v, np.float64) for k, v in tree.items()}


# ----------------------------------------------------------------------------
# EWC++ update
# ----------------------------------------------------------------------------


def test_ewcpp_update():
    r = np.random.RandomState(3)
    F = {"a": r.rand(3, 2).astype(np.float32), "b": np.zeros(4, np.float32)}
    g = {"a": r.randn(3, 2).astype(np.float32), "b": r.randn(4).astype(np.float32)}
    out = rg.update_ewcpp_importance(F, g, alpha=0.3)
    for k in F:
        np.testing.assert_allclose(np.asarray(out[k]), 0.3 * g[k] ** 2 + 0.7 * F[k], **TOL)
    # Rainbow fork: an all-zero leaf is initialised to g² (per leaf)
    out = rg.update_ewcpp_importance(F, g, alpha=0.5, init_if_zero=True)
    np.testing.assert_allclose(np.asarray(out["a"]), 0.5 * g["a"] ** 2 + 0.5 * F["a"], **TOL)
    np.testing.assert_allclose(np.asarray(out["b"]), g["b"] ** 2, **TOL)


# ----------------------------------------------------------------------------
# EWC penalty
# ----------------------------------------------------------------------------


def test_ewc_penalty_zero_at_anchor_and_hand_value_elsewhere():
    params = init(4)
    xs, ys = data(4)
    grads = [to_np(GRAD1(params, xs[i], ys[i])) for i in range(len(ys))]
    fisher = {k: np.mean([g[k] ** 2 for g in grads], axis=0).astype(np.float32) for k in NAMES}
    anchor = {k: v.copy() for k, v in params.items()}
    pen = jax.jit(rg.ewc_penalty)
    assert float(pen(params, anchor, fisher)) == 0.0

    r = np.random.RandomState(5)
    moved = {k: (v + 0.2 * r.randn(*v.shape)).astype(np.float32) for k, v in params.items()}
    ref = 0.0
    for k in NAMES:  # Σ F (θ − θ*)², no ½ (Rainbow-Memory)
        for f, a, b in zip(fisher[k].ravel(), moved[k].ravel(), anchor[k].ravel()):
            ref += float(f) * (float(a) - float(b)) ** 2
    np.testing.assert_allclose(float(pen(moved, anchor, fisher)), ref, rtol=1e-5)

    # gradient 2F(θ − θ*) w.r.t. θ only; anchor / importance are constants
    g_p, g_a, g_f = jax.grad(rg.ewc_penalty, argnums=(0, 1, 2))(moved, anchor, fisher)
    for k in NAMES:
        np.testing.assert_allclose(np.asarray(g_p[k]), 2 * fisher[k] * (moved[k] - anchor[k]), rtol=1e-5, atol=1e-7)
        assert np.all(np.asarray(g_a[k]) == 0.0) and np.all(np.asarray(g_f[k]) == 0.0)


# ----------------------------------------------------------------------------
# EWC++ running Fisher along training steps (RWalk's importance in the fork)
# ----------------------------------------------------------------------------


def test_ewcpp_running_fisher_along_sgd_path():
    """A few SGD steps on the tiny MLP: running Fisher (Rainbow fork's EWC++) vs numpy."""
    params = init(6)
    xs, ys = data(6, n=8)
    lr, alpha = 0.5, 0.5
    fisher = {k: np.zeros_like(v) for k, v in params.items()}
    np_p = to_np(params)
    np_f = {k: np.zeros_like(v) for k, v in np_p.items()}
    for step in range(4):
        a, b = 2 * step, 2 * step + 2
        g = GRADB(params, xs[a:b], ys[a:b])
        params = jax.tree_util.tree_map(lambda p, gg: p - lr * gg, params, g)
        fisher = rg.update_ewcpp_importance(fisher, g, alpha=alpha, init_if_zero=True)
        # numpy: hand gradients, explicit loops over the entries
        hand = [np_grad(np_p, xs[i], ys[i]) for i in range(a, b)]
        gb = {k: np.mean([h[k] for h in hand], axis=0) for k in NAMES}
        for k in NAMES:
            if np.all(np_f[k] == 0):
                np_f[k] = gb[k] ** 2
            else:
                np_f[k] = alpha * gb[k] ** 2 + (1 - alpha) * np_f[k]
            np_p[k] = np_p[k] - lr * gb[k]
    for k in NAMES:
        np.testing.assert_allclose(np.asarray(fisher[k]), np_f[k], rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(np.asarray(params[k]), np_p[k], rtol=1e-4, atol=1e-6)


def test_importance_accumulates_and_normalises():
    """online EWC sums session Fishers; RWalk keeps the running one; `used` = raw / max(raw)."""
    from cvs_jax.methods import fisher

    rng = np.random.default_rng(3)
    f1 = {"a": rng.random((3, 2)).astype(np.float32), "b": rng.random(4).astype(np.float32)}
    f2 = {"a": rng.random((3, 2)).astype(np.float32), "b": 5 * rng.random(4).astype(np.float32)}
    raw = fisher.accumulate("ewc", None, f1)
    raw = fisher.accumulate("ewc", raw, f2)
    used = fisher.for_penalty(raw, normalize=True)
    top = max(np.max(f1["a"] + f2["a"]), np.max(f1["b"] + f2["b"]))
    np.testing.assert_allclose(raw["a"], f1["a"] + f2["a"], rtol=1e-6)
    np.testing.assert_allclose(used["b"], (f1["b"] + f2["b"]) / top, rtol=1e-6)
    assert max(np.max(used["a"]), np.max(used["b"])) == pytest.approx(1.0)
    raw = fisher.accumulate("rwalk", f1, f2)  # running Fisher passed through
    used = fisher.for_penalty(raw, normalize=False)
    np.testing.assert_array_equal(used["b"], f2["b"])
    np.testing.assert_array_equal(raw["a"], f2["a"])
