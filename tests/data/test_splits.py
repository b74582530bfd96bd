"""Tests for cvs_jax.data.splits against the official CVS session counts (docs/configs-and-data.md)."""

import math

import numpy as np
import pytest

from cvs_jax.data.splits import SETUPS, SessionPlan, make_session_plan
from cvs_jax.errors import SplitError


def _labels(num_classes, per_class, seed=123):
    """Synthetic train labels, shuffled so indices are not grouped by class."""
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), per_class))


CIFAR = _labels(100, 500)
TINY = _labels(200, 500)

CIFAR_GENERAL = dict(
    setup="general",
    num_sessions=5,
    first_classes=20,
    classes_per_session=20,
    old_class_percent=10,
    samples_per_new_class=400,
    val_fraction=0.1,
)
TINY_GENERAL = dict(
    setup="general",
    num_sessions=10,
    first_classes=20,
    classes_per_session=20,
    old_class_percent=30,
    samples_per_new_class=225,
    val_fraction=0.05,
    shuffle_classes=False,
)
CIFAR_DISJOINT = dict(setup="disjoint", num_sessions=5, first_classes=20, classes_per_session=20, val_fraction=0.1)
CIFAR_BLURRY = dict(
    setup="blurry", num_sessions=5, first_classes=20, classes_per_session=20, blurry_minor_percent=10, val_fraction=0.1
)
TINY_BLURRY = dict(
    setup="blurry",
    num_sessions=10,
    first_classes=20,
    classes_per_session=20,
    blurry_minor_percent=30,
    val_fraction=0.05,
    shuffle_classes=False,
)


@pytest.fixture(scope="module")
def plans():
    return {
        "cifar_general": make_session_plan(CIFAR, **CIFAR_GENERAL),
        "tiny_general": make_session_plan(TINY, **TINY_GENERAL),
        "cifar_disjoint": make_session_plan(CIFAR, **CIFAR_DISJOINT),
        "cifar_blurry": make_session_plan(CIFAR, **CIFAR_BLURRY),
        "tiny_blurry": make_session_plan(TINY, **TINY_BLURRY),
    }


def _pool(session):
    return np.concatenate([session.train, session.val])


def _plabels(plan, labels):
    return plan.to_protocol_labels(labels)


def _per_class(plan, labels, idx):
    return np.bincount(_plabels(plan, labels)[idx], minlength=plan.class_order.size)


# ---------------------------------------------------------------- general
def test_cifar_general_official_counts(plans):
    p = plans["cifar_general"]
    assert [len(s.train) for s in p.sessions] == [7200, 7992, 7992, 7956, 7992]
    assert [len(s.val) for s in p.sessions] == [800, 888, 888, 884, 888]
    assert [len(_pool(s)) for s in p.sessions] == [8000, 8880, 8880, 8840, 8880]


@pytest.mark.parametrize(
    "name,spc,per_old",
    [
        ("cifar_general", 400, [44, 22, 14, 11]),
        ("tiny_general", 225, [96, 48, 32, 24, 19, 16, 13, 12, 10]),
    ],
)
def test_general_per_old_class_counts_are_exact_and_even(plans, name, spc, per_old):
    p = plans[name]
    labels = CIFAR if name.startswith("cifar") else TINY
    for t, s in enumerate(p.sessions):
        cnt = _per_class(p, labels, _pool(s))
        new = s.new_classes
        assert np.all(cnt[new] == spc)
        old = np.arange(new.min())  # every class seen before session t
        if t == 0:
            assert old.size == 0
        else:
            assert np.all(cnt[old] == per_old[t - 1]), f"session {t}: old classes not spread evenly"
        assert np.all(cnt[new.max() + 1 :] == 0), "future classes leaked into the session"


def test_tiny_general_official_counts(plans):
    p = plans["tiny_general"]
    assert [len(s.train) for s in p.sessions] == [4275, 6099, 6099, 6099, 6099, 6080, 6099, 6004, 6099, 5985]
    assert [len(s.val) for s in p.sessions] == [225, 321, 321, 321, 321, 320, 321, 316, 321, 315]
    np.testing.assert_array_equal(p.class_order, np.arange(200))  # official Tiny: sorted wnid order


@pytest.mark.parametrize("name,m", [("cifar_general", 0.10), ("tiny_general", 0.30)])
def test_general_old_share_is_about_m(plans, name, m):
    p = plans[name]
    labels = CIFAR if name.startswith("cifar") else TINY
    for s in p.sessions[1:]:
        pool = _pool(s)
        old = np.sum(_plabels(p, labels)[pool] < s.new_classes.min())
        share = old / pool.size
        assert m - 0.015 <= share <= m, share  # floor() only ever rounds the old share down


def test_general_auto_samples_per_new_class_is_largest_feasible():
    p = make_session_plan(CIFAR, **{**CIFAR_GENERAL, "samples_per_new_class": None})
    spc = np.bincount(_plabels(p, CIFAR)[_pool(p.sessions[0])]).max()

    # class 0 then also supplies floor(20*spc/9/n_old) in every later session; its total must fit in 500
    def shares(n):
        return sum(math.floor(20 * n / 9 / (20 * t)) for t in range(1, 5))

    assert spc + shares(spc) <= 500 < spc + 1 + shares(spc + 1)
    used = np.concatenate([_pool(s) for s in p.sessions])
    assert used.size == np.unique(used).size


def test_general_not_enough_images_raises():
    with pytest.raises(SplitError, match="samples_per_new_class"):
        make_session_plan(CIFAR, **{**CIFAR_GENERAL, "samples_per_new_class": 495})


# ---------------------------------------------------------------- disjoint
def test_disjoint_classes_never_return(plans):
    p = plans["cifar_disjoint"]
    seen = set()
    for t, s in enumerate(p.sessions):
        classes = set(np.unique(_plabels(p, CIFAR)[_pool(s)]).tolist())
        assert classes == set(s.new_classes.tolist()) == set(range(20 * t, 20 * t + 20))
        assert not classes & seen
        seen |= classes
        assert len(s.train) == 9000 and len(s.val) == 1000
        assert np.all(_per_class(p, CIFAR, s.val)[s.new_classes] == 50)


def test_disjoint_samples_per_new_class():
    p = make_session_plan(CIFAR, **CIFAR_DISJOINT, samples_per_new_class=300)
    for s in p.sessions:
        assert np.all(_per_class(p, CIFAR, _pool(s))[s.new_classes] == 300)


# ---------------------------------------------------------------- blurry
@pytest.mark.parametrize("name,b,major,minor", [("cifar_blurry", 0.10, 432, 12), ("tiny_blurry", 0.30, 336, 16)])
def test_blurry_counts_and_major_share(plans, name, b, major, minor):
    p = plans[name]
    labels = CIFAR if name.startswith("cifar") else TINY
    n = p.class_order.size
    for s in p.sessions:
        cnt = _per_class(p, labels, _pool(s))
        is_major = np.isin(np.arange(n), s.new_classes)
        assert np.all(cnt > 0), "every blurry session must contain all classes"
        assert np.all(cnt[is_major] == major) and np.all(cnt[~is_major] == minor)
        assert cnt[is_major].sum() / cnt.sum() == pytest.approx(1 - b, abs=1e-12)
        assert np.unique(_plabels(p, labels)[s.train]).size == n
        assert s.num_outputs == n
    if name == "tiny_blurry":
        assert [len(s.train) for s in p.sessions] == [9120] * 10
        assert [len(s.val) for s in p.sessions] == [480] * 10


def test_blurry_too_few_images_raises():
    with pytest.raises(SplitError, match="blurry_minor_percent"):
        make_session_plan(
            _labels(10, 20),
            setup="blurry",
            num_sessions=5,
            first_classes=2,
            classes_per_session=2,
            blurry_minor_percent=10,
        )


# ---------------------------------------------------------------- invariants for every setup
@pytest.mark.parametrize("name", ["cifar_general", "tiny_general", "cifar_disjoint", "cifar_blurry", "tiny_blurry"])
def test_no_image_in_two_sessions_and_val_never_trained(plans, name):
    p = plans[name]
    everything = np.concatenate([_pool(s) for s in p.sessions])
    assert everything.size == np.unique(everything).size
    all_train = np.concatenate([s.train for s in p.sessions])
    all_val = np.concatenate([s.val for s in p.sessions])
    assert not np.intersect1d(all_train, all_val).size
    for s in p.sessions:
        assert s.train.dtype == np.int64 and s.val.dtype == np.int64


@pytest.mark.parametrize("name,frac", [("cifar_general", 0.1), ("tiny_general", 0.05), ("cifar_blurry", 0.1)])
def test_val_is_stratified(plans, name, frac):
    p = plans[name]
    labels = CIFAR if name.startswith("cifar") else TINY
    for s in p.sessions:
        pool = _pool(s)
        n_val = math.ceil(round(frac * pool.size, 9))
        assert s.val.size == n_val
        share = _per_class(p, labels, pool) * n_val / pool.size
        assert np.all(np.abs(_per_class(p, labels, s.val) - share) < 1)


def test_val_queries_accumulate(plans):
    p = plans["cifar_general"]
    for s in range(5):
        expected = np.sort(np.concatenate([p.sessions[u].val for u in range(s + 1)]))
        np.testing.assert_array_equal(p.val_queries(s), expected)
    b = plans["cifar_blurry"]
    all_val = np.sort(np.concatenate([x.val for x in b.sessions]))
    assert all_val.size == 5 * 960  # 9,600-image pools (432 + 4*12 per class); official blurry10 uses 10,000
    for s in range(5):
        np.testing.assert_array_equal(b.val_queries(s), all_val)


def test_joint_train_is_union(plans):
    p = plans["cifar_general"]
    np.testing.assert_array_equal(p.joint_train(2), np.sort(np.concatenate([x.train for x in p.sessions[:3]])))
    with pytest.raises(ValueError, match="s="):
        p.joint_train(5)


def test_test_queries_select_seen_classes(plans):
    test_labels = _labels(100, 100, seed=7)  # original labels of a CIFAR-like test split
    for name in ("cifar_general", "cifar_disjoint"):
        p = plans[name]
        tp = p.to_protocol_labels(test_labels)
        for s in range(5):
            q = p.test_queries(s, tp)
            assert q.size == 2000 * (s + 1)
            np.testing.assert_array_equal(q, np.flatnonzero(tp < 20 * (s + 1)))
    b = plans["cifar_blurry"]
    tp = b.to_protocol_labels(test_labels)
    for s in range(5):
        np.testing.assert_array_equal(b.test_queries(s, tp), np.arange(10000))


def test_test_queries_skip_unused_classes():
    p = make_session_plan(
        CIFAR, setup="blurry", num_sessions=2, first_classes=10, classes_per_session=10, blurry_minor_percent=10
    )
    tp = p.to_protocol_labels(_labels(100, 100, seed=7))
    assert p.test_queries(0, tp).size == 2000 and np.all(tp[p.test_queries(0, tp)] >= 0)


@pytest.mark.parametrize(
    "name,expected",
    [
        ("cifar_general", [20, 40, 60, 80, 100]),
        ("cifar_disjoint", [20, 40, 60, 80, 100]),
        ("cifar_blurry", [100] * 5),
    ],
)
def test_num_outputs_and_seen_classes(plans, name, expected):
    p = plans[name]
    assert [s.num_outputs for s in p.sessions] == expected
    for s in range(5):
        want = np.arange(100) if name == "cifar_blurry" else np.arange(20 * (s + 1))
        np.testing.assert_array_equal(p.seen_classes(s), want)


# ---------------------------------------------------------------- relabelling and seeding
def test_protocol_labels_round_trip(plans):
    p = plans["cifar_general"]
    assert sorted(p.class_order.tolist()) == list(range(100))
    assert not np.array_equal(p.class_order, np.arange(100))  # shuffled by default
    proto = p.to_protocol_labels(CIFAR)
    np.testing.assert_array_equal(p.class_order[proto], CIFAR)
    np.testing.assert_array_equal(p.to_protocol_labels(p.class_order), np.arange(100))
    np.testing.assert_array_equal(p.to_protocol_labels(np.array([-3, 100, 10**6])), [-1, -1, -1])


def test_subset_of_classes_maps_rest_to_minus_one():
    p = make_session_plan(
        TINY, setup="disjoint", num_sessions=3, first_classes=10, classes_per_session=5, num_classes=200, seed=3
    )
    assert p.class_order.size == 20
    proto = p.to_protocol_labels(TINY)
    assert np.sum(proto >= 0) == 20 * 500 and set(np.unique(proto).tolist()) == set(range(-1, 20))
    assert [len(s.new_classes) for s in p.sessions] == [10, 5, 5]


@pytest.mark.parametrize("setup", SETUPS)
def test_deterministic_per_seed_and_changes_across_seeds(setup):
    kw = dict(
        setup=setup,
        num_sessions=5,
        first_classes=20,
        classes_per_session=20,
        old_class_percent=10,
        samples_per_new_class=400 if setup == "general" else None,
    )
    a, b = make_session_plan(CIFAR, **kw, seed=5), make_session_plan(CIFAR, **kw, seed=5)
    c = make_session_plan(CIFAR, **kw, seed=6)
    np.testing.assert_array_equal(a.class_order, b.class_order)
    for x, y in zip(a.sessions, b.sessions):
        np.testing.assert_array_equal(x.train, y.train)
        np.testing.assert_array_equal(x.val, y.val)
    assert not np.array_equal(a.class_order, c.class_order)
    assert not np.array_equal(a.sessions[0].train, c.sessions[0].train)


def test_unshuffled_seed_still_changes_images():
    kw = dict(CIFAR_DISJOINT, shuffle_classes=False, samples_per_new_class=100)
    a, b = make_session_plan(CIFAR, **kw, seed=0), make_session_plan(CIFAR, **kw, seed=1)
    np.testing.assert_array_equal(a.class_order, b.class_order)
    assert not np.array_equal(a.sessions[0].train, b.sessions[0].train)


# ---------------------------------------------------------------- input validation
@pytest.mark.parametrize(
    "overrides,param",
    [
        (dict(setup="blurred"), "setup"),
        (dict(num_sessions=0), "num_sessions"),
        (dict(num_sessions=6), "classes_per_session"),  # 20 + 5*20 = 120 > 100 classes
        (dict(first_classes=40), "first_classes"),  # 40 + 4*20 = 120 > 100
        (dict(old_class_percent=100), "old_class_percent"),
        (dict(old_class_percent=-1), "old_class_percent"),
        (dict(val_fraction=1.0), "val_fraction"),
        (dict(val_fraction=-0.1), "val_fraction"),
        (dict(setup="blurry", first_classes=10), "first_classes"),
        (dict(setup="blurry", blurry_minor_percent=0), "blurry_minor_percent"),
        (dict(samples_per_new_class=501), "samples_per_new_class"),
        (dict(num_classes=50), "num_classes"),
    ],
)
def test_invalid_inputs_raise_naming_parameter(overrides, param):
    kw = dict(setup="disjoint", num_sessions=5, first_classes=20, classes_per_session=20)
    kw.update(overrides)
    with pytest.raises(SplitError, match=param):
        make_session_plan(CIFAR, **kw)


def test_unknown_setup_lists_valid_ones():
    with pytest.raises(SplitError) as e:
        make_session_plan(CIFAR, setup="x", num_sessions=5, first_classes=20, classes_per_session=20)
    assert all(s in str(e.value) for s in SETUPS)


# ---------------------------------------------------------------- performance
def test_full_size_label_arrays_give_a_complete_plan():
    """Fashion-MNIST-sized labels (10 x 6000) split into every session's full share (the vectorised
    grouping handles real sizes; a timing is not asserted on a shared machine)."""
    fmnist = _labels(10, 6000)
    p = make_session_plan(
        fmnist, setup="general", num_sessions=5, first_classes=2, classes_per_session=2, old_class_percent=10
    )
    used = np.concatenate([np.concatenate([s.train, s.val]) for s in p.sessions])
    assert np.unique(used).size == used.size  # no image in two sessions
    assert np.isin(fmnist[used], p.class_order).all() and used.size > 50_000  # most of the 60,000 images


def test_plan_type():
    p = make_session_plan(CIFAR, **CIFAR_DISJOINT)
    assert isinstance(p, SessionPlan) and p.setup == "disjoint" and len(p.sessions) == 5
    assert [s.index for s in p.sessions] == list(range(5))
