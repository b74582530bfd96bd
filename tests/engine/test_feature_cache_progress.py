"""Preparing the feature cache says what it does and how far it got (minutes of silence on a CPU otherwise)."""

from __future__ import annotations

import os

import numpy as np

from configs import image_folder_general
from cvs_jax.engine import features

VIT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "backbones", "vit_patch16.safetensors")


class _Photos:
    """A split held in memory: uint8 images of the stored shape."""

    image_shape = (32, 32, 3)

    def __init__(self, n: int):
        self.images = np.random.default_rng(0).integers(0, 256, (n, *self.image_shape), dtype=np.uint8)
        self.labels = np.zeros(n, np.int32)

    def __len__(self) -> int:
        return len(self.labels)

    def read(self, idx):
        return self.images[np.asarray(idx, np.int64)]


def test_cache_preparation_prints_a_start_line_and_progress(tmp_path, monkeypatch):
    c = image_folder_general.get_config("cpu")
    c.model.name, c.model.pretrained, c.model.train_blocks = "vit", VIT, "1"
    c.data.stored_size, c.augment.size, c.data.data_dir = 32, 32, str(tmp_path)
    c.train.eval_batch_size = 4
    monkeypatch.setattr(features, "PROGRESS_SECONDS", 0.0)
    lines = []
    trunk = features.Trunk(c, (32, 32, 3), lines.append)
    feats = trunk.split(_Photos(10), "test")
    assert feats.images.shape[0] == 10
    assert lines[0].startswith("features: 10 test images through the frozen trunk")
    progress = [line for line in lines[1:] if " of 10 images " in line]
    assert [line.split()[1] for line in progress] == ["4", "8"], lines  # after each chunk but the last
    lines.clear()
    features.Trunk(c, (32, 32, 3), lines.append).split(_Photos(10), "test")
    assert lines == []  # read from the cache: nothing computed, nothing said
