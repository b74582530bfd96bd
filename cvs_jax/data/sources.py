"""Image datasets for a run: decoded in host memory when small, else streamed from their records.

`load_dataset(name, data_dir=..., manual_dir=...)` returns an `ImageDataset` (train + test splits
whose ``read(idx)`` gives uint8 images, int32 labels, class names).

* Our offline builders (`stores.SOURCES`: `fashion_mnist_local`, `tiny_imagenet_zip` with configs `full`
  / `mini` / `custom`, `stanford_dogs_256`, `inat_m`, `product_m`) are prepared once from the files
  in `manual_dir` into a record store in `data_dir` (`records.py`: ArrayRecord files of encoded
  images, written one image at a time).  A split whose decoded images fit `data.in_memory_limit_mb`
  is decoded into RAM once (`Split`); a larger one is read batch by batch (`records.StoreSplit`).
  Both give the same pixels, so a run gives the same results either way.
* Any other name is a standard TFDS dataset (e.g. `fashion_mnist`, `cifar100`), read into RAM with
  `tfds.data_source(name, download=False)`. It must be prepared in `data_dir` in the array_record
  format (random access; the tfrecord format needs TensorFlow to read). Image features decode with
  PIL, no TensorFlow needed. Preparing standard datasets needs TensorFlow and internet, so it is
  not done here: prepare them elsewhere with
  `tfds build NAME --data_dir=DIR --file_format=array_record`.

Finding a run's stores is ``stores.py``'s (no TFDS); tensorflow_datasets is imported here only to prepare
a store (``_prepare``, the builders' TFDS half) or to read a standard TFDS dataset (``_load_tfds``), so
reading a run whose stores are prepared (thumbnails of ``search``, the report) never loads it.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import tempfile
import time
import types
from typing import Any

import ml_collections
import numpy as np

from cvs_jax.data import parts, records, stores
from cvs_jax.data.builders import image_folder
from cvs_jax.data.dataset import ImageDataset, Rows, Split
from cvs_jax.errors import ConfigError, DataError, DatasetNotFoundError, SourceMismatchError

__all__ = [
    "DatasetNotFoundError",
    "ImageDataset",
    "Rows",
    "SourceMismatchError",
    "Split",
    "load_dataset",
    "load_run_dataset",
]

_CHUNK = 8192  # Records per `__getitems__` call.
_WARNED: set = set()  # stores whose warnings were printed by this process

_log = logging.getLogger(__name__)  # the package's one logging path (cli.quiet_logging sets its level)


class CorruptImagesError(DataError):
    """The source had undecodable images and the config says to refuse them."""


def load_dataset(
    name: str,
    *,
    data_dir: str,
    manual_dir: str | None = None,
    on_corrupt: str = "refuse",
    memory_limit_mb: float | None = None,
    options: dict | None = None,
) -> ImageDataset:
    """Loads a dataset's train and test splits: into memory, or, for our builders when the decoded
    images would take more than ``memory_limit_mb``, as ``records.StoreSplit``s read on demand.

    Args:
      name: a key of `stores.SOURCES` (optionally `name/config`), or a standard TFDS
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
    start = time.perf_counter()
    if stores.is_ours(name):
        dataset = _load_local(
            name,
            data_dir=data_dir,
            manual_dir=manual_dir,
            on_corrupt=on_corrupt,
            memory_limit_mb=memory_limit_mb,
            options=options,
        )
    else:
        dataset = _load_tfds(name, data_dir=data_dir)
    _log.info(
        "Loaded %s: %d train + %d test images of shape %s, %d classes, in %.2f s.",
        dataset.name,
        len(dataset.train),
        len(dataset.test),
        dataset.image_shape,
        dataset.num_classes,
        time.perf_counter() - start,
    )
    return dataset


def streamed(config):
    """A copy of the run ``config`` that reads its images from the record stores on demand (the same pixels,
    nothing decoded ahead): for what needs labels only, or only some images."""
    c = ml_collections.ConfigDict(config.to_dict())
    c.data.in_memory_limit_mb = 0.0
    return c


def load_run_dataset(data_config) -> ImageDataset:
    """``config.data``'s dataset, with the folders of ``data.updates`` appended when there are any."""
    d = data_config
    kwargs: dict[str, Any] = dict(
        data_dir=d.data_dir,
        on_corrupt=d.on_corrupt,
        memory_limit_mb=d.in_memory_limit_mb,
        options=stores.builder_options(d),
    )
    first = load_dataset(d.name, manual_dir=d.manual_dir, **kwargs)
    if not d.updates:
        return first
    return parts.concat([first] + [load_dataset("image_folder", manual_dir=u, **kwargs) for u in d.updates])


# --------------------------------------------------------------------------
# Our offline builders.


def _load_local(
    name: str,
    *,
    data_dir: str,
    manual_dir: str | None,
    on_corrupt: str,
    memory_limit_mb: float | None = None,
    options: dict | None = None,
) -> ImageDataset:
    local = stores.resolve(name, data_dir, manual_dir, options or {})
    full_name, directory, source = local.full_name, local.directory, local.source
    info = records.read_info(directory)
    if info is not None and info.get("format_version") != records.FORMAT_VERSION:
        print(
            f"{full_name}: {directory} holds format {info.get('format_version')}, this version reads format "
            f"{records.FORMAT_VERSION}: preparing it again."
        )
        shutil.rmtree(directory)
        info = None
    if info is not None:
        stored = info.get("source_fingerprint")
        if source is not None and stored is not None and stored != source.normalized_fingerprint():
            raise SourceMismatchError(
                f"{full_name}: {directory} was prepared from {info.get('source_description')}, which differs"
                f" from {source.description} ({stored} vs {source.fingerprint})."
                " Use another --config.data.data_dir or delete that folder."
            )
    else:
        if source is None:
            assert local.missing is not None  # _resolve_local keeps why the source is absent
            raise local.missing
        _prepare(local, data_dir)
        info = records.read_info(directory)
        assert info is not None  # _prepare wrote the store

    skipped = [f for split in ("train", "test") for f in info.get(f"skipped_{split}", [])]
    if skipped:
        if on_corrupt == "refuse":
            raise CorruptImagesError(
                f"{full_name}: {len(skipped)} source image(s) could not be decoded"
                f" (e.g. {skipped[0]}); replace the files, or set"
                " --config.data.on_corrupt=skip to train without them."
            )
        if directory not in _WARNED:  # once per store and process (printed, not also logged: one line)
            _WARNED.add(directory)
            print(f"{full_name}: skipped {len(skipped)} undecodable image(s), e.g. {skipped[0]}")
    _warn_degenerate(full_name, directory, info)

    t0 = time.perf_counter()
    streamed = [records.StoreSplit(directory, split, info) for split in ("train", "test")]
    shape = tuple(info["image_shape"])
    decoded_mb = sum(len(s) for s in streamed) * int(np.prod(shape)) / 2**20
    names = tuple(info["class_names"])
    if memory_limit_mb is not None and decoded_mb > memory_limit_mb:
        _log.info("Streaming %s (%.0f MB decoded > data.in_memory_limit_mb).", full_name, decoded_mb)
        splits = streamed
    else:
        splits = [Split(images=_decode_all(s), labels=s.labels, store=s) for s in streamed]
        _log.info("Decoded %s from %s in %.2f s.", full_name, directory, time.perf_counter() - t0)
    sessions = [info.get("metadata", {}).get(f"{split}_sessions") for split in ("train", "test")]
    sessions = [None if s is None else np.asarray(s, np.int64) for s in sessions]
    return ImageDataset(full_name, splits[0], splits[1], names, (directory,), *sessions)


def _in_memory(split) -> bool:
    parts = getattr(split, "parts", None)  # several image folders (data.updates): each part decides
    return all(_in_memory(p) for p in parts) if parts is not None else isinstance(split, Split)


def data_mode(dataset: ImageDataset, limit_mb: float | None) -> str:
    """Where a run reads its images from and why, for its ``data:`` line: decoded in memory or streamed
    from the record store, against ``data.in_memory_limit_mb``."""
    mb = (len(dataset.train) + len(dataset.test)) * int(np.prod(dataset.image_shape)) / 2**20
    limit = "no limit" if limit_mb is None else f"data.in_memory_limit_mb={limit_mb:g}"
    if _in_memory(dataset.train) and _in_memory(dataset.test):
        why = f"{mb:,.0f} MB decoded <= {limit}" if dataset.stores else "a standard TFDS dataset is decoded whole"
        return f"in memory ({why})"
    return f"streamed from its records ({mb:,.0f} MB decoded > {limit}; lower it to stream, raise it to decode)"


def _warn_degenerate(full_name: str, directory: str, info: dict) -> None:
    """A warning (once per store and process) naming the images of a user's folder that are kept but
    probably mistakes: smaller than a few pixels, or the same bytes filed under two classes."""
    if not full_name.startswith("image_folder") or ("degenerate", directory) in _WARNED:
        return
    _WARNED.add(("degenerate", directory))
    tiny = info.get("metadata", {}).get("tiny") or []
    if tiny:
        shown = ", ".join(tiny[:3]) + (", ..." if len(tiny) > 3 else "")
        print(
            f"warning: {len(tiny)} image(s) of {full_name} are smaller than {image_folder.MIN_SIDE} pixels on a side "
            f"(kept, upscaled to the stored size): {shown}"
        )
    by_digest: dict[bytes, tuple[int, str]] = {}
    clashes = []
    for split in ("train", "test"):
        try:
            rows = records.StoreSplit(directory, split, info)
            pairs = zip(rows.digests(), rows.labels, rows.sources())
        except (OSError, ValueError, records.StoreChangedError):
            return
        for digest, label, name in pairs:
            seen = by_digest.setdefault(digest.tobytes(), (int(label), name))
            if seen[0] != int(label):
                clashes.append((seen[1], name))
    if clashes:
        names = info.get("class_names", [])
        shown = "; ".join(f"{a} = {b}" for a, b in clashes[:3]) + ("; ..." if len(clashes) > 3 else "")
        print(
            f"warning: {len(clashes)} image(s) of {full_name} have the same bytes under two classes "
            f"(of {len(names)}): {shown}; remove the wrong copy, or the class of each is ambiguous."
        )


def _decode_all(split: records.StoreSplit) -> np.ndarray:
    images = np.empty((len(split), *split.image_shape), np.uint8)
    start = 0
    for chunk in split.iter_decoded():
        images[start : start + len(chunk)] = chunk
        start += len(chunk)
    return images


def _prepare(local: stores.Local, data_dir: str) -> None:
    """Runs the builder's generators into a record store: one image in memory at a time (the builders'
    TFDS half, imported here: only preparing a store needs tensorflow_datasets)."""
    from cvs_jax.data.builders import tfds_builders  # pylint: disable=g-import-not-at-top

    cls, config, full_name, source, directory = local.cls, local.config, local.full_name, local.source, local.directory
    assert source is not None  # load_dataset prepares only from a source it found
    old = os.path.join(data_dir, *full_name.split("/"))
    if glob.glob(os.path.join(old, "*", "dataset_info.json")):
        print(
            f"{full_name}: {old} holds a copy in the earlier raw-pixel TFDS format, which this version no "
            f"longer reads; preparing format {records.FORMAT_VERSION} in {directory} (the old folder can be "
            f"deleted)."
        )
    print(f"Preparing {full_name} from {source.description} into {directory} ...")
    t0 = time.perf_counter()
    kwargs = {"config": config} if config else {}
    # the builder object only runs its generators: its own TFDS folder stays empty, so keep it apart
    scratch = tempfile.TemporaryDirectory(prefix="cvs-builder-")
    builder = tfds_builders.builder(cls.name, local.options)(data_dir=scratch.name, **kwargs)
    if cls.SOURCE_IN_DATA_DIR:
        builder.source_dir = data_dir  # type: ignore[attr-defined]  # where the TFDS source dataset is
    generators = builder._split_generators(types.SimpleNamespace(manual_dir=local.manual_dir))  # pylint: disable=protected-access

    def examples(split, generator):
        for i, (_, ex) in enumerate(generator):
            if int(ex["id"]) != i:
                raise AssertionError(f"{full_name}: the builder yields {split} record {ex['id']} at position {i}")
            yield records.Example(
                image=np.asarray(ex["image"], np.uint8),
                label=int(ex["label"]),
                source=str(ex.get("source", f"{split}[{i}]")),
                source_bytes=ex.get("source_bytes"),
                passthrough=bool(ex.get("passthrough", False)),
            )

    def info() -> dict:  # read after the examples: the generators fill the metadata while they run
        metadata = dict(builder.info.metadata or {})
        for key in list(metadata):
            if key.startswith(("source_files_", "source_ids_")):  # the same as <split>.sources.txt
                del metadata[key]
        return {
            "name": full_name,
            "class_names": list(tfds_builders.features_of(builder.info)["label"].names),
            "source_fingerprint": source.normalized_fingerprint(),
            "source_description": source.description,
            **{f"skipped_{split}": metadata.pop(f"skipped_{split}", []) for split in generators},
            "metadata": metadata,
        }

    split_examples = {split: examples(split, gen) for split, gen in generators.items()}
    with scratch:
        records.write(directory, split_examples, encoding=cls.STORE_ENCODING, info=info, log=print)
    print(f"Prepared {full_name} in {time.perf_counter() - t0:.1f} s.")


# --------------------------------------------------------------------------
# Standard TFDS datasets.


def _load_tfds(name: str, *, data_dir: str) -> ImageDataset:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top  # a standard TFDS dataset
    from tensorflow_datasets.core import registered as tfds_registered  # pylint: disable=g-import-not-at-top

    from cvs_jax.data.builders.tfds_builders import features_of  # pylint: disable=g-import-not-at-top
    from cvs_jax.data.builders.tfds_tempdirs import tfds_builder  # pylint: disable=g-import-not-at-top

    try:
        builder = tfds_builder(name, data_dir)
    except tfds_registered.DatasetNotFoundError as e:
        raise DatasetNotFoundError(
            f"{name}: not one of our offline datasets ({', '.join(stores.SOURCES)}) nor a known TFDS dataset."
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
                f" ({', '.join(stores.SOURCES)})."
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
    _log.info("Read %s from %s in %.2f s.", name, builder.data_dir, time.perf_counter() - t0)
    return ImageDataset(
        name=name,
        train=train,
        test=test,
        class_names=tuple(features_of(builder.info)["label"].names),
    )


def _read_generic_split(source: Any) -> Split:  # a TFDS data source: len() and __getitems__
    """Reads all records of a TFDS data source with `image` and `label`.

    TFDS shuffles records when it prepares a dataset; when records carry an `id`
    like `train_01234` (e.g. `cifar100`), the split is put back in the original
    release order, which index-based session splits (and the official CVS split
    files) refer to.
    """
    n = len(source)
    images: np.ndarray | None = None
    labels = np.empty((n,), np.int32)
    ids = []
    for start in range(0, n, _CHUNK):
        stop = min(n, start + _CHUNK)
        records = source.__getitems__(list(range(start, stop)))
        if images is None:
            first = np.asarray(records[0]["image"])
            if first.dtype != np.uint8:
                raise DataError(f"expected uint8 images, got {first.dtype}; use a dataset of 8-bit images.")
            images = np.empty((n, *first.shape), np.uint8)
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
