"""Small real-format datasets written by the tests themselves (no downloads), and the tiny config.

``write_fashion_idx`` writes gzipped IDX files in the Fashion-MNIST layout whose
classes are learnable: each class is a fixed random 28x28 template plus noise and
a random shift, so retrieval recall is well above chance after a few steps.
"""

from __future__ import annotations

import gzip
import os
import struct

import numpy as np

from configs import fashion_mnist_general


def _write_idx(path: str, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def make_images(labels: np.ndarray, seed: int, num_classes: int = 10) -> np.ndarray:
    rng = np.random.default_rng(1234)  # templates shared by train and test
    templates = rng.uniform(0, 255, size=(num_classes, 28, 28))
    templates = (templates + np.roll(templates, 1, 1) + np.roll(templates, 1, 2)) / 3
    rng = np.random.default_rng(seed)
    images = templates[labels] + rng.normal(0, 40, size=(len(labels), 28, 28))
    shifts = rng.integers(-2, 3, size=(len(labels), 2))
    images = np.stack([np.roll(im, tuple(s), (0, 1)) for im, s in zip(images, shifts)])
    return np.clip(images, 0, 255).astype(np.uint8)


def write_fashion_idx(directory: str, train_per_class: int = 60, test_per_class: int = 10, seed: int = 0) -> str:
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    for split, per_class, prefix in (("train", train_per_class, "train"), ("test", test_per_class, "t10k")):
        labels = rng.permutation(np.repeat(np.arange(10), per_class)).astype(np.uint8)
        images = make_images(labels, seed + (split == "test"))
        _write_idx(os.path.join(directory, f"{prefix}-images-idx3-ubyte.gz"), images)
        _write_idx(os.path.join(directory, f"{prefix}-labels-idx1-ubyte.gz"), labels)
    return directory


def tiny_config(manual_dir, tmp_path, method="finetune", sessions=3):
    c = fashion_mnist_general.get_config()
    c.method = method
    c.data.manual_dir = manual_dir
    c.data.data_dir = str(tmp_path / "tfds")
    c.data.num_sessions = sessions
    c.data.first_classes = 4
    c.data.classes_per_session = 2
    c.data.samples_per_new_class = 40
    c.model.width = 4
    c.model.embed_dim = 8
    c.train.epochs = 2
    c.train.batch_size = 16
    c.train.eval_batch_size = 64
    c.memory.budget = 30
    return c
