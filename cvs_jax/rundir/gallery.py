"""The accumulated gallery: embeddings that are never re-extracted.

Each row keeps the embedding made by the model of the session that added it,
its protocol label, that session's index and the index of the source image in
the dataset's train split (as in the official code).  Only the ``joint`` upper bound replaces
rows (it re-embeds everything with the current model).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from cvs_jax.errors import CheckpointError, UnreadableCheckpointError


@dataclasses.dataclass(frozen=True)
class GalleryPart:
    """The rows one session added (or, for ``joint``, the whole re-embedded gallery: ``replaces``)."""

    embeddings: np.ndarray  # float32 [n, D], raw (un-normalised), as the official code stores them
    labels: np.ndarray  # int32 [n], protocol labels
    source_ids: np.ndarray  # int64 [n], index into the dataset's train split (-1: added by search --add)
    session: int  # session whose model embedded the rows
    replaces: bool = False  # True: the rows of all earlier parts are dropped (joint re-extracts)

    def __post_init__(self):
        if not (self.embeddings.shape[0] == self.labels.shape[0] == self.source_ids.shape[0]):
            raise ValueError("gallery columns have different lengths")

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def as_dict(self) -> dict[str, np.ndarray | np.generic]:
        return {
            "embeddings": np.asarray(self.embeddings, np.float32),
            "labels": np.asarray(self.labels, np.int32),
            "source_ids": np.asarray(self.source_ids, np.int64),
            "session": np.int32(self.session),
            "replaces": np.int8(self.replaces),
        }

    @classmethod
    def from_dict(cls, d) -> "GalleryPart":
        return cls(
            np.asarray(d["embeddings"], np.float32),
            np.asarray(d["labels"], np.int32),
            np.asarray(d["source_ids"], np.int64),
            int(d["session"]),
            bool(int(d["replaces"])),
        )


class Gallery:
    """The gallery as its per-session parts: appending a session adds a part and copies nothing, and
    each session checkpoint stores only its own part, so a 10M-row gallery is held once in host
    memory and written once to disk.  ``embeddings`` is a row view (``RowConcat``) over the parts."""

    def __init__(self, parts, embed_dim: int):
        self.parts = tuple(p for p in parts if len(p))
        self.embed_dim = embed_dim
        for p in self.parts:
            if p.embeddings.shape[1] != embed_dim:
                raise ValueError(
                    f"gallery part of session {p.session} has width {p.embeddings.shape[1]}, not {embed_dim}"
                )

    @classmethod
    def empty(cls, embed_dim: int) -> "Gallery":
        return cls((), embed_dim)

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def _column(self, per_part, dtype) -> np.ndarray:
        cols = [np.asarray(per_part(p), dtype) for p in self.parts]
        return np.concatenate(cols) if cols else np.zeros((0,), dtype)

    @property
    def embeddings(self) -> "RowConcat":
        return RowConcat([p.embeddings for p in self.parts], width=self.embed_dim)

    @functools.cached_property  # the gallery never changes: built once, read every validation
    def labels(self) -> np.ndarray:
        return self._column(lambda p: p.labels, np.int32)

    @functools.cached_property  # the gallery never changes: built once, read every validation
    def source_ids(self) -> np.ndarray:
        return self._column(lambda p: p.source_ids, np.int64)

    @functools.cached_property  # the gallery never changes: built once, read every validation
    def sessions(self) -> np.ndarray:
        return self._column(lambda p: np.full(len(p), p.session), np.int32)

    def with_part(self, part: GalleryPart) -> "Gallery":
        """This gallery plus one session's rows (or only them, when the part ``replaces``)."""
        if part.replaces:
            return Gallery([part], self.embed_dim)
        overlap = np.intersect1d(self.source_ids, part.source_ids[part.source_ids >= 0])
        if overlap.size:
            raise ValueError(
                f"{overlap.size} source images are already in the gallery "
                f"(e.g. train index {int(overlap[0])}); rows are never added twice"
            )
        return Gallery(self.parts + (part,), self.embed_dim)

    @classmethod
    def restore(cls, checkpoints, last_session: int, embed_dim: int, item: str = "gallery") -> "Gallery":
        """The gallery after ``last_session``: the parts stored in session checkpoints 0..last_session.

        A part that cannot be read is refused (``CheckpointError``), never moved aside: its rows were
        embedded by that session's model and are never re-extracted.  Any other ``CheckpointError`` of
        the checkpoint layer (permissions, I/O) passes through unchanged."""

        gallery = cls.empty(embed_dim)
        for s in range(last_session + 1):
            try:
                d = checkpoints.restore(s, {item: None})[item]
            except UnreadableCheckpointError as e:  # damaged or missing files
                raise CheckpointError(cls._unreadable(checkpoints, s, str(e.__cause__ or e))) from e
            except CheckpointError:
                raise
            except Exception as e:  # noqa: BLE001 -- a checkpoint store other than Checkpoints
                raise CheckpointError(cls._unreadable(checkpoints, s, f"{type(e).__name__}: {e}")) from e
            if d:  # an empty session adds no part
                gallery = gallery.with_part(GalleryPart.from_dict(d))
        return gallery

    @staticmethod
    def _unreadable(checkpoints, s: int, why: str) -> str:
        return (
            f"the gallery rows of session {s + 1} cannot be read from {checkpoints.directory}/{s} "
            f"({why[:200]}); they were embedded by that session's model and are never re-extracted: "
            "restore that folder from a backup (nothing was changed)."
        )


class RowConcat:
    """Read-only row view of several arrays stacked vertically, without copying them.

    Lets the evaluator stream (stored gallery rows + this session's new rows) in blocks
    (``evaluate.recall_at_k_blocked``) instead of concatenating them, so a large gallery
    is never held twice in host memory during the per-epoch validation.
    """

    def __init__(self, parts, width: int | None = None):
        self._parts = [p for p in parts if p.shape[0]]
        self._starts = np.cumsum([0] + [p.shape[0] for p in self._parts])
        if width is None:
            width = self._parts[0].shape[1] if self._parts else 0
        self.shape = (int(self._starts[-1]), int(width))
        self.dtype = np.dtype(np.float32)

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype=None, copy=None):
        """A contiguous copy (for small galleries and tests; large ones are read in slices)."""
        out = self[0 : self.shape[0]]
        return out if dtype is None else out.astype(dtype)

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
