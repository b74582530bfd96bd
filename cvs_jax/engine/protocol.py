"""The data of a run: the dataset, its session plan and the protocol labels, as the phases, loaders and
passes read them; loaded by ``protocol_builder`` (apart, so that what reads a run's data does not sit
above the dataset builders)."""

from __future__ import annotations

import dataclasses
from typing import cast

import numpy as np

from cvs_jax.data import splits
from cvs_jax.data.dataset import ImageDataset
from cvs_jax.methods.base import Method


def first_per_label(idx: np.ndarray, labels: np.ndarray, n: int) -> np.ndarray:
    """The entries of sorted ``idx`` that are among the first ``n`` of their label."""
    order = np.argsort(labels, kind="stable")
    starts = np.searchsorted(labels[order], labels[order], side="left")
    keep = np.empty(idx.size, bool)
    keep[order] = np.arange(idx.size) - starts < n
    return idx[keep]


@dataclasses.dataclass
class Protocol:
    """The data of a run: images, protocol labels and the session plan."""

    dataset: ImageDataset
    plan: splits.SessionPlan
    train_labels: np.ndarray  # protocol labels of the train split (-1: class not used)
    test_labels: np.ndarray
    head_block: int = 0  # head rows: the classes rounded up to a multiple of this (0: exactly the classes)
    max_per_class: int | None = None  # data.max_per_class: test queries kept per class (the first ones)

    def test_queries(self, s: int) -> np.ndarray:
        """Session s's test queries: the plan's (classes seen so far), less the test images that
        arrive later (an image folder's manifest or update gives each test image a session)."""
        idx = self.plan.test_queries(s, self.test_labels)
        if self.max_per_class is not None:  # the first n of each class: session s's queries stay in s + 1's
            idx = first_per_label(idx, self.test_labels[idx], self.max_per_class)
        arrival = self.dataset.test_sessions
        return idx if arrival is None else idx[arrival[idx] <= s]

    def train_images(self, idx: np.ndarray) -> "LazyRows":
        """Train images by index, read only when sliced: embedding, Fisher and memory passes read them
        chunk by chunk, so no phase copies a whole session (``dataset.train`` may be in RAM or streamed)."""
        return LazyRows(self.dataset.train, idx)

    def test_images(self, idx: np.ndarray) -> "LazyRows":
        return LazyRows(self.dataset.test, idx)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return cast(tuple[int, int, int], tuple(self.dataset.image_shape))

    @property
    def num_classes(self) -> int:
        """Rows of the cosine head: every class of the plan, rounded up to ``model.head_block``."""
        classes = self.plan.num_classes
        return -(-classes // self.head_block) * self.head_block if self.head_block else classes

    def training_indices(self, method: Method, s: int) -> np.ndarray:
        """The images session s trains on and adds to the gallery (the method's data scope)."""
        return method.scope.indices(self.plan, s)

    def session_class_counts(self, method: Method) -> np.ndarray:
        """``[session, class]`` counts of the images each session trains on (without replay)."""
        return np.stack(
            [
                np.bincount(self.train_labels[self.training_indices(method, s)], minlength=self.num_classes)
                for s in range(self.plan.num_sessions)
            ]
        )

    def description(self) -> dict:
        """What ``protocol.json`` records: class names in protocol order and the session sizes."""
        names = self.dataset.class_names
        return {
            "dataset": self.dataset.name,
            "setup": self.plan.setup,
            "image_shape": list(self.dataset.image_shape),
            "class_names": [names[int(c)] for c in self.plan.class_order],
            "sessions": [
                {
                    "train": int(len(s.train)),
                    "val": int(len(s.val)),
                    "num_outputs": s.num_outputs,
                    "new_classes": s.new_classes.tolist(),
                }
                for s in self.plan.sessions
            ],
        }


class LazyRows:
    """Rows ``idx`` of a split, read when sliced (``rows[a:b]`` is a uint8 array, or features): what the chunked
    consumers (``chunks.iter_chunks``) take instead of a copied array."""

    def __init__(self, split, idx: np.ndarray):
        self._split = split
        self._idx = np.asarray(idx, np.int64)
        self.shape = (len(self._idx), *getattr(split, "row_shape", split.image_shape))
        self.dtype = np.dtype(getattr(split, "dtype", np.uint8))  # float32 for cached trunk features

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, item) -> np.ndarray:
        if not isinstance(item, slice):
            raise TypeError("LazyRows supports row slices only")
        return self._split.read(self._idx[item])

    def __array__(self, dtype=None, copy=None):
        out = self[:]
        return out if dtype is None else out.astype(dtype)
