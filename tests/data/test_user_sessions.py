"""Tests for cvs_jax.data.user_sessions: the "user" plan from per-image sessions."""

import numpy as np
import pytest
from PIL import Image

from cvs_jax.data import folder_inventory, splits
from cvs_jax.data.user_sessions import USER_SETUP, check_plan_feasible, plan_from_sessions
from cvs_jax.errors import ConfigError, SplitError


def _data(seed=0):
    """Session 0: labels 7, 3 (20 each); 1: labels 5 (20), 3 (6, old); 2: labels 1, 9 (15 each), 7 (4, old)."""
    rows = [(7, 0)] * 20 + [(3, 0)] * 20 + [(5, 1)] * 20 + [(3, 1)] * 6 + [(1, 2)] * 15 + [(9, 2)] * 15 + [(7, 2)] * 4
    perm = np.random.default_rng(seed).permutation(len(rows))
    labels = np.array([rows[i][0] for i in perm])
    sessions = np.array([rows[i][1] for i in perm])
    return labels, sessions


def test_sessions_classes_and_outputs():
    labels, sessions = _data()
    plan = plan_from_sessions(labels, sessions, val_fraction=0.1, seed=4)
    assert isinstance(plan, splits.SessionPlan) and plan.setup == USER_SETUP and plan.num_sessions == 3
    # first appearance: session, then original label
    assert plan.class_order.tolist() == [3, 7, 5, 1, 9]
    assert [s.new_classes.tolist() for s in plan.sessions] == [[0, 1], [2], [3, 4]]
    assert [s.num_outputs for s in plan.sessions] == [2, 3, 5]
    assert plan.to_protocol_labels(np.array([3, 7, 5, 1, 9, 0, 42])).tolist() == [0, 1, 2, 3, 4, -1, -1]
    seen_val = set()
    for s, sess in enumerate(plan.sessions):
        rows = np.flatnonzero(sessions == s)
        assert sess.index == s
        assert np.array_equal(np.sort(np.concatenate([sess.train, sess.val])), rows)
        assert np.intersect1d(sess.train, sess.val).size == 0
        assert np.array_equal(sess.train, np.sort(sess.train)) and sess.train.dtype == np.int64
        assert sess.val.size == int(np.ceil(0.1 * rows.size))  # make_session_plan's stratified rule
        seen_val |= set(sess.val.tolist())
        assert plan.seen_classes(s).tolist() == list(range(sess.num_outputs))
    assert sorted(seen_val) == plan.val_queries(2).tolist()
    assert np.array_equal(
        plan.joint_train(1), np.sort(np.concatenate([plan.sessions[0].train, plan.sessions[1].train]))
    )
    test_p = plan.to_protocol_labels(np.array([3, 5, 9, 7]))
    assert plan.test_queries(0, test_p).tolist() == [0, 3] and plan.test_queries(2, test_p).tolist() == [0, 1, 2, 3]


def test_no_val_trains_on_every_row_and_is_deterministic():
    labels, sessions = _data()
    plan = plan_from_sessions(labels, sessions, val_fraction=0.0)
    for s, sess in enumerate(plan.sessions):
        assert sess.train.tolist() == np.flatnonzero(sessions == s).tolist() and sess.val.size == 0
    a = plan_from_sessions(labels, sessions, val_fraction=0.2, seed=1)
    b = plan_from_sessions(labels, sessions, val_fraction=0.2, seed=1)
    c = plan_from_sessions(labels, sessions, val_fraction=0.2, seed=2)
    assert all(np.array_equal(x.val, y.val) for x, y in zip(a.sessions, b.sessions))
    assert any(not np.array_equal(x.val, y.val) for x, y in zip(a.sessions, c.sessions))


def test_val_rule_is_make_session_plan_rule():
    """One session of classes 0..K-1 (sorted): the same per-class val counts as the generator's."""
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(6), [13, 7, 21, 5, 9, 30]))
    for seed in range(4):
        ours = plan_from_sessions(labels, np.zeros_like(labels), val_fraction=0.15, seed=seed)
        gen = splits.make_session_plan(
            labels,
            setup="disjoint",
            num_sessions=1,
            first_classes=6,
            classes_per_session=0,
            val_fraction=0.15,
            shuffle_classes=False,
            seed=seed,
        )
        assert ours.class_order.tolist() == gen.class_order.tolist()
        assert (
            np.bincount(labels[ours.sessions[0].val], minlength=6).tolist()
            == np.bincount(labels[gen.sessions[0].val], minlength=6).tolist()
        )


def test_val_per_class_keeps_last_image():
    labels = np.array([0, 0, 0, 1, 2, 2, 1, 1, 3])
    sessions = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1])
    plan = plan_from_sessions(labels, sessions, val_fraction=0, val_per_class=2)
    p = plan.to_protocol_labels(labels)
    val0 = np.bincount(p[plan.sessions[0].val], minlength=4).tolist()
    val1 = np.bincount(p[plan.sessions[1].val], minlength=4).tolist()
    assert val0 == [2, 0, 0, 0]  # class 0: 3 images -> 2 val; class 1: its only image stays train
    assert val1 == [0, 1, 1, 0]  # label 1 has 2 in session 1 -> 1; label 2: 2 -> 1; label 3: 1 -> 0
    with pytest.raises(SplitError, match=r"val_per_class=2 needs val_fraction=0"):
        plan_from_sessions(labels, sessions, val_fraction=0.1, val_per_class=2)


def test_session_gap_refused():
    labels = np.array([0, 1, 2, 3])
    with pytest.raises(SplitError, match=r"session 2 has no train image but session 3 does \(sessions present: 1, 3"):
        plan_from_sessions(labels, np.array([0, 0, 2, 2]))
    with pytest.raises(SplitError, match=r"session 1 has no train image .*present: 2, 3"):
        plan_from_sessions(labels, np.array([1, 1, 2, 2]))
    with pytest.raises(SplitError, match=r"session 0 is not a positive session number"):
        plan_from_sessions(labels, np.array([0, -1, 1, 1]))


def test_starved_class_refused():
    labels = np.array([0, 0, 0, 0, 1])  # class 1: one image in its session
    sessions = np.zeros(5, np.int64)
    with pytest.raises(SplitError, match=r"class 'owl' \(label 1\) first appears in session 1 with 1 image"):
        # n_val = ceil(0.5 * 5) = 3: class 0 gets floor(4 * 3 / 5) = 2, the remainder goes to class 1 (3/5 > 2/5)
        plan_from_sessions(labels, sessions, val_fraction=0.5, class_names=["cat", "owl"])
    with pytest.raises(SplitError, match=r"^class 1 first appears in session 2 .*all drawn as validation queries"):
        plan_from_sessions(labels, np.array([0, 0, 1, 1, 1]), val_fraction=0.5)
    plan = plan_from_sessions(labels, sessions, val_fraction=0, val_per_class=1)
    assert np.bincount(labels[plan.sessions[0].train]).tolist() == [3, 1]


def test_bad_inputs_refused():
    with pytest.raises(SplitError, match=r"val_fraction=1.0 must lie in \[0, 1\)"):
        plan_from_sessions(np.array([0]), np.array([0]), val_fraction=1.0)
    with pytest.raises(SplitError, match=r"train split is empty"):
        plan_from_sessions(np.array([], np.int64), np.array([], np.int64))
    with pytest.raises(SplitError, match=r"non-negative"):
        plan_from_sessions(np.array([-1, 0]), np.array([0, 0]))
    with pytest.raises(ValueError, match=r"differ in length"):
        plan_from_sessions(np.array([0, 1]), np.array([0]))


def test_check_plan_feasible():
    labels, sessions = _data()
    plan = plan_from_sessions(labels, sessions, val_fraction=0.1)
    check_plan_feasible(plan, batch_size=8, memory_budget=5)
    smallest = min(len(s.train) for s in plan.sessions)  # session 2 (6 + 20 rows -> 23 train)
    check_plan_feasible(plan, batch_size=smallest)
    with pytest.raises(ConfigError, match=r"session 2 has 23 training images \(after 3 validation queries\), fewer"):
        check_plan_feasible(plan, batch_size=smallest + 1)
    with pytest.raises(ConfigError, match=r"memory.budget=4 is smaller than the 5 classes"):
        check_plan_feasible(plan, batch_size=8, memory_budget=4)


def test_plan_from_manifest_sessions(tmp_path):
    lines = ["path,label,split,session"]
    for i, (label, session) in enumerate([("b", 1), ("b", 1), ("a", 2), ("a", 2), ("b", 2), ("c", 3), ("c", 3)]):
        Image.new("RGB", (3 + i, 4)).save(tmp_path / f"{i}.png")
        lines.append(f"{i}.png,{label},train,{session}")
    Image.new("RGB", (4, 4)).save(tmp_path / "t.png")
    lines.append("t.png,a,test,")
    (tmp_path / "manifest.csv").write_text("\n".join(lines) + "\n")
    inv = folder_inventory.scan(str(tmp_path))
    plan = plan_from_sessions(inv.labels(), inv.sessions(), val_fraction=0, class_names=inv.class_names)
    assert [inv.class_names[c] for c in plan.class_order] == ["b", "a", "c"]
    assert [s.num_outputs for s in plan.sessions] == [1, 2, 3]
    assert [[inv.train[i].rel for i in s.train] for s in plan.sessions] == [
        ["0.png", "1.png"],
        ["2.png", "3.png", "4.png"],
        ["5.png", "6.png"],
    ]
    assert plan.test_queries(0, plan.to_protocol_labels(inv.labels("test"))).size == 0
    assert plan.test_queries(1, plan.to_protocol_labels(inv.labels("test"))).tolist() == [0]


def test_val_rows_are_the_generators_rule_on_its_stream():
    """The validation rows themselves, not only their counts: each session's pool (its rows in index
    order) split by the generator's own split function, drawing in session order from the generator's
    validation stream (the third child of ``SeedSequence(seed).spawn(4)``)."""
    rng0 = np.random.default_rng(5)
    labels = rng0.integers(0, 7, 160)
    sessions = np.where(labels < 3, 0, rng0.integers(1, 3, 160))  # classes 3..6 arrive in sessions 2-3, mixed
    for val_fraction, per_class in ((0.15, None), (0.0, 2)):
        plan = plan_from_sessions(labels, sessions, val_fraction=val_fraction, val_per_class=per_class, seed=7)
        plabels = plan.to_protocol_labels(labels)
        stream = np.random.default_rng(np.random.SeedSequence(7).spawn(4)[2])
        for s, sess in enumerate(plan.sessions):
            pool = np.flatnonzero(sessions == s)
            if per_class is None:
                train, val = splits.stratified_split(pool, plabels, splits.exact_fraction(val_fraction), stream)
            else:
                train, val = splits.per_class_split(pool, plabels, per_class, stream)
            assert sess.val.tolist() == val.tolist() and sess.train.tolist() == train.tolist()
            assert sess.val.size > 0
