"""iCaRL herding and per-class memory rebuild (spec Sec. 4)."""

import numpy as np
import pytest

from cvs_jax.methods import replay
from cvs_jax.methods.replay import herding_select, rebuild_memory

SEEDS = [0, 1, 2, 3, 4]


def ref_herding(emb, m):
    """Greedy rule transcribed literally: loop over candidates, strict < keeps the first."""
    z = np.asarray(emb, np.float64)
    z = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    mu = z.mean(axis=0)
    s = np.zeros_like(mu)
    remaining = list(range(len(z)))
    picks = []
    for k in range(1, m + 1):
        if not remaining:
            break
        best, best_j = np.inf, None
        for j in remaining:
            dist = np.linalg.norm(mu - (s + z[j]) / k)
            if dist < best:
                best, best_j = dist, j
        picks.append(best_j)
        remaining.remove(best_j)
        s = s + z[best_j]
    return np.array(picks, np.int64)


def official_style_herding(emb, m):
    """The official addNewExemplars loop (np.delete bookkeeping), float32, returning indices."""
    z = np.asarray(emb, np.float32)
    z = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    mean = np.mean(z, axis=0)
    ids = np.arange(len(z))
    acc = np.zeros_like(mean)
    out = []
    for i in range(m):
        x = np.linalg.norm(mean - (acc + z) / (i + 1), axis=1)
        idx = np.argmin(x)
        acc += z[idx]
        out.append(ids[idx])
        z, ids = np.delete(z, idx, axis=0), np.delete(ids, idx)
        if len(z) == 0:
            break
    return np.array(out, np.int64)


@pytest.mark.parametrize("seed", SEEDS)
def test_herding_matches_literal_greedy(seed):
    rng = np.random.default_rng(seed)
    n, d = int(rng.integers(10, 40)), int(rng.integers(4, 17))
    emb = rng.normal(size=(n, d)) * rng.uniform(0.5, 3.0, size=(n, 1))
    m = int(rng.integers(1, n))
    np.testing.assert_array_equal(herding_select(emb, m), ref_herding(emb, m))


@pytest.mark.parametrize("seed", SEEDS)
def test_herding_float32_matches_official_loop(seed):
    rng = np.random.default_rng(100 + seed)
    emb = rng.normal(size=(30, 8)).astype(np.float32)
    np.testing.assert_array_equal(herding_select(emb, 12), official_style_herding(emb, 12))


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_herding_m_ge_n_returns_permutation(seed):
    rng = np.random.default_rng(seed)
    emb = rng.normal(size=(9, 5))
    for m in (9, 25):
        picks = herding_select(emb, m)
        assert sorted(picks.tolist()) == list(range(9))
        np.testing.assert_array_equal(picks, ref_herding(emb, 9))


def test_herding_edge_cases():
    assert herding_select(np.ones((4, 3)), 0).shape == (0,)
    # identical rows tie everywhere: lowest index first
    np.testing.assert_array_equal(herding_select(np.ones((5, 3)), 3), [0, 1, 2])
    # scale-invariant (rows are normalised first)
    rng = np.random.default_rng(7)
    emb = rng.normal(size=(12, 4))
    np.testing.assert_array_equal(herding_select(emb, 6), herding_select(emb * rng.uniform(0.1, 10, (12, 1)), 6))


def _pool(seed, counts, d=6):
    rng = np.random.default_rng(seed)
    labels = np.concatenate([np.full(c, k) for k, c in enumerate(counts)])
    perm = rng.permutation(len(labels))
    labels = labels[perm]
    emb = rng.normal(size=(len(labels), d)) + labels[:, None] * 0.1
    ids = np.arange(len(labels)) + 1000
    return emb, labels, ids


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_rebuild_memory_quota_order_and_budget(seed):
    counts = [30, 12, 3, 25, 40]  # class 2 has fewer items than the quota
    emb, labels, ids = _pool(seed, counts)
    for budget in (50, 53, 5):
        sel_ids, sel_lab = rebuild_memory(emb, labels, ids, budget)
        quota = budget // len(counts)
        assert len(sel_ids) <= budget
        assert len(sel_ids) == sum(min(quota, c) for c in counts)
        assert np.all(np.diff(sel_lab) >= 0)  # grouped by ascending class
        start = 0
        for c in range(len(counts)):
            rows = np.flatnonzero(labels == c)
            want = ids[rows[ref_herding(emb[rows], quota)]]
            got = sel_ids[start : start + len(want)]
            np.testing.assert_array_equal(got, want)  # pick order within the class
            np.testing.assert_array_equal(sel_lab[start : start + len(want)], c)
            start += len(want)


def test_rebuild_memory_exact_budget_when_divisible():
    emb, labels, ids = _pool(0, [20] * 5)
    sel_ids, _ = rebuild_memory(emb, labels, ids, 25)
    assert len(sel_ids) == 25 and len(set(sel_ids.tolist())) == 25


def test_rebuild_memory_spec_totals():
    # Spec 4: CIFAR disjoint buffer 2000 with 60 classes -> 33 per class, 1980 stored.
    emb, labels, ids = _pool(1, [40] * 60, d=4)
    sel_ids, sel_lab = rebuild_memory(emb, labels, ids, 2000)
    assert len(sel_ids) == 1980
    np.testing.assert_array_equal(np.bincount(sel_lab), 33)


def test_rebuild_memory_budget_too_small():
    emb, labels, ids = _pool(0, [3, 3, 3])
    with pytest.raises(ValueError, match=r"memory_budget.*at least the number of classes seen.*N=3"):
        rebuild_memory(emb, labels, ids, 2)
    sel_ids, _ = rebuild_memory(emb, labels, ids, 3)
    assert len(sel_ids) == 3


# ---------------------------------------------------------------------------
# Reservoir (RWalk) and uncertainty-based (Rainbow) memories
# ---------------------------------------------------------------------------


def test_reservoir_respects_budget_and_is_uniform():
    budget, n = 20, 200
    counts = np.zeros(n)
    for seed in range(400):
        rng = np.random.default_rng(seed)
        mem, seen = replay.reservoir_update(np.zeros((0,), np.int64), 0, np.arange(100), budget, rng)
        mem, seen = replay.reservoir_update(mem, seen, np.arange(100, 200), budget, rng)  # a second session
        assert seen == n and len(mem) == budget and len(np.unique(mem)) == budget
        counts[mem] += 1
    freq = counts / 400
    # every item of either session is kept with probability budget / n = 0.1
    assert abs(freq[:100].mean() - 0.1) < 0.01 and abs(freq[100:].mean() - 0.1) < 0.01
    assert freq.max() < 0.2


def test_uncertainty_select_spreads_over_the_ranking():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 25)
    unc = rng.uniform(size=100)
    ids = np.arange(100) + 1000
    sel_ids, sel_labels = replay.uncertainty_select(unc, labels, ids, budget=22, selection="spread")
    assert len(sel_ids) == 4 * (22 // 4) <= 22
    for c in range(4):
        members = np.flatnonzero(labels == c)
        chosen = sel_ids[sel_labels == c] - 1000
        assert len(chosen) == 5
        # the least and the most uncertain sample of the class are both kept
        assert members[np.argmin(unc[members])] in chosen and members[np.argmax(unc[members])] in chosen
    with pytest.raises(ValueError, match="memory_budget=3"):
        replay.uncertainty_select(unc, labels, ids, budget=3)
    with pytest.raises(ValueError, match="selection='median'"):
        replay.uncertainty_select(unc, labels, ids, budget=22, selection="median")


def test_uncertainty_select_stride_is_the_fork_default():
    """Per class (25 candidates, quota 5): ranks 0, 5, 10, 15, 20 of the ascending ranking
    (tests/methods/test_rainbow.py pins the rule against a transcription of the fork)."""
    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(4), 25)
    unc = rng.uniform(size=100)
    sel_ids, sel_labels = replay.uncertainty_select(unc, labels, np.arange(100), budget=22)
    for c in range(4):
        members = np.flatnonzero(labels == c)
        ranked = members[np.argsort(unc[members])]
        np.testing.assert_array_equal(sel_ids[sel_labels == c], ranked[[0, 5, 10, 15, 20]])


def test_prediction_uncertainty():
    preds = np.array([[0, 1, 2], [0, 1, 1], [0, 2, 1], [0, 1, 0]])  # T=4 perturbations, 3 samples
    np.testing.assert_allclose(replay.prediction_uncertainty(preds), [0.0, 0.25, 0.5])
