"""Reading the standard TFDS dataset that a derived builder is made from, prepared in `data_dir`.

`stanford_dogs_256` and `inat_m` re-store (a subset of) a standard TFDS
dataset as fixed 256x256 uint8 arrays. The source must already be prepared in
the same `data_dir` in the array_record format (random access, readable
without TensorFlow); preparing it needs TensorFlow and internet, so it is done
elsewhere with `tfds build NAME --data_dir=DIR --file_format=array_record`.

Records are read as raw serialized examples and parsed here (label, a stable
key such as the image file name, the encoded image), so no TensorFlow is
needed and a label-only pass does not decode any image. Source records are
ordered by their key, not by their position: TFDS shuffles records when it
prepares a dataset, the key order does not depend on that.

`open_split` is the one place that reads the source; tests may replace it.  ``DerivedSource`` is the
file half of these builders (their TFDS half: ``tfds_builders.TfdsDerivedBuilder``); tensorflow_datasets is
imported only when a source is read (``describe_source``, ``open_split``), so this module is imported by
the commands that read a run without loading it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Sequence, cast

import numpy as np

from cvs_jax.data.builders import resize
from cvs_jax.data.builders._common import LocalSource, SourceInfo
from cvs_jax.data.builders.tfds_tempdirs import tfds_builder
from cvs_jax.errors import DatasetNotFoundError

_INDEX_CHUNK = 256  # Records per read in the label pass (bounds memory).


# Where a source's files are served today when the URLs registered in TFDS no longer serve them, and
# how TFDS reads files downloaded by hand (its manual dir needs each file's name in the checksums list).
FILES_TODAY = {
    "i_naturalist2017": (
        " The Caltech URLs TFDS registers for i_naturalist2017 are reported dead; the same files"
        " (visipedia/inat_comp, 2017) are served by the AWS Open Data bucket"
        " https://ml-inat-competition-datasets.s3.amazonaws.com/2017/ (train_val_images.tar.gz, 186 GB;"
        " train_val2017.zip; test2017.tar.gz, 53 GB): download the three into FILES, rewrite the three"
        " lines of TFDS's url_checksums/i_naturalist2017.txt as url, size, sha256 and file name separated by"
        " tabs (without a file name TFDS ignores a manual dir), then add --manual_dir=FILES to that tfds build."
    ),
}


def fix_hint(source_name: str) -> str:
    return (
        f"Fix: on a machine with TensorFlow and internet, run `tfds build"
        f" {source_name} --data_dir=DIR --file_format=array_record`, copy DIR"
        " here and point --config.data.data_dir at DIR (the derived dataset is"
        " then prepared into the same DIR)." + FILES_TODAY.get(source_name, "")
    )


@dataclasses.dataclass(frozen=True)
class SourceDescription:
    """A prepared standard TFDS dataset, as told by its dataset_info.json."""

    name: str
    version: str
    data_dir: str  # Where its files are (data_dir/name/version).
    class_names: tuple[str, ...]
    num_examples: dict[str, int]  # Source split -> records.


def describe_source(source_name: str, data_dir: str, splits: Sequence[str], derived_name: str) -> SourceDescription:
    """Checks that `source_name` is prepared in `data_dir` (reads no records).

    Raises:
      DatasetNotFoundError: not prepared, not in array_record, or a split missing.
    """
    from tensorflow_datasets.core import file_adapters  # pylint: disable=g-import-not-at-top  # not seen by pyright

    builder = tfds_builder(source_name, data_dir)
    if not builder.is_prepared():
        raise DatasetNotFoundError(
            f"{derived_name}: it is made from the standard TFDS dataset"
            f" {source_name!r}, which is not prepared in data_dir {data_dir!r}"
            f" (no {builder.data_dir}). {fix_hint(source_name)}"
        )
    formats = [builder.info.file_format, *builder.info.alternative_file_formats]
    if file_adapters.FileFormat.ARRAY_RECORD not in formats:
        raise DatasetNotFoundError(
            f"{derived_name}: {source_name} in {builder.data_dir} has no"
            f" array_record files ({builder.info.file_format}); reading it without"
            f" TensorFlow needs them. Fix: re-prepare it with `tfds build"
            f" {source_name} --data_dir=DIR --file_format=array_record`."
        )
    missing = [s for s in splits if s not in builder.info.splits]
    if missing:
        raise DatasetNotFoundError(
            f"{derived_name}: {source_name} in {builder.data_dir} has no split(s)"
            f" {missing} (has {list(builder.info.splits)}). {fix_hint(source_name)}"
        )
    return SourceDescription(
        name=source_name,
        version=str(builder.version),
        data_dir=str(builder.data_dir),
        class_names=tuple(cast(Any, builder.info.features)["label"].names),  # tfds types features as optional
        num_examples={s: int(builder.info.splits[s].num_examples) for s in splits},
    )


@dataclasses.dataclass(frozen=True)
class SourceSplit:
    """One split of the source: keys and labels up front, images on demand.

    Attributes:
      keys: stable id of each record (by position in the data source).
      labels: int64 source label of each record.
      read_encoded: positions -> the encoded image bytes (JPEG/PNG).
    """

    keys: tuple[str, ...]
    labels: np.ndarray
    read_encoded: Callable[[Sequence[int]], list[bytes]]


def open_split(source_name: str, split: str, data_dir: str, key_feature: str) -> SourceSplit:
    """Reads the keys and labels of one split (one pass, images not decoded)."""
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    from tensorflow_datasets.proto import tf_example_pb2  # pylint: disable=g-import-not-at-top

    builder = tfds_builder(source_name, data_dir)
    # tfds's decorator hides as_data_source's parameters, and the generated protobuf module has no stubs
    raw_bytes = tfds.decode.DeserializeMethod.RAW_BYTES
    raw = builder.as_data_source(split=split, deserialize_method=raw_bytes)  # pyright: ignore[reportCallIssue]
    parse = tf_example_pb2.Example.FromString  # pyright: ignore[reportAttributeAccessIssue]
    n = len(raw)
    keys, labels = [], np.empty((n,), np.int64)
    for start in range(0, n, _INDEX_CHUNK):
        stop = min(n, start + _INDEX_CHUNK)
        for j, record in enumerate(raw.__getitems__(list(range(start, stop)))):
            feature = parse(record).features.feature
            keys.append(feature[key_feature].bytes_list.value[0].decode("utf-8"))
            labels[start + j] = feature["label"].int64_list.value[0]

    def read_encoded(positions):
        records = raw.__getitems__([int(p) for p in positions])
        return [parse(r).features.feature["image"].bytes_list.value[0] for r in records]

    return SourceSplit(keys=tuple(keys), labels=labels, read_encoded=read_encoded)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a derived builder stores.

    Attributes:
      class_names: names of the new labels 0..K-1.
      source_classes: source label of each new label.
      records: our split -> [(source position, new label)] in storage order.
    """

    class_names: tuple[str, ...]
    source_classes: tuple[int, ...]
    records: dict[str, list[tuple[int, int]]]


class DerivedSource(LocalSource):
    """A dataset re-stored from a standard TFDS dataset in `data_dir` (SOURCE_IN_DATA_DIR).

    The source is a prepared TFDS dataset, so inspecting it reads its dataset_info.json through
    tensorflow_datasets (``describe_source``, which imports it then). The fingerprint holds the source's name,
    version and split sizes, the stored image size and the selection parameters, so a copy prepared
    otherwise is never reused.
    """

    SOURCE_IN_DATA_DIR = True
    SOURCE_NAME: ClassVar[str]
    # Our split -> source split.
    SOURCE_SPLITS: ClassVar[dict[str, str]]
    # Source feature with a stable string id of each record.
    KEY_FEATURE: ClassVar[str]

    @classmethod
    def selection_params(cls) -> dict[str, Any]:
        """The constants the stored content depends on (read at call time)."""
        return {}

    @classmethod
    def plan(cls, source: SourceDescription, splits: dict[str, SourceSplit]) -> Plan:
        raise NotImplementedError

    @classmethod
    def describe(cls, data_dir: str) -> SourceDescription:
        return describe_source(cls.SOURCE_NAME, data_dir, list(cls.SOURCE_SPLITS.values()), cls.name)

    @classmethod
    def source_info(cls, source: SourceDescription, size: int) -> SourceInfo:
        return SourceInfo(
            config_name=None,
            fingerprint={
                "source": source.name,
                "source_version": source.version,
                "source_num_examples": source.num_examples,
                "stored_size": size,
                **cls.selection_params(),
            },
            description=source.data_dir,
        )

    @classmethod
    def inspect_source(cls, manual_dir: str, config_name: str | None = None) -> SourceInfo:
        """`manual_dir` is the data_dir here (see SOURCE_IN_DATA_DIR)."""
        return cls.source_info(cls.describe(manual_dir), resize.stored_size())
