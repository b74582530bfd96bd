"""The official CVS CIFAR-100 sessions (ivclab/CVS ``collections/cifar100/*.json``) as a SessionPlan.

Two sources, one plan (``data.split="official"``, the default of ``configs/cifar100_*.py``):

* the PACKAGED file ``cvs_jax/data/official/cifar100_splits.npz`` (installed with the package,
  read through ``importlib.resources``; no other file needed) -- :func:`load_packaged_plan`;
* the official JSON files themselves, when ``data.official_split_dir`` points at them (they then
  win over the packaged file) -- :func:`load_official_plan`.

Both give the same plan, index for index (``tests/data/test_official_splits.py`` checks it whenever the
JSON files are at ``../shared/data/cvs-official-splits/cifar100``).

The JSON files
--------------
The official code ships, per setup and session t = 0..4,
``cifar100_{train,val}_{disjoint,blurry10,general10}_rand1_cls20_task{t}.json`` and the
setup-independent ``cifar100_test_rand1_cls20_task{t}.json``. Each file is a
JSON list of ``{"klass": <CIFAR-100 fine class name>, "file_name": "train/<klass>/<NNNN>.png" or
"test/<klass>/<NNNN>.png", "label": <protocol label in the official rand1 class order>}``.
Test file t holds all 100 test images of the classes with labels 20t..20t+19.

The packaged file
-----------------
``scripts/convert_official_splits.py`` converts the 35 JSON files (11 MB) once into a 27 kB ``.npz``
(plain arrays, no pickle; :func:`encode_json_dir` is the conversion, :data:`PACKAGED_SHA256` the
digest of its arrays, checked at every load):

* ``class_names``: ``<U`` [100], the official class order (``class_names[p]`` = name of label p);
* ``disjoint``, ``blurry10``, ``general10``: uint8 [100, 500], entry ``[p, k - 1]`` = where the
  image ``train/<class_names[p]>/<k>.png`` goes in that setup: ``2t`` = session t train,
  ``2t + 1`` = session t val, 255 = unused;
* ``test``: uint8 [100, 100], entry ``[p, k - 1]`` = the session t whose test file holds
  ``test/<class_names[p]>/<k>.png``.

Global indices into the train / test split are not stored: they depend on the dataset's labels,
and are resolved at load time exactly as for the JSON files (next section).

File name -> dataset index
--------------------------
``NNNN`` is the 1-based per-class number given by the PNG export the official code reads
(hwany-j/cifar100_png, made with ``knjcode/cifar2png``, which walks the python release
``cifar-100-python/train`` resp. ``/test`` in array order and names the k-th image of class c
``<split>/<c>/%04d.png % k``; its class names are the alphabetical CIFAR-100 fine labels, the same
as TFDS's). So

    ``<split>/<klass>/<k>.png``  ->  the k-th (1-based) position i, in increasing order, of the
    ``split`` array of the dataset with ``labels[i] == class_names.index(klass)``,

where the dataset's train (resp. test) arrays are in ORIGINAL CIFAR-100 release order. TFDS
``cifar100`` shuffles records when it prepares them; each record carries ``id`` = ``"train_%05d"`` /
``"test_%05d"``, its position in the release, and ``cvs_jax.data.sources`` puts every split back in
that order (:func:`original_order`) when it loads it. :func:`check_dataset_counts` refuses data that
cannot be the full CIFAR-100 (not 500 train / 100 test images per class), but it cannot detect a wrong
image ORDER.

Not verifiable offline: TFDS reads the BINARY release (``cifar-100-binary``), cifar2png the PYTHON
release; we assume both list the images in the same order. With internet, check it with one PNG
(``pip install cifar2png && cifar2png cifar100 cifar100png``; TFDS ``cifar100`` prepared in
ArrayRecord format)::

    import numpy as np
    from PIL import Image
    from cvs_jax.data import official_splits, sources

    ds = sources.load_dataset("cifar100", data_dir="~/tensorflow_datasets")  # release order (by id)
    for name in ("train/porcupine/0022.png", "test/fox/0100.png"):
        split, i = official_splits.resolve(name, class_names=ds.class_names,
                                           train_class_index=ds.train.labels, test_class_index=ds.test.labels)
        record = (ds.train if split == "train" else ds.test).images[i]
        assert np.array_equal(np.asarray(Image.open(f"cifar100png/{name}").convert("RGB")), record), name

If the assumption were wrong, the sessions would still have the official classes, per-class counts
and no image reuse (the mapping is a bijection within each class); only WHICH images of a class
fall into each session / into val would differ from the official runs.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.resources
import io
import json
import os
import re
from typing import Mapping, Sequence

import numpy as np

from cvs_jax.data.splits import Session, SessionPlan
from cvs_jax.errors import ConfigError, SplitError

__all__ = [
    "FILE_SETUPS",
    "OFFICIAL_DATASETS",
    "OFFICIAL_FIELDS",
    "PACKAGED_SHA256",
    "OfficialSessionPlan",
    "OfficialSplitError",
    "check_dataset_counts",
    "content_sha256",
    "encode_json_dir",
    "load_official_plan",
    "load_packaged_plan",
    "official_plan_for_dataset",
    "original_order",
    "packaged_arrays",
    "per_class_positions",
    "read_records",
    "resolve",
]

# Our setup name -> the tag in the official file names (and the tags themselves are accepted).
FILE_SETUPS = {"disjoint": "disjoint", "blurry": "blurry10", "general": "general10"}
NUM_SESSIONS = 5
CLASSES_PER_SESSION = 20
NUM_CLASSES = 100
TRAIN_PER_CLASS, TEST_PER_CLASS = 500, 100
UNUSED = 255  # packaged-file code of an image no session uses
_NAME = re.compile(r"^(?:\./)?(train|test)/([^/]+)/(\d+)\.png$")

# data.split="official" is defined for these datasets (base name, before any "/config" or ":version").
OFFICIAL_DATASETS = ("cifar100",)
# The generator fields the official files fix, per setup: with data.split="official" a config must
# leave them at these values (config_checks refuses others instead of ignoring them silently).
_COMMON_FIELDS = {
    "num_sessions": NUM_SESSIONS,
    "first_classes": CLASSES_PER_SESSION,
    "classes_per_session": CLASSES_PER_SESSION,
    "val_fraction": 0.1,
    "val_per_class": None,
}
OFFICIAL_FIELDS = {
    "disjoint": {**_COMMON_FIELDS, "samples_per_new_class": None},
    "blurry": {**_COMMON_FIELDS, "samples_per_new_class": None, "blurry_minor_percent": 10.0},
    "general": {
        **_COMMON_FIELDS,
        "samples_per_new_class": 400,
        "old_class_percent": 10.0,
        "general_shares": "uniform",
    },
}

# The packaged conversion of the JSON files (scripts/convert_official_splits.py writes it and prints
# the digest of its arrays, :func:`content_sha256`; a file with other content is refused).
PACKAGED_PACKAGE, PACKAGED_PATH = "cvs_jax.data", ("official", "cifar100_splits.npz")
PACKAGED_SHA256 = "5f6799496662ffdc1d7750b3092f9c75598460d2f2c2f1b9f99dde859778e10f"


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


def _parse(file_name: str) -> tuple[str, str, int]:
    m = _NAME.match(file_name)
    if m is None:
        raise OfficialSplitError(f"file_name {file_name!r} is not of the form train|test/<class>/<NNNN>.png")
    return m.group(1), m.group(2), int(m.group(3))


def resolve(
    file_name: str, *, class_names: Sequence[str] | Mapping[str, int], train_class_index, test_class_index
) -> tuple[str, int]:
    """``"train/fox/0007.png"`` -> ``("train", i)``: i = the 7th image of class fox in the train split.

    ``train_class_index`` / ``test_class_index``: :func:`per_class_positions` of the split's labels
    (or the label arrays themselves), in ORIGINAL CIFAR-100 order (module docstring).
    ``class_names``: the dataset's names (``class_names[c]`` = name of label c) or a name -> label dict.
    """
    split, klass, number = _parse(file_name)
    ids = _name_ids(class_names)
    if klass not in ids:
        raise OfficialSplitError(
            f"class {klass!r} of {file_name!r} is not among the dataset's class names "
            f"({len(ids)} names, e.g. {list(ids)[:3]}); is this CIFAR-100?"
        )
    c = ids[klass]
    index = _as_index(train_class_index if split == "train" else test_class_index)
    pos = index.get(c)
    if pos is None or not 1 <= number <= len(pos):
        n = 0 if pos is None else len(pos)
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


def _setup_tag(setup: str) -> tuple[str, str]:
    """``setup`` (ours or the file tag) -> (our setup name, the official file tag)."""
    tags = {**FILE_SETUPS, **{v: v for v in FILE_SETUPS.values()}}
    if setup not in tags:
        raise ConfigError(f"setup={setup!r}: the official CIFAR-100 files exist for {sorted(tags)}")
    tag = tags[setup]
    return {v: k for k, v in FILE_SETUPS.items()}[tag], tag


def _make_plan(plan_setup: str, order: np.ndarray, trains, vals, tests) -> OfficialSessionPlan:
    sessions = []
    for t in range(NUM_SESSIONS):
        for a in (trains[t], vals[t], tests[t]):
            a.setflags(write=False)
        lo = CLASSES_PER_SESSION * t
        new = np.arange(lo, lo + CLASSES_PER_SESSION, dtype=np.int64)
        new.setflags(write=False)
        outputs = NUM_CLASSES if plan_setup == "blurry" else lo + CLASSES_PER_SESSION
        sessions.append(Session(index=t, train=trains[t], val=vals[t], new_classes=new, num_outputs=outputs))
    order = np.asarray(order, np.int64)
    order.setflags(write=False)
    return OfficialSessionPlan(
        setup=plan_setup, class_order=order, sessions=tuple(sessions), test_sets=tuple(tests[:NUM_SESSIONS])
    )


def load_official_plan(
    split_dir: str, setup: str, *, train_class_index, test_class_index, class_names: Sequence[str]
) -> OfficialSessionPlan:
    """Builds the 5-session plan of the official CIFAR-100 JSON files for ``setup``.

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
    plan_setup, tag = _setup_tag(setup)
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

    trains, vals, tests = [], [], []
    for t in range(NUM_SESSIONS):
        trains.append(indices(_file(split_dir, "train", tag, t), "train"))
        vals.append(indices(_file(split_dir, "val", tag, t), "train"))
        tests.append(indices(_file(split_dir, "test", None, t), "test"))

    if sorted(label_to_klass) != list(range(NUM_CLASSES)):
        raise OfficialSplitError(f"{split_dir}: the labels in the files are not 0..99")
    order = np.asarray([names[label_to_klass[p]] for p in range(NUM_CLASSES)], np.int64)
    if np.unique(order).size != NUM_CLASSES:
        raise OfficialSplitError(f"{split_dir}: two labels name the same class")
    return _make_plan(plan_setup, order, trains, vals, tests)


# ---------------------------------------------------------------- the packaged file
def encode_json_dir(split_dir: str) -> dict[str, np.ndarray]:
    """The arrays of the packaged file (module docstring) from the 35 official JSON files in ``split_dir``.

    Refuses files that do not fit the format: a label naming two classes (or two labels one class),
    an image in two places of one setup, a number outside 1..500 (train) / 1..100 (test), labels
    other than 0..99, a test file with other classes than its session's.
    """
    label_to_klass: dict[int, str] = {}

    def records(path: str, expect_split: str):
        for r in read_records(path):
            label, klass = int(r["label"]), str(r["klass"])
            split, file_klass, number = _parse(str(r["file_name"]))
            if split != expect_split or file_klass != klass:
                raise OfficialSplitError(f"{path}: record {r} is not a {expect_split} image of its class")
            if label_to_klass.setdefault(label, klass) != klass:
                raise OfficialSplitError(
                    f"{path}: label {label} is {klass!r} here but {label_to_klass[label]!r} elsewhere"
                )
            if not 0 <= label < NUM_CLASSES:
                raise OfficialSplitError(f"{path}: label {label} is outside 0..{NUM_CLASSES - 1}")
            yield label, number

    def put(table: np.ndarray, path: str, expect_split: str, code: int) -> None:
        for label, number in records(path, expect_split):
            if not 1 <= number <= table.shape[1]:
                raise OfficialSplitError(
                    f"{path}: image number {number} of label {label} is outside 1..{table.shape[1]}"
                )
            if table[label, number - 1] != UNUSED:
                raise OfficialSplitError(f"{path}: {expect_split} image {number} of label {label} is used twice")
            table[label, number - 1] = code

    arrays: dict[str, np.ndarray] = {}
    for tag in FILE_SETUPS.values():
        table = np.full((NUM_CLASSES, TRAIN_PER_CLASS), UNUSED, np.uint8)
        for t in range(NUM_SESSIONS):
            put(table, _file(split_dir, "train", tag, t), "train", 2 * t)
            put(table, _file(split_dir, "val", tag, t), "train", 2 * t + 1)
        arrays[tag] = table
    test = np.full((NUM_CLASSES, TEST_PER_CLASS), UNUSED, np.uint8)
    for t in range(NUM_SESSIONS):
        put(test, _file(split_dir, "test", None, t), "test", t)
    want = np.repeat(np.arange(NUM_SESSIONS, dtype=np.uint8), CLASSES_PER_SESSION)[:, None]
    if not np.array_equal(test, np.broadcast_to(want, test.shape)):
        raise OfficialSplitError(f"{split_dir}: test file t must hold all 100 test images of labels 20t..20t+19")
    if sorted(label_to_klass) != list(range(NUM_CLASSES)):
        raise OfficialSplitError(f"{split_dir}: the labels in the files are not 0..99")
    names = [label_to_klass[p] for p in range(NUM_CLASSES)]
    if len(set(names)) != NUM_CLASSES:
        raise OfficialSplitError(f"{split_dir}: two labels name the same class")
    arrays["test"] = test
    arrays["class_names"] = np.asarray(names, dtype=str)
    return arrays


def content_sha256(arrays: Mapping[str, np.ndarray]) -> str:
    """Digest of the arrays' names, dtypes, shapes and bytes (independent of zip timestamps / zlib)."""
    h = hashlib.sha256()
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(f"{key}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def packaged_arrays() -> dict[str, np.ndarray]:
    """The arrays of the packaged file (read-only), read once through ``importlib.resources``."""
    ref = importlib.resources.files(PACKAGED_PACKAGE)
    for part in PACKAGED_PATH:
        ref = ref.joinpath(part)
    where = f"{PACKAGED_PACKAGE.replace('.', '/')}/{'/'.join(PACKAGED_PATH)}"
    fix = (
        "reinstall cvs_jax, or regenerate it from the official JSON files with "
        "`python scripts/convert_official_splits.py --split_dir DIR`"
    )
    try:
        data = ref.read_bytes()
    except OSError as e:
        raise OfficialSplitError(f"the packaged official CIFAR-100 split file {where} is missing; {fix}") from e
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError) as e:
        raise OfficialSplitError(
            f"the packaged official CIFAR-100 split file {where} is unreadable ({e}); {fix}"
        ) from e
    digest = content_sha256(arrays)
    if digest != PACKAGED_SHA256:
        raise OfficialSplitError(
            f"the packaged official CIFAR-100 split file {where} has content digest {digest}, "
            f"expected {PACKAGED_SHA256}; {fix}"
        )
    for a in arrays.values():
        a.setflags(write=False)
    return arrays


def load_packaged_plan(
    setup: str, *, train_class_index, test_class_index, class_names: Sequence[str]
) -> OfficialSessionPlan:
    """:func:`load_official_plan` from the packaged file instead of the JSON files (same arguments, same plan)."""
    plan_setup, tag = _setup_tag(setup)
    arrays = packaged_arrays()
    names = _name_ids(class_names)
    official = [str(n) for n in arrays["class_names"]]
    missing = [n for n in official if n not in names]
    if missing:
        raise OfficialSplitError(
            f"class {missing[0]!r} of the official CIFAR-100 order is not among the dataset's class names "
            f"({len(names)} names, e.g. {list(names)[:3]}); is this CIFAR-100?"
        )
    order = np.asarray([names[n] for n in official], np.int64)

    def positions(index, per_class: int, split: str) -> np.ndarray:
        """[p, k - 1] -> dataset index of image ``<split>/<official[p]>/<k>.png``."""
        index = _as_index(index)
        out = np.empty((NUM_CLASSES, per_class), np.int64)
        for p, c in enumerate(order.tolist()):
            pos = index.get(c)
            if pos is None or len(pos) < per_class:
                n = 0 if pos is None else len(pos)
                raise OfficialSplitError(
                    f"the official files number {per_class} {split} images of class {official[p]!r}, the "
                    f"dataset's {split} split has {n}; the official files need the full CIFAR-100"
                )
            out[p] = pos[:per_class]
        return out

    table, test = arrays[tag], arrays["test"]
    train_pos = positions(train_class_index, table.shape[1], "train")
    test_pos = positions(test_class_index, test.shape[1], "test")
    trains = [np.sort(train_pos[table == 2 * t]) for t in range(NUM_SESSIONS)]
    vals = [np.sort(train_pos[table == 2 * t + 1]) for t in range(NUM_SESSIONS)]
    tests = [np.sort(test_pos[test == t]) for t in range(NUM_SESSIONS)]
    return _make_plan(plan_setup, order, trains, vals, tests)


def official_plan_for_dataset(split_dir: str | None, setup: str, dataset) -> OfficialSessionPlan:
    """The official plan for a loaded ``sources.ImageDataset`` (CIFAR-100 in ORIGINAL order).

    ``split_dir``: a folder of the official JSON files (:func:`load_official_plan`), or None for the
    packaged file (:func:`load_packaged_plan`).
    """
    check_dataset_counts(dataset.train.labels, dataset.test.labels, dataset.class_names)
    train_index, test_index = per_class_positions(dataset.train.labels), per_class_positions(dataset.test.labels)
    index = dict(train_class_index=train_index, test_class_index=test_index)
    if split_dir is None:
        return load_packaged_plan(setup, **index, class_names=dataset.class_names)
    return load_official_plan(split_dir, setup, **index, class_names=dataset.class_names)
