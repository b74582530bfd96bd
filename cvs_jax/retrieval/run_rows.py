"""A run's gallery rows as its readers see them (search, serve, info, the run report): their columns in
search order, the session each row's image arrived in, what each session trained on, and the train
split that thumbnails are read from.  Below the run reader, so the report reads them without it."""

from __future__ import annotations

import dataclasses

import ml_collections
import numpy as np

from cvs_jax.errors import UserError
from cvs_jax.rundir.gallery import Gallery, RowConcat


@dataclasses.dataclass(frozen=True)
class Rows:
    """Every searchable row in search order: the session parts (gallery order), then the ``--add`` rows.
    Sessions are 0-based here (printed 1-based)."""

    embeddings: RowConcat  # raw float32 [N, D], as stored
    labels: np.ndarray  # int32 [N], protocol labels (-1: added without a label)
    arrival: np.ndarray  # int32 [N], session in which the image arrived
    model: np.ndarray  # int32 [N], session whose model embedded the row
    source_ids: np.ndarray  # int64 [N], train-split index (-1: added with --add)

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def trained_on(record: dict) -> int | None:
    """The images a session trained on (its new images plus replay, or all so far for ``joint``) from its
    ``results.json`` record (named ``train_images`` in runs written before ``new_images`` was recorded)."""
    return record["trained_on_images"] if "trained_on_images" in record else record.get("train_images")


class PartLog:
    """Passes ``Gallery.restore``'s reads through and keeps each part's (session, source ids): a
    ``joint`` part re-embeds every row, so a row's arrival session is that of the first part holding it."""

    def __init__(self, checkpoints):
        self._checkpoints = checkpoints
        self.parts: list[tuple[int, np.ndarray]] = []

    @property
    def directory(self) -> str:
        return self._checkpoints.directory

    def restore(self, step: int, templates: dict) -> dict:
        out = self._checkpoints.restore(step, templates)
        if out.get("gallery"):
            self.parts.append((int(out["gallery"]["session"]), np.asarray(out["gallery"]["source_ids"], np.int64)))
        return out


def arrival_sessions(parts: list[tuple[int, np.ndarray]], gallery: Gallery) -> np.ndarray:
    """0-based session in which each gallery row's image arrived: the first part (in session order)
    holding its source id; a row without a source id (-1) arrived with its own part."""
    arrival = gallery.sessions.copy()
    if not parts or gallery.source_ids.size == 0:
        return arrival
    ids = np.concatenate([p[1] for p in parts])
    sessions = np.concatenate([np.full(len(p[1]), p[0], np.int32) for p in parts])
    order = np.argsort(sessions, kind="stable")
    first_ids, first = np.unique(ids[order], return_index=True)  # first occurrence = earliest session
    first_sessions = sessions[order][first]
    known = gallery.source_ids >= 0
    pos = np.searchsorted(first_ids, gallery.source_ids[known])
    arrival[known] = first_sessions[pos]
    return arrival


def train_split(config: ml_collections.ConfigDict):
    """The run's train split, read on demand (``records.StoreSplit`` per part, nothing decoded ahead),
    or None when its data is not on this machine: what thumbnails of gallery rows are read from."""
    from cvs_jax.data import sources  # the loader: imported only when images are shown

    try:
        return sources.load_run_dataset(sources.streamed(config).data).train
    except (UserError, OSError):
        return None
