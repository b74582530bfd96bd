"""Each paper config's ``:smoke`` variant runs two sessions end to end on mocked or local data.

What the smoke runs check: the config's data source, session setup, augmentation (AutoAugment,
RandAugment, RandomResizedCrop), model family (ResNet-18 CIFAR / ImageNet stems, ResNet-50 with
frozen BN) and the CVS step with the frozen previous model in session 2.  Compiles dominate, so the
configs that share shapes share the persistent XLA cache. A config whose network, augmentation and method another
smoke run (or the suite's tiny runs) already trains builds its data and session plan and checks the setup's rules
on it instead of training (``check_setup_plan``): the disjoint and blurry configs (their dataset's general one
trains), ``tinyimagenet_mini_general`` (its ``gpu,smoke`` variant trains on the same data), ``productm_general``
(``inat_general`` trains the fine-grained recipe) and ``fashion_mnist_general`` (the tiny runs of every other test
file); 10-30 s of test time each on a 2-core CPU host.
"""

import importlib

import numpy as np
import pytest

from cvs_jax.engine import runner


def smoke_config(name, tmp_path, variant="smoke"):
    c = importlib.import_module(f"configs.{name}").get_config(variant)
    c.data.data_dir = str(tmp_path / "tfds")
    return c


def check_two_sessions(res):
    assert len(res["per_session"]) == 2
    for r in res["per_session"]:
        assert 0.0 <= r["recall"]["1"] <= r["recall"]["4"] <= 1.0 and r["steps"] > 0
    assert res["per_session"][1]["gallery_rows"] > res["per_session"][0]["gallery_rows"]


def check_setup_plan(c):
    """The config's checks and its ``:smoke`` data and session plan, without training: two sessions that
    follow the setup's rules (disjoint: no class trains in both; blurry: every class in both; general: new
    classes in session 2 beside old ones)."""
    from cvs_jax.engine import config_checks
    from cvs_jax.engine.protocol_builder import build_protocol

    config_checks.check(c, num_devices=1)
    proto = build_protocol(c)
    assert proto.plan.setup == c.data.setup and proto.plan.num_sessions == 2
    first, second = (set(proto.train_labels[s.train].tolist()) for s in proto.plan.sessions)
    assert first and second and -1 not in first | second
    if c.data.setup == "disjoint":
        assert first.isdisjoint(second), (first, second)
    elif c.data.setup == "blurry":  # each session's major classes, and every other class's minor share
        assert first == second, (first, second)
    else:
        assert first & second and second - first, (first, second)
    return proto


@pytest.mark.parametrize("name", ["cifar100_general", "cifar100_disjoint", "cifar100_blurry"])
def test_cifar100_smoke(name, tmp_path):
    """TFDS ``cifar100`` through ``tfds.testing.mock_data`` (random 32x32 images, random labels)."""
    from cvs_jax.testing.tiny_data import mock_tfds

    c = smoke_config(name, tmp_path)
    with mock_tfds(num_examples=2000):
        if c.data.setup != "general":
            check_setup_plan(c)
            return
        res = runner.run(c, str(tmp_path / "run"))
    check_two_sessions(res)


def write_fake_tiny_zip(directory, num_classes=6, train_per_class=24, val_per_class=6, seed=0) -> str:
    """A Tiny-ImageNet zip in the official layout (wnids, words, train/<wnid>/images, val + annotations)."""
    import os
    import zipfile

    from cvs_jax.testing.tiny_data import _jpeg_bytes, fake_class_image

    rng = np.random.default_rng(seed)
    wnids = [f"n{1000000 + k:08d}" for k in range(num_classes)]
    os.makedirs(directory, exist_ok=True)
    with zipfile.ZipFile(os.path.join(directory, "tiny-imagenet-200.zip"), "w") as zf:
        top = "tiny-imagenet-200/"
        zf.writestr(top + "wnids.txt", "".join(w + "\n" for w in wnids))
        zf.writestr(top + "words.txt", "".join(f"{w}\tclass {k}\n" for k, w in enumerate(wnids)))
        notes, n = [], 0
        for k, w in enumerate(wnids):
            for i in range(train_per_class):
                zf.writestr(f"{top}train/{w}/images/{w}_{i}.JPEG", _jpeg_bytes(fake_class_image(rng, k, (64, 64))))
            for _ in range(val_per_class):
                zf.writestr(f"{top}val/images/val_{n}.JPEG", _jpeg_bytes(fake_class_image(rng, k, (64, 64))))
                notes.append(f"val_{n}.JPEG\t{w}\t0\t0\t63\t63\n")
                n += 1
        zf.writestr(top + "val/val_annotations.txt", "".join(notes))
    return str(directory)


@pytest.fixture(scope="module")
def tiny_zip_dir(tmp_path_factory):
    return write_fake_tiny_zip(tmp_path_factory.mktemp("tinyzip"))


@pytest.mark.parametrize(
    "name", ["tinyimagenet_general", "tinyimagenet_disjoint", "tinyimagenet_blurry", "tinyimagenet_mini_general"]
)
def test_tinyimagenet_smoke(name, tiny_zip_dir, tmp_path):
    """Our ``tiny_imagenet_zip`` builder on a 6-class zip in the official layout."""
    c = smoke_config(name, tmp_path)
    c.data.manual_dir = tiny_zip_dir
    if name != "tinyimagenet_general":
        check_setup_plan(c)
        return
    check_two_sessions(runner.run(c, str(tmp_path / "run")))


def test_tinyimagenet_mini_gpu_variant_runs_on_cpu_with_smoke(tiny_zip_dir, tmp_path):
    """``:gpu`` restores the paper's network and recipe on the mini config; ``:gpu,smoke`` runs here."""
    from configs import variants

    gpu = importlib.import_module("configs.tinyimagenet_mini_general").get_config("gpu")
    assert (gpu.model.name, gpu.model.width, gpu.model.layout) == ("resnet18", 64, "imagenet")
    assert (gpu.train.schedule, gpu.train.epochs, gpu.train.batch_size) == ("official", variants.GPU_EPOCHS, 64)
    assert gpu.augment.policy == "randaugment" and gpu.memory.budget == 1000
    c = smoke_config("tinyimagenet_mini_general", tmp_path, variant="gpu,smoke")
    c.data.manual_dir = tiny_zip_dir
    check_two_sessions(runner.run(c, str(tmp_path / "run")))


def test_fashion_mnist_smoke(fashion_idx, tmp_path):

    c = smoke_config("fashion_mnist_general", tmp_path)
    c.data.manual_dir = fashion_idx(30, 5)
    check_setup_plan(c)


@pytest.fixture
def small_stored_images(monkeypatch):
    """Fine-grained builders store 256x256 images; 32x32 keeps the smoke runs quick (crops of 24)."""
    from cvs_jax.data.builders import resize

    monkeypatch.setattr(resize, "STORED_SIZE", 32)


@pytest.mark.slow  # the fine-grained recipe runs by default in test_inat_smoke; dogs adds its builder only
def test_dogs_smoke(small_stored_images, tmp_path):
    """``stanford_dogs_256`` from a fake prepared TFDS ``stanford_dogs`` (array_record, JPEG bytes)."""
    from cvs_jax.testing.tiny_data import write_fake_tfds_source

    c = smoke_config("dogs_general", tmp_path)
    write_fake_tfds_source(c.data.data_dir, "stanford_dogs", num_classes=6, train_per_class=20, test_per_class=4)
    check_two_sessions(runner.run(c, str(tmp_path / "run")))


def test_inat_smoke(small_stored_images, monkeypatch, tmp_path):
    """``inat_m`` from a fake TFDS ``i_naturalist2017``: 6 of 7 classes with >= 20 images, 20 drawn each."""
    from cvs_jax.data.builders import inat_m
    from cvs_jax.testing.tiny_data import write_fake_tfds_source

    monkeypatch.setattr(inat_m, "NUM_CLASSES", 6)
    monkeypatch.setattr(inat_m, "MIN_TRAIN_PER_CLASS", 20)
    monkeypatch.setattr(inat_m, "TRAIN_PER_CLASS", 20)
    c = smoke_config("inat_general", tmp_path)
    write_fake_tfds_source(
        c.data.data_dir,
        "i_naturalist2017",
        num_classes=7,
        train_per_class=[22, 25, 20, 12, 21, 24, 20],
        test_per_class=3,
    )
    res = runner.run(c, str(tmp_path / "run"))
    check_two_sessions(res)


def test_productm_smoke(small_stored_images, tmp_path):
    """``product_m`` from a fake Product-10K folder (train.csv + train/); 2 val queries per class."""
    from cvs_jax.testing.tiny_data import write_fake_product10k

    c = smoke_config("productm_general", tmp_path)
    c.data.manual_dir = write_fake_product10k(tmp_path / "p10k", num_classes=7, per_class=25)
    proto = check_setup_plan(c)
    # data.val_per_class = 2: two val queries of each class seen so far, in each session
    assert [len(s.val) for s in proto.plan.sessions] == [2 * s.num_outputs for s in proto.plan.sessions] == [8, 12]
