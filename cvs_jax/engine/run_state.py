"""What carries from one session to the next, and its session checkpoint.

``RunState`` after session s holds: the selected model of session s, the gallery
(one part per session, never re-extracted), the replay memory, the EWC/RWalk
importance and the per-session result records.  Saving it *is* the session
checkpoint ``checkpoints/sessions/<s>``; restoring the newest one resumes the run.
Items: ``variables`` (net + head), ``gallery`` (only the rows session s added),
``regularizer`` (raw importance + anchor, or empty) and the JSON ``meta``
(records, memory, when the importance was built).  Nothing else is stored: a frozen pretrained
trunk is left out of ``variables`` and read from its weight file (``frozen_trunk``).
"""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np

from cvs_jax.methods.seams import ImportanceState, ReplayMemory
from cvs_jax.models.frozen_trunk import FrozenTrunk
from cvs_jax.models.heads import ROW_KEYS
from cvs_jax.rundir.checkpoint import Checkpoints
from cvs_jax.rundir.gallery import Gallery, GalleryPart


def _head_rows(variables: dict, rows: int) -> dict:
    """The head's arrays cut or zero-padded to ``rows`` rows (rows beyond the classes seen are masked); of a
    template of shapes (``RunContext.variables_template``), the shapes."""
    params = dict(variables["params"])
    for key in ROW_KEYS:
        if isinstance(params.get(key), jax.ShapeDtypeStruct):
            params[key] = jax.ShapeDtypeStruct((rows,) + params[key].shape[1:], params[key].dtype)
        elif key in params:
            a = np.asarray(params[key])
            pad = np.zeros((max(rows - a.shape[0], 0),) + a.shape[1:], a.dtype)
            params[key] = np.concatenate([a[:rows], pad])
    return dict(variables, params=params)


def _stored_head(checkpoints: Checkpoints, step: int, variables: dict) -> dict:
    """``variables`` with the head cut to the rows checkpoint ``step`` stored, when it stored fewer
    (an ``update`` grew the head since): the template that checkpoint is read with."""
    stored = checkpoints.stored_shape(step, "variables", "params/head")
    if stored is not None and len(stored) == 2 and stored[0] < variables["params"]["head"].shape[0]:
        return _head_rows(variables, stored[0])
    return variables


def _stored_template(checkpoints: Checkpoints, step: int, variables: dict, trunk: FrozenTrunk | None) -> dict:
    """What checkpoint ``step`` stored of ``variables``: its head's rows, no frozen trunk."""
    variables = _stored_head(checkpoints, step, variables)
    return variables if trunk is None else trunk.without(variables)


def _complete(items: dict, variables: dict, trunk: FrozenTrunk | None, where: str) -> dict:
    """A session checkpoint's stored model with the frozen trunk of ``variables`` put back (host)."""
    stored = jax.device_get(items["variables"])
    if trunk is None:
        return stored
    trunk.check(items["meta"], where)
    return trunk.with_(stored, variables)


def restore_variables(checkpoints: Checkpoints, step: int, variables: dict, trunk: FrozenTrunk | None = None) -> dict:
    """The model of session checkpoint ``step``, its head zero-padded to ``variables``' rows (a session
    before an ``update`` grew the head: its model never scores the rows it did not have) and its frozen
    trunk, if any, taken from ``variables``."""
    rows = variables["params"]["head"].shape[0]
    items = checkpoints.restore(step, {"variables": _stored_template(checkpoints, step, variables, trunk)})
    where = os.path.join(checkpoints.directory, str(step))
    return _head_rows(_complete(items, variables, trunk, where), rows)


@dataclasses.dataclass(frozen=True)
class RunState:
    variables: dict  # {"params": {"net", <head arrays>}, "batch_stats"} of the last completed session (host arrays)
    gallery: Gallery
    memory: ReplayMemory
    importance: ImportanceState
    records: tuple[dict, ...] = ()  # one result record per completed session
    # retrieval.query_map: {s: map of model s to model s - 1} (s >= 1), kept beside the checkpoints
    query_maps: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def initial(cls, variables: dict, embed_dim: int) -> "RunState":
        return cls(jax.device_get(variables), Gallery.empty(embed_dim), ReplayMemory.empty(), ImportanceState())

    @property
    def completed(self) -> int:
        """Sessions completed: the index of the next session."""
        return len(self.records)

    @property
    def steps_done(self) -> int:
        """Training steps of the completed sessions (the x-axis offset of the run's curves)."""
        return sum(r["steps"] for r in self.records)

    def replace(self, **changes) -> "RunState":
        return dataclasses.replace(self, **changes)

    def save(self, checkpoints: Checkpoints, part: GalleryPart, trunk: FrozenTrunk | None = None) -> None:
        """Writes the session checkpoint of the last completed session; ``part`` = its gallery rows;
        a frozen ``trunk`` is left out (its weight file's digest is stored instead)."""
        variables = self.variables if trunk is None else trunk.without(self.variables)
        checkpoints.save(
            self.completed - 1,
            {"variables": variables, "gallery": part.as_dict(), "regularizer": self.importance.to_item()},
            {
                "per_session": list(self.records),
                "memory": self.memory.to_meta(),
                "regularizer_built_after": self.importance.built_after,
                **(trunk.meta() if trunk is not None else {}),
            },
        )

    @classmethod
    def restore(
        cls, checkpoints: Checkpoints, template: "RunState", trunk: FrozenTrunk | None = None
    ) -> "RunState | None":
        """The state after the newest readable session checkpoint, or None before the first.  A head
        saved with fewer rows than the template's (an ``update`` brought new classes) gets zero rows
        appended: rows beyond the classes seen are masked, and initialised when their class arrives.
        A frozen ``trunk`` comes from the template (the weight file), checked against the stored digest."""
        steps = checkpoints.steps()
        full = template.variables
        variables = _stored_template(checkpoints, steps[-1], full, trunk) if steps else full
        rows = full["params"]["head"].shape[0]
        restored = checkpoints.restore_latest({"variables": variables, "regularizer": None})
        if restored is None:
            return None
        last, items = restored
        meta = items["meta"]
        where = os.path.join(checkpoints.directory, str(last))
        return cls(
            variables=_head_rows(_complete(items, full, trunk, where), rows),
            gallery=Gallery.restore(checkpoints, last, template.gallery.embed_dim),  # one part per session
            memory=ReplayMemory.from_meta(meta["memory"]),
            importance=ImportanceState.from_item(items["regularizer"], meta["regularizer_built_after"]),
            records=tuple(meta["per_session"]),
        )
