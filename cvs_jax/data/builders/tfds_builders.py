"""The TFDS half of our offline builders: each is its dataset module's file half (``LocalSource``) plus a
TFDS DatasetInfo and the generators that ``sources`` runs to prepare a record store (no TensorFlow).

Only preparing a store needs this module (``main``, ``update``): the commands that read a trained run find
and read its stores through the file halves alone, without importing tensorflow_datasets (0.1-0.35 s of
CPU and ~10 MB of peak memory per process: docs/testing.md).  `BUILDERS` is the one registry of these
classes, by name.
"""

from __future__ import annotations

import os
from typing import Any, Sequence, cast

import numpy as np
import tensorflow_datasets as tfds

from cvs_jax.data.builders import _tfds_source, fashion_mnist_local, image_folder, product10k, resize, tiny_imagenet
from cvs_jax.data.builders._common import LocalSource, SourceInfo
from cvs_jax.data.builders.fashion_mnist_local import CLASS_NAMES, DEFAULT_MANUAL_DIR, FashionMnistLocalSource
from cvs_jax.data.builders.image_folder import ImageFolderSource
from cvs_jax.data.builders.inat_m import InatMSource
from cvs_jax.data.builders.product10k import ProductMSource
from cvs_jax.data.builders.stanford_dogs import StanfordDogs256Source
from cvs_jax.data.builders.tiny_imagenet import TinyImagenetZipSource
from cvs_jax.errors import DataError

# TFDS is imported here only, where a dataset is prepared or read through TFDS (main, update and the server import it
# when they need it: 0.8 s of CPU otherwise); its progress bars off, as our own progress lines follow
tfds.disable_progress_bar()


def features_of(info: tfds.core.DatasetInfo) -> Any:
    """``info.features``, our builders' FeaturesDict ("image", "label", ...): tfds types it as an optional
    FeatureConnector without item access, so each ``info.features["label"]`` read was a type error."""
    return info.features


def metadata_of(info: tfds.core.DatasetInfo) -> dict[str, Any]:
    """``info.metadata``, the MetadataDict every builder here declares in ``_info`` (tfds types it optional)."""
    return cast(dict[str, Any], info.metadata)


def image_features(shape: tuple[int, ...], class_names: Sequence[str] | None = None):
    """The TFDS features of every image builder here (its DatasetInfo): a uint8 image of ``shape`` kept as
    its raw bytes (BYTES: compact, fast to decode), a class label (``class_names``, else set by the builder
    when it reads its source) and the record's position ``id``."""
    return tfds.features.FeaturesDict(
        {
            "image": tfds.features.Tensor(shape=shape, dtype=np.uint8, encoding=tfds.features.Encoding.BYTES),
            "label": tfds.features.ClassLabel(names=class_names),
            "id": tfds.features.Scalar(dtype=np.int64),
        }
    )


def stored_features():
    """The features of every fine-grained builder (the record store keeps the images encoded,
    ``records.py``): a STORED_SIZE square image (``image_features``), label names set by the builder."""
    size = resize.stored_size()
    return image_features((size, size, 3))


class LocalInfo(tfds.core.DatasetInfo):
    """The DatasetInfo of every builder here: TFDS's, less its look for precomputed info on GCS.

    A builder made before its store is prepared asks ``initialize_from_bucket``, which makes a temporary
    directory before it finds GCS disabled and returns without removing it: one empty ``/tmp/tmp*tfds`` per
    ``main`` or ``update`` that prepared a store (this project's test host held 2,976 after a day of suites). Our
    data is local by design, so there is nothing on GCS to read."""

    def initialize_from_bucket(self) -> None:
        return None


class LocalBuilder(LocalSource, tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Base of the builders that read local files given as a manual dir.

    The prepared data always keeps the original file order (`disable_shuffling=True`) and has an int64
    `id` feature = position in that order.
    """

    @classmethod
    def _subclass(cls, values):
        # TFDS names a class by its own attributes (else by its Python name), and lists it unless told not to
        return type(cls.__name__, (cls,), {"name": cls.name, **values}, skip_registration=True)

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


class FashionMnistLocal(FashionMnistLocalSource, LocalBuilder):
    """Fashion-MNIST (60k train / 10k test, 28x28 grey) from local IDX files."""

    name = FashionMnistLocalSource.name  # TFDS would name it by its class name

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release: IDX files read directly."}
    MANUAL_DOWNLOAD_INSTRUCTIONS = f"""
  The manual dir must hold the four Fashion-MNIST IDX files (gzipped or not):
  {FashionMnistLocalSource.MANUAL_FILES_HINT}.
  Either `apt-get install dataset-fashion-mnist` (puts them in
  {DEFAULT_MANUAL_DIR}, the default manual dir of this builder), or download
  them from https://github.com/zalandoresearch/fashion-mnist into a folder and
  pass it as the manual dir.
  """

    def _info(self) -> tfds.core.DatasetInfo:
        return LocalInfo(
            builder=self,
            description=(
                "Fashion-MNIST read from local IDX files; records are in file"
                " order and `id` is the position in the original file."
            ),
            features=image_features((28, 28, 1), CLASS_NAMES),  # the raw 784 bytes per image
            supervised_keys=("image", "label"),
            disable_shuffling=True,
            homepage="https://github.com/zalandoresearch/fashion-mnist",
            metadata=tfds.core.MetadataDict(),
        )

    def _split_generators(self, dl_manager):
        manual_dir = self._resolve_manual_dir(dl_manager)
        source = self.inspect_source(manual_dir)
        self._record_source(source)
        files = fashion_mnist_local.find_idx_files(manual_dir)
        return {
            split: self._generate_examples(files[images_base], files[labels_base])
            for split, (images_base, labels_base) in fashion_mnist_local.IDX_FILES.items()
        }

    def _generate_examples(self, images_path: str, labels_path: str):
        images = fashion_mnist_local.read_idx(images_path)
        labels = fashion_mnist_local.read_idx(labels_path)
        if images.dtype != np.uint8 or labels.dtype != np.uint8:
            raise DataError(
                f"{images_path}, {labels_path}: expected uint8 IDX data, got {images.dtype} and {labels.dtype}."
            )
        if labels.size and int(labels.max()) >= len(CLASS_NAMES):
            raise DataError(f"{labels_path}: label {labels.max()} out of range.")
        images = images[..., None]
        name = os.path.basename(images_path)
        for i in range(images.shape[0]):
            yield i, {"image": images[i], "label": int(labels[i]), "id": i, "source": f"{name}#{i}"}


class TinyImagenetZip(TinyImagenetZipSource, LocalBuilder):
    """Tiny-ImageNet (200 classes, 64x64 RGB) from the official zip layout."""

    name = TinyImagenetZipSource.name  # TFDS would name it by its class name

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release: zip read in place with PIL."}
    BUILDER_CONFIGS = [
        tfds.core.BuilderConfig(
            name="full",
            description="Official tiny-imagenet-200.zip: 500 train images per"
            " class (100,000) + the 10,000 val images as test.",
        ),
        tfds.core.BuilderConfig(
            name="mini",
            description="tiny-imagenet-200-mini.zip: train images 0..99 of each"
            " class (20,000) + the 10,000 val images as test.",
        ),
        tfds.core.BuilderConfig(
            name="custom",
            description="Any other copy in the official layout (e.g. a small test fixture).",
        ),
    ]
    DEFAULT_CONFIG_NAME = "full"
    MANUAL_DOWNLOAD_INSTRUCTIONS = """
  Put the official Tiny-ImageNet zip, tiny-imagenet-200.zip
  (http://cs231n.stanford.edu/tiny-imagenet-200.zip), or a subset of it in the
  same layout such as tiny-imagenet-200-mini.zip, or the extracted
  tiny-imagenet-200/ folder, in the manual dir. The zip is read in place (not
  extracted). The config (full / mini / custom) must match the copy found.
  """

    def _info(self) -> tfds.core.DatasetInfo:
        return LocalInfo(
            builder=self,
            description=(
                "Tiny-ImageNet read from the official zip layout; labels follow the"
                " sorted-wnid convention; `test` is the official val split;"
                " records are in file order and `id` is the position in it."
            ),
            features=image_features(tiny_imagenet.IMAGE_SHAPE),  # names (words.txt) set when the source is read
            supervised_keys=("image", "label"),
            disable_shuffling=True,
            homepage="http://cs231n.stanford.edu/",
            metadata=tfds.core.MetadataDict(),
        )

    def _split_generators(self, dl_manager):
        manual_dir = self._resolve_manual_dir(dl_manager)
        assert self.builder_config is not None  # one of BUILDER_CONFIGS (tfds types it optional)
        source, index = self.select_source(manual_dir, self.builder_config.name)
        features_of(self.info)["label"].names = list(index.class_names)
        self._record_source(
            SourceInfo(
                config_name=index.config_name,
                fingerprint=tiny_imagenet.source_fingerprint(source, index),
                description=repr(source),
            )
        )
        metadata_of(self.info)["wnids"] = list(index.wnids)
        return {
            "train": self._generate_examples(source, index.train, "train"),
            "test": self._generate_examples(source, index.test, "test"),
        }

    def _generate_examples(self, source: tiny_imagenet.TinySource, items, split: str = ""):
        """Yields examples in order; undecodable images are skipped and recorded.

        Reading + JPEG decoding of the next block runs in a background thread
        while TFDS serializes and writes the current one (a pipeline; more
        decoding threads do not help: per-image work is mostly under the GIL).
        The names of skipped files go to ``info.metadata['skipped_<split>']``;
        ``load_dataset(..., on_corrupt='refuse')`` refuses a dataset that has any.
        """
        block = 1024
        skipped = metadata_of(self.info).setdefault(f"skipped_{split}", [])

        errors = resize.image_errors()

        def load(chunk):
            out = []
            for rel, _ in chunk:
                try:
                    data = source.read(rel)
                    out.append((*tiny_imagenet.decode_image_keeping_source(data, rel), data))
                except errors as e:  # PIL's errors for broken files and decompression bombs
                    out.append(None)
                    skipped.append(f"{rel}: {type(e).__name__}")
            return out

        chunks = [items[s : s + block] for s in range(0, len(items), block)]
        i = 0
        for chunk, images in resize.read_ahead(chunks, load):
            for decoded, (rel, label) in zip(images, chunk):
                if decoded is None:
                    continue
                image, passthrough, data = decoded
                yield (
                    i,
                    {
                        "image": image,
                        "label": label,
                        "id": i,
                        "source": rel,
                        "source_bytes": data,
                        "passthrough": passthrough,
                    },
                )
                i += 1


class ProductM(ProductMSource, LocalBuilder):
    """Product-M: Product-10K train classes with >= 20 images, seeded 80/20 split."""

    name = ProductMSource.name  # TFDS would name it by its class name

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    MANUAL_DOWNLOAD_INSTRUCTIONS = """
  Put the official Product-10K training files (https://products-10k.github.io/)
  in the manual dir: train.csv and either the train/ image folder or train.zip.
  """

    def _info(self) -> tfds.core.DatasetInfo:
        return LocalInfo(
            builder=self,
            description=(
                "Product-M (CVS, CVPR 2022): Product-10K training classes with >="
                " 20 images, split per class (seeded) into 80% train / 20% test;"
                " 256x256 images; records ordered by (label, file name)."
            ),
            features=stored_features(),  # label names set at preparation
            supervised_keys=("image", "label"),
            disable_shuffling=True,
            homepage="https://products-10k.github.io/",
            metadata=tfds.core.MetadataDict(),
        )

    def _split_generators(self, dl_manager):
        manual_dir = self._resolve_manual_dir(dl_manager)
        index, images = product10k.open_source(manual_dir)
        size = int(features_of(self.info)["image"].shape[0])
        self._record_source(
            SourceInfo(
                config_name=None, fingerprint=product10k.fingerprint(index, size), description=images.description
            )
        )
        plan = product10k.split(index.rows, **product10k.selection_params())
        features_of(self.info)["label"].names = [str(c) for c in plan.source_classes]
        metadata_of(self.info)["source_classes"] = list(plan.source_classes)
        return {
            "train": self._generate_examples(images, plan.train, size, "train"),
            "test": self._generate_examples(images, plan.test, size, "test"),
        }

    def _generate_examples(self, images: product10k.ImageFiles, records, size: int, split_name: str):
        """Yields records in order; `id` = position among the stored ones."""
        skipped = metadata_of(self.info).setdefault(f"skipped_{split_name}", [])
        items = resize.decode_blocks(
            records,
            lambda block: [images.read(name) for name, _ in block],
            size,
            skipped,
            describe=lambda item: item[0],
        )
        for i, ((name, label), image, data, passthrough) in enumerate(items):
            yield (
                i,
                {
                    "image": image,
                    "label": label,
                    "id": i,
                    "source": name,
                    "source_bytes": data,
                    "passthrough": passthrough,
                },
            )


class ImageFolder(ImageFolderSource, LocalBuilder, skip_registration=True):
    """A user's images (``ImageFolderSource.with_options`` fixes the stored size and the drawn test split)."""

    name = ImageFolderSource.name  # TFDS would name it by its class name

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    MANUAL_DOWNLOAD_INSTRUCTIONS = "Set --config.data.manual_dir to your folder of class folders or CSV manifest."

    def _info(self) -> tfds.core.DatasetInfo:
        return LocalInfo(
            builder=self,
            description="A user's labelled images, stored at data.stored_size (shorter side, centre crop).",
            features=tfds.features.FeaturesDict({"label": tfds.features.ClassLabel()}),
            disable_shuffling=True,
            metadata=tfds.core.MetadataDict(),
        )

    def _split_generators(self, dl_manager):
        inventory = self._scan(self._resolve_manual_dir(dl_manager))
        features_of(self.info)["label"].names = list(inventory.class_names)
        metadata_of(self.info)["ignored"] = dict(inventory.ignored)
        metadata_of(self.info)["test_given"] = inventory.test_given
        metadata_of(self.info)["root"] = inventory.root  # stores are shared by content: sources shown per run
        # photos turned upright by their EXIF orientation: in store.json, so the feature cache (keyed by it) of
        # a store prepared again after this rule never reuses the features of a sideways copy prepared before
        metadata_of(self.info)["exif_upright"] = True
        if inventory.sessions() is not None:
            metadata_of(self.info)["train_sessions"] = []
            metadata_of(self.info)["test_sessions"] = []
        return {
            "train": self._generate_examples(inventory.train, "train"),
            "test": self._generate_examples(inventory.test, "test"),
        }

    def _generate_examples(self, entries, split: str):
        skipped = metadata_of(self.info).setdefault(f"skipped_{split}", [])
        sessions = metadata_of(self.info).get(f"{split}_sessions")

        def read_block(block):
            out = []
            for e in block:
                with open(e.path, "rb") as f:
                    out.append(f.read())
            return out

        items = resize.decode_blocks(
            entries, read_block, self.STORED_SIZE, skipped, describe=lambda e: e.path, exif=True
        )  # photos upright, as viewers show them (phones store portraits sideways with an EXIF tag)
        tiny = metadata_of(self.info).setdefault("tiny", [])
        for i, (entry, image, data, passthrough) in enumerate(items):
            if image_folder.smaller_than(data, image_folder.MIN_SIDE):
                tiny.append(entry.path)
            if sessions is not None:  # a test row without a session is a query from session 1 on
                sessions.append(-1 if entry.session is None else int(entry.session))
            yield (
                i,
                {
                    "image": image,
                    "label": entry.label,
                    "id": i,
                    "source": entry.path,
                    "source_bytes": data,
                    "passthrough": passthrough,
                },
            )


class TfdsDerivedBuilder(_tfds_source.DerivedSource, LocalBuilder, skip_registration=True):
    """Base of the builders that re-store a standard TFDS dataset from `data_dir` (their file half:
    ``_tfds_source.DerivedSource``)."""

    DESCRIPTION: str
    HOMEPAGE: str

    def _info(self) -> tfds.core.DatasetInfo:
        return LocalInfo(
            builder=self,
            description=self.DESCRIPTION,
            features=stored_features(),  # label names set at preparation
            supervised_keys=("image", "label"),
            disable_shuffling=True,
            homepage=self.HOMEPAGE,
            metadata=tfds.core.MetadataDict(),
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # The source is in data_dir.
        data_dir = getattr(self, "source_dir", None) or os.fspath(self.data_dir_root)  # set by sources._prepare
        size = int(features_of(self.info)["image"].shape[0])
        source = self.describe(data_dir)
        self._record_source(self.source_info(source, size))
        splits = {
            ours: _tfds_source.open_split(self.SOURCE_NAME, theirs, data_dir, self.KEY_FEATURE)
            for ours, theirs in self.SOURCE_SPLITS.items()
        }
        plan = self.plan(source, splits)
        features_of(self.info)["label"].names = list(plan.class_names)
        metadata_of(self.info)["source_classes"] = list(plan.source_classes)
        return {
            split: self._generate_examples(splits[split], records, size, split)
            for split, records in plan.records.items()
        }

    def _generate_examples(self, source: _tfds_source.SourceSplit, records, size: int, split: str):
        """Yields the planned records in order; `id` = position among the stored.

        the store's `<split>.sources.txt` line `id` is the source key of record `id`;
        undecodable images go to `metadata['skipped_<split>']`.
        """
        skipped = metadata_of(self.info).setdefault(f"skipped_{split}", [])
        items = resize.decode_blocks(
            records,
            lambda block: source.read_encoded([p for p, _ in block]),
            size,
            skipped,
            describe=lambda item: source.keys[item[0]],
        )
        for i, ((position, label), image, data, passthrough) in enumerate(items):
            yield (
                i,
                {
                    "image": image,
                    "label": label,
                    "id": i,
                    "source": str(source.keys[position]),
                    "source_bytes": data,
                    "passthrough": passthrough,
                },
            )


class StanfordDogs256(StanfordDogs256Source, TfdsDerivedBuilder):
    """All of TFDS's stanford_dogs, stored as 256x256 uint8 arrays."""

    name = StanfordDogs256Source.name  # TFDS would name it by its class name

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    HOMEPAGE = "http://vision.stanford.edu/aditya86/ImageNetDogs/main.html"
    DESCRIPTION = (
        "Stanford Dogs (TFDS stanford_dogs, official train/test lists), images"
        " resized to shorter side 256 and centre-cropped to 256x256; records"
        " sorted by source file name, `id` = position."
    )


class InatM(InatMSource, TfdsDerivedBuilder):
    """iNat-M: 200 iNat-2017 classes x 527 train images, their validation as test."""

    name = InatMSource.name  # TFDS would name it by its class name

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    HOMEPAGE = "https://github.com/visipedia/inat_comp/tree/master/2017"
    DESCRIPTION = (
        "iNat-M (CVS, CVPR 2022): 200 seeded-random classes of iNaturalist 2017"
        " with >= 527 train images, 527 seeded-random train images each, all"
        " their validation images as test; 256x256 images."
    )


# The one registry of our builders' TFDS halves: name -> builder class (``stores.SOURCES``: their file halves).
BUILDERS: dict[str, type[LocalBuilder]] = {
    cls.name: cls for cls in (FashionMnistLocal, TinyImagenetZip, StanfordDogs256, InatM, ProductM, ImageFolder)
}


def builder(name: str, options: dict) -> type[LocalBuilder]:
    """The builder of one of our datasets with the run's data options (``stores.builder_options``)."""
    return cast(type[LocalBuilder], BUILDERS[name].with_options(**options))
