"""Generated photo folders (class folders of learnable pictures in every format) and the tiny ``:cpu`` config
that trains on them in seconds: what the tests of your own images (``main``, ``update``, ``search``,
``info``, the report) run on."""

from __future__ import annotations

import os

import numpy as np
from PIL import Image

from configs import image_folder_general

FORMATS = (("png", "PNG"), ("jpg", "JPEG"), ("webp", "WEBP"), ("bmp", "BMP"))

SESSIONS = [  # the classes (train images) each session brings: new ones and a known one
    {"ant": 24, "bee": 24, "cat": 24},
    {"dog": 24, "ant": 8},
    {"eel": 24, "fox": 24},
]


def image(label: int, rng: np.random.Generator) -> Image.Image:
    """A learnable picture: a class colour pattern, noise, a random non-square size."""
    base = np.random.default_rng(100 + label).uniform(0, 255, (4, 4, 3))
    w, h = rng.integers(18, 40, size=2)
    arr = np.kron(base, np.ones((10, 10, 1)))[:h, :w]
    arr = np.clip(arr + rng.normal(0, 20, arr.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(arr)


def write_folder(root, classes: dict[str, int], test_per_class: int, seed: int) -> str:
    """``root/train/<class>/`` and ``root/test/<class>/`` with images in every format."""
    rng = np.random.default_rng(seed)
    for name, n in classes.items():
        label = sum(map(ord, name)) % 97
        for split, count in (("train", n), ("test", test_per_class)):
            folder = os.path.join(root, split, name)
            os.makedirs(folder, exist_ok=True)
            for i in range(count):
                ext, fmt = FORMATS[i % len(FORMATS)]
                image(label, rng).save(os.path.join(folder, f"{seed} img {i}.{ext}"), format=fmt)
    return str(root)


def config(tmp_path, manual_dir):
    """``image_folder_general.py:cpu`` at 16x16 with a width-4 network, one epoch per session."""
    c = image_folder_general.get_config("cpu")
    c.data.manual_dir = str(manual_dir)
    c.data.data_dir = str(os.path.join(tmp_path, "data"))
    c.data.stored_size = 16
    c.augment.size = 12
    c.model.width, c.model.embed_dim = 4, 8
    c.train.epochs, c.train.batch_size, c.train.eval_batch_size = 1, 8, 64
    c.train.checkpoint_every_steps = 2
    c.memory.budget = 24
    return c
