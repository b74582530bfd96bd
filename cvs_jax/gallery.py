"""The accumulated gallery: embeddings that are never re-extracted.

Each row keeps the embedding made by the model of the session that added it,
its protocol label, that session's index and the index of the source image in
the dataset's train split (spec §5).  Only the ``joint`` upper bound replaces
rows (it re-embeds everything with the current model).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Gallery:
    embeddings: np.ndarray  # float32 [N, D], raw (un-normalised), as the official code stores them
    labels: np.ndarray      # int32 [N], protocol labels
    sessions: np.ndarray    # int32 [N], session that embedded the row
    source_ids: np.ndarray  # int64 [N], index into the dataset's train split

    @classmethod
    def empty(cls, embed_dim: int) -> "Gallery":
        return cls(np.zeros((0, embed_dim), np.float32), np.zeros((0,), np.int32),
                   np.zeros((0,), np.int32), np.zeros((0,), np.int64))

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __post_init__(self):
        n = self.labels.shape[0]
        if not (self.embeddings.shape[0] == self.sessions.shape[0] == self.source_ids.shape[0] == n):
            raise ValueError("gallery columns have different lengths")

    def append(self, embeddings, labels, session: int, source_ids) -> "Gallery":
        """A new gallery with the rows of one session added below the stored ones."""
        overlap = np.intersect1d(self.source_ids, np.asarray(source_ids))
        if overlap.size:
            raise ValueError(f"{overlap.size} source images are already in the gallery "
                             f"(e.g. train index {int(overlap[0])}); rows are never added twice")
        n = len(labels)
        return Gallery(
            np.concatenate([self.embeddings, np.asarray(embeddings, np.float32)]),
            np.concatenate([self.labels, np.asarray(labels, np.int32)]),
            np.concatenate([self.sessions, np.full((n,), session, np.int32)]),
            np.concatenate([self.source_ids, np.asarray(source_ids, np.int64)]),
        )

    def as_dict(self) -> dict[str, np.ndarray]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d) -> "Gallery":
        return cls(np.asarray(d["embeddings"], np.float32), np.asarray(d["labels"], np.int32),
                   np.asarray(d["sessions"], np.int32), np.asarray(d["source_ids"], np.int64))


class RowConcat:
    """Read-only row view of several arrays stacked vertically, without copying them.

    Lets the evaluator stream (stored gallery rows + this session's new rows) in blocks
    (``evaluate.recall_at_k_blocked``) instead of concatenating them, so a large gallery
    is never held twice in host memory during the per-epoch validation.
    """

    def __init__(self, parts):
        self._parts = [p for p in parts if p.shape[0]]
        self._starts = np.cumsum([0] + [p.shape[0] for p in self._parts])
        width = self._parts[0].shape[1:] if self._parts else (0,)
        self.shape = (int(self._starts[-1]),) + tuple(width)
        self.dtype = np.dtype(np.float32)

    def __getitem__(self, item):
        if not isinstance(item, slice) or item.step not in (None, 1):
            raise TypeError("RowConcat supports contiguous row slices only")
        start, stop, _ = item.indices(self.shape[0])
        out = []
        for part, lo in zip(self._parts, self._starts[:-1]):
            a, b = max(start - lo, 0), min(stop - lo, part.shape[0])
            if a < b:
                out.append(np.asarray(part[a:b], np.float32))
        return np.concatenate(out) if out else np.zeros((0,) + self.shape[1:], np.float32)

