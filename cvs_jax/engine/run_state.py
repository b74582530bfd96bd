"""What carries from one session to the next, and its session checkpoint.

``RunState`` after session s holds: the selected model of session s, the gallery
(one part per session, never re-extracted), the replay memory, the EWC/RWalk
importance and the per-session result records.  Saving it *is* the session
checkpoint ``checkpoints/sessions/<s>``; restoring the newest one resumes the run.
Items: ``variables`` (net + head), ``gallery`` (only the rows session s added),
``regularizer`` (raw importance + anchor, or empty) and the JSON ``meta``
(records, memory, when the importance was built).  Nothing else is stored.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import jax
import numpy as np

from cvs_jax.methods.seams import ImportanceState, ReplayMemory
from cvs_jax.models.heads import ROW_KEYS
from cvs_jax.retrieval import query_maps
from cvs_jax.retrieval.gallery import Gallery, GalleryPart
from cvs_jax.rundir.checkpoint import Checkpoints

if TYPE_CHECKING:
    from cvs_jax.engine.context import RunContext


def _head_rows(variables: dict, rows: int) -> dict:
    """The head's arrays cut or zero-padded to ``rows`` rows (rows beyond the classes seen are masked)."""
    params = dict(variables["params"])
    for key in ROW_KEYS:
        if key in params:
            a = np.asarray(params[key])
            pad = np.zeros((max(rows - a.shape[0], 0),) + a.shape[1:], a.dtype)
            params[key] = np.concatenate([a[:rows], pad])
    return dict(variables, params=params)


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

    def save(self, checkpoints: Checkpoints, part: GalleryPart) -> None:
        """Writes the session checkpoint of the last completed session; ``part`` = its gallery rows."""
        checkpoints.save(
            self.completed - 1,
            {"variables": self.variables, "gallery": part.as_dict(), "regularizer": self.importance.to_item()},
            {
                "per_session": list(self.records),
                "memory": self.memory.to_meta(),
                "regularizer_built_after": self.importance.built_after,
            },
        )

    @classmethod
    def restore(cls, checkpoints: Checkpoints, template: "RunState") -> "RunState | None":
        """The state after the newest readable session checkpoint, or None before the first.  A head
        saved with fewer rows than the template's (an ``update`` brought new classes) gets zero rows
        appended: rows beyond the classes seen are masked, and initialised when their class arrives."""
        variables = template.variables
        steps = checkpoints.steps()
        stored = checkpoints.stored_shape(steps[-1], "variables", "params/head") if steps else None
        rows = variables["params"]["head"].shape[0]
        if stored is not None and len(stored) == 2 and stored[0] < rows:
            variables = _head_rows(variables, stored[0])
        restored = checkpoints.restore_latest({"variables": variables, "regularizer": None})
        if restored is None:
            return None
        last, items = restored
        meta = items["meta"]
        return cls(
            variables=_head_rows(jax.device_get(items["variables"]), rows),
            gallery=Gallery.restore(checkpoints, last, template.gallery.embed_dim),  # one part per session
            memory=ReplayMemory.from_meta(meta["memory"]),
            importance=ImportanceState.from_item(items["regularizer"], meta["regularizer_built_after"]),
            records=tuple(meta["per_session"]),
        )


def resume(ctx: RunContext) -> RunState:
    """The state after the newest session checkpoint of ``ctx``'s run, or a fresh one."""
    fresh = RunState.initial(ctx.initial_variables(), ctx.config.model.embed_dim)
    state = RunState.restore(ctx.sessions, fresh)
    if state is None:
        return fresh
    state = state.replace(
        query_maps=query_maps.stored_maps(ctx.workdir, state.completed - 1, ctx.config.retrieval.query_map)
    )
    ctx.log.print(
        f"resumed after session {state.completed}: gallery {len(state.gallery)} rows, memory {len(state.memory)}"
    )
    return state
