"""Distillation losses vs. small numpy references written from the formulas
(official CVS kdloss.py / mmdloss.py / train.py, MLKD, RKD, DarkRank, BatchHard)."""

import functools

import jax
import numpy as np
import pytest

from cvs_jax.methods import distillation as dl

SEEDS = [0, 1, 2]
TOL = dict(rtol=1e-5, atol=1e-5)
N, D, K, C_OLD = 10, 6, 7, 4


# ----------------------------------------------------------------------------
# numpy references (float64, loops)
# ----------------------------------------------------------------------------


def np_norm(x):
    x = np.asarray(x, np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def np_log_softmax(z):
    z = np.asarray(z, np.float64)
    m = z.max()
    return z - (m + np.log(np.sum(np.exp(z - m))))


def np_cos(e, w):
    return np_norm(e) @ np_norm(w).T


def np_kd(s, t, T=2.0, C=None, rows=None):
    """official KDLoss on the first C columns, mean over `rows`."""
    s, t = np.asarray(s, np.float64), np.asarray(t, np.float64)
    C = s.shape[1] if C is None else C
    rows = range(s.shape[0]) if rows is None else rows
    vals = []
    for i in rows:
        ls = np_log_softmax(s[i, :C] / T)
        pt = np.exp(np_log_softmax(t[i, :C] / T))
        vals.append(-np.sum(pt * ls))
    return float(np.mean(vals)) if vals else 0.0


def np_bct(emb, head, labels, c_old, temp=0.05):
    z = np_cos(emb, head[:c_old]) / temp
    vals = [-np_log_softmax(z[i])[labels[i]] for i in range(len(labels)) if labels[i] < c_old]
    return float(np.mean(vals)) if vals else 0.0


def np_mmd(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    depth = a.shape[1]

    def k(x, y):
        out = np.zeros((x.shape[0], y.shape[0]))
        for i in range(x.shape[0]):
            for j in range(y.shape[0]):
                out[i, j] = np.exp(-np.mean((x[i] - y[j]) ** 2) / depth)
        return out

    return k(a, a).mean() + k(b, b).mean() - 2 * k(a, b).mean()


def np_dark(s, t, T=2.0, C=None, temp=0.05, t_squared=True):
    s, t = np.asarray(s, np.float64) / temp, np.asarray(t, np.float64) / temp
    C = s.shape[1] if C is None else C
    vals = []
    for i in range(s.shape[0]):
        lq = np_log_softmax(s[i, :C] / T)
        lp = np_log_softmax(t[i, :C] / T)
        vals.append(np.sum(np.exp(lp) * (lp - lq)))
    return float(np.mean(vals)) * (T * T if t_squared else 1.0)


def np_pdist(x, zero_diag=True):
    n = x.shape[0]
    d = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            d[i, j] = np.sqrt(max(np.sum((x[i] - x[j]) ** 2), 1e-12))
            if zero_diag and i == j:
                d[i, j] = 0.0
    return d


def np_mlkd_abs(a, b):
    a, b = np_norm(a), np_norm(b)
    return float(np.mean([np.sqrt(np.sum((a[i] - b[i] + 1e-6) ** 2)) for i in range(a.shape[0])]))


def np_mlkd_rel(a, b):
    a, b = np_norm(a), np_norm(b)
    return float(np.sqrt(np.sum((np_pdist(a, False) - np_pdist(b, False)) ** 2)))


def np_huber(x):
    ax = np.abs(x)
    return np.where(ax < 1.0, 0.5 * x * x, ax - 0.5)


def np_rkd_dist(a, b):
    a, b = np_norm(a), np_norm(b)
    ds, dt = np_pdist(a), np_pdist(b)
    ds, dt = ds / ds[ds > 0].mean(), dt / dt[dt > 0].mean()
    return float(np_huber(ds - dt).mean())


def np_rkd_angle(a, b):
    a, b = np_norm(a), np_norm(b)
    n = a.shape[0]

    def ang(x):
        out = np.zeros((n, n, n))
        for i in range(n):
            for j in range(n):
                for k in range(n):
                    u, w = x[j] - x[i], x[k] - x[i]
                    u = u / max(np.linalg.norm(u), 1e-12)
                    w = w / max(np.linalg.norm(w), 1e-12)
                    out[i, j, k] = u @ w
        return out

    return float(np_huber(ang(a) - ang(b)).mean())


def np_darkrank(a, b, alpha=3.0, beta=3.0, list_len=None):
    """RKD HardDarkRank: sort teacher scores descending (self first), drop it, PL NLL."""
    a, b = np_norm(a), np_norm(b)
    n = a.shape[0]
    L = n - 1 if list_len is None else list_len
    st = -alpha * np_pdist(b) ** beta
    ss = -alpha * np_pdist(a) ** beta
    vals = []
    for i in range(n):
        others = [j for j in range(n) if j != i]
        perm = sorted(others, key=lambda j: -st[i, j])[:L]
        x = ss[i, perm]
        lp = 0.0
        for r in range(L):
            m = x[r:].max()
            lp += x[r] - (m + np.log(np.sum(np.exp(x[r:] - m))))
        vals.append(-lp)
    return float(np.mean(vals))


def np_batch_hard(a, b, labels, margin=0.1, eps=1e-6):
    a, o = np_norm(a), np_norm(b)
    n = a.shape[0]
    terms = []
    for i in range(n):
        dist = [np.sqrt(np.sum((a[i] - o[j]) ** 2)) for j in range(n)]
        pos = [j for j in range(n) if labels[j] == labels[i]]
        neg = [j for j in range(n) if labels[j] != labels[i]]
        if not neg:
            continue
        p = max(pos, key=lambda j: dist[j])
        q = min(neg, key=lambda j: dist[j])
        dp = np.sqrt(np.sum((a[i] - o[p] + eps) ** 2))
        dn = np.sqrt(np.sum((a[i] - o[q] + eps) ** 2))
        terms.append(max(0.0, dp - dn + margin))
    return float(np.mean(terms)) if terms else 0.0


# ----------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------


def make(seed, n=N, d=D, k=K, n_labels=5):
    r = np.random.RandomState(seed)
    new = r.randn(n, d).astype(np.float32)
    old = (new + 0.7 * r.randn(n, d)).astype(np.float32)
    labels = r.randint(0, n_labels, size=n).astype(np.int32)
    head = r.randn(k, d).astype(np.float32)
    new_cos = np.tanh(r.randn(n, k)).astype(np.float32)  # NormLayer outputs in [-1, 1]
    old_cos = np.tanh(r.randn(n, k)).astype(np.float32)
    return new, old, labels, head, new_cos, old_cos


# Compiled once per module (shapes are shared between tests, so each loss compiles a few
# times only: the machine is small and compiles dominate the runtime).
EMB_LOSSES = {
    "mmd": (dl.mmd_loss, np_mmd),
    "mlkd_abs": (dl.mlkd_absolute_loss, np_mlkd_abs),
    "mlkd_rel": (dl.mlkd_relative_loss, np_mlkd_rel),
    "rkd_dist": (dl.rkd_distance_loss, np_rkd_dist),
    "rkd_angle": (dl.rkd_angle_loss, np_rkd_angle),
    "darkrank": (dl.darkrank_hard_loss, np_darkrank),
    "darkrank4": (
        functools.partial(dl.darkrank_hard_loss, list_len=4),
        functools.partial(np_darkrank, list_len=4),
    ),
}
EMB_JIT = {name: jax.jit(f) for name, (f, _) in EMB_LOSSES.items()}
EMB_VG = {name: jax.jit(jax.value_and_grad(f, argnums=(0, 1))) for name, (f, _) in EMB_LOSSES.items()}

BH = jax.jit(dl.batch_hard_triplet_loss)
BH_VG = jax.jit(jax.value_and_grad(dl.batch_hard_triplet_loss, argnums=(0, 1)))
# logit losses: class counts are traced ints (one compile serves C_OLD and 0)
BCT = jax.jit(dl.bct_influence_loss)
BCT_VG = jax.jit(jax.value_and_grad(dl.bct_influence_loss, argnums=(0, 1)))
LWF = jax.jit(dl.lwf_kd_loss)
LWF_VG = jax.jit(jax.value_and_grad(dl.lwf_kd_loss, argnums=(0, 1)))
MMDKD = jax.jit(dl.mmd_kd_new_class_loss)
MMDKD_VG = jax.jit(jax.value_and_grad(dl.mmd_kd_new_class_loss, argnums=(0, 1)))
DARK = jax.jit(dl.dark_knowledge_loss, static_argnames=("T", "t_squared"))
DARK_VG = jax.jit(jax.value_and_grad(dl.dark_knowledge_loss, argnums=(0, 1)), static_argnames=("T", "t_squared"))


# ----------------------------------------------------------------------------
# values
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_embedding_losses_match_numpy(seed):
    new, old, *_ = make(seed)
    for name, (_, ref) in EMB_LOSSES.items():
        got = float(EMB_JIT[name](new, old))
        np.testing.assert_allclose(got, ref(new, old), err_msg=name, **TOL)


@pytest.mark.parametrize("seed", SEEDS)
def test_batch_hard_matches_numpy(seed):
    new, old, labels, *_ = make(seed, n_labels=3)
    got = float(BH(new, old, labels))
    np.testing.assert_allclose(got, np_batch_hard(new, old, labels), **TOL)


@pytest.mark.parametrize("seed", SEEDS)
def test_logit_losses_match_numpy(seed):
    new, old, labels, head, new_cos, old_cos = make(seed)
    # BCT: old head = first C_OLD rows of an allocated K-row head.
    got = BCT(new, head, labels, C_OLD)
    np.testing.assert_allclose(float(got), np_bct(new, head, labels, C_OLD), **TOL)
    # LwF: official KDLoss(h/0.05, o/0.05) with T = 2 over the old columns.
    ref = np_kd(new_cos / 0.05, old_cos / 0.05, 2.0, C_OLD)
    np.testing.assert_allclose(float(LWF(new_cos, old_cos, num_old_classes=C_OLD)), ref, **TOL)
    # same on tensors with exactly C_OLD columns (the official shapes), no mask
    got = dl.lwf_kd_loss(new_cos[:, :C_OLD], old_cos[:, :C_OLD])
    np.testing.assert_allclose(float(got), ref, **TOL)
    # MMD KD on new-class rows: new logits [n, K] restricted to old columns vs old [n, C_OLD].
    rows = [i for i in range(N) if labels[i] >= C_OLD]
    got = MMDKD(new_cos, old_cos[:, :C_OLD], labels, C_OLD)
    ref = np_kd(new_cos / 0.05, old_cos / 0.05, 2.0, C_OLD, rows)
    np.testing.assert_allclose(float(got), ref, **TOL)
    # Dark knowledge: T^2 * KL.
    got = DARK(new_cos, old_cos, num_old_classes=C_OLD)
    np.testing.assert_allclose(float(got), np_dark(new_cos, old_cos, 2.0, C_OLD), **TOL)
    got = DARK(new_cos, old_cos, T=4.0, t_squared=False)
    ref = np_dark(new_cos, old_cos, 4.0, None, t_squared=False)
    np.testing.assert_allclose(float(got), ref, **TOL)


def test_kd_vs_dark_knowledge_gradient_relation():
    """KL and the official CE-form KD differ by a teacher constant: grads differ by T^2."""
    _, _, _, _, new_cos, old_cos = make(5)
    _, (g_kd, _) = LWF_VG(new_cos, old_cos, num_old_classes=C_OLD)
    _, (g_dk, _) = DARK_VG(new_cos, old_cos, num_old_classes=C_OLD)
    np.testing.assert_allclose(np.asarray(g_dk), 4.0 * np.asarray(g_kd), rtol=1e-4, atol=1e-5)
    assert np.all(np.asarray(g_kd)[:, C_OLD:] == 0.0)


def test_mmd_zero_for_identical_and_raw_embeddings():
    new, old, *_ = make(3)
    f = EMB_JIT["mmd"]
    assert abs(float(f(new, new))) < 1e-6
    # raw (un-normalized) embeddings: a common rescaling changes the value
    assert abs(float(f(new, old)) - float(f(2 * new, 2 * old))) > 1e-4
    np.testing.assert_allclose(float(dl.mmd_loss(new, old, dim=D)), float(f(new, old)), **TOL)


# ----------------------------------------------------------------------------
# gradients: old side frozen, new side finite
# ----------------------------------------------------------------------------


def _check_grads(vg, args, name, kwargs=None):
    _, (g_new, g_old) = vg(*args, **(kwargs or {}))
    g_new, g_old = np.asarray(g_new), np.asarray(g_old)
    assert np.all(np.isfinite(g_new)), name
    assert np.any(g_new != 0.0), name
    assert np.all(g_old == 0.0), name


def test_old_side_gradients_are_zero():
    new, old, labels, head, new_cos, old_cos = make(0, n_labels=3)
    labels_k = labels.copy()
    labels_k[0] = 0  # at least one old-class row for BCT
    labels_k[1] = K - 1  # and one new-class row for the MMD KD
    for name in EMB_LOSSES:
        _check_grads(EMB_VG[name], (new, old), name)
    _check_grads(BH_VG, (new, old, labels), "batch_hard")
    _check_grads(BCT_VG, (new, head, labels_k, C_OLD), "bct")
    _check_grads(LWF_VG, (new_cos, old_cos), "lwf", dict(num_old_classes=C_OLD))
    _check_grads(MMDKD_VG, (new_cos, old_cos, labels_k, C_OLD), "mmd_kd")
    _check_grads(DARK_VG, (new_cos, old_cos), "dark", dict(num_old_classes=C_OLD))


# ----------------------------------------------------------------------------
# masks and edge cases
# ----------------------------------------------------------------------------


def _zero_with_finite_grad(vg, args, name, kwargs=None):
    val, (g_new, _) = vg(*args, **(kwargs or {}))
    assert float(val) == 0.0, name
    assert np.all(np.isfinite(np.asarray(g_new))), name


def test_no_old_classes_gives_zero_without_nan():
    new, old, labels, head, new_cos, old_cos = make(7)
    _zero_with_finite_grad(BCT_VG, (new, head, labels, 0), "bct")
    _zero_with_finite_grad(LWF_VG, (new_cos, old_cos), "lwf", dict(num_old_classes=0))
    _zero_with_finite_grad(DARK_VG, (new_cos, old_cos), "dark", dict(num_old_classes=0))
    _zero_with_finite_grad(MMDKD_VG, (new_cos, old_cos, labels, 0), "mmd_kd 0")
    # blurry: every class is old -> no new-class rows -> 0
    _zero_with_finite_grad(MMDKD_VG, (new_cos, old_cos, labels, K), "mmd_kd K")
    # BCT with no old-class sample in the batch
    _zero_with_finite_grad(BCT_VG, (new, head, np.full(N, K - 1, np.int32), C_OLD), "bct none")


def test_single_label_batch_triplet_variants():
    from cvs_jax.methods.losses import neighbor_session_triplet_loss

    new, old, *_ = make(11)
    labels = np.zeros(N, np.int32)
    _zero_with_finite_grad(BH_VG, (new, old, labels), "batch_hard")
    assert float(neighbor_session_triplet_loss(new, old, labels)) == 0.0


def test_batch_hard_reduces_to_cvs_positive_when_classes_are_singletons():
    """With all labels distinct the only positive is j = i: same as the CVS L_m triplet."""
    from cvs_jax.methods.losses import neighbor_session_triplet_loss

    new, old, *_ = make(13)
    labels = np.arange(N, dtype=np.int32)
    np.testing.assert_allclose(
        float(BH(new, old, labels)), float(neighbor_session_triplet_loss(new, old, labels)), **TOL
    )


def test_darkrank_list_len_clipped_and_identical_models():
    new, old, *_ = make(17)
    np.testing.assert_allclose(
        float(dl.darkrank_hard_loss(new, old, list_len=100)),
        float(EMB_JIT["darkrank"](new, old)),
        **TOL,
    )
    # the relational losses vanish when the two models agree
    for name in ("mlkd_abs", "mlkd_rel", "rkd_dist", "rkd_angle"):
        assert abs(float(EMB_JIT[name](new, new))) < 1e-5, name
