"""Image datasets for a run: decoded in host memory when small, else streamed from their records.

`load_dataset(name, data_dir=..., manual_dir=...)` returns an `ImageDataset` (train + test splits
whose ``read(idx)`` gives uint8 images, int32 labels, class names).

* Our offline builders (`BUILDERS`: `fashion_mnist_local`, `tiny_imagenet_zip` with configs `full`
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
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import types
from typing import Any, Protocol

import numpy as np
import tensorflow_datasets as tfds
from tensorflow_datasets.core import registered as tfds_registered  # tfds.core.registered, which pyright cannot see

from cvs_jax.data import records
from cvs_jax.data.builders import image_folder
from cvs_jax.data.builders._common import LocalBuilder, SourceInfo, features_of
from cvs_jax.data.builders.fashion_mnist_local import FashionMnistLocal
from cvs_jax.data.builders.image_folder import ImageFolder
from cvs_jax.data.builders.inat_m import InatM
from cvs_jax.data.builders.product10k import ProductM
from cvs_jax.data.builders.stanford_dogs import StanfordDogs256
from cvs_jax.data.builders.tiny_imagenet import TinyImagenetZip
from cvs_jax.errors import ConfigError, DataError, DatasetNotFoundError, SourceMismatchError

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
    cls.name: cls for cls in (FashionMnistLocal, TinyImagenetZip, StanfordDogs256, InatM, ProductM, ImageFolder)
}

_CHUNK = 8192  # Records per `__getitems__` call.
_WARNED: set = set()  # stores whose warnings were printed by this process

_log = logging.getLogger(__name__)  # the package's one logging path (cli.quiet_logging sets its level)


@dataclasses.dataclass(frozen=True)
class Split:
    """A split decoded into host memory (``store``: the records it was decoded from, if any)."""

    images: np.ndarray  # uint8 [N, H, W, C]
    labels: np.ndarray  # int32 [N], original dataset labels
    store: records.StoreSplit | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def image_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.images.shape[1:])

    def read(self, idx: np.ndarray) -> np.ndarray:
        return self.images[np.asarray(idx, np.int64)]


class Rows(Protocol):
    """What a dataset's split offers: ``Split`` (in memory), ``records.StoreSplit`` (read on demand), or
    ``parts.ConcatSplit`` (several folders read as one)."""

    @property
    def labels(self) -> np.ndarray: ...

    @property
    def image_shape(self) -> tuple[int, ...]: ...

    def __len__(self) -> int: ...

    def read(self, idx: np.ndarray) -> np.ndarray: ...


@dataclasses.dataclass(frozen=True)
class ImageDataset:
    name: str
    train: Rows
    test: Rows
    class_names: tuple[str, ...]
    stores: tuple[str, ...] = ()  # the record stores' folders, in row order (none for standard TFDS data)
    train_sessions: np.ndarray | None = None  # 0-based session of each train row, when the data gives it
    test_sessions: np.ndarray | None = None  # session from which each test row is a query (-1: from the start)

    @property
    def store(self) -> str | None:
        return self.stores[0] if len(self.stores) == 1 else None

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return self.train.image_shape  # type: ignore[return-value]

    def source_names(self, split: str = "train") -> list[str] | None:
        """Each row's source (a file path, or ``file#index`` for packed files); None when unknown."""
        names = [read_source_names(s, split) for s in self.stores]
        known = [n for n in names if n is not None]
        return None if not names or len(known) < len(names) else [x for n in known for x in n]


def read_source_names(store: str, split: str = "train") -> list[str] | None:
    """The sources of a store's split, read from its ``<split>.sources.txt`` (no images touched)."""
    path = os.path.join(store, f"{split}.sources.txt")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def source_names(data_config, split: str = "train") -> list[str] | None:
    """The sources of a run's dataset rows (``config.data``), without loading the dataset: what
    ``search`` and ``export`` show for gallery rows.  None for standard TFDS datasets."""
    stores = store_dirs(data_config)
    names = [] if stores is None else [read_source_names(s, split) for s in stores]
    known = [n for n in names if n is not None]
    if stores is None or len(known) < len(names):
        return None
    given = [data_config.manual_dir] + list(data_config.updates)
    return [x for store, n, m in zip(stores, known, given) for x in shown_sources(store, n, m)]


def store_dirs(data_config) -> list[str] | None:
    """The record stores of a run's dataset (its folder, then each ``data.updates`` folder), found
    from their sources without reading any image; None for standard TFDS datasets or when a source is
    gone."""
    name = data_config.name
    if name.split("/", 1)[0].split(":", 1)[0] not in BUILDERS:
        return None
    data_dir, options = os.path.expanduser(data_config.data_dir), builder_options(data_config)
    parts = [(name, data_config.manual_dir)] + [("image_folder", u) for u in data_config.updates]
    try:
        return [_resolve_local(part_name, data_dir, manual_dir, options).directory for part_name, manual_dir in parts]
    except DataError:
        return None


def builder_options(data_config) -> dict:
    """The ``config.data`` fields a builder's preparation depends on (``image_folder``'s)."""
    return {k: data_config[k] for k in ("stored_size", "test_fraction", "test_seed")}


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
    local = _resolve_local(name, data_dir, manual_dir, options or {})
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


@dataclasses.dataclass(frozen=True)
class _Local:
    """One of our builders resolved for a run: its class (with the run's options), config, names,
    manual dir, the source found there (None: absent) and the store's folder."""

    cls: type[LocalBuilder]
    config: str | None
    full_name: str
    manual_dir: str
    source: SourceInfo | None
    missing: DataError | None
    directory: str


def _resolve_local(name: str, data_dir: str, manual_dir: str | None, options: dict) -> _Local:
    """The cheap look at the source files (headers / zip directory / folder listing only) that names
    the config and the store; raises the builder's "not found" error when neither source nor store
    is there."""
    base, _, config = name.partition("/")
    config = config or None
    cls = BUILDERS[base].with_options(**options)
    manual_dir = os.path.expanduser(
        manual_dir or cls.DEFAULT_MANUAL_DIR or os.path.join(data_dir, "downloads", "manual")
    )
    try:
        source = cls.inspect_source(data_dir if cls.SOURCE_IN_DATA_DIR else manual_dir, config)
        missing = None
    except DatasetNotFoundError as e:
        source, missing = None, e
    if cls.BUILDER_CONFIGS and config is None:
        if source is not None:
            config = source.config_name
        else:  # No source: reuse the single prepared config, if any.
            prepared = [
                c.name
                for c in cls.BUILDER_CONFIGS
                if records.read_info(records.store_dir(data_dir, f"{base}/{c.name}")) is not None
            ]
            if len(prepared) != 1:
                assert missing is not None  # set with source None
                raise missing
            config = prepared[0]
    full_name = f"{base}/{config}" if config else base
    if source is None and cls.store_name(full_name, None) != full_name:
        # a store named by its source: found through the index of the stores prepared from this folder
        directory = indexed_store(data_dir, manual_dir, options)
        if directory is None:
            assert missing is not None  # set with source None
            raise missing
    else:
        directory = records.store_dir(data_dir, cls.store_name(full_name, source))
    if source is None and records.read_info(directory) is None:
        assert missing is not None  # set with source None
        raise missing
    if source is not None and cls.store_name(full_name, None) != full_name:
        _index_store(data_dir, manual_dir, options, directory)
    return _Local(cls, config, full_name, manual_dir, source, missing, directory)


# --------------------------------------------------------------------------
# Which store a folder was prepared into: a run stays readable after its folder moves.


def _index_path(data_dir: str, manual_dir: str, options: dict) -> str:
    key = json.dumps({"source": os.path.abspath(manual_dir), "options": options}, sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return os.path.join(os.path.expanduser(data_dir), "cvs_records", "by_source", f"{digest}.json")


def _index_store(data_dir: str, manual_dir: str, options: dict, directory: str) -> None:
    """Records that ``manual_dir`` (with ``options``) is stored in ``directory`` (a store named by
    its source's contents); written when it changes, atomically."""
    path = _index_path(data_dir, manual_dir, options)
    entry = {"source": os.path.abspath(manual_dir), "store": os.path.basename(directory)}
    try:
        with open(path) as f:
            if json.load(f) == entry:
                return
    except (OSError, ValueError):
        pass
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(entry, f)
        os.replace(tmp, path)
    except OSError:  # a read-only data_dir: the run then needs its folder where it was
        pass


def indexed_store(data_dir: str, manual_dir: str, options: dict) -> str | None:
    """The store ``manual_dir`` was last prepared into (``<data_dir>/cvs_records/by_source/``), when
    that store is still there; None otherwise."""
    try:
        with open(_index_path(data_dir, manual_dir, options)) as f:
            directory = records.store_dir(data_dir, json.load(f)["store"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return directory if records.read_info(directory) is not None else None


def source_root(manual_dir: str) -> str:
    """The folder a source's files are named relative to (a manifest's folder for a CSV)."""
    path = os.path.abspath(os.path.expanduser(manual_dir))
    return os.path.dirname(path) if path.lower().endswith(".csv") else path


def shown_sources(store: str, names: list[str], manual_dir: str | None) -> list[str]:
    """``names`` (a store's recorded source paths) under the folder the run was given: stores are shared
    by content, so a store prepared from another folder with the same files names that folder's paths."""
    info = records.read_info(store) or {}
    root = info.get("metadata", {}).get("root")
    if not root or manual_dir is None:
        return names
    given = source_root(manual_dir)
    if given == root:
        return names
    prefix = root.rstrip(os.sep) + os.sep
    return [given + os.sep + n[len(prefix) :] if n.startswith(prefix) else n for n in names]


def _prepare(local: _Local, data_dir: str) -> None:
    """Runs the builder's generators into a record store: one image in memory at a time."""
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
    builder = cls(data_dir=scratch.name, **kwargs)
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
            "class_names": list(features_of(builder.info)["label"].names),
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
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds_registered.DatasetNotFoundError as e:
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


def store_digests(config, only: set[str] | None = None) -> dict[str, str]:
    """SHA-256 (hex) -> source of every image of the run's record stores (none for standard TFDS data);
    ``only``: of those digests alone (the few images a session from adds checks, without a dict of every
    stored image)."""
    wanted = None if only is None else np.array([bytes.fromhex(d) for d in only if d], dtype="V32")

    stores = store_dirs(config.data)
    if stores is None:
        return {}
    folders = [config.data.manual_dir] + list(config.data.updates)
    out: dict[str, str] = {}
    for store, folder in zip(stores, folders):
        info = records.read_info(store)
        assert info is not None  # the run's stores are complete (prepared before it trained)
        for split in ("train", "test"):
            if not os.path.exists(os.path.join(store, f"{split}.sha256.npy")):
                continue
            rows = records.StoreSplit(store, split, info)
            digests = rows.digests()
            if wanted is not None:
                hits = np.flatnonzero(np.isin(np.ascontiguousarray(digests).view("V32").ravel(), wanted))
                if not len(hits):
                    continue
                names = shown_sources(store, rows.sources(), folder)
                for i in hits:
                    out.setdefault(digests[i].tobytes().hex(), names[i])
                continue
            for digest, name in zip(digests, shown_sources(store, rows.sources(), folder)):
                out.setdefault(digest.tobytes().hex(), name)
    return out
