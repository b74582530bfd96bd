"""Every paper config: it loads (plain and ``:smoke``), passes the config checks, and its session
plan on labels of the real dataset's size matches the setup's definition (paper §4.1)."""

import importlib
import os
import types

import numpy as np
import pytest

from cvs_jax.data import official_splits
from cvs_jax.data.sources import ImageDataset, Split
from cvs_jax.data.splits import plan_from_config
from cvs_jax.engine import config_checks

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")
NOT_RUNNABLE = {"__init__", "base", "variants", "finegrained"}
RUNNABLE = sorted(f[:-3] for f in os.listdir(CONFIG_DIR) if f.endswith(".py") and f[:-3] not in NOT_RUNNABLE)
# Table 1 of the paper: every dataset x setup
PAPER = {
    "cifar100_disjoint",
    "cifar100_blurry",
    "cifar100_general",
    "tinyimagenet_disjoint",
    "tinyimagenet_blurry",
    "tinyimagenet_general",
    "dogs_general",
    "inat_general",
    "productm_general",
}


def load(name, variant=""):
    return importlib.import_module(f"configs.{name}").get_config(variant)


def test_every_paper_cell_has_a_config():
    assert PAPER <= set(RUNNABLE), sorted(PAPER - set(RUNNABLE))


@pytest.mark.parametrize("name", RUNNABLE)
@pytest.mark.parametrize("variant", ["", "smoke"])
def test_config_loads_and_passes_checks(name, variant, tmp_path):
    c = load(name, variant)
    if c.data.manual_dir is not None or c.data.name == "image_folder":
        c.data.manual_dir = str(tmp_path)  # the check only needs the folder to exist
    config_checks.check(c, num_devices=1)
    if variant == "smoke":
        assert c.train.epochs == 1 and c.data.num_sessions == 2 and c.model.width == 8
        assert c.model.pretrained is None


CIFAR = ("cifar100_general", "cifar100_disjoint", "cifar100_blurry")


@pytest.mark.parametrize("name", RUNNABLE)
def test_split_source(name):
    """CIFAR-100 configs use the official sessions (packaged); image folders the user's; the others, and
    every :smoke, the generator."""
    c = load(name)
    assert c.data.split == ("official" if name in CIFAR else "user" if name == "image_folder_general" else "generator")
    assert c.data.official_split_dir is None
    assert load(name, "smoke").data.split == "generator"


def _official_plan(c, seed=0):
    """The plan ``build_protocol`` makes for ``c`` (data.split="official") on CIFAR-100-shaped labels."""
    rng = np.random.default_rng(seed)
    train, test = rng.permutation(np.repeat(np.arange(100), 500)), rng.permutation(np.repeat(np.arange(100), 100))
    names = sorted(str(n) for n in official_splits.packaged_arrays()["class_names"])
    ds = ImageDataset(
        name="cifar100",
        class_names=tuple(names),
        train=Split(images=np.zeros((train.size, 1, 1, 3), np.uint8), labels=train.astype(np.int32)),
        test=Split(images=np.zeros((test.size, 1, 1, 3), np.uint8), labels=test.astype(np.int32)),
    )
    return official_splits.official_plan_for_dataset(c.data.official_split_dir, c.data.setup, ds), train


def test_cifar100_general_official_split_statistics():
    """The official general10 files follow the (S,C,M,L) rule (docs/configs-and-data.md):
    train 7200/7992/7992/7956/7992."""
    c = load("cifar100_general")
    plan, labels = _official_plan(c)
    assert [len(s.train) for s in plan.sessions] == [7200, 7992, 7992, 7956, 7992]
    _check_general(c, plan, labels)
    # the generator (data.split="generator") gives the same session sizes, from other images
    c.data.split = "generator"
    gen = _plan(c, labels)
    assert [len(s.train) for s in gen.sessions] == [7200, 7992, 7992, 7956, 7992]
    _check_general(c, gen, labels)


def test_cifar100_disjoint_official_split_statistics():
    plan, labels = _official_plan(load("cifar100_disjoint"))
    pl = plan.to_protocol_labels(labels)
    for t, s in enumerate(plan.sessions):
        assert (len(s.train), len(s.val)) == (9000, 1000)
        for idx, per in ((s.train, 450), (s.val, 50)):
            counts = np.bincount(pl[idx], minlength=100)
            assert np.all(counts[20 * t : 20 * t + 20] == per) and counts.sum() == 20 * per


def test_cifar100_blurry_official_split_statistics():
    """Official blurry10 (docs/configs-and-data.md): 10,000 images per session (9,000 train), every class in
    every session,
    about 8.1 % minor-class images drawn unevenly (2-21 per minor class; 441-473 per major class); all 500
    images of every class used. Our generator (data.split="generator") makes 9,600 at exactly 10 %."""
    c = load("cifar100_blurry")
    plan, labels = _official_plan(c)
    pl = plan.to_protocol_labels(labels)
    minor_share, minor_counts, major_counts = [], [], []
    for t, s in enumerate(plan.sessions):
        assert (len(s.train), len(s.val)) == (9000, 1000)
        counts = np.bincount(pl[np.concatenate([s.train, s.val])], minlength=100)
        major = np.zeros(100, bool)
        major[20 * t : 20 * t + 20] = True
        assert np.all(np.bincount(pl[s.train], minlength=100) > 0)
        minor_share.append(counts[~major].sum() / counts.sum())
        minor_counts.append(counts[~major])
        major_counts.append(counts[major])
    assert all(0.079 <= m <= 0.081 for m in minor_share), minor_share
    assert np.concatenate(minor_counts).min() == 2 and np.concatenate(minor_counts).max() == 21
    assert np.concatenate(major_counts).min() == 441 and np.concatenate(major_counts).max() == 473
    assert sum(len(s.train) + len(s.val) for s in plan.sessions) == 50000
    c.data.split = "generator"
    gen = _plan(c, labels)
    gl = gen.to_protocol_labels(labels)
    for t, s in enumerate(gen.sessions):
        pool = np.concatenate([s.train, s.val])
        assert len(pool) == 9600
        assert np.isin(gl[pool], np.arange(20 * t, 20 * t + 20)).sum() == 8640  # 90 % major, 10 % minor


@pytest.mark.parametrize(
    "name,field,value,message",
    [
        ("tinyimagenet_general", "data.split", "official", "exist only for cifar100, not tiny_imagenet_zip"),
        ("fashion_mnist_general", "data.split", "official", "set --config.data.split=generator"),
        ("cifar100_general", "data.split", "random", "data.split='random' is unknown"),
        ("cifar100_general", "data.num_sessions", 3, "data.num_sessions=3, but the official CIFAR-100 general10"),
        ("cifar100_general", "data.old_class_percent", 30.0, "data.old_class_percent=30.0, but .* fix 10.0"),
        ("cifar100_blurry", "data.blurry_minor_percent", 30.0, "blurry10 sessions fix 10.0"),
        ("cifar100_disjoint", "data.val_fraction", 0.2, "set --config.data.split=generator to split with"),
        ("fashion_mnist_general", "data.official_split_dir", "CONFIGS", "only read with data.split='official'"),
    ],
)
def test_split_refusals(name, field, value, message, tmp_path):
    c = load(name)
    if c.data.manual_dir is not None:
        c.data.manual_dir = str(tmp_path)
    group, key = field.split(".")
    c[group][key] = CONFIG_DIR if value == "CONFIGS" else value  # any existing folder
    with pytest.raises(config_checks.ConfigError, match=message):
        config_checks.check(c, num_devices=1)


def test_official_split_with_its_fields_passes_and_generator_switch_frees_them():
    c = load("cifar100_general")
    c.data.official_split_dir = CONFIG_DIR  # any existing folder passes the check
    config_checks.check(c, num_devices=1)
    c.data.official_split_dir = None
    c.data.split, c.data.old_class_percent, c.data.num_sessions = "generator", 30.0, 3
    config_checks.check(c, num_devices=1)


@pytest.mark.parametrize(
    "name,sessions,s,cc,m,budget,batch",
    [
        ("dogs_general", 4, 60, 20, 30.0, 600, 64),
        ("inat_general", 5, 100, 25, 30.0, 4000, 64),
        ("productm_general", 3, 1343, 700, 40.0, 3000, 32),
        ("tinyimagenet_general", 10, 20, 20, 30.0, 4000, 64),
        ("cifar100_general", 5, 20, 20, 10.0, 2000, 16),
    ],
)
def test_paper_general_parameters(name, sessions, s, cc, m, budget, batch):
    c = load(name)
    d = c.data
    assert (d.first_classes, d.classes_per_session, d.old_class_percent, d.num_sessions) == (s, cc, m, sessions)
    assert (c.memory.budget, c.train.batch_size, c.data.setup) == (budget, batch, "general")


def test_finegrained_recipe():
    for name in ("dogs_general", "inat_general", "productm_general"):
        c = load(name)
        assert (c.model.name, c.model.layout, c.model.frozen_bn) == ("resnet50", "torchvision", True)
        assert (c.train.epochs, c.train.schedule, c.train.lr) == (100, "constant", 1e-4)
        assert (c.augment.crop, c.augment.size) == ("resized", 224)


def _plan(c, train_labels):
    return plan_from_config(train_labels, c, num_classes=int(train_labels.max()) + 1)


def _check_general(c, plan, labels):
    """New classes per session = (S, C, C, ...); from session 2 on, old classes make up ~M of the pool;
    validation queries are the configured share (or count per class) of each session's pool."""
    d = c.data
    pl = plan.to_protocol_labels(labels)
    assert plan.num_sessions == d.num_sessions
    for t, sess in enumerate(plan.sessions):
        pool = np.concatenate([sess.train, sess.val])
        assert len(np.intersect1d(sess.train, sess.val)) == 0
        new = set(sess.new_classes.tolist())
        assert len(new) == (d.first_classes if t == 0 else d.classes_per_session)
        assert set(np.unique(pl[pool])) >= new
        if t > 0:
            n_new = int(np.isin(pl[pool], list(new)).sum())
            old = np.arange(d.first_classes + (t - 1) * d.classes_per_session)
            m = d.old_class_percent / 100
            got = np.bincount(pl[pool], minlength=pl.max() + 1)[old]
            if d.general_shares == "uniform":  # each old class: floor(N_new * M / (1 - M) / n_old)
                np.testing.assert_array_equal(got, int(np.floor(n_new * m / (1 - m) / old.size + 1e-9)))
            else:  # M of the pool, spread over the old classes in proportion to their sizes
                total = int(np.floor(n_new * m / (1 - m) + 1e-9))
                assert got.sum() == total
                sizes = np.bincount(pl, minlength=pl.max() + 1)[old]
                assert np.abs(got - total * sizes / sizes.sum()).max() < 1.0
        if d.val_per_class is None:
            assert abs(len(sess.val) / len(pool) - d.val_fraction) < 0.01
        else:
            per = np.bincount(pl[sess.val], minlength=pl.max() + 1)
            avail = np.bincount(pl[pool], minlength=pl.max() + 1)
            present = avail > 0
            np.testing.assert_array_equal(per[present], np.minimum(d.val_per_class, avail[present] - 1))


def test_dogs_split_statistics():
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(120), 100))  # 12,000 train images
    c = load("dogs_general")
    _check_general(c, _plan(c, labels), labels)


def test_inat_split_statistics():
    labels = np.random.default_rng(1).permutation(np.repeat(np.arange(200), 527))  # iNat-M: 200 x 527
    c = load("inat_general")
    _check_general(c, _plan(c, labels), labels)


def test_productm_split_statistics():
    """2,743 classes with 16..80 training images each (>= 20 images, 20% held out as test)."""
    rng = np.random.default_rng(2)
    counts = rng.integers(16, 81, size=2743)
    labels = rng.permutation(np.repeat(np.arange(2743), counts))
    c = load("productm_general")
    _check_general(c, _plan(c, labels), labels)


def test_productm_proportional_split_uses_most_images():
    """Long-tailed Product-M: the proportional rule uses most images; the uniform rule would not."""
    rng = np.random.default_rng(2)
    counts = rng.integers(16, 81, size=2743)
    labels = rng.permutation(np.repeat(np.arange(2743), counts))
    c = load("productm_general")
    plan = _plan(c, labels)
    every = np.concatenate([np.concatenate([x.train, x.val]) for x in plan.sessions])
    assert np.unique(every).size == every.size  # no image in two sessions
    again = _plan(c, labels)
    assert all(
        np.array_equal(a.train, b.train) and np.array_equal(a.val, b.val) for a, b in zip(plan.sessions, again.sessions)
    )
    used = every.size / labels.size
    c.data.general_shares = "uniform"
    used_uniform = sum(len(x.train) + len(x.val) for x in _plan(c, labels).sessions) / labels.size
    assert used > 0.8 and used_uniform < 0.4, (used, used_uniform)


@pytest.mark.parametrize("name", RUNNABLE)
def test_smoke_is_small_on_full_size_data(name):
    """``:smoke`` on data of a real dataset's size (100 classes x 600 images) trains a few hundred images
    per session and asks a few hundred queries: the cap, not the data, sizes a smoke run."""
    from cvs_jax.engine.protocol import Protocol

    c = load(name, "smoke")
    rng = np.random.default_rng(0)
    train, test = rng.permutation(np.repeat(np.arange(100), 600)), rng.permutation(np.repeat(np.arange(100), 100))
    plan = plan_from_config(train, c, num_classes=100)
    assert max(len(s.train) for s in plan.sessions) <= 300
    proto = Protocol(
        types.SimpleNamespace(test_sessions=None),
        plan,
        plan.to_protocol_labels(train),
        plan.to_protocol_labels(test),
        0,
        c.data.max_per_class,
    )
    queries = [proto.test_queries(s) for s in range(plan.num_sessions)]
    assert 0 < len(queries[-1]) <= 400
    assert np.isin(queries[0], queries[1]).all()  # capped queries of a session stay queries later
    counts = np.bincount(proto.test_labels[queries[-1]])
    assert counts.max() == c.data.max_per_class  # the first n of each seen class, no more


def test_max_per_class_none_leaves_the_plan_unchanged():
    c = load("fashion_mnist_general")
    labels = np.random.default_rng(1).permutation(np.repeat(np.arange(10), 700))
    a = plan_from_config(labels, c, num_classes=10)
    c.data.max_per_class = 10_000
    b = plan_from_config(labels, c, num_classes=10)
    assert all(
        np.array_equal(x.train, y.train) and np.array_equal(x.val, y.val) for x, y in zip(a.sessions, b.sessions)
    )
