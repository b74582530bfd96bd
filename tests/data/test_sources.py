"""Tests of cvs_jax.data.sources and the offline TFDS builders (no TensorFlow)."""

from __future__ import annotations

import collections
import gzip
import io
import os
import pathlib
import struct
import tempfile
import time
import zipfile
from unittest import mock

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

from cvs_jax.data import records, sources, stores
from cvs_jax.data.builders import fashion_mnist_local, tfds_builders, tiny_imagenet
from cvs_jax.data.builders.tfds_builders import FashionMnistLocal, TinyImagenetZip
from cvs_jax.errors import DataError

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
DEBIAN_FASHION_DIR = "/usr/share/datasets/fashion-mnist"
MINI_ZIP = REPO_ROOT.parent / "shared" / "data" / "tiny-imagenet-200-mini.zip"


def test_tensorflow_not_needed(tmp_path):
    """The data layer prepares and reads a dataset without TensorFlow: a subprocess in which TensorFlow
    cannot be found (installed or not) prepares Fashion-MNIST from IDX files, reads it, and never
    imported a tensorflow module."""
    import subprocess
    import sys

    script = f"""
import importlib.machinery, importlib.util, sys
find = importlib.machinery.PathFinder.find_spec  # TensorFlow made invisible, as if not installed
hidden = lambda cls, n, path=None, target=None: None if n.split(".")[0] == "tensorflow" else find(n, path, target)
importlib.machinery.PathFinder.find_spec = classmethod(hidden)
assert importlib.util.find_spec("tensorflow") is None
from cvs_jax.data import sources
from cvs_jax.testing.tiny_data import write_fashion_idx
manual = write_fashion_idx({str(tmp_path / "idx")!r}, train_per_class=3, test_per_class=1)
ds = sources.load_dataset("fashion_mnist_local", data_dir={str(tmp_path / "tfds")!r}, manual_dir=manual)
assert len(ds.train) == 30 and len(ds.test) == 10, (len(ds.train), len(ds.test))
assert not [m for m in sys.modules if m.split(".")[0] == "tensorflow"]
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


# --------------------------------------------------------------------------
# Fashion-MNIST from IDX files.


def _write_idx(path: str, array: np.ndarray, compress: bool = True) -> None:
    array = np.asarray(array, np.uint8)
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
    opener = gzip.open if compress else open
    with opener(path, "wb") as f:
        f.write(header + array.tobytes())


def _write_fashion(directory, n_train=50, n_test=20, seed=0):
    """Writes real IDX files (train gzipped, test plain); returns the arrays."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    data = {}
    for split, prefix, n, compress in (("train", "train", n_train, True), ("test", "t10k", n_test, False)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=(n,), dtype=np.uint8)
        suffix = ".gz" if compress else ""
        _write_idx(os.path.join(directory, f"{prefix}-images-idx3-ubyte{suffix}"), images, compress)
        _write_idx(os.path.join(directory, f"{prefix}-labels-idx1-ubyte{suffix}"), labels, compress)
        data[split] = (images, labels)
    return data


def test_fashion_mnist_local_round_trip(tmp_path):
    manual = tmp_path / "manual"
    data = _write_fashion(manual)
    data_dir = str(tmp_path / "tfds")

    ds = sources.load_dataset("fashion_mnist_local", data_dir=data_dir, manual_dir=str(manual))
    assert ds.name == "fashion_mnist_local"
    assert ds.class_names == fashion_mnist_local.CLASS_NAMES
    assert ds.num_classes == 10
    assert ds.image_shape == (28, 28, 1)
    for split, (images, labels) in zip((ds.train, ds.test), (data["train"], data["test"])):
        assert split.images.dtype == np.uint8 and split.labels.dtype == np.int32
        np.testing.assert_array_equal(split.images, images[..., None])
        np.testing.assert_array_equal(split.labels, labels)

    # Stored in file order as lossless PNG records, each naming its source.
    store = records.StoreSplit(ds.store, "train", records.read_info(ds.store))
    assert records.read_info(ds.store)["encoding"] == "png"
    np.testing.assert_array_equal(store.read(np.array([49, 7, 0]))[..., 0], data["train"][0][[49, 7, 0]])
    assert store.sources()[7] == "train-images-idx3-ubyte.gz#7"
    assert ds.source_names("test")[0].startswith("t10k-images-idx3-ubyte") and ds.source_names("test")[0].endswith("#0")

    # Second call reuses the prepared copy.
    with mock.patch.object(FashionMnistLocal, "_split_generators", side_effect=AssertionError("rebuilt")):
        again = sources.load_dataset("fashion_mnist_local", data_dir=data_dir, manual_dir=str(manual))
    np.testing.assert_array_equal(again.train.images, ds.train.images)


def test_fashion_mnist_source_mismatch(tmp_path):
    data_dir = str(tmp_path / "tfds")
    _write_fashion(tmp_path / "a", n_train=30, n_test=10)
    _write_fashion(tmp_path / "b", n_train=31, n_test=10)
    sources.load_dataset("fashion_mnist_local", data_dir=data_dir, manual_dir=str(tmp_path / "a"))
    with pytest.raises(sources.SourceMismatchError, match="differs"):
        sources.load_dataset("fashion_mnist_local", data_dir=data_dir, manual_dir=str(tmp_path / "b"))


@pytest.mark.skipif(not os.path.isdir(DEBIAN_FASHION_DIR), reason="apt-get install dataset-fashion-mnist")
def test_real_fashion_mnist_files():
    """The Debian package's four IDX files, found and read by the builder's reader: shapes, labels and pixels (one
    second; the whole 70,000-image store is built by ``test_real_fashion_mnist``, ``slow``, and by the demo)."""
    files = fashion_mnist_local.find_idx_files(DEBIAN_FASHION_DIR)
    train, test = files["train-images-idx3-ubyte"], files["t10k-images-idx3-ubyte"]
    assert fashion_mnist_local.read_idx_shape(train) == (60000, 28, 28)
    assert fashion_mnist_local.read_idx_shape(test) == (10000, 28, 28)
    for name, per_class in (("train-labels-idx1-ubyte", 6000), ("t10k-labels-idx1-ubyte", 1000)):
        np.testing.assert_array_equal(np.bincount(fashion_mnist_local.read_idx(files[name])), [per_class] * 10)
    images = fashion_mnist_local.read_idx(test)
    assert images.dtype == np.uint8 and 0 < images.mean() < 255


@pytest.mark.slow  # 35 s of the default suite on a 2-core host (2026-12-07): the files are read by the test above
@pytest.mark.skipif(not os.path.isdir(DEBIAN_FASHION_DIR), reason="apt-get install dataset-fashion-mnist")
def test_real_fashion_mnist(tmp_path):
    start = time.perf_counter()
    ds = sources.load_dataset("fashion_mnist_local", data_dir=str(tmp_path))
    first = time.perf_counter() - start
    start = time.perf_counter()
    ds = sources.load_dataset("fashion_mnist_local", data_dir=str(tmp_path))
    second = time.perf_counter() - start
    print(f"real Fashion-MNIST: build+load {first:.1f} s, load {second:.1f} s")
    assert ds.train.images.shape == (60000, 28, 28, 1)
    assert ds.test.images.shape == (10000, 28, 28, 1)
    assert ds.num_classes == 10
    np.testing.assert_array_equal(np.bincount(ds.train.labels), [6000] * 10)
    np.testing.assert_array_equal(np.bincount(ds.test.labels), [1000] * 10)
    files = fashion_mnist_local.find_idx_files(DEBIAN_FASHION_DIR)
    np.testing.assert_array_equal(ds.test.images[..., 0], fashion_mnist_local.read_idx(files["t10k-images-idx3-ubyte"]))
    np.testing.assert_array_equal(ds.train.labels, fashion_mnist_local.read_idx(files["train-labels-idx1-ubyte"]))


# --------------------------------------------------------------------------
# Tiny-ImageNet from the official zip layout.

# Listed unsorted on purpose: labels must follow the SORTED order.
_WNIDS = ["n03000003", "n01000001", "n02000002"]
_WORDS = {
    "n01000001": "goldfish, Carassius auratus",
    "n02000002": "bullfrog",
    "n03000003": "tabby, tabby cat",
    "n09999999": "unused extra line",
}
_TRAIN_INDICES = [0, 1, 2, 10]  # 10 must come after 2 (numeric order).
# val file number -> wnid; written in this (shuffled) order.
_VAL = {3: "n01000001", 0: "n02000002", 10: "n03000003", 1: "n03000003", 2: "n01000001", 4: "n02000002"}
_GREY = "val/images/val_1.JPEG"


def _jpeg(rng, grey=False) -> bytes:
    if grey:
        img = Image.fromarray(rng.integers(0, 256, (64, 64), dtype=np.uint8), "L")
    else:
        img = Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    out = io.BytesIO()
    img.save(out, format="JPEG")
    return out.getvalue()


def _tiny_files(seed=0, drop_val=()) -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    files = {
        "wnids.txt": "".join(w + "\n" for w in _WNIDS).encode(),
        "words.txt": "".join(f"{w}\t{n}\n" for w, n in _WORDS.items()).encode(),
    }
    for wnid in _WNIDS:
        files[f"train/{wnid}/{wnid}_boxes.txt"] = b""  # As in the official zip.
        for i in reversed(_TRAIN_INDICES):
            files[f"train/{wnid}/images/{wnid}_{i}.JPEG"] = _jpeg(rng)
    lines = []
    for n, wnid in _VAL.items():
        if n in drop_val:
            continue
        name = f"val/images/val_{n}.JPEG"
        files[name] = _jpeg(rng, grey=(name == _GREY))
        lines.append(f"val_{n}.JPEG\t{wnid}\t0\t0\t63\t63\n")
    files["val/val_annotations.txt"] = "".join(lines).encode()
    return files


def _write_tiny_zip(path, files, top="tiny-imagenet-200/"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(top + name, data)


def _expected_tiny(files):
    def decode(name):
        with Image.open(io.BytesIO(files[name])) as img:
            return np.asarray(img.convert("RGB"))

    wnids = sorted(_WNIDS)
    train = [(f"train/{w}/images/{w}_{i}.JPEG", wnids.index(w)) for w in wnids for i in _TRAIN_INDICES]
    val = [
        (f"val/images/val_{n}.JPEG", wnids.index(_VAL[n])) for n in sorted(_VAL) if f"val/images/val_{n}.JPEG" in files
    ]
    return ([(decode(f), l) for f, l in train], [(decode(f), l) for f, l in val])


def _check_tiny(ds, files):
    train, test = _expected_tiny(files)
    assert ds.class_names == ("goldfish, Carassius auratus", "bullfrog", "tabby, tabby cat")
    assert ds.image_shape == (64, 64, 3)
    np.testing.assert_array_equal(ds.train.labels, [l for _, l in train])
    np.testing.assert_array_equal(ds.train.images, np.stack([i for i, _ in train]))
    np.testing.assert_array_equal(ds.test.labels, [l for _, l in test])
    np.testing.assert_array_equal(ds.test.images, np.stack([i for i, _ in test]))


def test_tiny_imagenet_zip(tmp_path):
    files = _tiny_files()
    _write_tiny_zip(str(tmp_path / "manual" / "tiny-imagenet-200.zip"), files)
    data_dir = str(tmp_path / "tfds")
    ds = sources.load_dataset("tiny_imagenet_zip", data_dir=data_dir, manual_dir=str(tmp_path / "manual"))
    assert ds.name == "tiny_imagenet_zip/custom"
    assert len(ds.train) == 12 and len(ds.test) == 6
    # Sorted-wnid labels, numeric image order: n01 x4, n02 x4, n03 x4.
    np.testing.assert_array_equal(ds.train.labels, np.repeat([0, 1, 2], 4))
    # val_0..val_4, val_10 in numeric order, labels from val_annotations.txt.
    np.testing.assert_array_equal(ds.test.labels, [1, 2, 0, 0, 1, 2])
    _check_tiny(ds, files)
    grey = ds.test.images[1]  # val_1 was a greyscale JPEG.
    assert np.array_equal(grey[..., 0], grey[..., 1])
    assert np.array_equal(grey[..., 0], grey[..., 2])

    assert records.read_info(ds.store)["metadata"]["wnids"] == sorted(_WNIDS)
    # The source JPEGs are stored as they are (RGB ones), so the pixels are the source's exactly.
    assert ds.train.store.sources()[0].endswith(".JPEG")
    raw = ds.train.store._records([0])[0].partition(b"\n")[2]  # pylint: disable=protected-access
    assert raw in files.values()

    # The extracted folder is the same source: reused, not rebuilt.
    extracted = tmp_path / "extracted"
    for name, data in files.items():
        path = extracted / "tiny-imagenet-200" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    with mock.patch.object(TinyImagenetZip, "_split_generators", side_effect=AssertionError("rebuilt")):
        again = sources.load_dataset("tiny_imagenet_zip/custom", data_dir=data_dir, manual_dir=str(extracted))
    _check_tiny(again, files)


def test_tiny_imagenet_extracted_folder_and_mismatch(tmp_path):
    files = _tiny_files(seed=1, drop_val=(4,))
    extracted = tmp_path / "manual" / "tiny-imagenet-200"
    for name, data in files.items():
        path = extracted / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    data_dir = str(tmp_path / "tfds")
    ds = sources.load_dataset("tiny_imagenet_zip", data_dir=data_dir, manual_dir=str(tmp_path / "manual"))
    assert len(ds.test) == 5
    _check_tiny(ds, files)
    # Other files, same config, same data_dir: refused.
    _write_tiny_zip(str(tmp_path / "other" / "x.zip"), _tiny_files(seed=2), top="tiny-imagenet-200-mini/")
    with pytest.raises(sources.SourceMismatchError):
        sources.load_dataset("tiny_imagenet_zip", data_dir=data_dir, manual_dir=str(tmp_path / "other"))
    # No source at all: the single prepared config is reused.
    ds = sources.load_dataset("tiny_imagenet_zip", data_dir=data_dir, manual_dir=str(tmp_path / "empty"))
    assert ds.name == "tiny_imagenet_zip/custom"


def test_tiny_imagenet_config_detection():
    wnids = tuple(f"n{i:08d}" for i in range(200))

    def index(train_per_class, n_val=10_000):
        return tiny_imagenet.TinyIndex(
            wnids=wnids,
            class_names=wnids,
            train=tuple(("x", c) for c in range(200) for _ in range(train_per_class)),
            test=(("y", 0),) * n_val,
        )

    assert index(500).config_name == "full"
    assert index(100).config_name == "mini"
    assert index(99).config_name == "custom"
    assert index(100, n_val=50).config_name == "custom"


SUBSET_LABELS, SUBSET_PER_CLASS = (0, 7, 199), 4  # the real mini zip's classes and train images the subset keeps


def _real_subset_zip(path, labels=SUBSET_LABELS, per_class=SUBSET_PER_CLASS, val_per_class=3) -> dict:
    """A zip of the real mini zip's files for a few of its classes (its own wnids.txt, its words.txt, the first
    train images and the val images of those classes with their annotation lines), laid out as the real one:
    what the reader meets in the real files, at a thousandth of the decoding. Returns {val_<n>: label}."""
    top = "tiny-imagenet-200-mini/"
    with zipfile.ZipFile(MINI_ZIP) as real, zipfile.ZipFile(path, "w") as out:
        wnids = sorted(real.read(top + "wnids.txt").decode().split())
        kept = [wnids[label] for label in labels]
        out.writestr(top + "wnids.txt", "\n".join(kept) + "\n")
        out.writestr(top + "words.txt", real.read(top + "words.txt"))
        for wnid in kept:
            for i in range(per_class):
                name = f"train/{wnid}/images/{wnid}_{i}.JPEG"
                out.writestr(top + name, real.read(top + name))
        lines, val, taken = [], {}, collections.Counter()
        for line in real.read(top + "val/val_annotations.txt").decode().splitlines():
            image, wnid = line.split("\t")[:2]
            if wnid in kept and taken[wnid] < val_per_class:
                taken[wnid] += 1
                lines.append(line)
                val[image] = sorted(kept).index(wnid)
                out.writestr(f"{top}val/images/{image}", real.read(f"{top}val/images/{image}"))
        out.writestr(top + "val/val_annotations.txt", "\n".join(lines) + "\n")
    return val


@pytest.mark.skipif(not MINI_ZIP.exists(), reason=f"{MINI_ZIP} not present")
def test_real_tiny_imagenet_files(tmp_path):
    """The real mini zip's own files (names, words, annotations, JPEGs) for three of its classes: labels,
    names and pixels as the zip holds them, and a second load reads the prepared store. The whole zip
    (30,000 JPEGs decoded, ~25-35 s) is the slow test below."""
    manual = tmp_path / "manual"
    manual.mkdir()
    val = _real_subset_zip(manual / "tiny-imagenet-200-mini.zip")
    ds = sources.load_dataset("tiny_imagenet_zip", data_dir=str(tmp_path / "tfds"), manual_dir=str(manual))
    assert ds.name == "tiny_imagenet_zip/custom" and ds.num_classes == len(SUBSET_LABELS)
    assert ds.class_names[0] == "goldfish, Carassius auratus"  # n01443537, label 0 of the 200
    top = "tiny-imagenet-200-mini/"
    with zipfile.ZipFile(MINI_ZIP) as zf:
        wnids = sorted(zf.read(top + "wnids.txt").decode().split())
        train = [(wnids[label], i) for label in SUBSET_LABELS for i in range(SUBSET_PER_CLASS)]
        for row, (wnid, i) in enumerate(train):
            with Image.open(io.BytesIO(zf.read(f"{top}train/{wnid}/images/{wnid}_{i}.JPEG"))) as img:
                np.testing.assert_array_equal(ds.train.images[row], np.asarray(img.convert("RGB")))
        np.testing.assert_array_equal(ds.train.labels, np.repeat(np.arange(len(SUBSET_LABELS)), SUBSET_PER_CLASS))
        order = sorted(val, key=lambda name: int(name[len("val_") : -len(".JPEG")]))  # numeric val_<n> order
        np.testing.assert_array_equal(ds.test.labels, [val[name] for name in order])
        for row, name in enumerate(order):
            with Image.open(io.BytesIO(zf.read(f"{top}val/images/{name}"))) as img:
                np.testing.assert_array_equal(ds.test.images[row], np.asarray(img.convert("RGB")))
    again = sources.load_dataset("tiny_imagenet_zip/custom", data_dir=str(tmp_path / "tfds"), manual_dir=str(manual))
    np.testing.assert_array_equal(again.train.images, ds.train.images)


@pytest.mark.slow  # 25-37 s of the default suite on a 2-core host (2026-12-07): the files are read by the test above
@pytest.mark.skipif(not MINI_ZIP.exists(), reason=f"{MINI_ZIP} not present")
def test_real_tiny_imagenet_mini_zip(tmp_path):
    start = time.perf_counter()
    ds = sources.load_dataset("tiny_imagenet_zip", data_dir=str(tmp_path), manual_dir=str(MINI_ZIP.parent))
    first = time.perf_counter() - start
    start = time.perf_counter()
    ds = sources.load_dataset("tiny_imagenet_zip/mini", data_dir=str(tmp_path), manual_dir=str(MINI_ZIP.parent))
    second = time.perf_counter() - start
    print(f"Tiny-ImageNet mini: build+load {first:.1f} s, load {second:.1f} s")
    assert ds.name == "tiny_imagenet_zip/mini"
    assert ds.train.images.shape == (20000, 64, 64, 3)
    assert ds.test.images.shape == (10000, 64, 64, 3)
    assert ds.num_classes == 200
    np.testing.assert_array_equal(np.bincount(ds.train.labels), [100] * 200)
    np.testing.assert_array_equal(np.bincount(ds.test.labels), [50] * 200)
    assert ds.class_names[0] == "goldfish, Carassius auratus"  # n01443537.
    # Spot-check pixels and labels against the zip.
    with zipfile.ZipFile(MINI_ZIP) as zf:
        top = "tiny-imagenet-200-mini/"
        wnids = sorted(zf.read(top + "wnids.txt").decode().split())
        ann = dict(line.split("\t")[:2] for line in zf.read(top + "val/val_annotations.txt").decode().splitlines())
        for label, i in ((0, 0), (7, 42), (199, 99)):
            wnid = wnids[label]
            with Image.open(io.BytesIO(zf.read(f"{top}train/{wnid}/images/{wnid}_{i}.JPEG"))) as img:
                np.testing.assert_array_equal(ds.train.images[label * 100 + i], np.asarray(img.convert("RGB")))
        for n in (0, 1234, 9999):
            assert ds.test.labels[n] == wnids.index(ann[f"val_{n}.JPEG"])
            with Image.open(io.BytesIO(zf.read(f"{top}val/images/val_{n}.JPEG"))) as img:
                np.testing.assert_array_equal(ds.test.images[n], np.asarray(img.convert("RGB")))


# --------------------------------------------------------------------------
# Missing data.


def test_missing_fashion_files_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(sources.DatasetNotFoundError) as info:
        sources.load_dataset("fashion_mnist_local", data_dir=str(tmp_path / "d"), manual_dir=str(empty))
    message = str(info.value)
    assert isinstance(info.value, DataError)  # a UserError: one line from the entry points
    assert "fashion_mnist_local" in message
    assert str(empty) in message
    assert "apt-get install dataset-fashion-mnist" in message
    assert "manual_dir" in message
    assert "train-images-idx3-ubyte.gz" in message


def test_missing_tiny_imagenet_error(tmp_path):
    with pytest.raises(sources.DatasetNotFoundError) as info:
        sources.load_dataset("tiny_imagenet_zip", data_dir=str(tmp_path / "d"), manual_dir=str(tmp_path / "nothing"))
    message = str(info.value)
    assert "tiny_imagenet_zip" in message
    assert str(tmp_path / "nothing") in message
    assert "tiny-imagenet-200.zip" in message


def test_missing_standard_dataset_error(tmp_path):
    with pytest.raises(sources.DatasetNotFoundError) as info:
        sources.load_dataset("mnist", data_dir=str(tmp_path))
    message = str(info.value)
    assert "mnist" in message and str(tmp_path) in message
    assert "array_record" in message
    with pytest.raises(sources.DatasetNotFoundError, match="no_such_dataset"):
        sources.load_dataset("no_such_dataset", data_dir=str(tmp_path))


# --------------------------------------------------------------------------
# Standard TFDS datasets.


def test_standard_tfds_dataset_through_mock_data():
    from cvs_jax.testing.tiny_data import mock_tfds  # pylint: disable=g-import-not-at-top

    with mock_tfds(num_examples=9):
        ds = sources.load_dataset("fashion_mnist", data_dir="/nonexistent")
    assert ds.name == "fashion_mnist"
    assert ds.train.images.shape == (9, 28, 28, 1)
    assert ds.test.images.shape == (9, 28, 28, 1)
    assert ds.train.images.dtype == np.uint8
    assert ds.class_names[0] == "T-shirt/top" and ds.num_classes == 10
    assert ds.train.labels.dtype == np.int32
    assert ds.train.labels.min() >= 0 and ds.train.labels.max() < 10


class CvsTestPngDataset(tfds.core.GeneratorBasedBuilder):
    """Like a standard TFDS image dataset: `tfds.features.Image` (PNG) + label."""

    VERSION = tfds.core.Version("1.0.0")
    IMAGES = np.random.default_rng(0).integers(0, 256, (12, 8, 8, 3), np.uint8)

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=(8, 8, 3)),
                    "label": tfds.features.ClassLabel(names=["a", "b", "c"]),
                }
            ),
        )

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(0, 8), "test": self._generate_examples(8, 12)}

    def _generate_examples(self, start, stop):
        for i in range(start, stop):
            png = io.BytesIO()
            Image.fromarray(self.IMAGES[i]).save(png, format="PNG")  # No TF needed.
            yield i, {"image": png.getvalue(), "label": i % 3}


def test_standard_image_feature_dataset_decodes_without_tf(tmp_path):
    """A prepared array_record copy with Image features reads via PIL."""
    CvsTestPngDataset(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
    ds = sources.load_dataset("cvs_test_png_dataset", data_dir=str(tmp_path))
    assert ds.class_names == ("a", "b", "c")
    assert ds.train.images.shape == (8, 8, 8, 3)
    # TFDS shuffles standard datasets on write: compare as sets of pairs.
    images = CvsTestPngDataset.IMAGES
    expected = sorted((images[i].tobytes(), i % 3) for i in range(8))
    got = sorted((im.tobytes(), int(l)) for im, l in zip(ds.train.images, ds.train.labels))
    assert got == expected


def test_tiny_imagenet_corrupt_images_refused_or_skipped(tmp_path):
    files = _tiny_files(seed=3)
    wnid = sorted(_WNIDS)[0]
    broken = f"train/{wnid}/images/{wnid}_{_TRAIN_INDICES[0]}.JPEG"
    files[broken] = b"\xff\xd8 not really a jpeg"
    _write_tiny_zip(str(tmp_path / "manual" / "tiny.zip"), files)
    kwargs = dict(data_dir=str(tmp_path / "data"), manual_dir=str(tmp_path / "manual"))
    with pytest.raises(sources.CorruptImagesError, match=r"1 source image\(s\) could not be decoded.*on_corrupt=skip"):
        sources.load_dataset("tiny_imagenet_zip", **kwargs)
    ds = sources.load_dataset("tiny_imagenet_zip", on_corrupt="skip", **kwargs)
    assert len(ds.train) == len(_WNIDS) * len(_TRAIN_INDICES) - 1  # the broken one is left out, counted
    assert np.bincount(ds.train.labels)[0] == len(_TRAIN_INDICES) - 1


def test_each_builder_is_its_datasets_file_half_plus_tfds():
    """The TFDS half of each dataset (``tfds_builders.BUILDERS``, which prepares its store) subclasses its file
    half (``stores.SOURCES``, which finds the store without TFDS), by the same name and configs."""
    assert tfds_builders.BUILDERS.keys() == stores.SOURCES.keys()
    for name, builder in tfds_builders.BUILDERS.items():
        assert issubclass(builder, stores.SOURCES[name]) and builder.name == name
        assert tuple(c.name for c in builder.BUILDER_CONFIGS) == builder.CONFIG_NAMES
    with_options = tfds_builders.builder("image_folder", {"stored_size": 48, "test_fraction": 0.5, "test_seed": 3})
    assert issubclass(with_options, tfds_builders.ImageFolder) and with_options.name == "image_folder"
    assert (with_options.STORED_SIZE, with_options.TEST_FRACTION, with_options.SEED) == (48, 0.5, 3)


def test_making_a_builder_leaves_no_temporary_folder(tmp_path, monkeypatch):
    """``_prepare`` makes each builder on an empty folder, where TFDS's DatasetInfo looked for precomputed info
    on GCS through a temporary directory it never removed: one empty ``tmp*tfds`` in /tmp per prepared store
    (``tfds_builders.LocalInfo`` skips the look)."""
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    for name, builder in tfds_builders.BUILDERS.items():
        configs = builder.CONFIG_NAMES or (None,)
        for config in configs:
            kwargs = {"config": config} if config else {}
            made = builder(data_dir=str(tmp_path / "data" / name / str(config)), **kwargs)
            assert made.info.full_name.startswith(name)
    assert sorted(os.listdir(temp)) == []
