"""Product-M of the CVS paper (`product_m`), from the Product-10K training set.

Product-10K (https://products-10k.github.io/) labels only its training set.
The paper: "We remove the category with fewer than 20 images in the training
set. We then construct the train-test split based on the original training set
because the official testing data do not offer labels. Finally, there are
2,743 classes." It gives no test ratio; ours (TEST_PERCENT) is our choice.

Manual dir (read in place, nothing extracted):

  train.csv            official, columns name,class,group (header row)
  train/<name>         the training images, or instead:
  train.zip            holding train/<name> (or <name> at its top level)

When both train/ and train.zip are there, train/ is read.

Rule (deterministic; the parameters are module constants, read at
preparation and part of the source fingerprint):
1. Keep the classes with >= MIN_IMAGES_PER_CLASS (20) rows in train.csv
   (counted from the csv; an image that later fails to decode is skipped and
   recorded, it does not change the classes).
2. New labels 0..K-1 follow the sorted (numeric) original class ids; class
   names are those ids as strings.
3. `rng = np.random.default_rng(SEED)` (SEED = 0). For each kept class in
   label order, its images sorted by file name (string order), test =
   `sorted(rng.choice(n, n * TEST_PERCENT // 100, replace=False))` (20%,
   floored: >= 4 per class), train = the rest.
4. Both splits stored ordered by (label, file name); images resized to
   shorter side 256 and centre-cropped to 256x256 (see `resize`).
Metadata: `source_classes` (original id of each label), `skipped_<split>` (undecodable); the
store's `<split>.sources.txt` names the file of each record.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import hashlib
import io
import os

import numpy as np

from cvs_jax.data.builders import resize
from cvs_jax.data.builders._common import LocalSource, SourceInfo, ZipOrFolder
from cvs_jax.errors import DataError, DatasetNotFoundError

# Read at preparation time (tests patch them).
MIN_IMAGES_PER_CLASS = 20
TEST_PERCENT = 20
SEED = 0

CSV_NAME = "train.csv"
LAYOUT_HINT = (
    "Expected layout: DIR/train.csv (official, columns name,class,group) and"
    " the training images as DIR/train/<name> or in DIR/train.zip. Fix:"
    " download them from https://products-10k.github.io/ and set"
    " --config.data.manual_dir=DIR."
)


class ImageFiles(ZipOrFolder):
    """The training images: a `train/` folder or `train.zip`, by file name."""

    def __init__(self, manual_dir: str):
        self.folder = os.path.join(manual_dir, "train")
        self.zip_path = self.archive = os.path.join(manual_dir, "train.zip")
        self.is_zip = not os.path.isdir(self.folder)
        if not self.is_zip:
            self.members = {n: n for n in os.listdir(self.folder)}
        elif os.path.isfile(self.zip_path):
            self.members = {}
            for member in self._zipfile().namelist():
                name = member[len("train/") :] if member.startswith("train/") else (member if "/" not in member else "")
                if name and not member.endswith("/"):
                    self.members[name] = member
        else:
            raise DatasetNotFoundError(
                f"product_m: neither the folder {self.folder!r} nor {self.zip_path!r} exists. {LAYOUT_HINT}"
            )

    @property
    def description(self) -> str:
        return self.zip_path if self.is_zip else self.folder

    def _member(self, name: str) -> str:
        return self.members[name]

    def _file(self, name: str) -> str:
        return os.path.join(self.folder, name)


@dataclasses.dataclass(frozen=True)
class CsvIndex:
    sha256: str
    rows: tuple[tuple[str, int], ...]  # (file name, original class), csv order.


def read_csv(manual_dir: str) -> CsvIndex:
    path = os.path.join(manual_dir, CSV_NAME)
    if not os.path.isfile(path):
        raise DatasetNotFoundError(f"product_m: {CSV_NAME} not found in {manual_dir!r}. {LAYOUT_HINT}")
    with open(path, "rb") as f:
        data = f.read()
    reader = csv.DictReader(io.StringIO(data.decode("utf-8-sig")))
    if not {"name", "class"} <= set(reader.fieldnames or ()):
        raise DataError(
            f"product_m: {path} has columns {reader.fieldnames}; expected name,class,group (the official train.csv)."
        )
    rows = []
    for line, row in enumerate(reader, start=2):
        try:
            rows.append((row["name"], int(row["class"])))
        except (TypeError, ValueError) as e:
            raise DataError(f"product_m: {path}:{line}: bad row {row}.") from e
    if not rows:
        raise DataError(f"product_m: {path} has no rows.")
    return CsvIndex(sha256=hashlib.sha256(data).hexdigest(), rows=tuple(rows))


def open_source(manual_dir: str) -> tuple[CsvIndex, ImageFiles]:
    """Reads the csv and lists the images (cheap); raises if anything is missing."""
    absent = []
    if not os.path.isfile(os.path.join(manual_dir, CSV_NAME)):
        absent.append(CSV_NAME)
    if not (os.path.isdir(os.path.join(manual_dir, "train")) or os.path.isfile(os.path.join(manual_dir, "train.zip"))):
        absent.append("train/ (or train.zip)")
    if absent:
        raise DatasetNotFoundError(
            f"product_m: missing in manual dir {manual_dir!r}: {' and '.join(absent)}. {LAYOUT_HINT}"
        )
    index = read_csv(manual_dir)
    images = ImageFiles(manual_dir)
    missing = [name for name, _ in index.rows if name not in images.members]
    if missing:
        images.close()
        raise DatasetNotFoundError(
            f"product_m: {len(missing)} image(s) named in {CSV_NAME} are not in"
            f" {images.description!r} (e.g. {missing[:3]}). {LAYOUT_HINT}"
        )
    return index, images


def selection_params() -> dict:
    return {"min_images_per_class": MIN_IMAGES_PER_CLASS, "test_percent": TEST_PERCENT, "seed": SEED}


@dataclasses.dataclass(frozen=True)
class Split:
    source_classes: tuple[int, ...]  # Original id of each new label.
    train: tuple[tuple[str, int], ...]  # (file name, new label), stored order.
    test: tuple[tuple[str, int], ...]


def split(rows, *, min_images_per_class: int, test_percent: int, seed: int) -> Split:
    """Steps 1-4 of the module docstring."""
    files = collections.defaultdict(list)
    for name, cls in rows:
        files[cls].append(name)
    kept = sorted(c for c, names in files.items() if len(names) >= min_images_per_class)
    if not kept:
        raise DataError(f"product_m: no class has >= {min_images_per_class} images.")
    rng = np.random.default_rng(seed)
    train, test = [], []
    for label, cls in enumerate(kept):
        names = sorted(files[cls])
        n = len(names)
        is_test = np.zeros(n, bool)
        is_test[rng.choice(n, size=n * test_percent // 100, replace=False)] = True
        train += [(name, label) for name, t in zip(names, is_test) if not t]
        test += [(name, label) for name, t in zip(names, is_test) if t]
    return Split(source_classes=tuple(kept), train=tuple(train), test=tuple(test))


def fingerprint(index: CsvIndex, size: int) -> dict:
    return {"csv_sha256": index.sha256, "num_images": len(index.rows), "stored_size": size, **selection_params()}


class ProductMSource(LocalSource):
    """Product-M: Product-10K train classes with >= 20 images, seeded 80/20 split."""

    name = "product_m"
    DEFAULT_MANUAL_DIR = None  # TFDS default: <data_dir>/downloads/manual.
    MANUAL_FILES_HINT = "train.csv and train/ (or train.zip) of Product-10K"

    @classmethod
    def inspect_source(cls, manual_dir: str, config_name: str | None = None) -> SourceInfo:
        index, images = open_source(manual_dir)
        images.close()
        return SourceInfo(
            config_name=None, fingerprint=fingerprint(index, resize.stored_size()), description=images.description
        )
