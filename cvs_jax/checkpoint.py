"""Session checkpoints with orbax: model, optimizer, gallery, and run metadata (incl. memory).

One checkpoint per completed session (orbax step = session index); saves are
atomic (orbax writes to a temporary directory and renames), so a crash never
leaves a half-written session behind, and stored gallery rows are never lost.
Restoring gives back exactly what was saved (arrays bit for bit).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


class SessionCheckpoints:
    def __init__(self, directory: str):
        self._mgr = ocp.CheckpointManager(
            os.path.abspath(directory),
            options=ocp.CheckpointManagerOptions(max_to_keep=None, create=True,
                                                 enable_async_checkpointing=False),
        )

    def latest_session(self) -> int | None:
        return self._mgr.latest_step()

    def save(self, session: int, *, model: dict, gallery: dict, meta: dict) -> None:
        """``meta`` is JSON (results so far, the replay memory's source ids: small lists)."""
        self._mgr.save(session, args=ocp.args.Composite(
            model=ocp.args.StandardSave(jax.device_get(model)),
            gallery=ocp.args.StandardSave(gallery),
            meta=ocp.args.JsonSave(meta)))
        self._mgr.wait_until_finished()

    def restore(self, session: int, *, model_like: dict) -> dict[str, Any]:
        """Restores a session; ``model_like`` gives the pytree structure of the model item."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, jax.device_get(model_like))
        out = self._mgr.restore(session, args=ocp.args.Composite(
            model=ocp.args.StandardRestore(abstract),
            gallery=ocp.args.StandardRestore(),
            meta=ocp.args.JsonRestore()))
        return {k: out[k] for k in ("model", "gallery", "meta")}

    def close(self) -> None:
        self._mgr.close()


def as_numpy_tree(tree):
    return jax.tree.map(np.asarray, tree)
