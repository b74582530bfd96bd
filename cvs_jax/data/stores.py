"""Where a run's record stores are and what they hold, read without TensorFlow or tensorflow_datasets.

A run's images live in record stores (``records.py``) under ``<data_dir>/cvs_records``, one per source
folder (``data.manual_dir``, then each ``data.updates`` folder).  This module finds them from the
builders' file halves (``builders._common.LocalSource``: a folder listing, zip directory or file headers;
no image decoded) and reads what the reading commands show of them: each row's source path
(``source_names``), each image's SHA-256 (``store_digests``), the stores themselves (``store_dirs``).
``search``, ``info``, ``export`` and the server read a run through it alone; ``sources`` (loading and
preparing a dataset, ``main`` and ``update``) resolves through the same ``resolve``, then imports the
builders' TFDS half only to prepare a store.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import numpy as np

from cvs_jax.data import records
from cvs_jax.data.builders._common import LocalSource, SourceInfo
from cvs_jax.data.builders.fashion_mnist_local import FashionMnistLocalSource
from cvs_jax.data.builders.image_folder import ImageFolderSource
from cvs_jax.data.builders.inat_m import InatMSource
from cvs_jax.data.builders.product10k import ProductMSource
from cvs_jax.data.builders.stanford_dogs import StanfordDogs256Source
from cvs_jax.data.builders.tiny_imagenet import TinyImagenetZipSource
from cvs_jax.errors import DataError, DatasetNotFoundError

# The one registry of our offline datasets' file halves: name -> class (``tfds_builders.BUILDERS``: the
# builders that prepare them, by the same names).
SOURCES: dict[str, type[LocalSource]] = {
    cls.name: cls
    for cls in (
        FashionMnistLocalSource,
        TinyImagenetZipSource,
        StanfordDogs256Source,
        InatMSource,
        ProductMSource,
        ImageFolderSource,
    )
}


def is_ours(name: str) -> bool:
    """Whether a ``data.name`` (``name[/config][:version]``) is one of our datasets (else a standard TFDS one)."""
    return name.split("/", 1)[0].split(":", 1)[0] in SOURCES


def source_names(data_config, split: str = "train") -> list[str] | None:
    """The sources of a run's dataset rows (``config.data``), without loading the dataset: what
    ``search`` and ``export`` show for gallery rows.  None for standard TFDS datasets."""
    stores = store_dirs(data_config)
    names = [] if stores is None else [records.read_source_names(s, split) for s in stores]
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
    if not is_ours(name):
        return None
    data_dir, options = os.path.expanduser(data_config.data_dir), builder_options(data_config)
    parts = [(name, data_config.manual_dir)] + [("image_folder", u) for u in data_config.updates]
    try:
        return [resolve(part_name, data_dir, manual_dir, options).directory for part_name, manual_dir in parts]
    except DataError:
        return None


def builder_options(data_config) -> dict:
    """The ``config.data`` fields a builder's preparation depends on (``image_folder``'s)."""
    return {k: data_config[k] for k in ("stored_size", "test_fraction", "test_seed")}


@dataclasses.dataclass(frozen=True)
class Local:
    """One of our datasets resolved for a run: its file half (with the run's options), config, names,
    manual dir, the source found there (None: absent) and the store's folder."""

    cls: type[LocalSource]
    config: str | None
    full_name: str
    manual_dir: str
    source: SourceInfo | None
    missing: DataError | None
    directory: str
    options: dict  # the run's data options (``builder_options``), which the builder is prepared with


def resolve(name: str, data_dir: str, manual_dir: str | None, options: dict) -> Local:
    """The cheap look at the source files (headers / zip directory / folder listing only) that names
    the config and the store; raises the builder's "not found" error when neither source nor store
    is there."""
    base, _, config = name.partition("/")
    config = config or None
    cls = SOURCES[base].with_options(**options)
    manual_dir = os.path.expanduser(
        manual_dir or cls.DEFAULT_MANUAL_DIR or os.path.join(data_dir, "downloads", "manual")
    )
    try:
        source = cls.inspect_source(data_dir if cls.SOURCE_IN_DATA_DIR else manual_dir, config)
        missing = None
    except DatasetNotFoundError as e:
        source, missing = None, e
    if cls.CONFIG_NAMES and config is None:
        if source is not None:
            config = source.config_name
        else:  # No source: reuse the single prepared config, if any.
            prepared = [
                c for c in cls.CONFIG_NAMES if records.read_info(records.store_dir(data_dir, f"{base}/{c}")) is not None
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
    return Local(cls, config, full_name, manual_dir, source, missing, directory, options)


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
