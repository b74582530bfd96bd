"""Photo folders written by the tests themselves (images in four formats, learnable classes), the
tiny image_folder config that trains on them and a finished run of it to start from: shared by the
your-own-images tests, the feature cache's, the pretrained backbone's, update's and serve's."""

from __future__ import annotations

import os

import numpy as np
from PIL import Image

from cvs_jax.config import image_folder_general
from cvs_jax.engine import runner

FORMATS = (("png", "PNG"), ("jpg", "JPEG"), ("webp", "WEBP"), ("bmp", "BMP"))


def folder_image(label: int, rng: np.random.Generator) -> Image.Image:
    """A learnable picture: a class colour pattern, noise, a random non-square size."""
    base = np.random.default_rng(100 + label).uniform(0, 255, (4, 4, 3))
    w, h = rng.integers(18, 40, size=2)
    arr = np.kron(base, np.ones((10, 10, 1)))[:h, :w]
    arr = np.clip(arr + rng.normal(0, 20, arr.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(arr)


def write_folder(root, classes: dict[str, int], test_per_class: int, seed: int, names: list[str] | None = None):
    """``root/train/<class>/`` and ``root/test/<class>/`` with images in every format."""
    rng = np.random.default_rng(seed)
    for name, n in classes.items():
        label = sum(map(ord, name)) % 97
        for split, count in (("train", n), ("test", test_per_class)):
            folder = os.path.join(root, split, name)
            os.makedirs(folder, exist_ok=True)
            for i in range(count):
                ext, fmt = FORMATS[i % len(FORMATS)]
                folder_image(label, rng).save(os.path.join(folder, f"{seed} img {i}.{ext}"), format=fmt)
    return str(root)


SESSIONS = [  # the classes (train images) each session brings: new ones and a known one
    {"ant": 24, "bee": 24, "cat": 24},
    {"dog": 24, "ant": 8},
    {"eel": 24, "fox": 24},
]


def folder_config(tmp_path, manual_dir):
    """The image_folder config at a tiny size: a 4-wide net, one epoch, batches of 8."""
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


def backbone_config(name: str, pretrained: str | None, **model):
    """The image_folder config (its default variant) with ``model.name``, ``model.pretrained`` and any other
    ``model`` fields set: what the backbone and weight-file tests build networks from."""
    c = image_folder_general.get_config()
    c.model.name, c.model.pretrained = name, pretrained
    for k, v in model.items():
        c.model[k] = v
    return c


PHOTO_RUN_SESSIONS = ({"ant": 16, "bee": 16, "cat": 16}, {"dog": 16, "ant": 4})


def photo_run(root, network: str = "tiny", method: str | None = None) -> tuple[str, str]:
    """A finished one-session photo run under ``root/run`` and the folder of its next session
    (``python -m cvs_jax.update --workdir root/run --data <folder>``).  ``network="walkthrough"``: the
    ``:cpu`` variant's network and image sizes (docs/your-images.md), one epoch, instead of the tiny one;
    ``method``: another method than the config's (``joint``: a gallery re-embedded each session)."""
    sessions = enumerate(PHOTO_RUN_SESSIONS)
    first, second = (write_folder(root / f"s{i + 1}", classes, 3, seed=i) for i, classes in sessions)
    config = folder_config(root, first)
    if method is not None:
        config.method = method
    if network == "walkthrough":
        cpu = image_folder_general.get_config("cpu")
        config.data.stored_size, config.augment.size = cpu.data.stored_size, cpu.augment.size
        config.model.width, config.model.embed_dim = cpu.model.width, cpu.model.embed_dim
    elif network != "tiny":
        raise ValueError(f"network={network!r}: 'tiny' or 'walkthrough'")
    runner.run(config, str(root / "run"))
    return str(root / "run"), second


def new_photo(path, name: str = "ant", seed: int = 1000) -> str:
    """A photo of class ``name``'s pattern whose bytes are in no run (for adds); returns ``path``."""
    folder_image(sum(map(ord, name)) % 97, np.random.default_rng(seed)).save(path)
    return str(path)


def new_photos(folder, counts: dict[str, int], seed: int = 100) -> dict[str, list[str]]:
    """``counts[name]`` new photos (bytes in no run) of each class as ``folder/<class>/<class>-<i>.png``."""
    out = {}
    for name, n in counts.items():
        os.makedirs(os.path.join(folder, name), exist_ok=True)
        out[name] = [
            new_photo(os.path.join(folder, name, f"{name}-{i}.png"), name, seed=seed + 10 * i) for i in range(n)
        ]
        seed += 1000
    return out


def uploads(paths) -> list[tuple[str, tuple[str, bytes]]]:
    """``paths`` as the multipart ``file`` fields of a ``/search`` or ``/add`` request (TestClient's ``files``)."""
    out = []
    for p in paths:
        with open(p, "rb") as f:
            out.append(("file", (os.path.basename(p), f.read())))
    return out
