"""The official CVS CIFAR-100 sessions (docs/configs-and-data.md) as a SessionPlan, from the packaged file and the JSON
files.

The packaged file ships with cvs_jax, so its tests always run (the CI case). The JSON files are read
when ``../shared/data/cvs-official-splits/cifar100`` exists (the tests that need them skip otherwise);
then both sources must give the same plan, index for index. Labels are synthetic, CIFAR-shaped.
"""

import importlib.util
import json
import os
from collections import defaultdict
from unittest import mock

import numpy as np
import pytest

from cvs_jax.data import official_splits as osp
from cvs_jax.errors import ConfigError, SplitError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPLIT_DIR = os.path.join(ROOT, "..", "shared", "data", "cvs-official-splits", "cifar100")
HAVE_JSON = os.path.isdir(SPLIT_DIR)
needs_json = pytest.mark.skipif(not HAVE_JSON, reason="official JSON split files not available")
SETUPS = ("disjoint", "blurry", "general")

RNG = np.random.default_rng(7)
TRAIN = RNG.permutation(np.repeat(np.arange(100), 500))  # CIFAR-like: original order is not grouped by class
TEST = RNG.permutation(np.repeat(np.arange(100), 100))
# CIFAR-100 fine label names are alphabetical (the releases' label files, which TFDS and cifar2png read).
NAMES = tuple(sorted(str(n) for n in osp.packaged_arrays()["class_names"]))
SPEC_ORDER_HEAD = ["fox", "cockroach", "bowl", "beaver", "boy"]


def _export_names(labels, split, names):
    """File names the cifar2png-style export gives each position: per-class 1-based counter in array order."""
    count = defaultdict(int)
    out = []
    for c in labels:
        count[int(c)] += 1
        out.append(f"{split}/{names[c]}/{count[int(c)]:04d}.png")
    return out


def _load(source, setup, train=TRAIN, test=TEST, names=NAMES):
    idx = dict(train_class_index=train, test_class_index=test, class_names=names)
    if source == "packaged":
        return osp.load_packaged_plan(setup, **idx)
    return osp.load_official_plan(SPLIT_DIR, setup, **idx)


def _same_plan(a, b):
    assert a.setup == b.setup
    np.testing.assert_array_equal(a.class_order, b.class_order)
    assert len(a.sessions) == len(b.sessions) == len(a.test_sets) == len(b.test_sets) == 5
    for x, y, tx, ty in zip(a.sessions, b.sessions, a.test_sets, b.test_sets):
        np.testing.assert_array_equal(x.train, y.train)
        np.testing.assert_array_equal(x.val, y.val)
        np.testing.assert_array_equal(x.new_classes, y.new_classes)
        np.testing.assert_array_equal(tx, ty)
        assert x.num_outputs == y.num_outputs and x.index == y.index


@pytest.fixture(scope="module", params=["packaged", pytest.param("json", marks=needs_json)])
def source(request):
    return request.param


@pytest.fixture(scope="module")
def plans(source):
    return {s: _load(source, s) for s in SETUPS}


# ---------------------------------------------------------------- the packaged file
def test_packaged_file_is_small_and_intact():
    from importlib import resources

    ref = resources.files("cvs_jax.data").joinpath("official").joinpath("cifar100_splits.npz")
    assert ref.is_file() and len(ref.read_bytes()) < 100_000  # 27 kB
    a = osp.packaged_arrays()
    assert osp.content_sha256(a) == osp.PACKAGED_SHA256
    assert sorted(a) == ["blurry10", "class_names", "disjoint", "general10", "test"]
    assert a["class_names"].shape == (100,) and len(set(a["class_names"].tolist())) == 100
    assert all(a[t].shape == (100, 500) and a[t].dtype == np.uint8 for t in osp.FILE_SETUPS.values())
    assert not a["disjoint"].flags.writeable
    np.testing.assert_array_equal(a["test"], np.repeat(np.arange(5), 20)[:, None] * np.ones((1, 100), int))


def test_packaged_file_refused_when_changed(monkeypatch):
    monkeypatch.setattr(osp, "PACKAGED_SHA256", "0" * 64)
    osp.packaged_arrays.cache_clear()
    try:
        with pytest.raises(osp.OfficialSplitError, match="content digest.*convert_official_splits"):
            osp.packaged_arrays()
    finally:
        monkeypatch.undo()
        osp.packaged_arrays.cache_clear()
    assert osp.content_sha256(osp.packaged_arrays()) == osp.PACKAGED_SHA256


@needs_json
def test_packaged_plan_equals_json_plan_index_for_index():
    for setup in SETUPS:
        _same_plan(_load("packaged", setup), _load("json", setup))
    # another label layout and a permuted name list: still the same plan
    rng = np.random.default_rng(11)
    train, test = rng.permutation(TRAIN), rng.permutation(TEST)
    shuffled = list(NAMES)[::-1]
    for setup in SETUPS:
        a = _load("packaged", setup, 99 - train, 99 - test, shuffled)
        _same_plan(a, _load("json", setup, 99 - train, 99 - test, shuffled))


@needs_json
def test_conversion_is_reproducible(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location(
        "convert", os.path.join(ROOT, "scripts", "convert_official_splits.py")
    )
    convert = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(convert)
    outs = [str(tmp_path / f"{k}.npz") for k in range(2)]
    for out in outs:
        assert convert.main(["--split_dir", SPLIT_DIR, "--out", out]) == 0
    printed = capsys.readouterr().out
    assert f"content sha256 {osp.PACKAGED_SHA256}" in printed and "NOTE" not in printed
    with open(outs[0], "rb") as f, open(outs[1], "rb") as g:
        assert f.read() == g.read()  # byte-reproducible
    packaged = os.path.join(ROOT, "cvs_jax", "data", "official", "cifar100_splits.npz")
    assert convert.main(["--split_dir", SPLIT_DIR, "--out", packaged, "--check"]) == 0
    arrays = osp.encode_json_dir(SPLIT_DIR)
    assert osp.content_sha256(arrays) == osp.PACKAGED_SHA256


# ---------------------------------------------------------------- file name -> index
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


def test_packaged_plan_follows_the_file_name_mapping():
    """Image ``train/<class_names[p]>/<k>.png`` with code 2t (2t+1) is in session t's train (val)."""
    a = osp.packaged_arrays()
    plan = _load("packaged", "blurry")
    names = _export_names(TRAIN, "train", NAMES)
    where = {}
    for t, s in enumerate(plan.sessions):
        where.update({int(i): 2 * t for i in s.train})
        where.update({int(i): 2 * t + 1 for i in s.val})
    row = {str(n): p for p, n in enumerate(a["class_names"])}
    for i in range(0, TRAIN.size, 97):
        _, klass, k = names[i].split("/")
        assert where.get(i, osp.UNUSED) == a["blurry10"][row[klass], int(k[:4]) - 1]


def test_original_order_from_tfds_ids():
    perm = RNG.permutation(50)
    ids = [f"train_{j:05d}".encode() if j % 2 else f"train_{j:05d}" for j in perm]
    order = osp.original_order(ids)
    np.testing.assert_array_equal(perm[order], np.arange(50))
    with pytest.raises(ValueError, match="permutation"):
        osp.original_order(["train_00000", "train_00002"])


# ---------------------------------------------------------------- the plan (both sources)
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


def test_no_image_in_two_sessions(plans):
    for setup, p in plans.items():
        every = np.concatenate([np.concatenate([s.train, s.val]) for s in p.sessions])
        assert np.unique(every).size == every.size, setup
        proto = p.to_protocol_labels(TRAIN)
        if setup == "disjoint":
            assert np.all(np.bincount(proto[p.sessions[2].train], minlength=100)[40:60] == 450)
        if setup == "blurry":
            assert all(np.unique(proto[s.train]).size == 100 for s in p.sessions)
        if setup == "general":  # the official files: 44, 22, 14, 11 images of every old class (train + val)
            for t, per_old in ((1, 44), (2, 22), (3, 14), (4, 11)):
                s = p.sessions[t]
                got = np.bincount(proto[np.concatenate([s.train, s.val])], minlength=100)
                assert np.all(got[: 20 * t] == per_old) and np.all(got[20 * t : 20 * t + 20] == 400)


@needs_json
def test_labels_follow_the_json():
    for setup in SETUPS:
        p = _load("json", setup)
        proto = p.to_protocol_labels(TRAIN)
        for t, s in enumerate(p.sessions):
            for kind, idx in (("train", s.train), ("val", s.val)):
                tag = osp.FILE_SETUPS[setup]
                with open(os.path.join(SPLIT_DIR, f"cifar100_{kind}_{tag}_rand1_cls20_task{t}.json")) as f:
                    want = np.sort([r["label"] for r in json.load(f)])
                np.testing.assert_array_equal(np.sort(proto[idx]), want)  # resolved images carry the JSON labels


def test_class_order_matches_the_spec(plans, source):
    for p in plans.values():
        order = [NAMES[c] for c in p.class_order]
        assert order[0] == "fox" and order[19] == "porcupine" and order[99] == "hamster"
        assert order[:5] == SPEC_ORDER_HEAD
        assert order[20:22] == ["telephone", "couch"] and order[80:82] == ["rose", "streetcar"]
        assert sorted(p.class_order.tolist()) == list(range(100))
    # a permuted name list moves class_order with it
    shuffled = list(NAMES)[::-1]
    p = _load(source, "disjoint", 99 - TRAIN, 99 - TEST, shuffled)
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


def _dataset(names=NAMES, train=TRAIN, test=TEST):
    from cvs_jax.data.sources import ImageDataset, Split

    return ImageDataset(
        name="cifar100",
        class_names=names,
        train=Split(images=np.zeros((train.size, 1, 1, 3), np.uint8), labels=train.astype(np.int32)),
        test=Split(images=np.zeros((test.size, 1, 1, 3), np.uint8), labels=test.astype(np.int32)),
    )


def test_plan_for_a_loaded_dataset(source):
    ds = _dataset()
    p = osp.official_plan_for_dataset(SPLIT_DIR if source == "json" else None, "general10", ds)
    assert p.setup == "general" and [len(s.train) for s in p.sessions][:2] == [7200, 7992]
    assert p.test_queries(1, p.to_protocol_labels(ds.test.labels)).size == 4000


def test_refusals(source, tmp_path):
    with pytest.raises(osp.OfficialSplitError, match="500 per class"):
        osp.check_dataset_counts(TRAIN[:-1], TEST, NAMES)
    with pytest.raises(osp.OfficialSplitError, match="500 per class"):
        osp.official_plan_for_dataset(None, "general", _dataset(train=TRAIN[:-1]))
    with pytest.raises(ConfigError, match="setup"):
        _load(source, "blurry30")
    # a subset of CIFAR-100 cannot hold the official image numbers
    with pytest.raises(osp.OfficialSplitError, match="full CIFAR-100"):
        _load(source, "disjoint", train=np.repeat(np.arange(100), 50))
    with pytest.raises(osp.OfficialSplitError, match="is this CIFAR-100"):
        _load(source, "disjoint", names=("apple",) + tuple(f"c{k}" for k in range(99)))
    if source == "json":
        with pytest.raises(SplitError, match="missing"):
            osp.load_official_plan(
                str(tmp_path), "general", train_class_index=TRAIN, test_class_index=TEST, class_names=NAMES
            )


# ---------------------------------------------------------------- through build_protocol, TFDS mocked
class _Source(list):
    """A TFDS data source: ``len`` and batched reads."""

    def __getitems__(self, keys):
        return [self[k] for k in keys]


def _mock_cifar100(labels_by_split):
    """``as_data_source_fn`` for ``tfds.testing.mock_data``: records stored SHUFFLED, as TFDS stores them,
    each with its release position as ``id``; the image's first two bytes encode that position."""
    rng = np.random.default_rng(5)

    def source(split):
        labels = labels_by_split[split]
        out = _Source()
        for j in rng.permutation(labels.size):
            image = np.zeros((2, 2, 3), np.uint8)
            image[0, 0, :2] = divmod(int(j), 256)
            out.append({"image": image, "label": int(labels[j]), "id": f"{split}_{j:05d}"})
        return out

    def as_data_source(self, split=None, **kwargs):
        return [source(s) for s in split] if isinstance(split, (list, tuple)) else source(split)

    return as_data_source


@pytest.mark.parametrize("split_dir", [None, pytest.param(SPLIT_DIR, marks=needs_json)])
def test_protocol_build_official_on_mocked_cifar100(split_dir, tmp_path):
    import tensorflow_datasets as tfds
    from tensorflow_datasets.image_classification import cifar

    from configs import cifar100_blurry
    from cvs_jax.engine import config_checks
    from cvs_jax.engine.protocol_builder import build_protocol

    real_info = cifar.Cifar100._info

    def info_with_names(self):  # a prepared copy has the release's fine_label_names.txt; the code alone has none
        info = real_info(self)
        info.features["label"].names = list(NAMES)
        return info

    c = cifar100_blurry.get_config()
    assert c.data.split == "official"
    c.data.data_dir, c.data.official_split_dir = str(tmp_path / "tfds"), split_dir
    config_checks.check(c, num_devices=1)
    with (
        mock.patch.object(cifar.Cifar100, "_info", info_with_names),
        tfds.testing.mock_data(
            policy=tfds.testing.MockPolicy.USE_CODE, as_data_source_fn=_mock_cifar100({"train": TRAIN, "test": TEST})
        ),
    ):
        proto = build_protocol(c)
    ds = proto.dataset
    assert tuple(ds.class_names) == NAMES
    for split, labels in ((ds.train, TRAIN), (ds.test, TEST)):  # records back in release order (by id)
        np.testing.assert_array_equal(
            split.images[:, 0, 0, 0].astype(int) * 256 + split.images[:, 0, 0, 1], np.arange(labels.size)
        )
        np.testing.assert_array_equal(split.labels, labels)
    _same_plan(proto.plan, _load("packaged", "blurry"))
    assert [ds.class_names[c] for c in proto.plan.class_order[:5]] == SPEC_ORDER_HEAD
    assert [s["train"] for s in proto.description()["sessions"]] == [9000] * 5
    np.testing.assert_array_equal(proto.train_labels, proto.plan.to_protocol_labels(TRAIN))
