"""iNat-M of the CVS paper (`inat_m`), from TFDS's `i_naturalist2017`.

The paper: "We sample 527 images per class for the 200 classes; each contains
at least 527 samples". It does not say which 200 of the eligible classes, nor
which 527 images, so this builder fixes one deterministic choice:

1. Source: TFDS `i_naturalist2017` (5,089 classes; train 579,184, validation
   95,986; its test split has no labels and is not used), prepared in
   `data_dir` in array_record. Its records are ordered by their `id` (the
   image file's base name, stable across preparations), not by position.
2. Eligible classes: source labels with >= MIN_TRAIN_PER_CLASS (527) train
   images.
3. `rng = np.random.default_rng(SEED)` (SEED = 0); the classes are
   `sorted(rng.choice(sorted(eligible), NUM_CLASSES, replace=False))`.
4. New labels 0..199 follow the sorted source label ids; class names = the
   source names (species).
5. For each class in that order, with the same rng:
   `sorted(rng.choice(n_c, TRAIN_PER_CLASS, replace=False))` picks positions
   in the class's id-sorted train records.
6. `test` = ALL validation images of the 200 classes.
Both splits are stored ordered by (new label, source id); images resized to
shorter side 256 and centre-cropped to 256x256 (see `resize`).

Audit trail in the metadata: `source_classes` (source label of each new
label); the store's `<split>.sources.txt` names the source `id` of each stored
record, by our `id`).

Preparing the source: `tfds build i_naturalist2017 --data_dir=DIR
--file_format=array_record` on a machine with TensorFlow and internet. TFDS
downloads train_val_images.tar.gz (~199 GB), test2017.tar.gz (~56 GB) and
train_val2017.zip from the 2017 competition URLs registered in TFDS
(vision.caltech.edu); its checksum list names no files for a manual dir, so
those URLs must still serve the files (not checked here: no internet).
Preparing `inat_m` then reads the whole train split once for the labels, and
the ~105k chosen + validation images a second time.
"""

from __future__ import annotations

import numpy as np

from cvs_jax.data.builders._tfds_source import DerivedSource, Plan, SourceDescription, SourceSplit
from cvs_jax.errors import DataError

SOURCE_NAME = "i_naturalist2017"
# Read at preparation time (tests patch them small).
SEED = 0
NUM_CLASSES = 200
MIN_TRAIN_PER_CLASS = 527
TRAIN_PER_CLASS = 527


def select(
    train: SourceSplit,
    test: SourceSplit,
    class_names,
    *,
    seed: int,
    num_classes: int,
    min_train_per_class: int,
    train_per_class: int,
) -> Plan:
    """The selection of the module docstring (steps 2-6)."""
    if train_per_class > min_train_per_class:
        raise ValueError(f"inat_m: TRAIN_PER_CLASS={train_per_class} > MIN_TRAIN_PER_CLASS={min_train_per_class}.")
    counts = np.bincount(train.labels, minlength=len(class_names))
    eligible = np.flatnonzero(counts >= min_train_per_class)
    if len(eligible) < num_classes:
        raise DataError(
            f"inat_m: only {len(eligible)} classes of {SOURCE_NAME} have >="
            f" {min_train_per_class} train images; {num_classes} are needed."
            " Is the source complete?"
        )
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(eligible, size=num_classes, replace=False))
    new_label = {int(c): i for i, c in enumerate(chosen)}

    def by_class(split: SourceSplit):
        groups = {c: [] for c in new_label}
        for p in sorted(range(len(split.keys)), key=lambda p: split.keys[p]):
            label = int(split.labels[p])
            if label in groups:
                groups[label].append(p)
        return groups

    train_groups, test_groups = by_class(train), by_class(test)
    train_records, test_records = [], []
    for c in chosen:
        c = int(c)
        positions = train_groups[c]
        picks = np.sort(rng.choice(len(positions), size=train_per_class, replace=False))
        train_records += [(positions[k], new_label[c]) for k in picks]
        test_records += [(p, new_label[c]) for p in test_groups[c]]
    return Plan(
        class_names=tuple(class_names[int(c)] for c in chosen),
        source_classes=tuple(int(c) for c in chosen),
        records={"train": train_records, "test": test_records},
    )


class InatMSource(DerivedSource):
    """iNat-M: 200 iNat-2017 classes x 527 train images, their validation as test (the TFDS half:
    ``tfds_builders.InatM``)."""

    name = "inat_m"
    SOURCE_NAME = SOURCE_NAME
    SOURCE_SPLITS = {"train": "train", "test": "validation"}
    KEY_FEATURE = "id"

    @classmethod
    def selection_params(cls):
        return {
            "seed": SEED,
            "num_classes": NUM_CLASSES,
            "min_train_per_class": MIN_TRAIN_PER_CLASS,
            "train_per_class": TRAIN_PER_CLASS,
        }

    @classmethod
    def plan(cls, source: SourceDescription, splits: dict[str, SourceSplit]) -> Plan:
        return select(splits["train"], splits["test"], source.class_names, **cls.selection_params())
