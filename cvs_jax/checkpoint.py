"""Orbax checkpoints: one per completed session, plus rolling mid-session ones.

``sessions/<s>``: after session s — the selected model, optimizer state, the
gallery and run metadata (results so far, replay memory).  Kept forever.
``progress/<n>``: inside a session every ``train.checkpoint_every_steps`` steps
and after each epoch's validation — the training state, the best model so far
and the epoch's running sums.  Only the last two are kept.

Saves are atomic (orbax writes a temporary directory and renames it), so a crash
while writing leaves the previous checkpoint as the latest.  A checkpoint that
cannot be read is moved aside (never deleted) and the previous one is used.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp

_EMPTY = "__empty__"


class Checkpoints:
    """A directory of numbered checkpoints, each holding pytree items and one JSON item."""

    def __init__(self, directory: str, *, max_to_keep: int | None, log: Callable[[str], None] = print):
        self._dir = os.path.abspath(directory)
        self._log = log
        self._max_to_keep = max_to_keep
        self._mgr = self._open(max_to_keep)

    def _open(self, max_to_keep: int | None = None) -> ocp.CheckpointManager:
        return ocp.CheckpointManager(
            self._dir,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False, cleanup_tmp_directories=True
            ),
        )

    @property
    def directory(self) -> str:
        return self._dir

    def steps(self) -> list[int]:
        return sorted(self._mgr.all_steps())

    def save(self, step: int, trees: dict[str, Any], meta: dict) -> None:
        # orbax refuses empty containers; an empty dict is stored as a marker and restored as {}.
        args = {
            k: ocp.args.StandardSave(jax.device_get(v) if v else {_EMPTY: np.zeros((1,), np.int8)})
            for k, v in trees.items()
        }
        args["meta"] = ocp.args.JsonSave(meta)
        self._mgr.save(step, args=ocp.args.Composite(**args), force=True)
        self._mgr.wait_until_finished()

    def _restore(self, step: int, templates: dict[str, Any]) -> dict[str, Any]:
        args = {
            k: ocp.args.StandardRestore(
                None if t is None else jax.tree.map(ocp.utils.to_shape_dtype_struct, jax.device_get(t))
            )
            for k, t in templates.items()
        }
        args["meta"] = ocp.args.JsonRestore()
        out = self._mgr.restore(step, args=ocp.args.Composite(**args))
        return {
            k: ({} if isinstance(out[k], dict) and _EMPTY in out[k] else out[k]) for k in list(templates) + ["meta"]
        }

    def restore(self, step: int, templates: dict[str, Any]) -> dict[str, Any]:
        return self._restore(step, templates)

    def restore_latest(
        self, templates: dict[str, Any], steps: range | None = None
    ) -> tuple[int, dict[str, Any]] | None:
        """The newest readable checkpoint as (step, items); unreadable ones are moved aside.

        ``templates`` maps item name -> a pytree with the expected structure (or None
        for items restored as saved, e.g. plain numpy dicts).  ``steps`` limits the
        search to a range of checkpoint numbers (e.g. one session's).
        """
        for step in reversed(self.steps()):
            if steps is not None and step not in steps:
                continue
            try:
                return step, self._restore(step, templates)
            except Exception as e:  # orbax raises many types for truncated/corrupt files
                aside = os.path.join(self._dir, f"unreadable-{step}-{int(time.time())}")
                self._log(
                    f"warning: checkpoint {os.path.join(self._dir, str(step))} cannot be read "
                    f"({type(e).__name__}: {str(e)[:200]}); moved it to {aside} and falling back "
                    f"to the previous checkpoint."
                )
                self._mgr.close()
                os.rename(os.path.join(self._dir, str(step)), aside)
                self._mgr = self._open(self._max_to_keep)
        return None

    def close(self) -> None:
        self._mgr.close()
