"""The official CVS CIFAR-100 session files as a SessionPlan (spec §2), on synthetic CIFAR-like labels."""

import json
import os
from collections import defaultdict

import numpy as np
import pytest

from cvs_jax.data import official_splits as osp
from cvs_jax.errors import ConfigError, SplitError

SPLIT_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "cvs-official-splits", "cifar100")
pytestmark = pytest.mark.skipif(not os.path.isdir(SPLIT_DIR), reason="official split files not available")

RNG = np.random.default_rng(7)
TRAIN = RNG.permutation(np.repeat(np.arange(100), 500))  # CIFAR-like: original order is not grouped by class
TEST = RNG.permutation(np.repeat(np.arange(100), 100))


def _names():
    names = set()
    for t in range(5):
        with open(os.path.join(SPLIT_DIR, f"cifar100_test_rand1_cls20_task{t}.json")) as f:
            names |= {r["klass"] for r in json.load(f)}
    return tuple(sorted(names))  # CIFAR-100 fine label names are alphabetical (python release / TFDS)


NAMES = _names() if os.path.isdir(SPLIT_DIR) else ()


def _export_names(labels, split, names):
    """File names the cifar2png-style export gives each position: per-class 1-based counter in array order."""
    count = defaultdict(int)
    out = []
    for c in labels:
        count[int(c)] += 1
        out.append(f"{split}/{names[c]}/{count[int(c)]:04d}.png")
    return out


@pytest.fixture(scope="module")
def plans():
    idx = dict(
        train_class_index=osp.per_class_positions(TRAIN),
        test_class_index=osp.per_class_positions(TEST),
        class_names=NAMES,
    )
    return {s: osp.load_official_plan(SPLIT_DIR, s, **idx) for s in ("disjoint", "blurry", "general")}


def test_file_name_mapping_round_trips_on_synthetic_labels():
    assert len(NAMES) == 100 and NAMES[:3] == ("apple", "aquarium_fish", "baby")
    pos = osp.per_class_positions(TRAIN)
    assert sorted(pos) == list(range(100)) and all(np.all(np.diff(p) > 0) for p in pos.values())
    tpos = osp.per_class_positions(TEST)
    for split, labels in (("train", TRAIN), ("test", TEST)):
        for i, name in enumerate(_export_names(labels, split, NAMES)):
            assert osp.resolve(name, class_names=NAMES, train_class_index=pos, test_class_index=tpos) == (split, i)
    # label arrays are accepted in place of the index; a leading "./" is tolerated.
    assert osp.resolve("./test/apple/0001.png", class_names=NAMES, train_class_index=TRAIN, test_class_index=TEST) == (
        "test",
        int(np.flatnonzero(TEST == 0)[0]),
    )
    for bad in ("train/apple/0501.png", "train/apple/0000.png", "train/unicorn/0001.png", "val/apple/0001.png"):
        with pytest.raises(osp.OfficialSplitError):
            osp.resolve(bad, class_names=NAMES, train_class_index=pos, test_class_index=tpos)


def test_original_order_from_tfds_ids():
    perm = RNG.permutation(50)
    ids = [f"train_{j:05d}".encode() if j % 2 else f"train_{j:05d}" for j in perm]
    order = osp.original_order(ids)
    np.testing.assert_array_equal(perm[order], np.arange(50))
    with pytest.raises(ValueError, match="permutation"):
        osp.original_order(["train_00000", "train_00002"])


def test_official_session_sizes(plans):
    g, d, b = plans["general"], plans["disjoint"], plans["blurry"]
    assert [len(s.train) for s in g.sessions] == [7200, 7992, 7992, 7956, 7992]
    assert [len(s.val) for s in g.sessions] == [800, 888, 888, 884, 888]
    for p in (d, b):
        assert [len(s.train) for s in p.sessions] == [9000] * 5
        assert [len(s.val) for s in p.sessions] == [1000] * 5
    assert [s.num_outputs for s in g.sessions] == [20, 40, 60, 80, 100]
    assert [s.num_outputs for s in d.sessions] == [20, 40, 60, 80, 100]
    assert [s.num_outputs for s in b.sessions] == [100] * 5
    assert (g.setup, d.setup, b.setup) == ("general", "disjoint", "blurry")
    assert [s.new_classes.tolist() for s in g.sessions] == [list(range(20 * t, 20 * t + 20)) for t in range(5)]


def test_no_image_in_two_sessions_and_labels_follow_the_json(plans):
    for setup, p in plans.items():
        every = np.concatenate([np.concatenate([s.train, s.val]) for s in p.sessions])
        assert np.unique(every).size == every.size, setup
        proto = p.to_protocol_labels(TRAIN)
        for t, s in enumerate(p.sessions):
            for kind, idx in (("train", s.train), ("val", s.val)):
                tag = osp.FILE_SETUPS[setup]
                with open(os.path.join(SPLIT_DIR, f"cifar100_{kind}_{tag}_rand1_cls20_task{t}.json")) as f:
                    want = np.sort([r["label"] for r in json.load(f)])
                np.testing.assert_array_equal(np.sort(proto[idx]), want)  # resolved images carry the JSON labels
        if setup == "disjoint":
            assert np.all(np.bincount(proto[p.sessions[2].train], minlength=100)[40:60] == 450)
        if setup == "blurry":
            assert all(np.unique(proto[s.train]).size == 100 for s in p.sessions)


def test_class_order_matches_the_spec(plans):
    for p in plans.values():
        order = [NAMES[c] for c in p.class_order]
        assert order[0] == "fox" and order[19] == "porcupine" and order[99] == "hamster"
        assert order[:5] == ["fox", "cockroach", "bowl", "beaver", "boy"]
        assert order[20:22] == ["telephone", "couch"] and order[80:82] == ["rose", "streetcar"]
        assert sorted(p.class_order.tolist()) == list(range(100))
    # a permuted name list moves class_order with it
    shuffled = list(NAMES)[::-1]
    p = osp.load_official_plan(
        SPLIT_DIR, "disjoint", train_class_index=99 - TRAIN, test_class_index=99 - TEST, class_names=shuffled
    )
    assert shuffled[p.class_order[0]] == "fox"


def test_official_test_and_val_queries(plans):
    test_proto = {k: p.to_protocol_labels(TEST) for k, p in plans.items()}
    for setup in ("disjoint", "general"):
        p = plans[setup]
        for s in range(5):
            q = p.test_queries(s, test_proto[setup])
            assert q.size == 2000 * (s + 1)
            assert set(test_proto[setup][q].tolist()) == set(range(20 * (s + 1)))
        assert p.val_queries(4).size == (5000 if setup == "disjoint" else 800 + 888 * 3 + 884)
    b = plans["blurry"]
    for s in range(5):
        np.testing.assert_array_equal(b.test_queries(s, test_proto["blurry"]), np.arange(10000))
        assert b.val_queries(s).size == 5000
    assert b.test_queries(0).size == 10000  # labels are optional


def test_plan_for_a_loaded_dataset():
    from cvs_jax.data.sources import ImageDataset, Split

    ds = ImageDataset(
        name="cifar100",
        class_names=NAMES,
        train=Split(images=np.zeros((TRAIN.size, 1, 1, 3), np.uint8), labels=TRAIN.astype(np.int32)),
        test=Split(images=np.zeros((TEST.size, 1, 1, 3), np.uint8), labels=TEST.astype(np.int32)),
    )
    p = osp.official_plan_for_dataset(SPLIT_DIR, "general10", ds)
    assert p.setup == "general" and [len(s.train) for s in p.sessions][:2] == [7200, 7992]
    assert p.test_queries(1, p.to_protocol_labels(ds.test.labels)).size == 4000


def test_refusals(tmp_path):
    with pytest.raises(osp.OfficialSplitError, match="500 per class"):
        osp.check_dataset_counts(TRAIN[:-1], TEST, NAMES)
    with pytest.raises(ConfigError, match="setup"):
        osp.load_official_plan(SPLIT_DIR, "blurry30", train_class_index=TRAIN, test_class_index=TEST, class_names=NAMES)
    with pytest.raises(SplitError, match="missing"):
        osp.load_official_plan(
            str(tmp_path), "general", train_class_index=TRAIN, test_class_index=TEST, class_names=NAMES
        )
    # a subset of CIFAR-100 cannot hold the official image numbers
    small = np.repeat(np.arange(100), 50)
    with pytest.raises(osp.OfficialSplitError, match="full CIFAR-100"):
        osp.load_official_plan(SPLIT_DIR, "disjoint", train_class_index=small, test_class_index=TEST, class_names=NAMES)
