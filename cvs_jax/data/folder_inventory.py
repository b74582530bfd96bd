"""Inventory of a user's own labelled images (pure Python + numpy; no TensorFlow, no image decoding).

:func:`scan` lists the images, their classes, their train/test split and (manifest only) their
session, and :class:`Inventory` carries the result; another module decodes the files into records.

Layouts of ``source``
---------------------
Checked in this order (the first that applies wins):

1. **Manifest**: ``source`` is a CSV file, or a directory holding ``manifest.csv``. The manifest wins
   over any folders next to it (they are not scanned). Header row required; columns
   ``path,label[,split][,session]`` in any order (other columns are refused). ``path`` is relative
   to the CSV's folder (the *root*) or absolute; ``label`` is the class name (a string);
   ``split`` is ``train`` or ``test``; ``session`` is a positive integer, 1-based, required on
   every train row when the column exists (test rows may leave it empty); it is stored 0-based.
2. **train/test folders**: a directory with ``train/<class>/...`` and optionally ``test/<class>/...``;
   the two are the splits. ``test/`` without ``train/`` is refused. Other entries of the directory
   are ignored ("not in train/ or test/").
3. **Class folders**: a directory of ``<class>/...`` folders.

In folder layouts every image anywhere below ``<class>/`` (nested folders included) belongs to that
class; the class name is the folder name. Class names are sorted (``str`` order) and label ``i`` is
``class_names[i]`` (manifest: the sorted labels of the train rows).

Ignored and counted in ``Inventory.ignored`` (never an error), one count per skipped directory
entry (a skipped folder counts once): ``"not an image"`` (extension not in
:data:`IMAGE_EXTENSIONS`, case-insensitive, or not a regular file), ``"hidden"`` (name starting
with ``.``; hidden folders are not entered), ``"symlink outside root"`` (a symlink whose target
resolves outside the root), ``"broken symlink"``, ``"symlink loop"`` (a folder symlink to one of
its own parents), ``"not in a class folder"`` (a file directly in the root, or in ``train/`` /
``test/``) and ``"not in train/ or test/"``. One file is neither an entry nor counted: ``rows.json``
directly in the root of class folders (:data:`FOLDER_RECORD`, the record ``update --from_added`` writes
beside the class folders it lays out; not a photo). Symlinks whose targets stay inside the root are
followed. In a manifest, a row is ignored as ``"hidden"`` if a component of its path below the root
starts with ``.`` and as ``"symlink outside root"`` if its path lies in the root but resolves outside
it; a path written outside the root (absolute, or with ``..``) is taken as written. A manifest row
naming a missing file or a file with a non-image extension is refused, not ignored.

Test split when none is given (class folders; a manifest without a ``split`` column)
---------------------------------------------------------------------------------
``rng = np.random.default_rng(seed)`` is made once. For each class in label order, its n entries
sorted by ``rel`` (``str`` order), ``k = min(floor(n * test_fraction), n - 1)`` and the entries at
positions ``rng.choice(n, k, replace=False)`` are test, the rest train (``rng.choice`` is called for
every class, also when k = 0). So every class keeps at least one train image.
``floor(n * test_fraction)`` is computed on the exact decimal value of ``test_fraction``
(``0.3`` is 3/10), so binary rounding never moves a count.

Both splits are ordered by ``(label, rel)``. Entries of a manifest with a ``session`` column carry it;
with a drawn split the test entries keep theirs, so a session can lose rows to the test split.
"""

from __future__ import annotations

import collections
import contextlib
import csv
import dataclasses
import hashlib
import math
import os
import pathlib
from fractions import Fraction

import numpy as np

from cvs_jax.errors import DataError
from cvs_jax.rundir import paths

__all__ = ["FOLDER_RECORD", "IMAGE_EXTENSIONS", "MANIFEST_NAME", "Entry", "Inventory", "scan"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp")  # compared case-insensitively
MANIFEST_NAME = "manifest.csv"
FOLDER_RECORD = paths.FROM_ADDED_RECORD  # a from_added folder's record of its rows (added_session.py): skipped
MANIFEST_COLUMNS = ("path", "label", "split", "session")
SPLITS = ("train", "test")


@dataclasses.dataclass(frozen=True)
class Entry:
    path: str  # absolute, normalised path of the file (as reached from the root; symlinks not resolved)
    rel: str  # path relative to the root (posix), what is stored and shown; absolute if outside the root
    label: int  # index into Inventory.class_names
    session: int | None  # 0-based session from the manifest's ``session`` column (1-based there), else None
    size: int = -1  # file size in bytes at scan time (for the fingerprint)


@dataclasses.dataclass(frozen=True)
class Inventory:
    root: str  # absolute folder the entries are relative to (the manifest's folder for a CSV)
    kind: str  # "folders" | "manifest"
    class_names: tuple[str, ...]  # sorted (str order) folder names / manifest labels
    train: tuple[Entry, ...]  # ordered by (label, rel)
    test: tuple[Entry, ...]  # ordered by (label, rel)
    test_given: bool  # False: the test split was drawn by scan (seeded, stratified)
    ignored: dict[str, int]  # reason -> count of skipped entries
    test_fraction: float | None = None  # the drawing parameters (None when the test split was given)
    seed: int | None = None
    manifest: str | None = None  # the CSV read, for kind "manifest"

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def labels(self, split: str = "train") -> np.ndarray:
        """int64 labels of ``split`` in entry order."""
        return np.asarray([e.label for e in self._split(split)], np.int64)

    def sessions(self) -> np.ndarray | None:
        """int64 0-based sessions of the train entries (manifest ``session`` column), else None."""
        if not self.train or self.train[0].session is None:
            return None
        return np.asarray([e.session for e in self.train], np.int64)

    def _split(self, split: str) -> tuple[Entry, ...]:
        if split not in SPLITS:
            raise ValueError(f"split={split!r}; use 'train' or 'test'")
        return self.train if split == "train" else self.test

    def fingerprint(self) -> dict:
        """JSON-able identity of the inventory, cheap (no file contents read).

        ``sha256`` covers one line ``split<TAB>rel<TAB>class name<TAB>size`` per entry (train then
        test, in entry order) and the drawing parameters (``test_fraction``, ``seed``; null when the
        test split was given, since they then change nothing). Renaming, adding, removing or resizing
        a file changes it; touching a file does not. Sessions are not part of it (they change the
        plan, not the images).
        """
        h = hashlib.sha256()
        h.update(f"kind\t{self.kind}\ntest_given\t{self.test_given}\n".encode())
        h.update(f"test_fraction\t{self.test_fraction!r}\nseed\t{self.seed!r}\n".encode())
        for split in SPLITS:
            for e in self._split(split):
                h.update(f"{split}\t{e.rel}\t{self.class_names[e.label]}\t{e.size}\n".encode())
        return {
            "kind": self.kind,
            "num_classes": self.num_classes,
            "num_train": len(self.train),
            "num_test": len(self.test),
            "test_given": self.test_given,
            "test_fraction": self.test_fraction,
            "seed": self.seed,
            "sha256": h.hexdigest(),
        }

    def description(self) -> str:
        """One line: where, how many classes and images, how the test split came about, what was ignored."""
        where = self.manifest if self.kind == "manifest" else self.root
        if self.test_given:
            how = "test split given"
        else:
            how = f"test split drawn: {self.test_fraction:g} of each class, seed {self.seed}"
        text = (
            f"{self.kind} {where}: {self.num_classes} classes, {len(self.train)} train / "
            f"{len(self.test)} test images ({how})"
        )
        sessions = self.sessions()
        if sessions is not None:
            text += f", {int(sessions.max()) + 1} sessions"
        if self.ignored:
            text += "; ignored: " + ", ".join(f"{n} {reason}" for reason, n in sorted(self.ignored.items()))
        return text


# ---------------------------------------------------------------- helpers
def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def _posix(rel: str) -> str:
    return pathlib.PurePath(rel).as_posix()


class _Walker:
    """Lists the image files below a folder, counting what it skips (module docstring)."""

    def __init__(self, root: str):
        self.root = root
        self.root_real = os.path.realpath(root)
        self.ignored: collections.Counter = collections.Counter()

    def classify(self, path: str, name: str) -> str:
        """ "dir", "file", or the reason the entry is skipped."""
        if name.startswith("."):
            return "hidden"
        if os.path.islink(path):
            real = os.path.realpath(path)
            if not _inside(real, self.root_real):
                return "symlink outside root"
            if not os.path.exists(real):
                return "broken symlink"
        if os.path.isdir(path):
            return "dir"
        if os.path.isfile(path) and _is_image(name):
            return "file"
        return "not an image"

    def listdir(self, folder: str) -> list[str]:
        try:
            names = sorted(os.listdir(folder))
        except OSError as e:
            raise DataError(f"cannot list {folder!r} ({e.strerror}); check that it exists and is readable.") from e
        for name in names:
            _check_utf8(os.path.join(folder, name))
        return names

    def files(self, folder: str, rel: str, stack: frozenset[str] = frozenset()) -> list[tuple[str, int]]:
        """``(rel, size)`` of every image below ``folder`` (``rel`` = its path relative to the root)."""
        stack = stack | {os.path.realpath(folder)}
        out = []
        for name in self.listdir(folder):
            path = os.path.join(folder, name)
            kind = self.classify(path, name)
            child = f"{rel}/{name}" if rel else name
            if kind == "dir":
                if os.path.realpath(path) in stack:
                    self.ignored["symlink loop"] += 1
                else:
                    out += self.files(path, child, stack)
            elif kind == "file":
                out.append((child, os.stat(path).st_size))
            else:
                self.ignored[kind] += 1
        return out

    def class_folders(self, folder: str, rel: str) -> dict[str, list[tuple[str, int]]]:
        """``{class name: [(rel, size)]}`` of the class folders directly in ``folder``."""
        classes = {}
        for name in self.listdir(folder):
            path = os.path.join(folder, name)
            kind = self.classify(path, name)
            if kind == "dir":
                child = f"{rel}/{name}" if rel else name
                files = self.files(path, child, frozenset({os.path.realpath(folder)}))
                if not files:
                    raise DataError(
                        f"class folder {path!r} holds no image (extensions {', '.join(IMAGE_EXTENSIONS)}; hidden "
                        f"files and symlinks leaving {self.root!r} do not count); add images or remove the folder."
                    )
                classes[name] = files
            elif not rel and name == FOLDER_RECORD and kind == "not an image" and os.path.isfile(path):
                continue  # bookkeeping beside the class folders, not a photo left out
            elif kind == "file" or (kind == "not an image" and os.path.isfile(path)):
                self.ignored["not in a class folder"] += 1
            else:
                self.ignored[kind] += 1
        return classes


def _check_fraction(test_fraction: float) -> Fraction:
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)):
        raise DataError(f"test_fraction={test_fraction!r} must be a number in [0, 1), e.g. 0.2.")
    if not 0 <= test_fraction < 1:
        raise DataError(
            f"test_fraction={test_fraction} must lie in [0, 1): it is the share of each class's images drawn "
            "as test queries (every class keeps at least one train image); use e.g. 0.2."
        )
    return Fraction(repr(float(test_fraction)))


def _draw(groups: list[list], frac: Fraction, seed: int) -> tuple[list, list]:
    """Split each class's items (sorted by rel) into train / test by the rule of the module docstring."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for items in groups:
        n = len(items)
        k = min(math.floor(n * frac), n - 1)
        is_test = np.zeros(n, bool)
        is_test[rng.choice(n, k, replace=False)] = True
        train += [it for it, t in zip(items, is_test) if not t]
        test += [it for it, t in zip(items, is_test) if t]
    return train, test


def _entries(root: str, items, names_to_label: dict[str, int]) -> tuple[Entry, ...]:
    """``items``: (rel, class name, size, session) -> entries ordered by (label, rel)."""
    out = []
    for rel, name, size, session in items:
        path = rel if os.path.isabs(rel) else os.path.normpath(os.path.join(root, rel))
        out.append(Entry(path=path, rel=rel, label=names_to_label[name], session=session, size=size))
    return tuple(sorted(out, key=lambda e: (e.label, e.rel)))


def _finish(root, kind, class_names, train, test, test_given, ignored, frac, seed, manifest=None) -> Inventory:
    """Draws the test split if needed and builds the inventory; ``train``/``test``: (rel, name, size, session)."""
    class_names = tuple(sorted(class_names))
    label = {n: i for i, n in enumerate(class_names)}
    if not test_given:
        groups = [[] for _ in class_names]
        for item in train:
            groups[label[item[1]]].append(item)
        groups = [sorted(g, key=lambda it: it[0]) for g in groups]
        train, test = _draw(groups, frac, seed)
    return Inventory(
        root=root,
        kind=kind,
        class_names=class_names,
        train=_entries(root, train, label),
        test=_entries(root, test, label),
        test_given=test_given,
        ignored=dict(sorted(ignored.items())),
        test_fraction=None if test_given else float(frac),
        seed=None if test_given else int(seed),
        manifest=manifest,
    )


# ---------------------------------------------------------------- folder layouts
def _scan_folders(root: str, frac: Fraction, seed: int) -> Inventory:
    walker = _Walker(root)
    train_dir, test_dir = os.path.join(root, "train"), os.path.join(root, "test")
    if os.path.isdir(train_dir):
        for name in walker.listdir(root):
            if not (name in SPLITS and os.path.isdir(os.path.join(root, name))):
                walker.ignored["hidden" if name.startswith(".") else "not in train/ or test/"] += 1
        train_classes = walker.class_folders(train_dir, "train")
        test_classes = walker.class_folders(test_dir, "test") if os.path.isdir(test_dir) else None
        if not train_classes:
            raise DataError(
                f"{train_dir!r} holds no class folder; put the train images in {train_dir}/<class>/ folders."
            )
        if test_classes is not None:
            if not test_classes:
                raise DataError(
                    f"{test_dir!r} holds no class folder; put the test images in {test_dir}/<class>/ "
                    "folders, or remove test/ to have a test split drawn from train/."
                )
            extra = sorted(set(test_classes) - set(train_classes))
            if extra:
                raise DataError(
                    f"class {extra[0]!r} has test images ({test_dir}/{extra[0]}/) but no train folder "
                    f"{train_dir}/{extra[0]}/ ({len(extra)} such class(es): {extra[:3]}); add its train images "
                    "or remove its test folder."
                )
    elif os.path.isdir(test_dir):
        raise DataError(
            f"{root!r} has test/ but no train/; put the train images in {train_dir}/<class>/ "
            f"(or, for one pool of class folders, move the classes out of test/ to {root}/<class>/)."
        )
    else:
        train_classes, test_classes = walker.class_folders(root, ""), None
        if not train_classes:
            raise DataError(
                f"{root!r} holds no class folder with images; expected {root}/<class>/<image>, "
                f"{root}/train/<class>/<image> or a {MANIFEST_NAME} (columns path,label[,split][,session])."
            )

    def items(classes):
        return [(rel, name, size, None) for name, files in classes.items() for rel, size in files]

    test_items = [] if test_classes is None else items(test_classes)
    given = test_classes is not None
    return _finish(root, "folders", train_classes, items(train_classes), test_items, given, walker.ignored, frac, seed)


# ---------------------------------------------------------------- manifest
def _read_manifest(csv_path: str) -> tuple[list[str], list[tuple[int, dict]]]:
    """Header (lower-cased) and ``(line, row)`` of the non-blank rows."""
    try:
        with open(csv_path, encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f)
            header, rows = None, []
            for row in reader:
                if not any(cell.strip() for cell in row):
                    continue
                if header is None:
                    header = [c.strip().lower() for c in row]
                    continue
                rows.append((reader.line_num, row))
    except UnicodeDecodeError as e:
        raise DataError(f"manifest {csv_path!r} is not UTF-8 text ({e}); save it as UTF-8 CSV.") from e
    except csv.Error as e:
        raise DataError(f"manifest {csv_path!r} is not valid CSV ({e}).") from e
    except OSError as e:
        raise DataError(f"cannot read manifest {csv_path!r} ({e.strerror}).") from e
    if header is None:
        raise DataError(f"manifest {csv_path!r} is empty; it needs a header row path,label[,split][,session] and rows.")
    extra = [c for c in header if c not in MANIFEST_COLUMNS]
    missing = [c for c in ("path", "label") if c not in header]
    if extra or missing or len(set(header)) != len(header):
        what = []
        if missing:
            what.append(f"lacks column(s) {missing}")
        if extra:
            what.append(f"has unknown column(s) {extra}")
        if len(set(header)) != len(header):
            what.append("repeats a column")
        raise DataError(
            f"manifest {csv_path!r} header {header} {' and '.join(what)}; the header row must be "
            "path,label[,split][,session] (no other columns)."
        )
    out = []
    for line, row in rows:
        if len(row) != len(header):
            raise DataError(
                f"{csv_path}:{line}: {len(row)} field(s) but the header has {len(header)} ({','.join(header)}); "
                "quote fields that contain commas."
            )
        out.append((line, {c: v.strip() for c, v in zip(header, row)}))
    if not out:
        raise DataError(f"manifest {csv_path!r} has a header but no rows; add one row per image.")
    return header, out


def _row_session(value: str, where: str, split: str, written: str) -> int | None:
    """A row's 0-based session from the manifest's 1-based ``session`` value (test rows may leave it empty)."""
    if value:
        try:
            session = int(value)
        except ValueError:
            session = 0
        if session < 1:
            raise DataError(f"{where}: session {value!r} is not a positive integer; sessions are numbered 1, 2, 3, ...")
        return session - 1
    if split == "train":
        raise DataError(
            f"{where}: empty session for train image {written!r}; with a session column every train "
            "row needs its session (1, 2, ...)."
        )
    return None


def _manifest_splits(csv_path: str, root: str, parsed: list, has_split: bool):
    """``(train, test, class names)`` of the parsed rows, refusing missing files and test-only labels."""
    missing = [(line, path) for line, path, *_ in parsed if not os.path.isfile(path)]
    if missing:
        named = ", ".join(f"{p!r} (line {line})" for line, p in missing[:3])
        raise DataError(
            f"manifest {csv_path!r}: {len(missing)} row(s) name no existing file, e.g. {named}; "
            f"paths are relative to {root!r} or absolute; fix them or remove the rows."
        )
    train = [(rel, label, os.stat(path).st_size, s) for _, path, rel, label, split, s in parsed if split == "train"]
    test = [(rel, label, os.stat(path).st_size, s) for _, path, rel, label, split, s in parsed if split == "test"]
    if not train:
        raise DataError(f"manifest {csv_path!r} has no train image (all rows ignored or split=test); add train rows.")
    names = {label for _, label, _, _ in train}
    orphans = [(line, label) for line, _, _, label, split, _ in parsed if split == "test" and label not in names]
    if orphans:
        line, label = orphans[0]
        raise DataError(
            f"{csv_path}:{line}: label {label!r} has test rows but no train row "
            f"({len({lb for _, lb in orphans})} such label(s)); add train images of it or remove its test rows."
        )
    if has_split and not test:
        raise DataError(
            f"manifest {csv_path!r} has a split column but no row with split=test; add test rows, "
            "or drop the split column to have a test split drawn."
        )
    return train, test, names


def _scan_manifest(csv_path: str, frac: Fraction, seed: int) -> Inventory:
    root = os.path.dirname(csv_path)
    root_real = os.path.realpath(root)
    header, rows = _read_manifest(csv_path)
    has_split, has_session = "split" in header, "session" in header
    ignored: collections.Counter = collections.Counter()
    first_line: dict[str, int] = {}
    parsed = []  # (line, abs path, rel, label, split, session)
    for line, row in rows:
        where = f"{csv_path}:{line}"
        written, label = row["path"], row["label"]
        if not written:
            raise DataError(f"{where}: empty path; every row names one image file.")
        if not label:
            raise DataError(f"{where}: empty label for {written!r}; every row needs its class name.")
        split = row["split"].lower() if has_split else "train"
        if split not in SPLITS:
            raise DataError(f"{where}: split {row['split']!r} is not 'train' or 'test'; fix the value.")
        session = _row_session(row["session"], where, split, written) if has_session else None
        path = os.path.normpath(written if os.path.isabs(written) else os.path.join(root, written))
        if path in first_line:
            raise DataError(
                f"{where}: {written!r} is listed twice (also on line {first_line[path]}); "
                "list every image once, with one label and split."
            )
        first_line[path] = line
        inside = _inside(path, root)
        rel = _posix(os.path.relpath(path, root)) if inside else _posix(path)
        parts = rel.split("/") if inside else [os.path.basename(path)]
        if any(p.startswith(".") for p in parts):
            ignored["hidden"] += 1
            continue
        if not _is_image(path):
            raise DataError(
                f"{where}: {written!r} is not an image file by its extension (expected one of "
                f"{', '.join(IMAGE_EXTENSIONS)}); remove the row or convert the file."
            )
        if inside and not _inside(os.path.realpath(path), root_real):
            ignored["symlink outside root"] += 1
            continue
        parsed.append((line, path, rel, label, split, session))

    train, test, names = _manifest_splits(csv_path, root, parsed, has_split)
    return _finish(root, "manifest", names, train, test, has_split, ignored, frac, seed, manifest=csv_path)


# ---------------------------------------------------------------- entry point
def _check_utf8(path: str) -> None:
    """Refuses a path whose name is not UTF-8 (a latin-1 ``café.jpg`` from an old camera card or zip):
    the store's source list and the fingerprint are UTF-8, and such a name was a UnicodeEncodeError
    traceback after the listing."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise DataError(
            f"{os.fsencode(path)!r} has a name that is not UTF-8; rename it to UTF-8 (every name below a folder: "
            f"convmv -f latin1 -t utf8 -r --notest FOLDER), or move it out of the folder."
        ) from None


_HELD: dict | None = None  # (source, test_fraction, seed) -> Inventory while ``scans_held`` is open


@contextlib.contextmanager
def scans_held():
    """Within it, each source is scanned once and its inventory reused (a command's view of its folders is the
    one it started with). A photo ``main`` scanned its folder six times (the config check, the data check,
    the protocol and each session's page): 0.26 s each for the walkthrough's 1,920-row manifest (2-core host),
    about 135 us a row: at 100,000 photos, five scans more are over a minute. Only commands open it
    (``runner.run``, ``run_comparison``, ``update``), never a server, whose folders may change under it. A
    refused scan is not kept."""
    global _HELD
    outer = _HELD
    if outer is None:
        _HELD = {}
    try:
        yield
    finally:
        if outer is None:
            _HELD = None


def scan(source: str, *, test_fraction: float = 0.2, seed: int = 0) -> Inventory:
    """Inventory of the labelled images at ``source`` (layouts and rules: module docstring); once per
    ``scans_held`` block.

    ``source``: a CSV manifest, or a directory holding ``manifest.csv`` (which then wins over any
    folders there), ``train/<class>/`` [+ ``test/<class>/``] folders, or ``<class>/`` folders.
    ``test_fraction`` / ``seed``: how the test split is drawn when the source gives none.

    Raises ``DataError`` (what is wrong and the fix) for: a missing source, no images at all, a class
    folder without images, a test label absent from train, a malformed or duplicated manifest row,
    a manifest row naming a missing or non-image file, ``test_fraction`` outside [0, 1).
    """
    frac = _check_fraction(test_fraction)
    source = os.path.abspath(os.path.expanduser(os.fspath(source)))
    _check_utf8(source)
    key, held = (source, frac, seed), _HELD  # read once: a drawing thread may scan as the block closes
    if held is not None and key in held:
        return held[key]
    inventory = _scan(source, frac, seed)
    if held is not None:
        held[key] = inventory
    return inventory


def _scan(source: str, frac: Fraction, seed: int) -> Inventory:
    if os.path.isfile(source):
        if not source.lower().endswith(".csv"):
            raise DataError(
                f"{source!r} is a file but not a .csv manifest; pass a folder of class folders, a "
                "train/test folder or a CSV manifest (columns path,label[,split][,session])."
            )
        return _scan_manifest(source, frac, seed)
    if not os.path.isdir(source):
        raise DataError(f"{source!r} does not exist; pass a folder of class folders or a CSV manifest.")
    manifest = os.path.join(source, MANIFEST_NAME)
    if os.path.isfile(manifest):
        return _scan_manifest(manifest, frac, seed)
    return _scan_folders(source, frac, seed)
