"""Pieces shared by the offline TFDS builders (no TensorFlow needed)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import zipfile
from typing import Any, ClassVar, cast

import tensorflow_datasets as tfds


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


def features_of(info: tfds.core.DatasetInfo) -> Any:
    """``info.features``, our builders' FeaturesDict ("image", "label", ...): tfds types it as an optional
    FeatureConnector without item access, so each ``info.features["label"]`` read was a type error."""
    return info.features


def metadata_of(info: tfds.core.DatasetInfo) -> dict[str, Any]:
    """``info.metadata``, the MetadataDict every builder here declares in ``_info`` (tfds types it optional)."""
    return cast(dict[str, Any], info.metadata)


class LocalBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Base of the builders that read local files given as a manual dir.

    Subclasses define `DEFAULT_MANUAL_DIR`, `MANUAL_FILES_HINT` and
    `inspect_source`; the prepared data always keeps the original file order
    (`disable_shuffling=True`) and has an int64 `id` feature = position in that
    order.
    """

    DEFAULT_MANUAL_DIR: ClassVar[str | None] = None
    # Short description of the expected files, used in error messages.
    MANUAL_FILES_HINT: ClassVar[str] = ""
    # True for builders derived from a standard TFDS dataset prepared in the
    # data_dir (stanford_dogs_256, inat_m): `inspect_source` is then given the
    # data_dir instead of a manual dir.
    SOURCE_IN_DATA_DIR: ClassVar[bool] = False
    # How the record store encodes the images (``records.py``): "jpeg" for photos (the source bytes
    # when they are already the stored image), "png" (lossless) for small or grey images.
    STORE_ENCODING: ClassVar[str] = "jpeg"

    @classmethod
    def with_options(cls, **options) -> type["LocalBuilder"]:
        """The builder with the run's data options (``image_folder`` reads its size and test split)."""
        del options
        return cls

    @classmethod
    def store_name(cls, full_name: str, source: SourceInfo | None) -> str:
        """The record store's name in ``<data_dir>/cvs_records`` (default: the dataset's name)."""
        del source
        return full_name

    @classmethod
    def inspect_source(cls, manual_dir: str, config_name: str | None = None) -> SourceInfo:
        """Checks `manual_dir` quickly; raises DatasetNotFoundError if unusable."""
        raise NotImplementedError

    def _resolve_manual_dir(self, dl_manager) -> str:
        """The manual dir passed to download_and_prepare, else the default one."""
        try:
            return str(dl_manager.manual_dir)
        except AssertionError:  # Not given / missing / empty.
            if self.DEFAULT_MANUAL_DIR is None:
                raise
            return self.DEFAULT_MANUAL_DIR

    def _record_source(self, source: SourceInfo) -> None:
        """Stores the source identity in the dataset metadata (metadata.json)."""
        metadata_of(self.info)["source_fingerprint"] = source.normalized_fingerprint()
        metadata_of(self.info)["source_description"] = source.description
