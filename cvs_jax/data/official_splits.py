"""The official CVS CIFAR-100 session files (ivclab/CVS ``collections/cifar100/*.json``) as a SessionPlan.

The official code ships, per setup and session t = 0..4,
``cifar100_{train,val}_{disjoint,blurry10,general10}_rand1_cls20_task{t}.json`` and the
setup-independent ``cifar100_test_rand1_cls20_task{t}.json`` (spec §2.1-§2.5). Each file is a
JSON list of ``{"klass": <CIFAR-100 fine class name>, "file_name": "train/<klass>/<NNNN>.png" or
"test/<klass>/<NNNN>.png", "label": <protocol label in the official rand1 class order>}``.

File name -> dataset index (ASSUMPTION, could not be verified offline)
----------------------------------------------------------------------
``NNNN`` is the 1-based per-class number given by the PNG export the official code reads
(hwany-j/cifar100_png; the PNG tar itself is a Git-LFS object, not available). That export has the
layout of ``knjcode/cifar2png``, which walks the python release (``cifar-100-python/train`` resp.
``/test``) in array order and names the k-th image of class c ``<split>/<c>/%04d.png % k``. So we map

    ``<split>/<klass>/<k>.png``  ->  the k-th (1-based) position i, in increasing order, of the
    ``split`` array of the dataset with ``labels[i] == class_names.index(klass)``,

where the dataset's train (resp. test) arrays MUST be in ORIGINAL CIFAR-100 order (the array order
of the python release that cifar2png reads; TFDS reads the binary release, whose order we assume
to be the same -- both hold the same 50,000 / 10,000 images; not verifiable offline). TFDS ``cifar100``
shuffles records when it prepares them; each record carries ``id`` = ``"train_%05d"`` /
``"test_%05d"``, its position in the original order. A loader must therefore sort by that id before
using this module: read ``record["id"]`` and
reorder the split with :func:`original_order` (``cvs_jax.data.sources._read_generic_split`` currently
does not read ``id``). :func:`check_dataset_counts` refuses data that cannot be the full CIFAR-100
(not 500 train / 100 test images per class), but it cannot detect a wrong image ORDER.

If the assumption were wrong, the sessions would still have the official classes, per-class counts
and no image reuse (the mapping is a bijection within each class); only WHICH images of a class
fall into each session / into val would differ from the official runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Mapping, Sequence

import numpy as np

from cvs_jax.data.splits import Session, SessionPlan
from cvs_jax.errors import ConfigError, SplitError

__all__ = [
    "FILE_SETUPS",
    "OfficialSessionPlan",
    "OfficialSplitError",
    "check_dataset_counts",
    "load_official_plan",
    "official_plan_for_dataset",
    "original_order",
    "per_class_positions",
    "read_records",
    "resolve",
]

# Our setup name -> the tag in the official file names (and the tags themselves are accepted).
FILE_SETUPS = {"disjoint": "disjoint", "blurry": "blurry10", "general": "general10"}
NUM_SESSIONS = 5
CLASSES_PER_SESSION = 20
NUM_CLASSES = 100
_NAME = re.compile(r"^(?:\./)?(train|test)/([^/]+)/(\d+)\.png$")


class OfficialSplitError(SplitError):
    """The split files or the dataset do not fit the official CIFAR-100 protocol."""


# ---------------------------------------------------------------- file name -> index
def per_class_positions(labels: np.ndarray) -> dict[int, np.ndarray]:
    """``{class_id: positions}``: the indices ``i`` with ``labels[i] == class_id``, increasing.

    ``positions[k - 1]`` is the image the PNG export called ``<class>/%04d.png % k``.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array, got shape {labels.shape} dtype {labels.dtype}")
    order = np.argsort(labels, kind="stable")  # grouped by class, increasing within
    classes, starts = np.unique(labels[order], return_index=True)
    groups = np.split(order.astype(np.int64), starts[1:])
    out = {}
    for c, g in zip(classes.tolist(), groups):
        g.setflags(write=False)
        out[int(c)] = g
    return out


def _as_index(x) -> Mapping[int, np.ndarray]:
    return x if isinstance(x, Mapping) else per_class_positions(np.asarray(x))


def _name_ids(class_names) -> Mapping[str, int]:
    if isinstance(class_names, Mapping):
        return class_names
    return {str(n): i for i, n in enumerate(class_names)}


def resolve(
    file_name: str, *, class_names: Sequence[str] | Mapping[str, int], train_class_index, test_class_index
) -> tuple[str, int]:
    """``"train/fox/0007.png"`` -> ``("train", i)``: i = the 7th image of class fox in the train split.

    ``train_class_index`` / ``test_class_index``: :func:`per_class_positions` of the split's labels
    (or the label arrays themselves), in ORIGINAL CIFAR-100 order (module docstring).
    ``class_names``: the dataset's names (``class_names[c]`` = name of label c) or a name -> label dict.
    """
    m = _NAME.match(file_name)
    if m is None:
        raise OfficialSplitError(f"file_name {file_name!r} is not of the form train|test/<class>/<NNNN>.png")
    split, klass, number = m.group(1), m.group(2), int(m.group(3))
    ids = _name_ids(class_names)
    if klass not in ids:
        raise OfficialSplitError(
            f"class {klass!r} of {file_name!r} is not among the dataset's class names "
            f"({len(ids)} names, e.g. {list(ids)[:3]}); is this CIFAR-100?"
        )
    c = ids[klass]
    index = _as_index(train_class_index if split == "train" else test_class_index)
    pos = index.get(c)
    n = 0 if pos is None else len(pos)
    if not 1 <= number <= n:
        raise OfficialSplitError(
            f"{file_name!r}: image number {number} but the dataset's {split} split has "
            f"{n} images of class {klass!r}; the official files need the full CIFAR-100"
        )
    return split, int(pos[number - 1])


def original_order(ids: Sequence) -> np.ndarray:
    """Permutation that puts TFDS records in original CIFAR order, from their ``id`` features.

    ``ids`` are ``"train_01234"``-style strings (or bytes); returns ``perm`` such that
    ``split.images[perm]`` is in original order (``perm[j]`` = the record with id number j).
    """
    nums = np.empty(len(ids), np.int64)
    for j, s in enumerate(ids):
        s = s.decode() if isinstance(s, (bytes, np.bytes_)) else str(s)
        m = re.search(r"(\d+)$", s)
        if m is None:
            raise ValueError(f"record id {s!r} has no trailing number (expected e.g. 'train_01234')")
        nums[j] = int(m.group(1))
    perm = np.argsort(nums, kind="stable")
    if not np.array_equal(nums[perm], np.arange(len(ids))):
        raise ValueError("record ids are not a permutation of 0..N-1; cannot restore the original order")
    return perm


def check_dataset_counts(train_labels: np.ndarray, test_labels: np.ndarray, class_names: Sequence[str]) -> None:
    """Refuse data that cannot be the full CIFAR-100 (100 classes x 500 train / 100 test)."""
    if len(class_names) != NUM_CLASSES:
        raise OfficialSplitError(
            f"the official CIFAR-100 split files need 100 classes, the dataset has {len(class_names)}"
        )
    for split, labels, want in (("train", train_labels, 500), ("test", test_labels, 100)):
        cnt = np.bincount(np.asarray(labels, np.int64), minlength=NUM_CLASSES)
        bad = np.flatnonzero(cnt != want)
        if bad.size:
            raise OfficialSplitError(
                f"{split} split: class {int(bad[0])} ({class_names[bad[0]]}) has "
                f"{int(cnt[bad[0]])} images, the official files need {want} per class "
                f"(full CIFAR-100, original order)"
            )


# ---------------------------------------------------------------- the plan
@dataclasses.dataclass(frozen=True, eq=False)
class OfficialSessionPlan(SessionPlan):
    """A SessionPlan whose test queries come from the official test files.

    ``test_sets[t]``: sorted test-split indices of ``cifar100_test_rand1_cls20_task{t}.json``.
    """

    test_sets: tuple[np.ndarray, ...] = ()

    def test_queries(self, s: int, test_protocol_labels: np.ndarray | None = None) -> np.ndarray:
        """Union of the official test files 0..s (blurry: all of them), sorted test-split indices.

        ``test_protocol_labels`` is accepted for API compatibility; it is only used to check that
        the result agrees with the label rule of :meth:`SessionPlan.test_queries`.
        """
        self._check(s)
        last = len(self.test_sets) - 1 if self.setup == "blurry" else s
        out = np.sort(np.concatenate([self.test_sets[u] for u in range(last + 1)]))
        if test_protocol_labels is not None:
            by_label = super().test_queries(s, test_protocol_labels)
            if not np.array_equal(out, by_label):
                raise OfficialSplitError(
                    f"session {s}: the official test files select {out.size} test images "
                    f"but the seen classes have {by_label.size}; dataset/label mismatch"
                )
        return out


def read_records(path: str) -> list[dict]:
    if not os.path.isfile(path):
        raise OfficialSplitError(
            f"official split file {path} is missing; copy the ivclab/CVS "
            f"collections/cifar100/*.json files into {os.path.dirname(path) or '.'}"
        )
    with open(path) as f:
        records = json.load(f)
    if not isinstance(records, list) or not all(
        isinstance(r, dict) and {"klass", "file_name", "label"} <= r.keys() for r in records
    ):
        raise OfficialSplitError(f"{path}: expected a JSON list of {{klass, file_name, label}} records")
    return records


def _file(split_dir: str, kind: str, tag: str | None, t: int) -> str:
    mid = f"{kind}_{tag}" if tag else kind
    return os.path.join(split_dir, f"cifar100_{mid}_rand1_cls20_task{t}.json")


def load_official_plan(
    split_dir: str, setup: str, *, train_class_index, test_class_index, class_names: Sequence[str]
) -> OfficialSessionPlan:
    """Builds the 5-session plan of the official CIFAR-100 files for ``setup``.

    Args:
      split_dir: folder with the official JSON files (e.g. ``../shared/data/cvs-official-splits/cifar100``).
      setup: ``disjoint``, ``blurry`` (= ``blurry10``) or ``general`` (= ``general10``).
      train_class_index / test_class_index: :func:`per_class_positions` of the dataset's train /
        test labels (or the label arrays), in ORIGINAL CIFAR-100 order (see module docstring).
      class_names: the dataset's class names; ``class_names[c]`` = name of original label c.

    Returns an :class:`OfficialSessionPlan`: sessions (sorted train-split indices of the train / val
    files), ``class_order`` from the JSON labels, ``num_outputs`` = 100 (blurry) or 20 (t+1), and
    ``test_queries(s)`` = indices of the union of the official test files 0..s (blurry: all).
    """
    tags = {**FILE_SETUPS, **{v: v for v in FILE_SETUPS.values()}}
    if setup not in tags:
        raise ConfigError(f"setup={setup!r}: the official CIFAR-100 files exist for {sorted(tags)}")
    tag = tags[setup]
    plan_setup = {v: k for k, v in FILE_SETUPS.items()}[tag]
    train_index, test_index = _as_index(train_class_index), _as_index(test_class_index)
    names = _name_ids(class_names)

    label_to_klass: dict[int, str] = {}
    seen_files: dict[str, str] = {}

    def indices(path: str, expect_split: str) -> np.ndarray:
        out = []
        for r in read_records(path):
            label, klass, fname = int(r["label"]), str(r["klass"]), str(r["file_name"])
            if label_to_klass.setdefault(label, klass) != klass:
                raise OfficialSplitError(
                    f"{path}: label {label} is {klass!r} here but {label_to_klass[label]!r} elsewhere"
                )
            if fname in seen_files:
                raise OfficialSplitError(f"{fname} appears in both {seen_files[fname]} and {path}")
            seen_files[fname] = path
            split, i = resolve(fname, class_names=names, train_class_index=train_index, test_class_index=test_index)
            if split != expect_split or fname.split("/")[-2] != klass:
                raise OfficialSplitError(f"{path}: record {r} is not a {expect_split} image of its class")
            out.append(i)
        return np.sort(np.asarray(out, np.int64))

    sessions, test_sets = [], []
    for t in range(NUM_SESSIONS):
        train = indices(_file(split_dir, "train", tag, t), "train")
        val = indices(_file(split_dir, "val", tag, t), "train")
        test = indices(_file(split_dir, "test", None, t), "test")
        for a in (train, val, test):
            a.setflags(write=False)
        lo = CLASSES_PER_SESSION * t
        new = np.arange(lo, lo + CLASSES_PER_SESSION, dtype=np.int64)
        new.setflags(write=False)
        outputs = NUM_CLASSES if plan_setup == "blurry" else lo + CLASSES_PER_SESSION
        sessions.append(Session(index=t, train=train, val=val, new_classes=new, num_outputs=outputs))
        test_sets.append(test)

    if sorted(label_to_klass) != list(range(NUM_CLASSES)):
        raise OfficialSplitError(f"{split_dir}: the labels in the files are not 0..99")
    order = np.asarray([names[label_to_klass[p]] for p in range(NUM_CLASSES)], np.int64)
    if np.unique(order).size != NUM_CLASSES:
        raise OfficialSplitError(f"{split_dir}: two labels name the same class")
    order.setflags(write=False)
    return OfficialSessionPlan(
        setup=plan_setup, class_order=order, sessions=tuple(sessions), test_sets=tuple(test_sets)
    )


def official_plan_for_dataset(split_dir: str, setup: str, dataset) -> OfficialSessionPlan:
    """:func:`load_official_plan` for a loaded ``sources.ImageDataset`` (CIFAR-100 in ORIGINAL order)."""
    check_dataset_counts(dataset.train.labels, dataset.test.labels, dataset.class_names)
    return load_official_plan(
        split_dir,
        setup,
        train_class_index=per_class_positions(dataset.train.labels),
        test_class_index=per_class_positions(dataset.test.labels),
        class_names=dataset.class_names,
    )
