"""The file half of our offline builders, shared by all of them: no TensorFlow, no tensorflow_datasets.

``LocalSource`` is what a builder knows about its files: where they are, which config and content they hold
(``inspect_source``) and the record store they are prepared into (``store_name``).  The commands that only
read a run (``search``, ``info``, ``export``, the server) find its stores through it; the TFDS half
(``tfds_builders``: DatasetInfo and the generators that prepare a store) subclasses it, for ``main`` and
``update``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import zipfile
from typing import Any, ClassVar


@dataclasses.dataclass(frozen=True)
class SourceInfo:
    """What a builder found in its manual dir (cheap to compute: no decoding).

    Attributes:
      config_name: builder config that matches these files (None: no configs).
      fingerprint: JSON-able identity of the source content; stored in the
        prepared dataset's metadata and compared on reuse.
      description: human-readable location, e.g. the zip path.
    """

    config_name: str | None
    fingerprint: dict[str, Any]
    description: str

    def normalized_fingerprint(self) -> Any:
        return normalize_json(self.fingerprint)


def normalize_json(value: Any) -> Any:
    """Round-trips `value` through JSON (tuples -> lists, ...) for comparisons."""
    return json.loads(json.dumps(value, sort_keys=True))


def sha256_lines(lines) -> str:
    h = hashlib.sha256()
    for line in lines:
        h.update(str(line).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


class ZipOrFolder:
    """Source files read either from a zip archive (opened once, on first use) or from a folder.

    Subclasses set `is_zip`, `archive` (the zip's path) and implement `_member(name)` (the name
    inside the zip) and `_file(name)` (the path in the folder).
    """

    is_zip: bool
    archive: str
    _zip: zipfile.ZipFile | None = None

    def _member(self, name: str) -> str:
        raise NotImplementedError

    def _file(self, name: str) -> str:
        raise NotImplementedError

    def _zipfile(self) -> zipfile.ZipFile:
        if self._zip is None:
            self._zip = zipfile.ZipFile(self.archive)
        return self._zip

    def read(self, name: str) -> bytes:
        if self.is_zip:
            return self._zipfile().read(self._member(name))
        with open(self._file(name), "rb") as f:
            return f.read()

    def close(self):
        if self._zip is not None:
            self._zip.close()
            self._zip = None


class LocalSource:
    """One of our datasets as files on this machine (subclasses: one per builder, in its module).

    Subclasses set ``name`` and implement ``inspect_source``; the record store's data always keeps the
    source's file order, and its builder (``tfds_builders``) adds the TFDS half.
    """

    name: ClassVar[str]
    DEFAULT_MANUAL_DIR: ClassVar[str | None] = None  # None: <data_dir>/downloads/manual
    # Short description of the expected files, used in error messages.
    MANUAL_FILES_HINT: ClassVar[str] = ""
    # True for builders derived from a standard TFDS dataset prepared in the data_dir (stanford_dogs_256,
    # inat_m): `inspect_source` is then given the data_dir instead of a manual dir.
    SOURCE_IN_DATA_DIR: ClassVar[bool] = False
    # How the record store encodes the images (``records.py``): "jpeg" for photos (the source bytes
    # when they are already the stored image), "png" (lossless) for small or grey images.
    STORE_ENCODING: ClassVar[str] = "jpeg"
    # The builder's configs (tiny_imagenet_zip: full / mini / custom); none for most.
    CONFIG_NAMES: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def with_options(cls, **options) -> type["LocalSource"]:
        """The builder with the run's data options (``image_folder`` reads its size and test split)."""
        del options
        return cls

    @classmethod
    def _subclass(cls, values: dict[str, Any]) -> Any:
        """``cls`` with class attributes ``values`` (``with_options``); the TFDS half adds its keywords."""
        return type(cls.__name__, (cls,), values)

    @classmethod
    def store_name(cls, full_name: str, source: SourceInfo | None) -> str:
        """The record store's name in ``<data_dir>/cvs_records`` (default: the dataset's name)."""
        del source
        return full_name

    @classmethod
    def inspect_source(cls, manual_dir: str, config_name: str | None = None) -> SourceInfo:
        """Checks `manual_dir` quickly; raises DatasetNotFoundError if unusable."""
        raise NotImplementedError
