"""Tiny-ImageNet from the official zip (read in place), as a TFDS builder.

Needs no TensorFlow: JPEGs are decoded with PIL and stored as uint8 tensors.
Layout read (inside a zip or an extracted folder; the top-level folder name is
free, e.g. `tiny-imagenet-200/` or `tiny-imagenet-200-mini/`):

  <top>/wnids.txt                       the class ids (one per line)
  <top>/words.txt                       wnid<TAB>name (may list more wnids)
  <top>/train/<wnid>/images/<wnid>_<i>.JPEG
  <top>/val/images/val_<n>.JPEG
  <top>/val/val_annotations.txt         val_<n>.JPEG<TAB>wnid<TAB>bbox...

Conventions (those of the official data and most Tiny-ImageNet code):
labels = index of the wnid in SORTED wnid order; `train` = train/ ordered by
sorted wnid then numeric image index; `test` = the official val/ images
(labelled by val_annotations.txt) in numeric val_<n> order. `id` = position in
that order.

Builder configs keep different sources apart in one data_dir: `full` (official
zip, 500 train images per class), `mini` (100 per class, e.g.
tiny-imagenet-200-mini.zip) and `custom` (any other subset in this layout, e.g.
test fixtures). The source's identity (file names and sizes) is recorded in
the dataset metadata so that a prepared copy is never silently reused for
different files.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import os
import re
import zipfile

import numpy as np
import tensorflow_datasets as tfds

from cvs_jax.data.builders._common import (
    LocalBuilder,
    SourceInfo,
    ZipOrFolder,
    features_of,
    metadata_of,
    sha256_lines,
)
from cvs_jax.data.builders.resize import image_errors, read_ahead
from cvs_jax.errors import DataError, DatasetNotFoundError

IMAGE_SHAPE = (64, 64, 3)
NUM_OFFICIAL_CLASSES = 200
NUM_OFFICIAL_VAL = 10_000
# config name -> train images per class (None: anything).
CONFIG_TRAIN_PER_CLASS = {"full": 500, "mini": 100, "custom": None}

_TRAIN_RE = re.compile(r"^train/([^/]+)/images/\1_(\d+)\.jpe?g$", re.IGNORECASE)
_VAL_RE = re.compile(r"^val/images/val_(\d+)\.jpe?g$", re.IGNORECASE)

FIX_HINT = (
    "Fix: put the official tiny-imagenet-200.zip (from"
    " http://cs231n.stanford.edu/tiny-imagenet-200.zip) or"
    " tiny-imagenet-200-mini.zip, or its extracted tiny-imagenet-200/ folder,"
    " in that directory, or set --config.data.manual_dir=DIR to the folder"
    " holding it."
)


class TinySource(ZipOrFolder):
    """Read access to one Tiny-ImageNet copy (zip or folder), names relative to <top>/."""

    def __init__(self, path: str, root: str):
        self.path = self.archive = path  # Zip file or folder.
        self.root = root  # Prefix of <top>/ inside the zip/folder ('' or 'x/').
        self.is_zip = os.path.isfile(path)
        self._sizes: dict[str, int] | None = None

    def __repr__(self):
        where = f"{self.path}!{self.root}" if self.is_zip else os.path.join(self.path, self.root)
        return f"TinySource({where})"

    def _member(self, rel: str) -> str:
        return self.root + rel

    def _file(self, rel: str) -> str:
        return os.path.join(self.path, self.root, rel)

    def sizes(self) -> dict[str, int]:
        """Relative file name -> size in bytes, for all files under <top>/."""
        if self._sizes is None:
            sizes = {}
            if self.is_zip:
                for info in self._zipfile().infolist():
                    if not info.is_dir() and info.filename.startswith(self.root):
                        sizes[info.filename[len(self.root) :]] = info.file_size
            else:
                top = os.path.join(self.path, self.root)
                for dirpath, _, filenames in os.walk(top):
                    rel_dir = os.path.relpath(dirpath, top)
                    for name in filenames:
                        rel = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
                        sizes[rel] = os.path.getsize(os.path.join(dirpath, name))
            self._sizes = sizes
        return self._sizes


@dataclasses.dataclass(frozen=True)
class TinyIndex:
    """Everything about a source except the pixels."""

    wnids: tuple[str, ...]  # Sorted: label = position.
    class_names: tuple[str, ...]
    train: tuple[tuple[str, int], ...]  # (relative file, label), in order.
    test: tuple[tuple[str, int], ...]

    @property
    def config_name(self) -> str:
        counts = collections.Counter(label for _, label in self.train)
        per_class = set(counts.values()) if len(counts) == len(self.wnids) else {-1}
        if len(self.wnids) == NUM_OFFICIAL_CLASSES and len(self.test) == NUM_OFFICIAL_VAL and len(per_class) == 1:
            (n,) = per_class
            for name, expected in CONFIG_TRAIN_PER_CLASS.items():
                if expected == n:
                    return name
        return "custom"


def _zip_roots(path: str) -> list[str]:
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
    except (zipfile.BadZipFile, OSError):
        return []
    roots = []
    for name in sorted(names):
        if name == "wnids.txt" or (name.endswith("/wnids.txt") and name.count("/") == 1):
            root = name[: -len("wnids.txt")]
            if root + "val/val_annotations.txt" in names:
                roots.append(root)
    return roots


def _is_tiny_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "wnids.txt")) and os.path.isfile(
        os.path.join(path, "val", "val_annotations.txt")
    )


def find_sources(manual_dir: str) -> list[TinySource]:
    """All Tiny-ImageNet copies in the folder `manual_dir`.

    Looks at `manual_dir` itself, each `*.zip` in it, and each sub-folder.
    """
    sources = []
    if not os.path.isdir(manual_dir):
        return []
    if _is_tiny_dir(manual_dir):
        sources.append(TinySource(manual_dir, ""))
    for entry in sorted(os.listdir(manual_dir)):
        path = os.path.join(manual_dir, entry)
        if entry.endswith(".zip") and os.path.isfile(path):
            sources.extend(TinySource(path, r) for r in _zip_roots(path))
        elif os.path.isdir(path) and _is_tiny_dir(path):
            sources.append(TinySource(manual_dir, entry + "/"))
    return sources


def build_index(source: TinySource) -> TinyIndex:
    """Parses wnids/words/val_annotations and lists the images (no decoding)."""
    wnids = sorted(set(source.read("wnids.txt").decode("utf-8").split()))
    if not wnids:
        raise DataError(f"{source}: wnids.txt is empty.")
    label_of = {w: i for i, w in enumerate(wnids)}
    sizes = source.sizes()

    words = {}
    if "words.txt" in sizes:
        for line in source.read("words.txt").decode("utf-8").splitlines():
            wnid, _, name = line.partition("\t")
            if wnid in label_of:
                words[wnid] = name.strip()
    names = [words.get(w) or w for w in wnids]
    # ClassLabel needs unique names: disambiguate duplicates with the wnid.
    counts = collections.Counter(names)
    names = [f"{n} ({w})" if counts[n] > 1 else n for n, w in zip(names, wnids)]

    train = []
    for rel in sizes:
        m = _TRAIN_RE.match(rel)
        if m:
            if m.group(1) not in label_of:
                raise DataError(f"{source}: train folder {m.group(1)} not in wnids.txt")
            train.append(((label_of[m.group(1)], int(m.group(2))), rel))
    train.sort()

    annotations = {}
    for line in source.read("val/val_annotations.txt").decode("utf-8").splitlines():
        fields = line.split("\t")
        if len(fields) >= 2 and fields[0]:
            if fields[1] not in label_of:
                raise DataError(f"{source}: val_annotations.txt: {fields[1]} not in wnids.txt")
            annotations[fields[0]] = label_of[fields[1]]
    test = []
    for rel in sizes:
        m = _VAL_RE.match(rel)
        if m:
            base = rel.rsplit("/", 1)[1]
            if base not in annotations:
                raise DataError(f"{source}: {base} has no line in val_annotations.txt")
            test.append((int(m.group(1)), rel, annotations[base]))
    test.sort()
    if not train or not test:
        raise DataError(f"{source}: found {len(train)} train and {len(test)} val images.")
    return TinyIndex(
        wnids=tuple(wnids),
        class_names=tuple(names),
        train=tuple((rel, label) for (label, _), rel in train),
        test=tuple((rel, label) for _, rel, label in test),
    )


def source_fingerprint(source: TinySource, index: TinyIndex) -> dict:
    """Content identity: same for a zip and its extracted folder."""
    sizes = source.sizes()
    rels = [rel for rel, _ in index.train] + [rel for rel, _ in index.test]
    return {
        "num_classes": len(index.wnids),
        "num_train": len(index.train),
        "num_test": len(index.test),
        "wnids_sha256": sha256_lines(index.wnids),
        "files_sha256": sha256_lines(f"{rel}\t{sizes[rel]}" for rel in rels + ["val/val_annotations.txt"]),
    }


def decode_image_keeping_source(data: bytes, name: str = "") -> tuple[np.ndarray, bool]:
    """(uint8 [64, 64, 3], passthrough): passthrough when ``data`` is an RGB JPEG, whose bytes the
    record store keeps as they are (they decode to exactly this image)."""
    from PIL import Image  # pylint: disable=g-import-not-at-top

    with Image.open(io.BytesIO(data)) as img:
        passthrough = img.format == "JPEG" and img.mode == "RGB"
        if img.mode != "RGB":
            img = img.convert("RGB")
        array = np.asarray(img, dtype=np.uint8)
    if array.shape != IMAGE_SHAPE:
        raise ValueError(f"{name}: expected an image of shape {IMAGE_SHAPE}, got {array.shape}.")
    return array, passthrough


class TinyImagenetZip(LocalBuilder):
    """Tiny-ImageNet (200 classes, 64x64 RGB) from the official zip layout."""

    name = "tiny_imagenet_zip"
    STORE_ENCODING = "png"  # the few non-RGB files (grey, CMYK) re-encoded losslessly
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
    DEFAULT_MANUAL_DIR = None  # TFDS default: <data_dir>/downloads/manual.
    MANUAL_FILES_HINT = "tiny-imagenet-200.zip (or an extracted tiny-imagenet-200/)"
    MANUAL_DOWNLOAD_INSTRUCTIONS = """
  Put the official Tiny-ImageNet zip, tiny-imagenet-200.zip
  (http://cs231n.stanford.edu/tiny-imagenet-200.zip), or a subset of it in the
  same layout such as tiny-imagenet-200-mini.zip, or the extracted
  tiny-imagenet-200/ folder, in the manual dir. The zip is read in place (not
  extracted). The config (full / mini / custom) must match the copy found.
  """

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=(
                "Tiny-ImageNet read from the official zip layout; labels follow the"
                " sorted-wnid convention; `test` is the official val split;"
                " records are in file order and `id` is the position in it."
            ),
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Tensor(
                        shape=IMAGE_SHAPE,
                        dtype=np.uint8,
                        encoding=tfds.features.Encoding.BYTES,
                    ),
                    # Names (from words.txt) are set when the source is read.
                    "label": tfds.features.ClassLabel(),
                    "id": tfds.features.Scalar(dtype=np.int64),
                }
            ),
            supervised_keys=("image", "label"),
            disable_shuffling=True,
            homepage="http://cs231n.stanford.edu/",
            metadata=tfds.core.MetadataDict(),
        )

    @classmethod
    def select_source(cls, manual_dir: str, config_name: str | None = None) -> tuple[TinySource, TinyIndex]:
        """Finds the one source in `manual_dir` (matching `config_name` if given)."""
        sources = find_sources(manual_dir)
        if not sources:
            raise DatasetNotFoundError(
                f"tiny_imagenet_zip: no Tiny-ImageNet zip or folder (with"
                f" wnids.txt and val/val_annotations.txt) found in {manual_dir!r}."
                f" {FIX_HINT}"
            )
        indexed = [(s, build_index(s)) for s in sources]
        if config_name is not None:
            matching = [(s, i) for s, i in indexed if i.config_name == config_name]
            if not matching:
                found = ", ".join(f"{s} ({i.config_name})" for s, i in indexed)
                raise DatasetNotFoundError(
                    f"tiny_imagenet_zip/{config_name}: no matching Tiny-ImageNet copy"
                    f" in {manual_dir!r}; found: {found}. {FIX_HINT}"
                )
            indexed = matching
        if len(indexed) > 1:
            found = ", ".join(f"{s} ({i.config_name})" for s, i in indexed)
            raise DataError(
                f"tiny_imagenet_zip: several Tiny-ImageNet copies in {manual_dir!r}:"
                f" {found}. Name the config (tiny_imagenet_zip/full, /mini,"
                " /custom) or keep a single copy there."
            )
        return indexed[0]

    @classmethod
    def inspect_source(cls, manual_dir: str, config_name: str | None = None) -> SourceInfo:
        source, index = cls.select_source(manual_dir, config_name)
        try:
            return SourceInfo(
                config_name=index.config_name,
                fingerprint=source_fingerprint(source, index),
                description=repr(source),
            )
        finally:
            source.close()

    def _split_generators(self, dl_manager):
        manual_dir = self._resolve_manual_dir(dl_manager)
        assert self.builder_config is not None  # one of BUILDER_CONFIGS (tfds types it optional)
        source, index = self.select_source(manual_dir, self.builder_config.name)
        features_of(self.info)["label"].names = list(index.class_names)
        self._record_source(
            SourceInfo(
                config_name=index.config_name,
                fingerprint=source_fingerprint(source, index),
                description=repr(source),
            )
        )
        metadata_of(self.info)["wnids"] = list(index.wnids)
        return {
            "train": self._generate_examples(source, index.train, "train"),
            "test": self._generate_examples(source, index.test, "test"),
        }

    def _generate_examples(self, source: TinySource, items, split: str = ""):
        """Yields examples in order; undecodable images are skipped and recorded.

        Reading + JPEG decoding of the next block runs in a background thread
        while TFDS serializes and writes the current one (a pipeline; more
        decoding threads do not help: per-image work is mostly under the GIL).
        The names of skipped files go to ``info.metadata['skipped_<split>']``;
        ``load_dataset(..., on_corrupt='refuse')`` refuses a dataset that has any.
        """
        block = 1024
        skipped = metadata_of(self.info).setdefault(f"skipped_{split}", [])

        errors = image_errors()

        def load(chunk):
            out = []
            for rel, _ in chunk:
                try:
                    data = source.read(rel)
                    out.append((*decode_image_keeping_source(data, rel), data))
                except errors as e:  # PIL's errors for broken files and decompression bombs
                    out.append(None)
                    skipped.append(f"{rel}: {type(e).__name__}")
            return out

        chunks = [items[s : s + block] for s in range(0, len(items), block)]
        i = 0
        for chunk, images in read_ahead(chunks, load):
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
