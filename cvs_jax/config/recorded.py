"""A run's recorded config (``config.json``) on the writing side: what a resumed or updated run must
match, and the config it trains on.

``open_run(config, workdir)`` holds the workdir (``rundir.workdir``: the lock), checks the data, then
the config.  The first run writes ``config.json``.  A later run with a different config (apart from
fields that do not change results, ``stored.OPERATIONAL``) is refused once the workdir holds a checkpoint,
unless ``overwrite=True``, which moves the existing run into ``previous-<time>/``: saved checkpoints
and galleries are never deleted.  A workdir without any checkpoint (a start that failed, e.g. on a
data check) takes the new config; a run whose ``config.json`` was deleted is refused (``prepare``), told
from ``compare``'s copy of session 1 into an entry by its mark (``paths.SHARED_SESSION``).  ``continued_config(workdir)`` is the stored config ``update``
trains on: the readers' ``stored.stored_config`` with the loss weights completed from today's methods.
"""

from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterator

import ml_collections

from cvs_jax.config import base, stored
from cvs_jax.errors import ConfigError
from cvs_jax.methods import registry
from cvs_jax.rundir import paths
from cvs_jax.rundir import workdir as workdir_lib

# the per-session recipe lists an update extends with its session's --config.train.lr / epochs
SESSION_KEYS = ("train.session_lr", "train.session_epochs")


def continued_config(workdir: str) -> ml_collections.ConfigDict:
    """The run's ``config.json`` to train on (``update``): ``stored.stored_config`` with the run's loss
    weights laid over those today's methods declare, so that a term added since trains with its
    declared default; a recorded term no method declares any more is refused."""
    return stored.stored_config(workdir, term_weights=base.get_config().loss_weights.to_dict())


def _extends(before, after) -> bool:
    before, after = list(before or []), list(after or [])
    return len(after) > len(before) and after[: len(before)] == before


def prepare(config: ml_collections.ConfigDict, workdir: str) -> None:
    """Checks ``config`` against the workdir's ``config.json`` and records it (call with the lock held)."""
    os.makedirs(workdir, exist_ok=True)
    path = paths.config_file(workdir)
    current = config.to_dict()
    if os.path.exists(path):
        on_disk = stored.recorded(workdir)  # a moved run's own folders where they are now
        a, b = stored.comparable(on_disk), stored.comparable(current)
        # a field added since the run was recorded takes the value that run used (ADDED_KEYS) or its one
        # default, as stored.stored_config reads it: a run recorded by an earlier version resumes
        since = {**stored.flatten(base.get_config().to_dict()), **stored.ADDED_KEYS}
        a.update({k: since[k] for k in b if k not in a and k in since})
        if "model.head" in b:
            # the head the run trains with, "official" resolved for the method (a run recorded before
            # model.head existed trained the cosine head: it resumes under "official" for cvs, not for ewc)
            official = registry.get_method(config).official_head
            for flat in (a, b):
                flat["model.head"] = official if flat["model.head"] == "official" else flat["model.head"]
        diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        if (
            "data.updates" in diff
            and set(diff) <= {"data.updates", *SESSION_KEYS}
            and all(_extends(a.get(k), b.get(k)) for k in diff)
        ):
            diff = []  # python -m cvs_jax.update adds a folder (one session, with its own lr/epochs) to the run
        if not diff:
            workdir_lib.write_config(path, current)
            return
        shown = ", ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in diff[:5]) + (", ..." if len(diff) > 5 else "")
        if not workdir_lib.has_checkpoint(workdir):
            print(f"{workdir} holds no checkpoint of its earlier config ({shown}); config.json now records this one")
        elif "data.updates" in diff and not config.overwrite:
            raise ConfigError(
                f"workdir {workdir} holds a run extended by python -m cvs_jax.update (data.updates: "
                f"{a.get('data.updates')!r}); continue it with python -m cvs_jax.update --workdir {workdir} "
                f"--data NEW_FOLDER, or use another --workdir."
            )
        elif not config.overwrite:
            raise ConfigError(
                f"workdir {workdir} holds a run with a different config ({shown}); use another --workdir, "
                f"or pass --config.overwrite=True to move that run into {workdir}/previous-<time>/."
            )
        else:
            print(f"moved the previous run in {workdir} to {workdir_lib.move_aside(workdir)}")
    elif workdir_lib.has_checkpoint(workdir) and not os.path.exists(paths.shared_session_file(workdir)):
        # checkpoints without config.json: it was deleted, unless compare copied session 1 here (its mark)
        if not config.overwrite:
            raise ConfigError(
                f"workdir {workdir} holds a run's checkpoints but no config.json (deleted?): the config they were "
                "trained with is unknown, so they are not resumed with this one. Restore config.json from a copy "
                "of the run (or the config.json of a python -m cvs_jax.export of it), or pass "
                f"--config.overwrite=True to move that run into {workdir}/previous-<time>/."
            )
        print(f"moved the previous run in {workdir} (no config.json) to {workdir_lib.move_aside(workdir)}")
    workdir_lib.write_config(path, current)
    with contextlib.suppress(FileNotFoundError):  # config.json now says what trains on compare's session 1
        os.remove(paths.shared_session_file(workdir))


@contextlib.contextmanager
def open_run(
    config: ml_collections.ConfigDict, workdir: str, check: Callable[[], None] | None = None
) -> Iterator[None]:
    """Holds the workdir for one run: the lock first, then ``check`` (the data checks: a refusal
    leaves every file of the workdir as it was), then the config check (see the module docstring)."""

    def then() -> None:
        if check is not None:
            check()
        prepare(config, workdir)

    with workdir_lib.held(workdir, then):
        yield
