"""The compatible-representation terms (RACT, CL²R, d-Simplex-HOC, LCE) against numpy transcriptions of
their reference code, on random batches with repeated labels."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvs_jax.methods import lce, ract, simplex
from cvs_jax.methods.base import StepInputs
from cvs_jax.models.heads import CosineHead


def _norm(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _batch(seed, b=12, d=6, classes=4):
    rng = np.random.default_rng(seed)
    new = rng.normal(size=(b, d)).astype(np.float32)
    old = (new + 0.7 * rng.normal(size=(b, d))).astype(np.float32)
    labels = rng.integers(0, classes, size=b).astype(np.int32)
    return new, old, labels


def _log_softmax(x):
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


# ------------------------------------------------------------------ RACT (OpenCompatible contra_ract)


def _ract_reference(new, old, labels, temp, topk, new_to_new=True):
    """model/loss.py calculate_loss('contra_ract'), line by line in numpy (float64)."""
    n, o = _norm(np.float64(new)), _norm(np.float64(old))
    masks = (labels[None, :] == labels[:, None]).astype(np.float64)
    pos = np.sum(n * o, axis=1, keepdims=True)
    n2o = n @ o.T - masks * 1e9
    n2n = n @ n.T - masks * 1e9
    if topk > 0:
        n2o = -np.sort(-n2o, axis=1)[:, :topk]
        n2n = -np.sort(-n2n, axis=1)[:, :topk]
    blocks = [pos, n2o] + ([n2n] if new_to_new else [])
    logits = np.concatenate(blocks, axis=1) / temp
    return logits, -np.mean(_log_softmax(logits)[:, 0])


@pytest.mark.parametrize("topk", [-1, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_ract_logits_masks_and_loss_match_the_reference(seed, topk):
    new, old, labels = _batch(seed)
    want_logits, want = _ract_reference(new, old, labels, 0.01, topk)
    got_logits = np.asarray(ract.ract_logits(new, old, labels, temperature=0.01, topk_neg=topk))
    assert got_logits.shape == want_logits.shape == (12, 1 + 2 * (12 if topk < 0 else topk))
    live = want_logits > -1e9  # masked entries: both far below any live logit
    np.testing.assert_allclose(got_logits[live], want_logits[live], rtol=1e-5, atol=1e-3)
    assert np.all(got_logits[~live] < -1e9)
    got = float(ract.ract_loss(new, old, labels, temperature=0.01, topk_neg=topk))
    assert got == pytest.approx(want, rel=1e-4)


def test_ract_same_label_entries_and_the_diagonal_are_masked():
    new, old, labels = _batch(2)
    logits = np.asarray(ract.ract_logits(new, old, labels, temperature=1.0, topk_neg=-1))
    same = labels[:, None] == labels[None, :]
    b = len(labels)
    for block in (logits[:, 1 : 1 + b], logits[:, 1 + b :]):
        assert np.all(block[same] < -1e8) and np.all(block[~same] > -2)
    assert np.all(np.diag(logits[:, 1 + b :]) < -1e8)  # the diagonal is masked in both blocks


def test_ract_defaults_are_the_reference_config():
    assert ract.TEMPERATURE == 0.01 and ract.TOPK_NEG == 10
    new, old, labels = _batch(3, b=16)
    want = _ract_reference(new, old, labels, 0.01, 10)[1]
    assert float(ract.ract_loss(new, old, labels)) == pytest.approx(want, rel=1e-4)


def test_ract_contra_drops_the_new_to_new_block():
    new, old, labels = _batch(4)
    got = float(ract.ract_loss(new, old, labels, temperature=0.05, topk_neg=-1, new_to_new=False))
    assert got == pytest.approx(_ract_reference(new, old, labels, 0.05, -1, new_to_new=False)[1], rel=1e-4)


def test_ract_new_to_new_keys_carry_no_gradient_as_all_gather():
    """The official default (gather_all) all-gathers the keys without gradient: only anchors get one."""
    new, old, labels = _batch(5)

    def with_constant_keys(anchors, keys):
        n, k, o = [x / jnp.linalg.norm(x, axis=1, keepdims=True) for x in (anchors, keys, jnp.asarray(old))]
        mask = (labels[:, None] == labels[None, :]).astype(jnp.float32)
        logits = jnp.concatenate([jnp.sum(n * o, 1, keepdims=True), n @ o.T - mask * 1e9, n @ k.T - mask * 1e9], 1)
        return -jnp.mean(jax.nn.log_softmax(logits / 0.05, axis=1)[:, 0])

    want = jax.grad(with_constant_keys)(jnp.asarray(new), jnp.asarray(new))
    got = jax.grad(lambda x: ract.ract_loss(x, old, labels, temperature=0.05, topk_neg=-1))(jnp.asarray(new))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-6)
    grad_old = jax.grad(lambda y: ract.ract_loss(new, y, labels, topk_neg=-1))(jnp.asarray(old))
    assert np.abs(np.asarray(grad_old)).max() == 0


def test_ract_refuses_more_negatives_than_the_batch():
    new, old, labels = _batch(0, b=8)
    with pytest.raises(ValueError, match="topk_neg=10 exceeds the batch of 8"):
        ract.ract_loss(new, old, labels, topk_neg=10)


# ------------------------------------------------------------------ CL²R


def test_cl2r_distillation_is_one_minus_cosine_on_the_memory_half_only():
    new, old, _ = _batch(6, b=10)
    mask = np.asarray(simplex.memory_half_mask(10))
    assert mask.tolist() == [False] * 5 + [True] * 5  # cvs-jax's half batches: the stream first, the memory last
    cos = np.sum(_norm(np.float64(new)) * _norm(np.float64(old)), axis=1)
    want = np.mean(1.0 - cos[5:])  # F.cosine_embedding_loss(..., target 1) on the memory rows
    assert float(simplex.cl2r_distillation_loss(new, old, mask)) == pytest.approx(want, rel=1e-5)
    odd = np.asarray(simplex.memory_half_mask(9))
    assert odd.sum() == 4 and odd[-4:].all()  # policies.half_memory_split: 5 stream rows, 4 memory rows
    assert float(simplex.cl2r_distillation_loss(new, old, np.zeros(10, bool))) == 0.0
    grad_old = jax.grad(lambda y: simplex.cl2r_distillation_loss(new, y, mask))(jnp.asarray(old))
    assert np.abs(np.asarray(grad_old)).max() == 0


def test_cl2r_lambda_is_base_times_sqrt_new_over_old():
    # utils.update_criterion_weight(args, num_old_classes, num_new_classes) = base * sqrt(new / old)
    assert float(simplex.cl2r_weight(10, 40)) == pytest.approx(5 * np.sqrt(10 / 40))
    assert float(simplex.cl2r_weight(30, 20, base=2.0)) == pytest.approx(2 * np.sqrt(30 / 20))
    assert float(simplex.cl2r_weight(5, 0)) == 0.0  # no old class: nothing to distil
    assert simplex.CL2R_BASE == 5.0


# ------------------------------------------------------------------ d-Simplex-HOC


def _hoc_reference(new, old, labels, mu):
    """iamcl2r hoc.py _loss(out0=old, out1=new), in numpy: same-class entries zeroed, not removed."""
    out0, out1 = _norm(np.float64(old)), _norm(np.float64(new))
    sim = np.einsum("nc,mc->nm", out0, out1) * mu
    positive = -np.diag(sim)
    class_mask = labels[:, None] == labels[None, :]
    sim = sim * (~class_mask)
    m = sim.max(axis=1, keepdims=True)
    negative = (m + np.log(np.exp(sim - m).sum(axis=1, keepdims=True)))[:, 0]
    return np.mean(positive + negative)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hoc_matches_the_reference_with_its_zeroing_quirk(seed):
    new, old, labels = _batch(seed)
    want = _hoc_reference(new, old, labels, 10.0)
    assert float(simplex.hoc_loss(new, old, labels)) == pytest.approx(want, rel=1e-5)
    # the quirk matters: removing the same-class entries instead (a proper InfoNCE) gives another value
    o, n = _norm(np.float64(old)), _norm(np.float64(new))
    sim = 10 * o @ n.T
    removed = np.where(labels[:, None] != labels[None, :], sim, -np.inf)
    proper = np.mean(-np.diag(sim) + np.log(np.exp(removed).sum(1)))
    assert abs(want - proper) > 1e-3


def test_hoc_one_class_batch_is_the_positive_plus_log_batch():
    new, old, _ = _batch(7, b=8)
    labels = np.zeros(8, np.int32)  # every entry zeroed: logsumexp of B zeros = log B
    cos = np.sum(_norm(np.float64(new)) * _norm(np.float64(old)), axis=1)
    want = np.mean(-3.0 * cos) + np.log(8)
    assert float(simplex.hoc_loss(new, old, labels, mu=3.0)) == pytest.approx(want, rel=1e-5)
    assert simplex.HOC_MU == 10.0 and simplex.HOC_LAMBDA == 0.1


# ------------------------------------------------------------------ LCE


def _lce_reference(feats, labels, num_classes):
    """main.py save_lcefeat in numpy: normalise, class mean, normalise, min cosine."""
    f = _norm(np.float64(feats))
    centres, cos = np.zeros((num_classes, f.shape[1])), np.zeros(num_classes)
    for k in np.unique(labels):
        c = f[labels == k].mean(0)
        c = c / np.linalg.norm(c)
        centres[k], cos[k] = c, min(f[labels == k] @ c)
    return centres, cos


def test_lce_centres_and_boundaries_from_stored_rows():
    rng = np.random.default_rng(8)
    rows = rng.normal(size=(40, 5)).astype(np.float32) * rng.uniform(0.5, 3, size=(40, 1)).astype(np.float32)
    labels = rng.choice([0, 1, 3, 4], size=40)
    centres, bounds, mask = lce.centres_and_boundaries(rows, labels, 6)
    want_c, want_b = _lce_reference(rows, labels, 6)
    assert mask.tolist() == [True, True, False, True, True, False]
    np.testing.assert_allclose(centres, want_c, atol=1e-6)
    np.testing.assert_allclose(bounds, want_b, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(centres[mask], axis=1), 1.0, atol=1e-6)
    # read in blocks: the same when every block holds a few rows
    lce_block, lce._BLOCK = lce._BLOCK, 7
    try:
        again = lce.centres_and_boundaries(rows, labels, 6)
    finally:
        lce._BLOCK = lce_block
    np.testing.assert_allclose(again[0], centres, atol=1e-6)
    np.testing.assert_allclose(again[1], bounds, atol=1e-6)


def test_lce_align_is_the_mse_of_normalised_head_rows_and_centres():
    rng = np.random.default_rng(9)
    head = rng.normal(size=(6, 5)).astype(np.float32)
    centres = _norm(rng.normal(size=(6, 5))).astype(np.float32)
    mask = np.array([True, True, True, False, False, False])
    # F.mse_loss(normalize(W), C_old): the mean over every entry of the rows that have a centre
    want = np.mean((_norm(np.float64(head[:3])) - centres[:3]) ** 2)
    assert float(lce.lce_align_loss(head, centres, mask)) == pytest.approx(want, rel=1e-5)
    assert float(lce.lce_align_loss(head, centres, np.zeros(6, bool))) == 0.0
    assert lce.LAMBDA_ALIGN == 100.0 and lce.LAMBDA_BOUND == 1.0


def test_lce_boundary_clamps_the_raw_dot_product_and_hinges_on_theta():
    rng = np.random.default_rng(10)
    feats = (rng.normal(size=(16, 5)) * 0.4).astype(np.float32)  # raw features, some dots beyond +-1
    feats[:3] *= 10
    centres = _norm(rng.normal(size=(6, 5))).astype(np.float32)
    theta = rng.uniform(-0.5, 0.5, size=6).astype(np.float32)
    mask = np.array([True, True, True, True, False, False])
    labels = rng.integers(0, 6, size=16).astype(np.int32)
    labels[:4] = [0, 1, 2, 3]

    def reference(f):
        cos = np.clip(np.sum(f * centres[labels], axis=1), -1, 1)  # torch.mm(features, C.t()).clamp(-1, 1)
        hinge = np.maximum(theta[labels] - cos, 0)  # (old_class_cos[pids] - val_all).clamp(0)
        return np.mean(hinge[mask[labels]])

    got = float(lce.lce_boundary_loss(feats, labels, centres, theta, mask))
    assert got == pytest.approx(reference(np.float64(feats)), rel=1e-5) and got > 0
    normalised = float(lce.lce_boundary_loss(feats, labels, centres, theta, mask, normalize_features=True))
    assert normalised == pytest.approx(reference(_norm(np.float64(feats))), rel=1e-5)
    none = np.zeros(6, bool)
    assert float(lce.lce_boundary_loss(feats, labels, centres, theta, none)) == 0.0


# ------------------------------------------------------------------ the term functions a Method wraps


def _inputs(new, old, labels, head_rows, consts):
    head, old_head = {"head": jnp.asarray(head_rows)}, {"head": jnp.asarray(head_rows[::-1])}
    return StepInputs(
        params={}, new_emb=jnp.asarray(new), old_emb=jnp.asarray(old), labels=jnp.asarray(labels),
        classifier=CosineHead(0.05), head=head, old_head=old_head, consts=consts,
    )  # fmt: skip


def test_term_functions_read_the_step_inputs():
    new, old, labels = _batch(11, b=16, classes=6)
    rng = np.random.default_rng(11)
    rows = rng.normal(size=(6, 6)).astype(np.float32)
    centres, bounds, mask = lce.centres_and_boundaries(old, labels, 6)
    consts = {
        "valid_classes": jnp.int32(30),
        "old_classes": jnp.int32(20),
        "lce_centres": jnp.asarray(centres),
        "lce_boundaries": jnp.asarray(bounds),
        "lce_mask": jnp.asarray(mask),
        "cl2r_scale": jnp.float32(np.sqrt(10 / 20)),  # Cl2rWeight's constant: 10 new, 20 old
    }
    x = _inputs(new, old, labels, rows, consts)
    assert float(ract.ract_terms(x)["L_ract"]) == pytest.approx(_ract_reference(new, old, labels, 0.01, 10)[1], 1e-4)
    fd = float(simplex.cl2r_distillation_loss(new, old, simplex.memory_half_mask(16)))
    assert float(simplex.cl2r_terms(x)["L_fd"]) == pytest.approx(np.sqrt(10 / 20) * fd, rel=1e-5)  # 10 new, 20 old
    hoc = float(simplex.hoc_terms(x)["L_hoc"])  # carries 1 - hoc.ce_weight itself
    assert hoc == pytest.approx(0.9 * _hoc_reference(new, old, labels, 10.0), rel=1e-5)
    terms = lce.lce_terms(x)
    assert float(terms["L_align"]) == pytest.approx(float(lce.lce_align_loss(rows, centres, mask)), rel=1e-6)
    want = float(lce.lce_boundary_loss(new, labels, centres, bounds, mask))
    assert float(terms["L_bound"]) == pytest.approx(want, rel=1e-6)
