"""Image datasets as in-memory numpy arrays, read through TFDS without TensorFlow.

`load_dataset(name, data_dir=..., manual_dir=...)` returns an `ImageDataset`
(uint8 images, int32 labels, train + test splits, class names).

* Our offline builders (`BUILDERS`: `fashion_mnist_local`, `tiny_imagenet_zip`
  with configs `full` / `mini` / `custom`, e.g. `tiny_imagenet_zip/mini`) are
  prepared once into `data_dir` (array_record files) from the files in
  `manual_dir`, then read back with `builder.as_data_source()`; records keep
  the original file order (sorted by their `id` feature).
* Any other name is a standard TFDS dataset (e.g. `fashion_mnist`,
  `cifar100`), read with `tfds.data_source(name, download=False)`. It must be
  prepared in `data_dir` in the array_record format (random access; the
  tfrecord format needs TensorFlow to read). Image features decode with PIL
  (or OpenCV if installed), no TensorFlow needed. Preparing standard datasets
  needs TensorFlow (to encode images) and internet, so it is not done here:
  prepare them elsewhere with
  `tfds build NAME --data_dir=DIR --file_format=array_record`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Sequence

import numpy as np
import tensorflow_datasets as tfds
from absl import logging

from cvs_jax.data.builders import (
    DatasetNotFoundError,
    FashionMnistLocal,
    InatM,
    LocalBuilder,
    ProductM,
    SourceMismatchError,
    StanfordDogs256,
    TinyImagenetZip,
)
from cvs_jax.data.builders._common import allow_large_splits_without_tensorflow
from cvs_jax.errors import ConfigError, DataError

__all__ = [
    "BUILDERS",
    "DatasetNotFoundError",
    "ImageDataset",
    "SourceMismatchError",
    "Split",
    "load_dataset",
]

# The one registry of our offline builders: name -> builder class.
BUILDERS: dict[str, type[LocalBuilder]] = {
    cls.name: cls for cls in (FashionMnistLocal, TinyImagenetZip, StanfordDogs256, InatM, ProductM)
}

_CHUNK = 8192  # Records per `__getitems__` call.


@dataclasses.dataclass(frozen=True)
class Split:
    """A split decoded into host memory."""

    images: np.ndarray  # uint8 [N, H, W, C]
    labels: np.ndarray  # int32 [N], original dataset labels

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def image_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.images.shape[1:])

    def read(self, idx: np.ndarray) -> np.ndarray:
        return self.images[np.asarray(idx, np.int64)]


class RecordSplit:
    """A split read from its ArrayRecord records on demand (our builders' raw uint8 records): host
    memory holds the labels and the record order, never the images; ``read`` copies only the rows
    asked for.  Same pixels as ``Split``, so a run gives the same results either way."""

    def __init__(self, raw_source, order: np.ndarray, labels: np.ndarray, image_shape: tuple[int, ...]):
        self._source = raw_source
        self._order = np.asarray(order, np.int64)  # position j of the split = record order[j]
        self.labels = labels
        self._shape = tuple(int(d) for d in image_shape)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def image_shape(self) -> tuple[int, ...]:
        return self._shape

    def read(self, idx: np.ndarray) -> np.ndarray:
        from tensorflow_datasets.proto import tf_example_pb2  # pylint: disable=g-import-not-at-top

        records = self._source.__getitems__(self._order[np.asarray(idx, np.int64)].tolist())
        out = np.empty((len(records), *self._shape), np.uint8)
        for j, r in enumerate(records):
            data = tf_example_pb2.Example.FromString(r).features.feature["image"].bytes_list.value[0]
            out[j] = np.frombuffer(data, np.uint8).reshape(self._shape)
        return out


@dataclasses.dataclass(frozen=True)
class ImageDataset:
    name: str
    train: Split
    test: Split
    class_names: tuple[str, ...]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return self.train.image_shape  # type: ignore[return-value]


class CorruptImagesError(DataError):
    """The source had undecodable images and the config says to refuse them."""


def load_dataset(
    name: str,
    *,
    data_dir: str,
    manual_dir: str | None = None,
    on_corrupt: str = "refuse",
    memory_limit_mb: float | None = None,
) -> ImageDataset:
    """Loads a dataset's train and test splits: into memory, or, for our builders when the decoded
    images would take more than ``memory_limit_mb``, as ``RecordSplit``s read on demand.

    Args:
      name: a key of `BUILDERS` (optionally `name/config`), or a standard TFDS
        dataset name (optionally `name/config:version`).
      data_dir: TFDS data dir: where our builders are prepared (once) and where
        standard datasets are looked up.
      manual_dir: where our builders find their source files; default: the
        builder's default (`/usr/share/datasets/fashion-mnist` for
        fashion_mnist_local), else `<data_dir>/downloads/manual`. Ignored for
        standard TFDS datasets.

    Raises:
      DatasetNotFoundError: the source files / prepared copy are missing (raised
        before any long work; the message says what to do).
      SourceMismatchError: `data_dir` holds a copy prepared from other files.
      CorruptImagesError: undecodable source images with `on_corrupt='refuse'`
        (with `'skip'` they are left out and counted in the log).
    """
    if on_corrupt not in ("refuse", "skip"):
        raise ConfigError(f"data.on_corrupt={on_corrupt!r}: use 'refuse' or 'skip'.")
    data_dir = os.path.expanduser(data_dir)
    base = name.split("/", 1)[0].split(":", 1)[0]
    start = time.perf_counter()
    if base in BUILDERS:
        dataset = _load_local(
            name, data_dir=data_dir, manual_dir=manual_dir, on_corrupt=on_corrupt, memory_limit_mb=memory_limit_mb
        )
    else:
        dataset = _load_tfds(name, data_dir=data_dir)
    logging.info(
        "Loaded %s: %d train + %d test images of shape %s, %d classes, in %.2f s.",
        dataset.name,
        len(dataset.train),
        len(dataset.test),
        dataset.image_shape,
        dataset.num_classes,
        time.perf_counter() - start,
    )
    return dataset


# --------------------------------------------------------------------------
# Our offline builders.


def _prepared_configs(cls: type[LocalBuilder], data_dir: str) -> list[str]:
    names = [c.name for c in (cls.BUILDER_CONFIGS or [])]
    prepared = []
    for config in names:
        if cls(data_dir=data_dir, config=config).is_prepared():
            prepared.append(config)
    return prepared


def _load_local(
    name: str, *, data_dir: str, manual_dir: str | None, on_corrupt: str, memory_limit_mb: float | None = None
) -> ImageDataset:
    base, _, config = name.partition("/")
    config = config or None
    cls = BUILDERS[base]
    manual_dir = os.path.expanduser(
        manual_dir or cls.DEFAULT_MANUAL_DIR or os.path.join(data_dir, "downloads", "manual")
    )

    # Cheap look at the source files (headers / zip directory only).
    try:
        source = cls.inspect_source(data_dir if cls.SOURCE_IN_DATA_DIR else manual_dir, config)
        missing = None
    except DatasetNotFoundError as e:
        source, missing = None, e

    if cls.BUILDER_CONFIGS and config is None:
        if source is not None:
            config = source.config_name
        else:  # No source: reuse the single prepared config, if any.
            prepared = _prepared_configs(cls, data_dir)
            if len(prepared) != 1:
                raise missing
            config = prepared[0]

    kwargs = {"config": config} if config else {}
    builder = cls(data_dir=data_dir, file_format="array_record", **kwargs)
    full_name = f"{base}/{config}" if config else base
    if builder.is_prepared():
        stored = (builder.info.metadata or {}).get("source_fingerprint")
        if source is not None and stored is not None and (stored != source.normalized_fingerprint()):
            raise SourceMismatchError(
                f"{full_name}: {builder.data_dir} was prepared from"
                f" {builder.info.metadata.get('source_description')}, which differs"
                f" from {source.description} ({stored} vs {source.fingerprint})."
                " Use another --config.data.data_dir or delete that folder."
            )
    else:
        if source is None:
            raise missing
        logging.info("Preparing %s from %s into %s ...", full_name, source.description, data_dir)
        t0 = time.perf_counter()
        allow_large_splits_without_tensorflow()
        builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
        logging.info("Prepared %s in %.1f s.", full_name, time.perf_counter() - t0)
        # Re-open from disk so that everything is read back as stored.
        builder = cls(data_dir=data_dir, file_format="array_record", **kwargs)

    skipped = [f for split in ("train", "test") for f in (builder.info.metadata or {}).get(f"skipped_{split}", [])]
    if skipped:
        if on_corrupt == "refuse":
            raise CorruptImagesError(
                f"{full_name}: {len(skipped)} source image(s) could not be decoded"
                f" (e.g. {skipped[0]}); replace the files, or set"
                " --config.data.on_corrupt=skip to train without them."
            )
        logging.warning("%s: skipped %d undecodable image(s), e.g. %s", full_name, len(skipped), skipped[0])
        print(f"{full_name}: skipped {len(skipped)} undecodable image(s), e.g. {skipped[0]}")

    t0 = time.perf_counter()
    raw = builder.as_data_source(split=["train", "test"], deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES)
    decoded = builder.as_data_source(split=["train", "test"])
    shape = tuple(builder.info.features["image"].shape)
    decoded_mb = sum(len(r) for r in raw) * int(np.prod(shape)) / 2**20
    if memory_limit_mb is not None and decoded_mb > memory_limit_mb:
        splits = [_record_split(r, d, builder.info, full_name, builder.data_dir) for r, d in zip(raw, decoded)]
        logging.info("Streaming %s (%.0f MB decoded > data.in_memory_limit_mb).", full_name, decoded_mb)
        return ImageDataset(full_name, splits[0], splits[1], tuple(builder.info.features["label"].names))
    splits = []
    for raw_source, source_ in zip(raw, decoded):
        images, labels, ids = _read_local_split(raw_source, source_, builder.info)
        order = np.argsort(ids, kind="stable")
        if not np.array_equal(ids[order], np.arange(len(ids))):
            raise DataError(f"{full_name}: ids are not 0..N-1; delete {builder.data_dir} to prepare it again.")
        if not np.array_equal(order, np.arange(len(ids))):
            images, labels = images[order], labels[order]
        splits.append(Split(images=images, labels=labels))
    logging.info("Read %s from %s in %.2f s.", full_name, builder.data_dir, time.perf_counter() - t0)
    return ImageDataset(
        name=full_name,
        train=splits[0],
        test=splits[1],
        class_names=tuple(builder.info.features["label"].names),
    )


def _record_split(raw_source, source, info, full_name: str, data_dir: str) -> RecordSplit:
    """A ``RecordSplit``: labels and ids read in chunks (images parsed and dropped), records ordered
    by id; its first record checked against TFDS's own decoding."""
    from tensorflow_datasets.proto import tf_example_pb2  # pylint: disable=g-import-not-at-top

    n = len(raw_source)
    labels = np.empty((n,), np.int32)
    ids = np.empty((n,), np.int64)
    chunk = 256  # whole records (pixels included) pass through memory: keep the batch of them small
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        for j, r in enumerate(raw_source.__getitems__(list(range(start, stop)))):
            feature = tf_example_pb2.Example.FromString(r).features.feature
            labels[start + j], ids[start + j] = feature["label"].int64_list.value[0], feature["id"].int64_list.value[0]
    order = np.argsort(ids, kind="stable")
    if not np.array_equal(ids[order], np.arange(n)):
        raise DataError(f"{full_name}: ids are not 0..N-1; delete {data_dir} to prepare it again.")
    split = RecordSplit(raw_source, order, labels[order], tuple(info.features["image"].shape))
    if n:
        first = int(order[0])
        if not np.array_equal(np.asarray(source[first]["image"]), split.read(np.array([0]))[0]):
            raise AssertionError("Record decoding disagrees with TFDS.")
    return split


def _read_local_split(raw_source, source, info):
    """Reads a split of one of our builders: (images, int32 labels, ids).

    Fast path: parse the serialized tf.train.Example records directly (our
    features are a BYTES-encoded uint8 image and int64 label/id), about 3x
    faster than the generic TFDS numpy decoding; checked against it on the
    first record.
    """
    from tensorflow_datasets.proto import tf_example_pb2  # pylint: disable=g-import-not-at-top

    image_feature = info.features["image"]
    shape = tuple(image_feature.shape)
    n = len(raw_source)
    images = np.empty((n, *shape), np.uint8)
    labels = np.empty((n,), np.int32)
    ids = np.empty((n,), np.int64)
    parse = tf_example_pb2.Example.FromString
    for start in range(0, n, _CHUNK):
        stop = min(n, start + _CHUNK)
        records = raw_source.__getitems__(list(range(start, stop)))
        feats = [parse(r).features.feature for r in records]
        images[start:stop] = np.frombuffer(b"".join([f["image"].bytes_list.value[0] for f in feats]), np.uint8).reshape(
            (stop - start, *shape)
        )
        labels[start:stop] = [f["label"].int64_list.value[0] for f in feats]
        ids[start:stop] = [f["id"].int64_list.value[0] for f in feats]
    if n:
        reference = source[0]
        if not (
            np.array_equal(reference["image"], images[0])
            and int(reference["label"]) == labels[0]
            and int(reference["id"]) == ids[0]
        ):
            raise AssertionError("Fast record decoding disagrees with TFDS.")
    return images, labels, ids


# --------------------------------------------------------------------------
# Standard TFDS datasets.


def _load_tfds(name: str, *, data_dir: str) -> ImageDataset:
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as e:
        raise DatasetNotFoundError(
            f"{name}: not one of our offline datasets ({', '.join(BUILDERS)}) nor a known TFDS dataset."
        ) from e
    split_names = list(builder.info.splits)
    test_split = "test"
    if split_names and "test" not in split_names:
        test_split = "validation"
    t0 = time.perf_counter()
    try:
        train_source, test_source = tfds.data_source(
            name, split=["train", test_split], data_dir=data_dir, download=False
        )
    except (NotImplementedError, ValueError, KeyError) as e:
        # TFDS answers NotImplementedError ("file format TFRECORD not supported")
        # both for a missing dataset and for one prepared as tfrecord only.
        if not builder.is_prepared():
            raise DatasetNotFoundError(
                f"{name}: no prepared copy in {builder.data_dir} (searched data_dir"
                f" {data_dir!r}); datasets cannot be downloaded here, and preparing"
                " standard TFDS datasets needs TensorFlow. Fix: prepare it elsewhere"
                f" with `tfds build {name} --data_dir=DIR"
                " --file_format=array_record`, copy DIR here and set"
                " --config.data.data_dir=DIR; or use an offline dataset"
                f" ({', '.join(BUILDERS)})."
            ) from e
        if isinstance(e, NotImplementedError):
            raise DatasetNotFoundError(
                f"{name}: the copy in {builder.data_dir} has no array_record files"
                f" ({builder.info.file_format}); random access without TensorFlow"
                f" needs them. Fix: re-prepare with `tfds build {name}"
                " --data_dir=DIR --file_format=array_record`."
            ) from e
        raise
    train = _read_generic_split(train_source)
    test = _read_generic_split(test_source)
    logging.info("Read %s from %s in %.2f s.", name, builder.data_dir, time.perf_counter() - t0)
    return ImageDataset(
        name=name,
        train=train,
        test=test,
        class_names=tuple(builder.info.features["label"].names),
    )


def _read_generic_split(source: Sequence[Any]) -> Split:
    """Reads all records of a TFDS data source with `image` and `label`.

    TFDS shuffles records when it prepares a dataset; when records carry an `id`
    like `train_01234` (e.g. `cifar100`), the split is put back in the original
    release order, which index-based session splits (and the official CVS split
    files) refer to.
    """
    n = len(source)
    images = labels = None
    ids = []
    for start in range(0, n, _CHUNK):
        stop = min(n, start + _CHUNK)
        records = source.__getitems__(list(range(start, stop)))
        if images is None:
            first = np.asarray(records[0]["image"])
            if first.dtype != np.uint8:
                raise DataError(f"expected uint8 images, got {first.dtype}; use a dataset of 8-bit images.")
            images = np.empty((n, *first.shape), np.uint8)
            labels = np.empty((n,), np.int32)
        for j, record in enumerate(records):
            images[start + j] = record["image"]
            labels[start + j] = record["label"]
            if "id" in record:
                ids.append(record["id"])
    if images is None:
        raise DataError("a split of the dataset is empty; check the prepared copy in data.data_dir.")
    if len(ids) == n:
        from cvs_jax.data.official_splits import original_order  # pylint: disable=g-import-not-at-top

        try:
            perm = original_order(ids)
        except ValueError:
            perm = None  # ids without a numeric position: keep the stored order
        if perm is not None:
            images, labels = images[perm], labels[perm]
    return Split(images=images, labels=labels)
