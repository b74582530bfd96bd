"""A run's recorded config (``config.json``): what a resumed run must match, and what readers of a
finished run get.

``open_run(config, workdir)`` holds the workdir (``rundir.workdir``: the lock), checks the data, then
the config.  The first run writes ``config.json``.  A later run with a different config (apart from
fields that do not change results, ``OPERATIONAL``) is refused once the workdir holds a checkpoint,
unless ``overwrite=True``, which moves the existing run into ``previous-<time>/``: saved checkpoints
and galleries are never deleted.  A workdir without any checkpoint (a start that failed, e.g. on a
data check) takes the new config.  ``stored_config(workdir)`` is a run's config laid over today's
defaults, for the readers (``search``, ``update``, the reports).
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Callable, Iterator

import ml_collections

from cvs_jax.config import base
from cvs_jax.errors import ConfigError
from cvs_jax.methods import registry
from cvs_jax.rundir import paths
from cvs_jax.rundir import workdir as workdir_lib

# Fields that may change between a run and its resumption.
OPERATIONAL = (
    "overwrite",
    "data.data_dir",
    "data.manual_dir",
    "data.on_corrupt",  # refusing or skipping undecodable images never changes a session that trained
    "data.in_memory_limit_mb",
    "data.loader_threads",
    "data.loader_workers",
    "train.eval_batch_size",
    "train.checkpoint_every_steps",
    "log_every_steps",
    "distributed.multihost",
)
# Keys added after runs were recorded without them, with the value that reproduces what those runs did.
# the per-session recipe lists an update extends with its session's --config.train.lr / epochs
SESSION_KEYS = ("train.session_lr", "train.session_epochs")
ADDED_KEYS = {"model.head": "cosine"}  # before model.head existed, every method trained the cosine head


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def comparable(config_dict: dict) -> dict:
    """The fields of a config (as a dict) that change results, flattened (``"train.lr"``)."""
    flat = _flatten(json.loads(json.dumps(config_dict)))  # tuples -> lists, as stored
    return {k: v for k, v in flat.items() if k not in OPERATIONAL}


def _with_added_keys(config_dict: dict) -> dict:
    """``config_dict`` with every ``ADDED_KEYS`` entry it lacks set to the value its run used."""
    out = json.loads(json.dumps(config_dict))
    for dotted, value in ADDED_KEYS.items():
        *path, last = dotted.split(".")
        node = out
        for key in path:
            node = node.setdefault(key, {})
        node.setdefault(last, value)
    return out


def _lay_over(defaults: dict, stored: dict, prefix: str, unknown: list[str]) -> dict:
    out = dict(defaults)
    for key, value in stored.items():
        if key not in defaults:
            unknown.append(prefix + key)
        elif isinstance(value, dict) and isinstance(defaults[key], dict):
            out[key] = _lay_over(defaults[key], value, f"{prefix}{key}.", unknown)
        else:
            out[key] = value
    return out


def over_defaults(stored: dict, where: str) -> ml_collections.ConfigDict:
    """``stored`` (a run's recorded config) laid over today's defaults (``config.base.get_config()``):
    every recorded value is the run's, a field added since keeps its one default (or, for
    ``ADDED_KEYS``, the value the run used).  A recorded field that no longer exists is refused."""
    unknown: list[str] = []
    merged = _lay_over(base.get_config().to_dict(), _with_added_keys(stored), "", unknown)
    if unknown:
        raise ConfigError(
            f"{where} records field(s) this version of cvs_jax no longer has: {', '.join(sorted(unknown))}; "
            "the run was made by another version: read it with that version, or start a new run."
        )
    return ml_collections.ConfigDict(merged)


def stored_config(workdir: str) -> ml_collections.ConfigDict:
    """The run's ``config.json`` laid over today's defaults (``over_defaults``): what search and update
    read of a run."""
    path = paths.config_file(workdir)
    with open(path) as f:
        return over_defaults(json.load(f), path)


def _extends(stored, current) -> bool:
    stored, current = list(stored or []), list(current or [])
    return len(current) > len(stored) and current[: len(stored)] == stored


def prepare(config: ml_collections.ConfigDict, workdir: str) -> None:
    """Checks ``config`` against the workdir's ``config.json`` and records it (call with the lock held)."""
    os.makedirs(workdir, exist_ok=True)
    path = paths.config_file(workdir)
    current = config.to_dict()
    if os.path.exists(path):
        with open(path) as f:
            stored = json.load(f)
        a, b = comparable(stored), comparable(current)
        # a field added since the run was recorded takes the value that run used (ADDED_KEYS) or its one
        # default, as stored_config reads it: a run recorded by an earlier version resumes
        since = {**_flatten(base.get_config().to_dict()), **ADDED_KEYS}
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
    workdir_lib.write_config(path, current)


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
