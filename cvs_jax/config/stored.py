"""A run's stored config (``config.json``) as its readers get it: search, export, info, the reports
and serve read a finished or running run through ``stored_config``.

The stored config is laid over today's defaults (``config/defaults.py``): every recorded value is the
run's, a field added since keeps its one default (or, for ``ADDED_KEYS``, the value the run used), and
a recorded field that no longer exists is refused.  The loss weights stay as the run recorded them
(config.json holds every term of its time): completing them from today's methods is for a run that
trains on (``config.recorded``), so reading a run needs no method registry.
"""

from __future__ import annotations

import json

import ml_collections

from cvs_jax.config import defaults
from cvs_jax.errors import ConfigError
from cvs_jax.rundir import paths, run_files

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
    "profile_steps",
    "pictures",
    "distributed.multihost",
)
# Keys added after runs were recorded without them, with the value that reproduces what those runs did.
ADDED_KEYS = {"model.head": "cosine"}  # before model.head existed, every method trained the cosine head


def flatten(d: dict, prefix: str = "") -> dict:
    """A nested config dict as ``{"train.lr": ...}``."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def comparable(config_dict: dict) -> dict:
    """The fields of a config (as a dict) that change results, flattened (``"train.lr"``)."""
    flat = flatten(json.loads(json.dumps(config_dict)))  # tuples -> lists, as stored
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


_KINDS = ((bool, "true or false"), (int, "an integer"), (float, "a number"), (str, "a string"))


def _misfit(default, value) -> str | None:
    """What a field whose default is ``default`` takes, when the recorded ``value`` is not of that kind (a
    config.json edited by hand); None when it fits.  A field that may be null takes anything."""
    if default is None or value is None:
        return None
    if isinstance(default, dict):
        return None if isinstance(value, dict) else "a section of fields"
    if isinstance(default, (list, tuple)):
        return None if isinstance(value, list) else "a list"
    for kind, name in _KINDS:
        if isinstance(default, kind):
            fits = isinstance(value, (int, float) if kind is float else kind)
            return None if fits and (kind is bool or not isinstance(value, bool)) else name
    return None


def _lay_over(defaults_dict: dict, stored: dict, prefix: str, unknown: list[str], misfits: list[str]) -> dict:
    out = dict(defaults_dict)
    for key, value in stored.items():
        if key not in defaults_dict:
            unknown.append(prefix + key)
        elif (want := _misfit(defaults_dict[key], value)) is not None:
            misfits.append(f"{prefix}{key} = {json.dumps(value)[:40]} (it takes {want})")
        elif isinstance(value, dict):
            out[key] = _lay_over(defaults_dict[key], value, f"{prefix}{key}.", unknown, misfits)
        else:
            out[key] = value
    return out


def over_defaults(stored: dict, where: str, term_weights: dict | None = None) -> ml_collections.ConfigDict:
    """``stored`` (a run's recorded config) laid over today's defaults (see the module docstring).
    ``term_weights``: the loss weights to lay the run's over (a run that trains on passes today's
    methods' defaults, ``config.recorded``); None keeps the run's loss weights as recorded."""
    stored = _with_added_keys(stored)
    under = defaults.get_config().to_dict()
    under["loss_weights"] = stored.get("loss_weights", {}) if term_weights is None else term_weights
    unknown: list[str] = []
    misfits: list[str] = []
    merged = _lay_over(under, stored, "", unknown, misfits)
    if unknown:
        raise ConfigError(
            f"{where} records field(s) this version of cvs_jax no longer has: {', '.join(sorted(unknown))}; "
            "the run was made by another version: read it with that version, or start a new run (a field "
            "added to config.json by hand: remove it)."
        )
    if misfits:
        raise ConfigError(
            f"{where} records {'; '.join(misfits)}: edited by hand? Put the value back as the run recorded it "
            "(a copy of the run, or the config.json of a python -m cvs_jax.export of it, has it)."
        )
    return ml_collections.ConfigDict(merged)


def recorded(workdir: str) -> dict:
    """The run's ``config.json`` as a dict, its ``data.updates`` where they lie now (``paths.here``: the
    run's own from-added folders follow the run when it is moved or copied)."""
    out = run_files.read_json(paths.config_file(workdir))
    data = out.get("data")
    if isinstance(data, dict) and data.get("updates"):
        data["updates"] = [paths.here(workdir, u) for u in data["updates"]]
    return out


def stored_config(workdir: str, term_weights: dict | None = None) -> ml_collections.ConfigDict:
    """The run's ``config.json`` (``recorded``) laid over today's defaults (``over_defaults``)."""
    return over_defaults(recorded(workdir), paths.config_file(workdir), term_weights)
