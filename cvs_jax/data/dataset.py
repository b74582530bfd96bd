"""A loaded image dataset (``sources.load_dataset``): its train and test rows, classes and record stores.

Apart from the loading so that what only holds a dataset (``engine.protocol``) does not import what
finds and prepares one.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np

from cvs_jax.data import records


@dataclasses.dataclass(frozen=True)
class Split:
    """A split decoded into host memory (``store``: the records it was decoded from, if any)."""

    images: np.ndarray  # uint8 [N, H, W, C]
    labels: np.ndarray  # int32 [N], original dataset labels
    store: records.StoreSplit | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def image_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.images.shape[1:])

    def read(self, idx: np.ndarray) -> np.ndarray:
        return self.images[np.asarray(idx, np.int64)]


class Rows(Protocol):
    """What a dataset's split offers: ``Split`` (in memory), ``records.StoreSplit`` (read on demand), or
    ``parts.ConcatSplit`` (several folders read as one)."""

    @property
    def labels(self) -> np.ndarray: ...

    @property
    def image_shape(self) -> tuple[int, ...]: ...

    def __len__(self) -> int: ...

    def read(self, idx: np.ndarray) -> np.ndarray: ...


@dataclasses.dataclass(frozen=True)
class ImageDataset:
    name: str
    train: Rows
    test: Rows
    class_names: tuple[str, ...]
    stores: tuple[str, ...] = ()  # the record stores' folders, in row order (none for standard TFDS data)
    train_sessions: np.ndarray | None = None  # 0-based session of each train row, when the data gives it
    test_sessions: np.ndarray | None = None  # session from which each test row is a query (-1: from the start)

    @property
    def store(self) -> str | None:
        return self.stores[0] if len(self.stores) == 1 else None

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return self.train.image_shape  # type: ignore[return-value]

    def source_names(self, split: str = "train") -> list[str] | None:
        """Each row's source (a file path, or ``file#index`` for packed files); None when unknown."""
        names = [records.read_source_names(s, split) for s in self.stores]
        known = [n for n in names if n is not None]
        return None if not names or len(known) < len(names) else [x for n in known for x in n]
