"""One run per workdir: remember the config, refuse to mix runs, move old runs aside.

The first run writes ``config.json``.  A later run with a different config (apart
from fields that do not change results, e.g. paths or logging) is refused unless
``overwrite=True``, which moves the existing run into ``previous-<time>/`` — saved
checkpoints and galleries are never deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

import jax
import ml_collections

from cvs_jax.config_checks import ConfigError

# Fields that may change between a run and its resumption.
OPERATIONAL = (
    "overwrite",
    "data.data_dir",
    "data.manual_dir",
    "train.eval_batch_size",
    "train.checkpoint_every_steps",
    "log_every_steps",
    "distributed.multihost",
)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _comparable(config_dict: dict) -> dict:
    flat = _flatten(json.loads(json.dumps(config_dict)))  # tuples -> lists, as stored
    return {k: v for k, v in flat.items() if k not in OPERATIONAL}


def prepare(config: ml_collections.ConfigDict, workdir: str) -> None:
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "config.json")
    current = config.to_dict()
    if os.path.exists(path):
        with open(path) as f:
            stored = json.load(f)
        a, b = _comparable(stored), _comparable(current)
        diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        if diff:
            if not config.overwrite:
                shown = ", ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in diff[:5])
                raise ConfigError(
                    f"workdir {workdir} holds a run with a different config ({shown}"
                    f"{', ...' if len(diff) > 5 else ''}); use another --workdir, or pass "
                    f"--config.overwrite=True to move that run into {workdir}/previous-<time>/."
                )
            aside = os.path.join(workdir, f"previous-{time.strftime('%Y%m%d-%H%M%S')}")
            os.makedirs(aside)
            for name in os.listdir(workdir):
                if not name.startswith("previous-"):
                    os.rename(os.path.join(workdir, name), os.path.join(aside, name))
            print(f"moved the previous run in {workdir} to {aside}")
        else:
            return
    if jax.process_index() == 0:
        with open(path, "w") as f:
            json.dump(current, f, indent=2)


@contextlib.contextmanager
def open_run(config: ml_collections.ConfigDict, workdir: str):
    """Holds the workdir for one run (to be completed: the one-writer lock)."""
    prepare(config, workdir)
    yield
