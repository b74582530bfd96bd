"""Tiny photo-folder runs (``data.name=image_folder``) for tests that train, update, serve and search.

Each class is a colour pattern with noise at a random size, saved in every format the builder reads;
``folder_config`` trains a 4-wide network on 16-pixel images for one epoch (seconds on a CPU).
"""

from __future__ import annotations

import os

import numpy as np
from PIL import Image

from configs import image_folder_general

FORMATS = (("png", "PNG"), ("jpg", "JPEG"), ("webp", "WEBP"), ("bmp", "BMP"))


def class_image(label: int, rng: np.random.Generator) -> Image.Image:
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
        label = sum(map(ord, name)) % 97  # the class's pattern
        for split, count in (("train", n), ("test", test_per_class)):
            folder = os.path.join(root, split, name)
            os.makedirs(folder, exist_ok=True)
            for i in range(count):
                ext, fmt = FORMATS[i % len(FORMATS)]
                class_image(label, rng).save(os.path.join(folder, f"{seed} img {i}.{ext}"), format=fmt)
    return str(root)


def folder_config(tmp_path, manual_dir):
    c = image_folder_general.get_config("cpu")
    c.data.manual_dir = str(manual_dir)
    c.data.data_dir = str(tmp_path / "data")
    c.data.stored_size = 16
    c.augment.size = 12
    c.model.width, c.model.embed_dim = 4, 8
    c.train.epochs, c.train.batch_size, c.train.eval_batch_size = 1, 8, 64
    c.train.checkpoint_every_steps = 2
    c.memory.budget = 24
    return c


SESSIONS = ({"ant": 16, "bee": 16, "cat": 16}, {"dog": 16, "ant": 4})


def photo_run(root) -> tuple[str, str]:
    """A finished one-session photo run under ``root/run`` and the folder of its next session
    (``python -m cvs_jax.update --workdir root/run --data <folder>``)."""
    from cvs_jax.engine import runner  # pylint: disable=g-import-not-at-top

    first, second = (write_folder(root / f"s{i + 1}", classes, 3, seed=i) for i, classes in enumerate(SESSIONS))
    runner.run(folder_config(root, first), str(root / "run"))
    return str(root / "run"), second


def new_photo(path, name: str = "ant", seed: int = 1000) -> str:
    """A photo of class ``name``'s pattern whose bytes are in no run (for adds); returns ``path``."""
    class_image(sum(map(ord, name)) % 97, np.random.default_rng(seed)).save(path)
    return str(path)
