"""Prepared datasets as ArrayRecord files of encoded images: written one record at a time, read
one batch at a time, so neither preparing nor training holds a dataset in host memory.

A store is a folder ``<data_dir>/cvs_records/<name>`` (``/`` in a config name becomes ``_``)::

    store.json            format version, class names, image shape, encoding, counts, the source's
                          fingerprint and the builder's metadata; written last (its presence = complete)
    <split>.array_record  one record per image, in the builder's order (record i = row i of the split)
    <split>.labels.npy    int32 labels (read without touching the images)
    <split>.sources.txt   the source of each record (a file path, or ``file#index`` for packed files)
    <split>.sha256.npy    uint8 [N, 32]: digest of each image's source bytes (what ``update`` compares)

A record is a one-line JSON header (``label``, ``source``), a newline, then the encoded image.
Encoding: the source JPEG's bytes when they decode to exactly the stored image (same size, RGB:
Tiny-ImageNet's 64x64 files, photos already at the stored size), else one re-encode in the
builder's ``LocalSource.STORE_ENCODING``: ``png`` (lossless: Fashion-MNIST, and Tiny-ImageNet's
few grey/CMYK files, so its pixels are the source's exactly) or ``jpeg`` (photos resized to the
stored size: quality 95 without chroma subsampling).

A folder is prepared under a temporary name and renamed when complete, so a killed preparation
leaves nothing that could be mistaken for a dataset.  ``FORMAT_VERSION`` is checked on every open.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from cvs_jax.errors import DataError

FORMAT_VERSION = 2
STORE_FILE = "store.json"
JPEG_QUALITY = 95
ENCODINGS = ("png", "jpeg")


class StoreChangedError(DataError):
    """A record file is missing, or differs from what was written when the store was prepared."""


@dataclasses.dataclass(frozen=True)
class Example:
    """One image as a builder yields it: the stored pixels and, when they are exactly the decoded
    source file, the source's bytes (kept as they are)."""

    image: np.ndarray  # uint8 [H, W, C]
    label: int
    source: str
    source_bytes: bytes | None = None  # the file's bytes (digest; kept when ``passthrough``)
    passthrough: bool = False  # True: ``source_bytes`` decode to ``image`` exactly (JPEG, RGB)


def store_dir(data_dir: str, name: str) -> str:
    return os.path.join(os.path.expanduser(data_dir), "cvs_records", name.replace("/", "_"))


def encode(example: Example, encoding: str) -> bytes:
    """The bytes a record stores for ``example`` (see the module docstring)."""
    from PIL import Image  # pylint: disable=g-import-not-at-top

    if example.passthrough and example.source_bytes is not None:
        return example.source_bytes
    image = example.image[..., 0] if example.image.shape[-1] == 1 else example.image
    buf = io.BytesIO()
    if encoding == "png":
        Image.fromarray(image).save(buf, format="PNG", compress_level=1)
    elif encoding == "jpeg":
        Image.fromarray(image).save(buf, format="JPEG", quality=JPEG_QUALITY, subsampling=0)
    else:
        raise ValueError(f"unknown encoding {encoding!r}; one of {ENCODINGS}")
    return buf.getvalue()


def decode(data: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """Encoded image -> uint8 ``shape``; raises ``ValueError`` when the bytes are not that image."""
    from PIL import Image  # pylint: disable=g-import-not-at-top

    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            array = np.asarray(img, np.uint8)
    except Exception as e:  # PIL raises OSError, SyntaxError, DecompressionBombError, ...
        raise ValueError(f"{type(e).__name__}: {e}") from e
    if array.ndim == 2:
        array = array[..., None]
    if array.shape != tuple(shape):
        raise ValueError(f"decoded shape {array.shape}, stored images are {tuple(shape)}")
    return array


def _record(label: int, source: str, data: bytes) -> bytes:
    return json.dumps({"label": int(label), "source": source}).encode() + b"\n" + data


def _parse(record: bytes) -> tuple[dict, bytes]:
    head, _, data = record.partition(b"\n")
    return json.loads(head), data


def write(
    directory: str,
    splits: Mapping[str, Iterable[Example]],
    *,
    encoding: str,
    info: Callable[[], dict[str, Any]],
    log=print,
) -> None:
    """Writes a complete store at ``directory`` from each split's examples (a generator: one record
    in memory at a time).  ``info()`` (class names, fingerprint, metadata) goes into ``store.json``;
    it is called after the examples, since builders fill parts of it while they yield."""
    from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top

    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    tmp = f"{directory}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    counts, files, shape = {}, {}, None
    try:
        for split, examples in splits.items():
            path = os.path.join(tmp, f"{split}.array_record")
            writer = ArrayRecordWriter(path, "group_size:1")
            labels, digests = [], []
            t0 = time.time()
            with open(os.path.join(tmp, f"{split}.sources.txt"), "w", encoding="utf-8") as sources:
                for ex in examples:
                    if shape is None:
                        shape = tuple(int(d) for d in ex.image.shape)
                    elif tuple(ex.image.shape) != shape:
                        raise DataError(f"{ex.source}: image of shape {ex.image.shape}, the others are {shape}.")
                    data = encode(ex, encoding)
                    writer.write(_record(ex.label, ex.source, data))
                    sources.write(ex.source.replace("\n", " ") + "\n")
                    labels.append(ex.label)
                    digests.append(np.frombuffer(hashlib.sha256(ex.source_bytes or data).digest(), np.uint8))
                    if len(labels) % 5000 == 0:
                        log(f"  {split}: {len(labels)} images written ({len(labels) / (time.time() - t0):.0f}/s)")
            writer.close()
            np.save(os.path.join(tmp, f"{split}.labels.npy"), np.asarray(labels, np.int32))
            np.save(os.path.join(tmp, f"{split}.sha256.npy"), np.asarray(digests, np.uint8).reshape(-1, 32))
            counts[split] = len(labels)
            files[split] = os.path.getsize(path)
        if shape is None:
            raise DataError(f"{directory}: the source gave no images at all.")
        meta = {
            "format_version": FORMAT_VERSION,
            "encoding": encoding,
            "image_shape": list(shape),
            "counts": counts,
            "file_bytes": files,
            **info(),
        }
        with open(os.path.join(tmp, STORE_FILE), "w") as f:
            json.dump(meta, f, indent=1)
        if os.path.exists(directory):  # prepared meanwhile by another process: keep that one
            shutil.rmtree(tmp)
            return
        os.rename(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_info(directory: str) -> dict | None:
    """``store.json`` of a complete store, or None when there is none."""
    path = os.path.join(directory, STORE_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


class StoreSplit:
    """A split read from its records on demand: host memory holds the labels, never the images;
    ``read`` decodes only the rows asked for.  Picklable (worker processes reopen the file)."""

    def __init__(self, directory: str, split: str, info: dict):
        self.directory, self.split = directory, split
        self.path = os.path.join(directory, f"{split}.array_record")
        self._shape = tuple(int(d) for d in info["image_shape"])
        self._bytes = int(info["file_bytes"][split])
        self.labels = np.load(os.path.join(directory, f"{split}.labels.npy"))
        self._source = None
        self.check_file()

    def check_file(self) -> None:
        """Refuses a record file that is missing or not the size it was written with."""
        size = os.path.getsize(self.path) if os.path.exists(self.path) else None
        if size != self._bytes:
            what = "is missing" if size is None else f"has {size} bytes, {self._bytes} were written"
            raise StoreChangedError(
                f"{self.path} {what}: the prepared dataset changed on disk. Delete {self.directory} "
                f"and rerun to prepare it again (checkpoints are not touched)."
            )

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_source"} | {"_source": None}

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def image_shape(self) -> tuple[int, ...]:
        return self._shape

    def _records(self, idx: list[int]) -> Sequence[bytes]:
        if self._source is None:
            from array_record.python.array_record_data_source import (  # pylint: disable=g-import-not-at-top
                ArrayRecordDataSource,
            )

            self.check_file()
            self._source = ArrayRecordDataSource([self.path])
        try:
            return self._source.__getitems__(idx)
        except Exception as e:  # the reader's own errors for a truncated or rewritten file
            raise StoreChangedError(
                f"{self.path}: records {idx[:3]}... cannot be read ({e}); delete {self.directory} and rerun "
                f"to prepare the dataset again."
            ) from e

    def read(self, idx: np.ndarray) -> np.ndarray:
        ids: list[int] = np.asarray(idx, np.int64).tolist()
        out = np.empty((len(ids), *self._shape), np.uint8)
        for j, (i, record) in enumerate(zip(ids, self._records(ids))):
            head, data = _parse(record)
            try:
                out[j] = decode(data, self._shape)
            except ValueError as e:
                raise StoreChangedError(
                    f"{self.path}: record {i} ({head.get('source')}) does not decode ({e}); the file changed "
                    f"since it was prepared. Delete {self.directory} and rerun to prepare it again."
                ) from e
        return out

    def sources(self) -> list[str]:
        with open(os.path.join(self.directory, f"{self.split}.sources.txt"), encoding="utf-8") as f:
            return f.read().splitlines()

    def digests(self) -> np.ndarray:
        return np.load(os.path.join(self.directory, f"{self.split}.sha256.npy"))

    def iter_decoded(self, chunk: int = 1024) -> Iterator[np.ndarray]:
        for start in range(0, len(self), chunk):
            yield self.read(np.arange(start, min(len(self), start + chunk)))


def read_source_names(store: str, split: str = "train") -> list[str] | None:
    """The sources of a store's split, read from its ``<split>.sources.txt`` (no images touched)."""
    path = os.path.join(store, f"{split}.sources.txt")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()
