"""Tiny-ImageNet from the official zip (read in place): its files (this module, no TFDS) and their TFDS
builder (``tfds_builders.TinyImagenetZip``).

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

from cvs_jax.data.builders._common import LocalSource, SourceInfo, ZipOrFolder, sha256_lines
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


class TinyImagenetZipSource(LocalSource):
    """Tiny-ImageNet (200 classes, 64x64 RGB) from the official zip layout."""

    name = "tiny_imagenet_zip"
    STORE_ENCODING = "png"  # the few non-RGB files (grey, CMYK) re-encoded losslessly
    CONFIG_NAMES = tuple(CONFIG_TRAIN_PER_CLASS)  # full / mini / custom: see the builder's configs
    DEFAULT_MANUAL_DIR = None  # TFDS default: <data_dir>/downloads/manual.
    MANUAL_FILES_HINT = "tiny-imagenet-200.zip (or an extracted tiny-imagenet-200/)"

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
