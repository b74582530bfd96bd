"""Fashion-MNIST from local IDX files: the files (this module, no TFDS) and their TFDS builder
(``tfds_builders.FashionMnistLocal``), which needs no TensorFlow.

TFDS's own `fashion_mnist` builder only accepts downloads whose checksums it
knows; the Debian package `dataset-fashion-mnist` recompressed the files, so
this builder reads the IDX contents directly instead.
"""

from __future__ import annotations

import gzip
import os
import struct

import numpy as np

from cvs_jax.data.builders._common import LocalSource, SourceInfo
from cvs_jax.errors import DataError, DatasetNotFoundError

DEFAULT_MANUAL_DIR = "/usr/share/datasets/fashion-mnist"

CLASS_NAMES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

# split -> (images file, labels file), without the optional '.gz'.
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
ALL_IDX_FILES = tuple(f for pair in IDX_FILES.values() for f in pair)

_IDX_DTYPES = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _open(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def find_idx_files(manual_dir: str) -> dict[str, str]:
    """Maps each IDX base name to its path in `manual_dir` ('.gz' or plain).

    Raises:
      DatasetNotFoundError: a file is missing.
    """
    found, missing = {}, []
    for base in ALL_IDX_FILES:
        for candidate in (base + ".gz", base):
            path = os.path.join(manual_dir, candidate)
            if os.path.isfile(path):
                found[base] = path
                break
        else:
            missing.append(base)
    if missing:
        raise DatasetNotFoundError(
            f"fashion_mnist_local: Fashion-MNIST IDX files not found in"
            f" {manual_dir!r} (missing: {', '.join(m + '[.gz]' for m in missing)})."
            " Fix: `apt-get install dataset-fashion-mnist` (installs them in"
            f" {DEFAULT_MANUAL_DIR}), or set --config.data.manual_dir=DIR to a"
            " folder holding train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz,"
            " t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz (gzipped or"
            " not), downloaded from"
            " https://github.com/zalandoresearch/fashion-mnist."
        )
    return found


def _parse_header(f, path: str) -> tuple[np.dtype, tuple[int, ...]]:
    magic = f.read(4)
    if len(magic) != 4 or magic[0] != 0 or magic[1] != 0:
        raise DataError(f"{path}: not an IDX file (magic {magic!r}).")
    type_code, ndim = magic[2], magic[3]
    if type_code not in _IDX_DTYPES:
        raise DataError(f"{path}: unknown IDX type code {type_code:#x}.")
    shape = struct.unpack(f">{ndim}I", f.read(4 * ndim))
    return np.dtype(_IDX_DTYPES[type_code]), tuple(shape)


def read_idx_shape(path: str) -> tuple[int, ...]:
    """Reads only the header of an IDX file (gz or plain)."""
    with _open(path) as f:
        return _parse_header(f, path)[1]


def read_idx(path: str) -> np.ndarray:
    """Reads an IDX file (gzipped or plain) into a numpy array."""
    with _open(path) as f:
        dtype, shape = _parse_header(f, path)
        data = f.read()
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(data) != expected:
        raise DataError(f"{path}: expected {expected} data bytes for shape {shape}, got {len(data)}.")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


class FashionMnistLocalSource(LocalSource):
    """Fashion-MNIST (60k train / 10k test, 28x28 grey) from local IDX files."""

    name = "fashion_mnist_local"
    DEFAULT_MANUAL_DIR = DEFAULT_MANUAL_DIR
    STORE_ENCODING = "png"  # lossless: the 28x28 grey pixels exactly
    MANUAL_FILES_HINT = (
        "train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz"
    )

    @classmethod
    def inspect_source(cls, manual_dir: str, config_name: str | None = None) -> SourceInfo:
        del config_name  # No configs.
        files = find_idx_files(manual_dir)
        counts = {}
        for split, (images_base, labels_base) in IDX_FILES.items():
            image_shape = read_idx_shape(files[images_base])
            label_shape = read_idx_shape(files[labels_base])
            if len(image_shape) != 3 or tuple(image_shape[1:]) != (28, 28):
                raise DataError(f"{files[images_base]}: expected images of shape [N, 28, 28], got {image_shape}.")
            if label_shape != image_shape[:1]:
                raise DataError(
                    f"{files[labels_base]}: {label_shape[0]} labels for"
                    f" {image_shape[0]} images in {files[images_base]}."
                )
            counts[split] = image_shape[0]
        return SourceInfo(
            config_name=None,
            fingerprint={"num_examples": counts},
            description=f"IDX files in {manual_dir}",
        )
