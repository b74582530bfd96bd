"""The dataset of a live run: the first image folder plus one folder per ``update``, as one dataset
(``sources.load_run_dataset`` loads the parts).

Each part keeps its own record store; nothing is copied.  Rows are numbered part after part (the
first part's train rows, then the first update's, ...), so the rows of earlier sessions keep their
indices when a part is added: gallery ``source_ids`` and the session plan of completed sessions
stay valid.  Classes are matched by name: the first part's classes keep their labels, and each new
name gets the next label, in the order the parts list them (sorted names).  The first part's
train rows keep their sessions (the manifest's column, or all session 1); update k is one new
session after them, and its test images are queries from that session on.
"""

from __future__ import annotations

import numpy as np

from cvs_jax.data.dataset import ImageDataset
from cvs_jax.errors import DataError


class ConcatSplit:
    """Splits of several parts read as one: ``read`` asks each part for its rows only."""

    def __init__(self, splits, label_maps):
        self.parts = list(splits)
        self.offsets = np.cumsum([0] + [len(s) for s in self.parts])
        self.labels = np.concatenate([m[s.labels] for s, m in zip(self.parts, label_maps)]).astype(np.int32)
        shapes = {tuple(s.image_shape) for s in self.parts}
        if len(shapes) != 1:
            raise DataError(f"the run's image folders are stored at different sizes {sorted(shapes)}.")
        self._shape = shapes.pop()

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def image_shape(self) -> tuple[int, ...]:
        return self._shape

    def read(self, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx, np.int64)
        out = np.empty((len(idx), *self._shape), np.uint8)
        part = np.searchsorted(self.offsets, idx, side="right") - 1
        for p in np.unique(part):
            rows = np.flatnonzero(part == p)
            out[rows] = self.parts[p].read(idx[rows] - self.offsets[p])
        return out


def concat(datasets: list[ImageDataset]) -> ImageDataset:
    """One dataset of ``datasets`` (module docstring: labels by class name, sessions appended)."""
    names: list[str] = []
    index: dict[str, int] = {}
    maps = []
    for ds in datasets:
        for n in ds.class_names:
            if n not in index:
                index[n] = len(names)
                names.append(n)
        maps.append(np.asarray([index[n] for n in ds.class_names], np.int64))
    first = datasets[0]
    sessions = first.train_sessions if first.train_sessions is not None else np.zeros(len(first.train), np.int64)
    after = int(sessions.max()) + 1 if len(sessions) else 1
    added = [np.full(len(ds.train), after + k, np.int64) for k, ds in enumerate(datasets[1:])]
    sessions = np.concatenate([sessions] + added)
    test_first = first.test_sessions if first.test_sessions is not None else np.full(len(first.test), -1, np.int64)
    test_added = [np.full(len(ds.test), after + k, np.int64) for k, ds in enumerate(datasets[1:])]
    return ImageDataset(
        name=first.name,
        train=ConcatSplit([ds.train for ds in datasets], maps),
        test=ConcatSplit([ds.test for ds in datasets], maps),
        class_names=tuple(names),
        stores=tuple(s for ds in datasets for s in ds.stores),
        train_sessions=sessions,
        test_sessions=np.concatenate([test_first] + test_added),
    )
