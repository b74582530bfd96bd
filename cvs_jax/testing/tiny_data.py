"""Small real-format datasets written by the tests themselves (no downloads), and the tiny config.

``write_fashion_idx`` writes gzipped IDX files in the Fashion-MNIST layout whose
classes are learnable: each class is a fixed random 28x28 template plus noise and
a random shift, so retrieval recall is well above chance after a few steps.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import struct
from unittest import mock

import numpy as np

from cvs_jax.config import fashion_mnist_general
from cvs_jax.data.builders import tfds_tempdirs


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


# --------------------------------------------------------------------------
# Fine-grained datasets (stanford_dogs_256, inat_m, product_m) from synthetic
# images. Preparation resizes every image to `resize.STORED_SIZE` (256); for
# quick runs patch it first, e.g. `monkeypatch.setattr(resize, "STORED_SIZE", 32)`
# (from cvs_jax.data.builders import resize), in the same test that loads.


def fake_class_image(rng: np.random.Generator, label: int, size: tuple[int, int]) -> np.ndarray:
    """A uint8 [h, w, 3] image of class `label`: a fixed 6x6 colour pattern, upscaled, plus noise.

    Classes are learnable (as in `make_images`); sizes vary so the resize + centre crop matters.
    """
    from PIL import Image

    pattern = np.random.default_rng(10_000 + label).integers(0, 256, (6, 6, 3), dtype=np.uint8)
    h, w = size
    image = np.asarray(Image.fromarray(pattern).resize((w, h), Image.Resampling.BILINEAR), np.float32)
    image += rng.normal(0, 25, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def _jpeg_bytes(image: np.ndarray) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(image).save(out, format="JPEG", quality=90)
    return out.getvalue()


def _random_size(rng: np.random.Generator) -> tuple[int, int]:
    return int(rng.integers(40, 71)), int(rng.integers(40, 71))


def write_fake_product10k(root, num_classes: int = 4, per_class=25, seed: int = 0, layout: str = "folder") -> str:
    """Writes a Product-10K-like manual dir (train.csv + train/ or train.zip); returns its path.

    Use: `manual_dir = write_fake_product10k(tmp_path / "p10k", num_classes=6, per_class=25)`, then
    `sources.load_dataset("product_m", data_dir=str(tmp_path / "tfds"), manual_dir=manual_dir)`.
    Classes have original ids 3 * k + 5 (k = 0..num_classes-1), listed in a shuffled csv order;
    `per_class` is an int or one count per class (classes under 20 images are dropped by product_m).
    Images are JPEGs of 40-70 px sides named `<k>_<i>.jpg`; `layout` is "folder" or "zip".
    """
    import zipfile

    root = os.fspath(root)
    os.makedirs(root, exist_ok=True)
    counts = [per_class] * num_classes if isinstance(per_class, (int, np.integer)) else list(per_class)
    if len(counts) != num_classes:
        raise ValueError(f"per_class has {len(counts)} counts for {num_classes} classes")
    rng = np.random.default_rng(seed)
    rows = [(f"{k}_{i}.jpg", 3 * k + 5) for k in range(num_classes) for i in range(counts[k])]
    rows = [rows[j] for j in rng.permutation(len(rows))]
    files = {name: _jpeg_bytes(fake_class_image(rng, cls, _random_size(rng))) for name, cls in rows}
    with open(os.path.join(root, "train.csv"), "w") as f:
        f.write("name,class,group\n")
        f.writelines(f"{name},{cls},{cls % 3}\n" for name, cls in rows)
    if layout == "folder":
        os.makedirs(os.path.join(root, "train"), exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(root, "train", name), "wb") as f:
                f.write(data)
    elif layout == "zip":
        with zipfile.ZipFile(os.path.join(root, "train.zip"), "w") as zf:
            for name, data in files.items():
                zf.writestr(f"train/{name}", data)
    else:
        raise ValueError(f"layout={layout!r}: use 'folder' or 'zip'")
    return root


# Source label id of fake class k, per source dataset (non-contiguous, unsorted on purpose).
FAKE_SOURCE_LABEL = {
    "stanford_dogs": lambda k: (7 * k + 3) % 120,
    "i_naturalist2017": lambda k: (389 * k + 17) % 5089,
}
_FAKE_SPLITS = {"stanford_dogs": ("train", "test"), "i_naturalist2017": ("train", "validation")}


def write_fake_tfds_source(
    data_dir, name: str, num_classes: int, train_per_class, test_per_class, seed: int = 0
) -> str:
    """Prepares a small fake copy of the standard TFDS dataset `name` in `data_dir` (array_record).

    `name` is "stanford_dogs" (source of stanford_dogs_256) or "i_naturalist2017" (source of
    inat_m). The copy has the real builder's name, version and features, so the real reading
    code runs on it: no monkeypatching, no TensorFlow (images are JPEG bytes made with PIL).
    Fake class k has source label `FAKE_SOURCE_LABEL[name](k)`; `train_per_class` and
    `test_per_class` are ints or one count per class; images have 40-70 px sides. Use:
    `write_fake_tfds_source(tmp_path / "tfds", "i_naturalist2017", 5, [9, 9, 3, 9, 9], 2)` then
    (with inat_m's MIN_TRAIN_PER_CLASS, TRAIN_PER_CLASS, NUM_CLASSES patched small)
    `sources.load_dataset("inat_m", data_dir=str(tmp_path / "tfds"))`.
    Returns `data_dir`.
    """
    import tensorflow_datasets as tfds

    if name not in _FAKE_SPLITS:
        raise ValueError(f"name={name!r}: use one of {sorted(_FAKE_SPLITS)}")
    data_dir = os.fspath(data_dir)
    per_split = {}
    for split, per_class in zip(_FAKE_SPLITS[name], (train_per_class, test_per_class)):
        counts = [per_class] * num_classes if isinstance(per_class, (int, np.integer)) else list(per_class)
        if len(counts) != num_classes:
            raise ValueError(f"{split}: {len(counts)} counts for {num_classes} classes")
        per_split[split] = counts
    rng = np.random.default_rng(seed)
    label_of = FAKE_SOURCE_LABEL[name]

    def examples(split):
        counts = per_split[split]
        for k in range(num_classes):
            label = label_of(k)
            for i in range(counts[k]):
                image = _jpeg_bytes(fake_class_image(rng, label, _random_size(rng)))
                key = f"{split}_{k}_{i}"
                if name == "stanford_dogs":
                    filename = f"n{2085620 + label:08d}-Breed{label}/n{2085620 + label:08d}_{split}{i}.jpg"
                    yield key, {"image": image, "image/filename": filename, "label": label, "objects": []}
                else:
                    yield (
                        key,
                        {"id": f"{rng.integers(1 << 62):016x}", "image": image, "label": label, "supercategory": 0},
                    )

    real = tfds.builder_cls(name)

    class FakeSource(real, skip_registration=True):
        def _split_generators(self, dl_manager):
            if name == "stanford_dogs":  # tfds types info.features as an optional FeatureConnector (no [])
                names = [f"n{2085620 + l:08d}-breed{l}" for l in range(120)]
                self.info.features["label"].names = names  # pyright: ignore[reportIndexIssue, reportOptionalSubscript]
            return {split: examples(split) for split in _FAKE_SPLITS[name]}

    FakeSource.name = name
    # builder_cls returns type[DatasetBuilder]: pyright sees its abstract methods and not the subclass's arguments
    with tfds_tempdirs.no_stray_tempdirs():
        fake = FakeSource(data_dir=data_dir, file_format="array_record")  # pyright: ignore[reportAbstractUsage, reportCallIssue]
    fake.download_and_prepare()
    return data_dir


def _mock_getitems(record_keys, generator, serialized=False):
    # tfds 4.9.10's mock binds `_getitems` without `self` to the mocked
    # ArrayRecordDataSource.__getitems__ (a non-magic attribute of a MagicMock),
    # so batched reads fail with "missing argument 'record_keys'". Same result,
    # without `self`.
    assert not serialized
    return [generator[key] for key in record_keys]


@contextlib.contextmanager
def mock_tfds(num_examples: int):
    """`tfds.testing.mock_data` (random records from a dataset's features) with batched reads fixed."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.testing import mocking

    with (
        mock.patch.object(mocking, "_getitems", _mock_getitems),
        tfds.testing.mock_data(num_examples=num_examples, policy=tfds.testing.MockPolicy.USE_CODE),
    ):
        yield
