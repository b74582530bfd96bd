"""Train the next session of a run on newly arrived labelled images.

    python -m cvs_jax.update --workdir W --data DIR_or_CSV [--config.data.on_corrupt=skip]
        [--config.train.lr=0.01] [--config.train.epochs=10]
    python -m cvs_jax.update --workdir W --from_added

``--from_added`` trains on the labelled images added to the run (``search --add``, the server's
``/add``) since the last such session, laid out as a folder of class folders (``retrieval.added_session``) and
trained exactly as ``--data`` with that folder; the added rows keep their stored embeddings.

Example: ``python -m cvs_jax.update --workdir workdirs/photos --data photos/2026-03`` after a run of
``python -m cvs_jax.main --config configs/image_folder_general.py --workdir workdirs/photos
--config.data.manual_dir=photos/first``.  The config fields it takes: ``data.on_corrupt``, and
``train.lr`` and ``train.epochs`` for the new session only (recorded as its entry of
``train.session_lr`` / ``train.session_epochs`` in ``config.json`` and shown by ``info``; e.g. a lower
lr after a session stopped as diverged).

``DIR_or_CSV`` is read as ``data.name=image_folder`` reads its folder (class folders, train/ +
test/ folders, or a CSV manifest; ``folder_inventory``).  Its classes may be new or known (matched
by name).  The run's config applies unchanged (method, recipe but for those two, memory budget, stored size); the
folder is appended to ``data.updates`` in the workdir's ``config.json`` and the run resumes: the
completed sessions are restored, session S+1 trains on the new train images (plus the method's
replay), its model embeds them as a new gallery part (no stored row is touched), and
``results.json`` gains the session, with recall of the new and all earlier test queries.

The head grows to the classes seen, rounded up to ``model.head_block`` rows: a grown head changes
the step's shapes and compiles it anew (the persistent XLA cache cannot serve it), so in blocks of
``head_block`` rows that happens once per block of new classes, not at every session that brings one.

Rerunning an interrupted ``update`` with the same folder resumes it exactly.  A folder that is
already part of the run, or whose images (by content, SHA-256) are already in it, is refused, so
that no gallery row is duplicated.  Everything about the new folder (readable images, classes,
duplicates, the session's size against the batch, the memory budget) is checked before anything in
the workdir changes: a refused folder leaves the run as it was.  Runs whose first folder was cut into
sessions by the generator (``data.split=generator``, not ``blurry``) continue the same way.  A
problem to fix ends with one ``error: ...`` line and exit status 2; a workdir that a live ``main`` or
``update`` holds is refused naming that process.  A new class with fewer than ``FEW_PHOTOS`` train photos
is accepted with one ``warning:`` line naming it: its queries seldom find it until more photos arrive.
"""

from __future__ import annotations

import os
import shutil
import unicodedata
from collections.abc import Sequence

import ml_collections
import numpy as np
from absl import flags

from cvs_jax import cli
from cvs_jax.config import recipe as session_recipe
from cvs_jax.config import recorded
from cvs_jax.data import folder_inventory, records, sources, stores
from cvs_jax.engine import determinism, runner
from cvs_jax.errors import ConfigError, DataError, UserError
from cvs_jax.retrieval import added_session, gate, run_reader
from cvs_jax.rundir import paths, run_files
from cvs_jax.rundir import workdir as workdir_lib


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    flags.DEFINE_string("workdir", None, "The --workdir of a run of python -m cvs_jax.main.", flag_values=flag_values)
    flags.DEFINE_string(
        "data",
        None,
        "The new images: a folder of class folders, train/ + test/ folders, or a CSV manifest.",
        flag_values=flag_values,
    )
    flags.DEFINE_enum(
        "config.data.on_corrupt",
        None,
        ["refuse", "skip"],
        "Undecodable images of the new folder: refuse them (the run's default) or skip them.",
        flag_values=flag_values,
    )
    flags.DEFINE_float(
        "config.train.lr",
        None,
        "The new session's learning rate (default: the run's train.lr); recorded for that session only.",
        flag_values=flag_values,
    )
    flags.DEFINE_integer(
        "config.train.epochs",
        None,
        "The new session's epochs (default: the run's train.epochs); recorded for that session only.",
        flag_values=flag_values,
    )
    flags.DEFINE_bool(
        "from_added",
        False,
        "Train on the labelled images added (search --add, the server's /add) since the last such session "
        "instead of --data.",
        flag_values=flag_values,
    )
    flags.mark_flags_as_required(["workdir"], flag_values=flag_values)
    flags.register_multi_flags_validator(
        ["data", "from_added"],
        lambda f: (f["data"] is not None) != bool(f["from_added"]),
        message="pass either --data FOLDER (the new images) or --from_added (the images added to the run).",
        flag_values=flag_values,
    )


# The config fields update takes (--config.<field>): those safe to change between sessions.
UPDATE_FIELDS = ("data.on_corrupt", "train.lr", "train.epochs")
# the fields that apply to the new session only: recorded in config.json as its entry of these lists
SESSION_FIELDS = {"train.lr": "session_lr", "train.epochs": "session_epochs"}


def run_config(workdir: str) -> ml_collections.ConfigDict:
    path = paths.config_file(workdir)
    if not os.path.exists(path):
        raise ConfigError(
            f"{workdir} holds no cvs_jax run (config.json is missing); start one with python -m cvs_jax.main."
        )
    return recorded.continued_config(workdir)


def writable_config(workdir: str) -> ml_collections.ConfigDict:
    """``run_config`` for a new or resumed session: refuses a run a live ``main``/``update`` holds (say so,
    not "finish it first"; its folder, just recorded, may not be prepared yet), a run it cannot write into
    (a read-only copy), then a run whose folders are gone (``_check_folders_found``)."""
    config = run_config(workdir)
    workdir_lib.check_not_busy(workdir)
    workdir_lib.check_writable(workdir)  # before the new images are prepared
    _check_folders_found(workdir, config)
    return config


def _check_folders_found(workdir: str, config: ml_collections.ConfigDict) -> None:
    """Each folder the run learnt from is where it recorded it or was prepared into a record store of
    ``data.data_dir`` (found by that path): a run moved to another machine needs one or the other, and
    ``update`` takes no other folder for them (unlike ``main``'s ``--config.data.manual_dir``)."""
    d = config.data
    if d.name != "image_folder":
        return
    for field, folder in [("data.manual_dir", d.manual_dir)] + [("data.updates", u) for u in d.updates]:
        path = os.path.expanduser(folder)
        if not os.path.exists(path) and stores.indexed_store(d.data_dir, path, stores.builder_options(d)) is None:
            raise DataError(
                f"{workdir} learnt from {folder} ({field}), which is gone, and data.data_dir={d.data_dir!r} holds "
                f"no record store of it; put the folder back at that path (or bring the run's data_dir), then rerun."
            )


def _digests(dirs, folders=None) -> dict[bytes, str]:
    """SHA-256 of every stored image's source bytes -> its source, over the given record stores (paths
    shown under ``folders``, the folders the run was given, one per store: stores are shared by content)."""
    out = {}
    for store, folder in zip(dirs, folders or [None] * len(dirs)):
        info = records.read_info(store)
        assert info is not None  # the run's stores are complete (prepared before it trained)
        for split in ("train", "test"):
            rows = records.StoreSplit(store, split, info)
            for digest, name in zip(rows.digests(), stores.shown_sources(store, rows.sources(), folder)):
                out.setdefault(digest.tobytes(), name)
    return out


FEW_PHOTOS = 5  # a new class with fewer train photos than this gets a warning


def _check_folder(data: str) -> None:
    if not os.path.exists(data):
        raise DataError(
            f"--data {data} does not exist; pass the folder of newly arrived images (class folders, train/ + "
            f"test/ folders, or a CSV manifest)."
        )


def plan_update(workdir: str, data: str, overrides: dict | None = None) -> ml_collections.ConfigDict:
    """The run's config with ``data`` appended to ``data.updates`` (or as it is, when ``data`` is the
    newest update and its session is unfinished: a resume) and ``overrides`` (``UPDATE_FIELDS``)
    applied; refuses duplicates and unfinished runs."""
    config = writable_config(workdir)
    overrides = dict(overrides or {})
    recipe = {f: overrides.pop(f) for f in SESSION_FIELDS if overrides.get(f) is not None}
    _check_recipe(recipe)
    for field, value in overrides.items():
        if field not in UPDATE_FIELDS:
            raise ConfigError(f"--config.{field} cannot change between sessions; update takes {UPDATE_FIELDS}.")
        group, _, key = field.rpartition(".")
        config[group][key] = value
    d = config.data
    if d.name != "image_folder" or d.split not in ("user", "generator"):
        raise ConfigError(
            f"update adds sessions to runs of your own images (data.name=image_folder, data.split=user or "
            f"generator); {workdir} was made with data.name={d.name}, data.split={d.split}."
        )
    data = os.path.abspath(os.path.expanduser(data))
    updates = list(d.updates)
    if data == os.path.abspath(os.path.expanduser(d.manual_dir)):
        before = _sessions_before(config)
        held = "session 1" if before == 1 else f"sessions 1-{before}"
        raise DataError(
            f"{data} is the folder {workdir} started with ({held}); its images are in the gallery. Put newly "
            f"arrived images in a new folder."
        )
    if data not in updates:
        _check_folder(data)
    done = added_session.completed_sessions(workdir)
    if data in updates:
        session = _sessions_before(config) + len(updates) - 1  # the update's session (0-based)
        if data == updates[-1] and done <= session:
            # counted from the plan, not results.json's records (a deleted results.json counts none; it is
            # written anew as the run resumes), as the update's session is always the run's last
            _check_resumed_recipe(config, session, recipe)
            print(f"resuming the update with {data} (session {session + 1})")
            return config
        raise DataError(
            f"{data} was already added to {workdir} (update {updates.index(data) + 1}: session "
            f"{_sessions_before(config) + updates.index(data) + 1}); its images are in the "
            f"gallery. Put newly arrived images in a new folder."
        )
    expected = _sessions_before(config) + len(updates)
    if done < expected:
        raise ConfigError(
            f"{workdir} has completed {done} of its {expected} sessions; finish it first (rerun its last command: "
            f"python -m cvs_jax.main or python -m cvs_jax.update), then add {data}."
        )
    dirs = stores.store_dirs(config.data)
    if dirs is None or any(records.read_info(s) is None for s in dirs):
        sources.load_run_dataset(config.data)  # raises the message naming the missing folder (or prepares it)
        dirs = stores.store_dirs(config.data)
    known = _digests(dirs, [d.manual_dir] + updates)
    new = sources.load_dataset(
        "image_folder",
        data_dir=d.data_dir,
        manual_dir=data,
        on_corrupt=d.on_corrupt,
        memory_limit_mb=0.0,  # only its digests are read here
        options=stores.builder_options(d),
    )
    dup = [(name, known[digest]) for digest, name in _digests(new.stores, [data]).items() if digest in known]
    if dup:
        raise DataError(
            f"{len(dup)} image(s) of {data} are already in the run (same bytes), e.g. {dup[0][0]} = {dup[0][1]}; "
            f"remove them from the new folder so that no gallery row is duplicated."
        )
    _check_class_names(workdir, data, new.class_names)
    _warn_few_photos(workdir, data, new)
    config.data.updates = updates + [data]
    for field, value in recipe.items():  # the new session's entry (index: the sessions completed)
        key = SESSION_FIELDS[field]
        values = list(config.train[key])
        values += [None] * (done + 1 - len(values))
        values[done] = value
        config.train[key] = values
    return config


def _check_class_names(workdir: str, data: str, names: Sequence[str]) -> None:
    """Refuses a new class folder whose name differs from a known class's only in case or spaces (``Lemon/``
    for the run's ``lemon``), as ``search --add`` and ``/add`` refuse such a label: it became a second
    class, and a query of one counted the other's hits as wrong."""
    known = list(run_files.read_json(paths.protocol_file(workdir), fields=("class_names",))["class_names"])
    for name in names:
        twin = run_reader.twin_class(name, known)
        if twin is not None and run_reader.same_name(name, known) == twin:
            form = "nfc" if unicodedata.is_normalized("NFC", twin) else "nfd"
            raise DataError(
                f"class folder {name!r} of {data} is the run's class {twin!r} with its accents encoded another "
                f"way (Unicode NFC and NFD: macOS wrote names decomposed), so it would become a second class; "
                f"rename it to the run's form: convmv -f utf8 -t utf8 --{form} -r --notest '{data}'"
            )
        if twin is not None:
            raise DataError(
                f"class folder {name!r} of {data} is not a class of the run, but {twin!r} is (names are matched "
                f"exactly); rename the folder to {twin!r}, or give another class a name that differs in more "
                f"than case or spaces."
            )


def _warn_few_photos(workdir: str, data: str, new) -> None:
    """One warning line per class that first arrives with fewer than ``FEW_PHOTOS`` train photos: it enters
    the classifier and the gallery nearly empty, so its queries seldom find it (the session's R@1 drops)."""
    known = set(run_files.read_json(paths.protocol_file(workdir), fields=("class_names",))["class_names"])
    counts = np.bincount(np.asarray(new.train.labels, np.int64), minlength=len(new.class_names))
    for name, n in zip(new.class_names, counts):
        if name not in known and n < FEW_PHOTOS:
            print(
                f"warning: new class {name!r} has only {n} train photo(s) in {data}; with so few, its queries "
                f"seldom find it. Add {FEW_PHOTOS} or more photos of it to the folder (or leave it for a later "
                f"update)."
            )


def _check_recipe(recipe: dict) -> None:
    lr, epochs = recipe.get("train.lr"), recipe.get("train.epochs")
    if lr is not None and not 0 < lr < float("inf"):
        raise ConfigError(f"--config.train.lr={lr} must be a positive number (e.g. 0.01).")
    if epochs is not None and epochs < 1:
        raise ConfigError(f"--config.train.epochs={epochs} must be at least 1.")


def _check_resumed_recipe(config: ml_collections.ConfigDict, s: int, recipe: dict) -> None:
    """An interrupted update resumes with the recipe its session started with (its steps so far used it)."""
    started = {
        "train.lr": session_recipe.session_lr(config, s),
        "train.epochs": session_recipe.session_epochs(config, s),
    }
    for field, value in recipe.items():
        if value != started[field]:
            raise ConfigError(
                f"session {s + 1} was started with {field}={started[field]:g} and resumes with it; rerun the "
                f"update without --config.{field} (or with --config.{field}={started[field]:g})."
            )


def _sessions_before(config: ml_collections.ConfigDict) -> int:
    """Sessions of the run's first folder (its manifest's session column, else one; the generated
    ``data.num_sessions`` with ``data.split=generator``)."""
    if config.data.split == "generator":
        return int(config.data.num_sessions)
    c = ml_collections.ConfigDict(config.to_dict())
    c.data.updates = []
    c.data.in_memory_limit_mb = 0.0  # only the sessions are read: no image is decoded
    ds = sources.load_run_dataset(c.data)
    return 1 if ds.train_sessions is None or not len(ds.train_sessions) else int(np.max(ds.train_sessions)) + 1


@folder_inventory.scans_held()  # each folder scanned once by the checks, its store and the run
def update(workdir: str, data: str, overrides: dict | None = None) -> int:
    """``overrides``: ``UPDATE_FIELDS`` values to apply (``--config.<field>``), e.g. ``{"data.on_corrupt": "skip"}``."""
    try:
        _train(workdir, data, overrides)
    except UserError as e:
        return cli.report(e)
    return 0


def _train(workdir: str, data: str, overrides: dict | None) -> None:
    config = plan_update(workdir, data, overrides)
    determinism.apply(config.deterministic)
    results = runner.run(config, workdir)
    print(f"{workdir}: {len(results['per_session'])} sessions; results in {paths.results_file(workdir)}")
    print(gate_line(workdir, results))


def from_added_folder(workdir: str) -> tuple[str, bool, str]:
    """``(folder, made, what it holds)``: the folder of the next session made from the added rows
    (``retrieval.added_session``), or the folder of an unfinished ``--from_added`` session to resume
    (``made`` False)."""
    config = writable_config(workdir)
    updates = list(config.data.updates)
    done = added_session.completed_sessions(workdir)
    if (
        updates
        and added_session.is_added_folder(workdir, updates[-1])
        and done < _sessions_before(config) + len(updates)
    ):
        return updates[-1], False, "the images of the session being resumed"
    used, rows, left_out, deferred = added_session.pending(workdir, updates, config.model.embed_dim)
    what = added_session.describe(rows)
    print(f"the next session from {what} added and not yet learnt")
    if left_out:
        print(
            f"note: {len(left_out)} labelled added row(s) left out of it: their bytes are in the run already "
            f"(added with force), e.g. {left_out[0][0]} = {left_out[0][1]}; they stay searchable as added rows."
        )
    if deferred:
        print(added_session.deferred_note(deferred))
    return added_session.make_folder(workdir, done + 1, used, rows), True, what


@folder_inventory.scans_held()
def update_from_added(workdir: str, overrides: dict | None = None) -> int:
    """``update`` on the folder ``from_added_folder`` makes; a refused one is removed (nothing changes)."""
    parent = os.path.join(os.path.abspath(workdir), added_session.FOLDER)
    parent_made = not os.path.isdir(parent)
    try:
        folder, made, what = from_added_folder(workdir)
        try:
            _train(workdir, folder, overrides)
        except ConfigError as e:
            if "fewer than train.batch_size" not in str(e):
                raise
            raise ConfigError(
                f"too few images were added since the last session ({what}): {e} Each class needs at least "
                f"{added_session.MIN_PER_CLASS} images; add more labelled images and start the session again."
            ) from e
        finally:
            if made and folder not in run_config(workdir).data.updates:
                shutil.rmtree(folder if not parent_made else parent, ignore_errors=True)
    except UserError as e:
        return cli.report(e)
    return 0


def gate_line(workdir: str, results: dict) -> str:
    """The compatibility gate's verdict on the session just completed against the one before it, with the
    server's default thresholds (``retrieval.gate``): what a server would decide, for an operator without one."""
    candidate = len(results["per_session"]) - 1
    line = gate.line(gate.evaluate(results, candidate, candidate - 1 if candidate else None, gate.Thresholds()))
    served = gate.served_model(workdir, candidate).model
    if served != candidate:  # what search, export and a server starting now use (docs/serve.md)
        line += (
            f"; search, export and a new server use the model of session {served + 1} "
            f"(--session {candidate + 1}: this one)"
        )
    return line


@cli.command
def main(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> int:
    if len(argv) > 1:
        raise ConfigError(f"unexpected arguments: {argv[1:]}; pass --workdir and --data (or --from_added).")
    cli.quiet_logging()
    overrides = {f: flag_values[f"config.{f}"].value for f in UPDATE_FIELDS if flag_values[f"config.{f}"].present}
    if flag_values.from_added:
        return update_from_added(flag_values.workdir, overrides)
    return update(flag_values.workdir, flag_values.data, overrides)


if __name__ == "__main__":
    cli.run(main, define_flags)
