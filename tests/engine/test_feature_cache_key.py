"""The feature cache's key (``engine.features._trunk_identity``): what the trunk's outputs depend on."""

from __future__ import annotations

import os
import shutil

from configs import image_folder_general
from cvs_jax.augment import transforms as augment
from cvs_jax.engine import features

VIT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "backbones", "vit_patch16.safetensors")


def _config(weights: str):
    c = image_folder_general.get_config("cpu")
    c.model.name, c.model.pretrained, c.model.train_blocks = "vit", weights, "1"
    c.data.stored_size, c.augment.size = 32, 32
    return c


def _key(c) -> str:
    what = features._trunk_identity(c, (32, 32, 3), augment.Pipeline.from_config(c))  # pylint: disable=protected-access
    return features._digest(what)  # pylint: disable=protected-access


def test_key_follows_the_weight_files_bytes_not_its_path(tmp_path):
    a, b = str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")
    shutil.copy(VIT, a)
    shutil.copy(VIT, b)
    key = _key(_config(a))
    assert _key(_config(b)) == key  # the same bytes elsewhere: the same cache
    with open(a, "ab") as f:  # new bytes at the same path: a new cache
        f.write(b"\0")
    assert _key(_config(a)) != key


def test_key_follows_the_crop_and_its_size(tmp_path):
    c = _config(VIT)
    key = _key(c)
    c.augment.size = 24  # a smaller centre crop of the same stored images
    assert _key(c) != key
    c = _config(VIT)
    c.augment.crop = "pad" if c.augment.crop != "pad" else "resized"
    assert _key(c) != key
