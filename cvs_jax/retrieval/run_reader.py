"""Reading a trained run for search and export: its newest model, its gallery rows and their sources.

``Run(workdir)`` opens a run at any time, also while it trains: it reads only finalized checkpoints
and writes nothing (``_Reader``); ``Run(workdir, for_add=True)`` may append rows (the caller holds the
workdir's lock).  A query is prepared as the gallery images were stored (``prepare``, the data layer's
``resize.to_stored``) and embedded by the gallery's own path (``Network``).  Used by
``python -m cvs_jax.search`` and ``python -m cvs_jax.export``.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import os
import re
import unicodedata
from typing import Any, Iterable, Sequence

import jax
import ml_collections
import numpy as np
from PIL import Image

from cvs_jax import distributed
from cvs_jax.augment import transforms as augment
from cvs_jax.config import stored
from cvs_jax.data import stores
from cvs_jax.data.builders import resize
from cvs_jax.data.builders.resize import image_errors
from cvs_jax.errors import CheckpointError, SearchError, UserError
from cvs_jax.models import networks as models
from cvs_jax.models.frozen_trunk import FrozenTrunk
from cvs_jax.retrieval import additions, query_maps, topk
from cvs_jax.retrieval.embedder import Embedder
from cvs_jax.retrieval.run_rows import PartLog, Rows, arrival_sessions, train_split
from cvs_jax.rundir import paths, run_files
from cvs_jax.rundir import workdir as workdir_lib
from cvs_jax.rundir.checkpoint import Reader as _Reader
from cvs_jax.rundir.gallery import Gallery, RowConcat

ADDED_BASE = 1 << 40  # an added row's id is ADDED_BASE + its place among the added rows


def parse_int(text: str) -> int | None:
    """``text`` as an integer written the plain way (ASCII digits, an optional leading ``-``, no leading
    zero), else None: ``"²"``, ``"--5"``, ``"٣"`` and ``"007"`` are not numbers here (``str.isdigit`` and
    ``int`` accept some of them, or fail on them)."""
    if re.fullmatch(r"-?(0|[1-9][0-9]{0,17})", text, flags=re.ASCII) is None or text == "-0":
        return None
    return int(text)


def prepare(images: Iterable[Any], shape: Sequence[int]) -> np.ndarray:
    """Image files, PIL images or uint8 arrays -> uint8 [N, H, W, C] as the gallery images were stored.

    Every image goes through ``resize.to_stored`` (the builders' rule: shorter side resized, centre
    crop, "L" or "RGB"), so an image of the stored shape is passed through unchanged."""
    shape = tuple(int(d) for d in shape)
    out = []
    for item in images:
        if isinstance(item, (str, os.PathLike)):
            try:
                with Image.open(item) as im:
                    out.append(resize.to_stored(im, shape))
            except Image.DecompressionBombError as e:  # a readable file, too many pixels to decode safely
                raise SearchError(
                    f"image {os.fspath(item)!r} is too large to decode safely ({e}); pass a downscaled copy (e.g. "
                    f"at most {Image.MAX_IMAGE_PIXELS:,} pixels)."
                ) from e
            except image_errors() as e:
                raise SearchError(f"cannot read image {os.fspath(item)!r} ({e}); pass PNG/JPEG files.") from e
            continue
        if isinstance(item, Image.Image):
            out.append(resize.to_stored(item, shape))
            continue
        out.append(_from_array(np.asarray(item), shape))
    if not out:
        return np.zeros((0,) + shape, np.uint8)
    return np.stack(out)


def _from_array(arr: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if arr.dtype != np.uint8 or arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[-1] not in (1, 3, 4)):
        raise SearchError(f"an image array of shape {arr.shape} and dtype {arr.dtype}: pass uint8 [H, W(, C)].")
    if arr.shape == shape:
        return arr
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    return resize.to_stored(Image.fromarray(arr), shape)


def load_images(paths: list[str], shape: tuple[int, int, int]) -> np.ndarray:
    """Reads image files as uint8 [N, H, W, C] in the dataset's stored size and channel count."""
    return prepare(paths, shape)


class Network:  # shared with cvs_jax.export, as Run and prepare are
    """The run's eval-mode embedding network, used the way the gallery rows were made.

    The gallery rows are ``Embedder(model, Pipeline.from_config(config), train.eval_batch_size, ...)``
    of the stored uint8 images; this is the same object on one device, so the run's eval transform
    (``augment.Pipeline.eval``: normalisation, centre crop for ``crop="resized"``) and
    ``model.apply(train=False)`` apply to a prepared query exactly as to a gallery image. A short batch
    of queries runs in a small bucket (``chunks.iter_chunks``), so a gallery image queried on the machine
    that embedded it gets its stored row back within ``chunks.EXACTNESS``, not bitwise."""

    def __init__(self, config: ml_collections.ConfigDict, variables: dict, image_shape):
        self.variables = variables
        self.image_shape = tuple(int(d) for d in image_shape)
        model, pipeline = models.from_config(config), augment.Pipeline.from_config(config)
        self._embedder = Embedder(
            model,
            pipeline,
            config.train.eval_batch_size,
            config.model.dtype,
            distributed.data_mesh(jax.local_devices()[:1]),
            config.model.embed_dim,
        )

    @functools.cached_property
    def _placed(self) -> dict:
        """The variables on the device, put there once: a served model embeds a query per request."""
        return self._embedder.place(self.variables)

    def embed(self, images: np.ndarray) -> np.ndarray:
        """uint8 [N, H, W, C] of the stored shape -> raw float32 embeddings [N, D]."""
        return self._embedder(self._placed, np.asarray(images, np.uint8), placed=True)

    @property
    def rows_run(self) -> int:
        """Rows passed through the network so far, padding included (``Embedder.rows_run``)."""
        return self._embedder.rows_run

    def compile(self, sizes: Iterable[int]) -> None:
        """Compiles the network for calls of each of ``sizes`` images, without running it (``Embedder.compile``)."""
        self._embedder.compile(self._placed, self.image_shape, sizes)

    def embed_images(self, images: Iterable[Any]) -> np.ndarray:
        """Image files, PIL images or uint8 arrays of any size (``prepare``) -> float32 [N, D]."""
        return self.embed(prepare(images, self.image_shape))


def check_is_run(workdir: str) -> None:
    for name in (paths.CONFIG, paths.PROTOCOL):
        if not os.path.exists(os.path.join(workdir, name)):
            raise SearchError(
                f"{workdir} holds no cvs_jax run ({name} is missing); pass the --workdir of "
                f"a run of python -m cvs_jax.main."
            )


def check_sessions_kept(workdir: str, steps: list[int]) -> None:
    """Refuses a run whose ``results.json`` records more completed sessions than its session checkpoints
    hold, when no process is training it (a training run that set a damaged checkpoint aside trains that
    session again): the newest session's folder was deleted, and the run read without it is an older one,
    answering with an older model and a smaller gallery as if it were this run."""
    try:
        recorded = len(
            run_files.read_json(paths.results_file(workdir), fields=("per_session",), missing={}).get("per_session", [])
        )
    except UserError:  # a damaged results.json: what is searched does not depend on it
        return
    kept = steps[-1] + 1 if steps else 0
    if recorded > kept and workdir_lib.holder(workdir) is None:
        raise SearchError(
            f"{paths.session_dir(workdir, kept)} is missing: {paths.results_file(workdir)} records {recorded} "
            f"completed session(s), the session checkpoints end at session {kept}. Restore "
            f"{paths.sessions_dir(workdir)} from a copy of the run (read without it, the run would answer as the "
            f"older run it was after session {kept})."
            if kept
            else f"{paths.sessions_dir(workdir)} holds no session checkpoint, while {paths.results_file(workdir)} "
            f"records {recorded} completed session(s); restore it from a copy of the run."
        )


def train_source_names(config: ml_collections.ConfigDict) -> list[str] | None:
    """Each train-split row's source (a file path, or e.g. ``file.gz#123`` for packed sources) when the
    data layer can tell (``stores.source_names``, where present and the data is reachable), else None."""
    try:
        return stores.source_names(config.data, "train")
    except (UserError, OSError):  # the dataset is not on this machine: the rows keep their train index
        return None


def file_digest(path: str) -> str:
    """SHA-256 (hex) of a file's bytes: what the record stores keep of every image."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError as e:
        raise SearchError(f"cannot read image {path!r} ({e.strerror}).") from e
    return h.hexdigest()


class Run:
    """The newest model and the full gallery of a finished (or partly finished) run."""

    def __init__(
        self,
        workdir: str,
        *,
        for_add: bool = False,
        model_session: int | None = None,
        added: additions.Added | None = None,
    ):
        """``for_add``: the caller holds the workdir's lock and may write the additions; ``model_session``
        (0-based): embed queries with that completed session's model instead of the newest (a server's
        pin, or a model the gate kept); the gallery is the newest session's either way.  ``added``: added
        rows as stored that the caller holds (a server's, at a switch): only the segments after them are read."""
        self.workdir = workdir
        check_is_run(workdir)
        self.config = stored.stored_config(workdir)
        self.protocol = run_files.read_json(paths.protocol_file(workdir), fields=run_files.PROTOCOL_FIELDS)
        c = self.config
        sessions_dir = paths.sessions_dir(workdir)
        sessions = _Reader(sessions_dir, max_to_keep=None) if os.path.isdir(sessions_dir) else None
        check_sessions_kept(workdir, sessions.steps() if sessions is not None else [])
        if sessions is None or not sessions.steps():
            raise SearchError(f"{workdir} has no completed session yet; wait for the first session to finish.")
        # the newest session's model, as stored (no template: the head may have grown since the
        # protocol was written); a reader never moves a checkpoint (a damaged one is refused)
        steps = sessions.steps()
        if model_session is not None and model_session not in steps:
            raise SearchError(
                f"session {model_session + 1} of {workdir} is not a completed session; pass one of "
                f"{[s + 1 for s in steps]}."
            )
        self.gallery_session = steps[-1]  # the newest completed session: its gallery is searched
        self.session = steps[-1] if model_session is None else model_session  # the model's session
        self._sessions = sessions
        log = PartLog(sessions)
        self.gallery = Gallery.restore(log, self.gallery_session, c.model.embed_dim)
        self._arrival = arrival_sessions(log.parts, self.gallery)
        # retrieval.query_map: {s: model s -> model s - 1}; empty for a run without maps
        self.query_maps = query_maps.stored_maps(workdir, self.gallery_session, c.retrieval.query_map)
        self._additions = additions.writer(workdir) if for_add else None
        if self._additions is not None:  # for_add
            self.use_added(additions.read_for_append(self._additions, c.model.embed_dim))
        else:
            self.use_added(additions.read(workdir, c.model.embed_dim, held=added))

    @property
    def added(self) -> Gallery:
        return self._added.gallery

    @property
    def stored_added(self) -> additions.Added:
        """The added rows as read (or as last handed to ``use_added``): what a server keeps in step."""
        return self._added

    @property
    def added_as_stored(self) -> additions.Added:
        """``stored_added`` with the labels as stored (not resolved by name): what a later read or append
        goes on from (``additions.read``'s ``held``)."""
        return self._added_as_stored

    @property
    def ids(self) -> np.ndarray:
        """Each row's id, int64, which never changes for the life of the run: a session row's place in the
        session gallery (which only appends), ``ADDED_BASE`` + an added row's place among the added rows.
        Row numbers are positions (session rows, then added rows) and shift when a session adds rows."""
        return np.concatenate(
            [np.arange(len(self.gallery), dtype=np.int64), ADDED_BASE + np.arange(len(self._added), dtype=np.int64)]
        )

    def row_of_id(self, row_id: int) -> int | None:
        """The row (position) of an id, None when no row has it."""
        n, m = len(self.gallery), len(self._added)
        if 0 <= row_id < n:
            return int(row_id)
        if ADDED_BASE <= row_id < ADDED_BASE + m:
            return n + int(row_id - ADDED_BASE)
        return None

    def id_of_row(self, row: int) -> int:
        n = len(self.gallery)
        return int(row) if row < n else ADDED_BASE + int(row) - n

    def added_path(self, source: str) -> str:
        """An added row's file: a stored path relative to the workdir (the server's uploads) is read
        from the workdir where it is now, so a moved or copied workdir still shows its rows."""
        return source if os.path.isabs(source) else os.path.join(self.workdir, source)

    @property
    def added_sources(self) -> list[str]:
        return self._added.sources

    @property
    def added_digests(self) -> list[str]:
        """SHA-256 (hex) of each added file ("": added before they were kept)."""
        return self._added.digests

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.protocol["image_shape"])

    @functools.cached_property
    def _stored(self) -> dict:
        """The model's session checkpoint (its weights and meta), read when first needed: ``info`` needs only
        the gallery and the results, and describes a run whose newest weights are damaged (``model_problem``)."""
        return self._sessions.restore(self.session, {"variables": None})

    def model_problem(self) -> str | None:
        """Why the model's weights cannot be read (the checkpoint's one-line refusal), None when they can
        (or were read already: a server's model)."""
        if "network" in self.__dict__:
            return None
        try:
            _ = self._stored
        except CheckpointError as e:
            return str(e)
        return None

    @functools.cached_property
    def network(self) -> Network:
        """The newest session's network, built when first used (``info`` reads the gallery only); a frozen
        trunk, left out of the checkpoints, is read from the weight file (``frozen_trunk``)."""
        c, items = self.config, self._stored
        variables = items["variables"]
        trunk = FrozenTrunk.of(c)
        if trunk is not None:
            trunk.check(items["meta"], os.path.join(paths.sessions_dir(self.workdir), str(self.session)))
            variables = trunk.with_(variables, {"params": trunk.file_params(c, self.image_shape)})
        return Network(c, variables, self.image_shape)

    def preload(self, same_model: "Run | None" = None) -> None:
        """Reads now what the first answer would read lazily (the rows, the train split's source names,
        which import the data layer: seconds), so that a server does it beside serving, not under its
        lock; ``same_model``: a run of the same model session whose network (placed and compiled) this
        one takes instead of building its own."""
        if same_model is not None and same_model.session == self.session and "network" in same_model.__dict__:
            self.__dict__["network"] = same_model.network
        _ = self.rows, self._train_sources

    @property
    def variables(self) -> dict:
        return self.network.variables

    @property
    def class_names(self) -> list[str]:
        """The protocol's classes, then the new ones only added rows carry (``additions.class_list``)."""
        return list(self._class_list)

    def embed(self, images: np.ndarray) -> np.ndarray:
        return self.network.embed(images)

    @functools.cached_property
    def rows(self) -> Rows:
        g, a = self.gallery, self.added
        return Rows(
            embeddings=RowConcat([p.embeddings for p in g.parts + a.parts], width=g.embed_dim),
            labels=np.concatenate([g.labels, a.labels]).astype(np.int32),
            arrival=np.concatenate([self._arrival, a.sessions]).astype(np.int32),
            model=np.concatenate([g.sessions, a.sessions]).astype(np.int32),
            source_ids=np.concatenate([g.source_ids, a.source_ids]).astype(np.int64),
        )

    @functools.cached_property
    def _train_sources(self) -> list[str] | None:
        return train_source_names(self.config)

    def source(self, row: int) -> str:
        """Where a row's image came from: its file (or packed-file entry), ``train[i]`` when the data
        layer cannot tell, for an added row its file (relative to the workdir when inside it)."""
        n = len(self.gallery)
        if row >= n:
            return _relative_inside(self.added_sources[row - n], self.workdir)
        i = int(self.gallery.source_ids[row])
        names = self._train_sources
        return names[i] if names is not None and 0 <= i < len(names) else f"train[{i}]"

    def class_name(self, label: int) -> str:
        names = self._class_list  # per hit: not copied
        return names[label] if 0 <= label < len(names) else "?"

    def describe(self, row: int) -> dict:
        """What a hit (or an exported row) shows; sessions 1-based."""
        r = self.rows
        label = int(r.labels[row])
        return {
            "row": int(row),
            "id": self.id_of_row(row),
            "label": label,
            "class_name": self.class_name(label),
            "arrival_session": int(r.arrival[row]) + 1,
            "model_session": int(r.model[row]) + 1,
            "source": self.source(row),
        }

    @functools.cached_property
    def _train_split(self):
        return train_split(self.config)

    def row_images(self, rows: list[int]) -> list[np.ndarray | None]:
        """The stored images of rows (the thumbnails of hits): a session row read from the run's train
        split (its record stores or TFDS copy), an added row from its file; None where it cannot be read."""
        n, out = len(self.gallery), []
        for row in rows:
            image = None
            if row >= n:
                try:
                    image = prepare([self.added_path(self.added_sources[row - n])], self.image_shape)[0]
                except SearchError:
                    image = None
            elif self._train_split is not None:
                i = int(self.gallery.source_ids[row])
                try:
                    image = self._train_split.read(np.asarray([i]))[0] if 0 <= i < len(self._train_split) else None
                except (UserError, OSError):  # a store changed or gone since: the hit shows no picture
                    image = None
            out.append(image)
        return out

    def search(self, images: np.ndarray, k: int) -> list[list[dict]]:
        """Hits of uint8 images of the stored shape, best first (exact cosine, ties to the lower row).  A run
        with query maps scores each part (session rows and ``--add`` rows alike) with the query mapped from
        the newest model's space down to the space of the model that made the part (``query_maps``)."""
        q = self.embed(images)
        if self.query_maps:
            parts = [(p.session, p.embeddings) for p in self.gallery.parts + self.added.parts]
            scores, idx = query_maps.mapped_topk_indices(q, parts, self.query_maps, self.session, k)
            keep = min(k, len(self.rows))
            scores, idx = scores[:, :keep], idx[:, :keep]
        else:
            scores, idx = topk.topk_indices(q, self.rows.embeddings, k)
        return self.hits(scores, idx)

    def hits(self, scores: np.ndarray, rows: np.ndarray) -> list[list[dict]]:
        """Per query, its hits as ``search --json`` shows them (rank, score, ``describe``); rows < 0
        (fewer rows than asked for) are left out."""
        return [
            [
                {"rank": r + 1, "score": float(sc), **self.describe(int(j))}
                for r, (sc, j) in enumerate((sc, j) for sc, j in zip(srow, irow) if j >= 0)
            ]
            for srow, irow in zip(scores, rows)
        ]

    def use_added(self, added: additions.Added) -> None:
        """Rows added since this run was read (a server's ``/add``, or a newer step on disk), labelled by
        name against this run's protocol (``additions.resolve``)."""
        self._added_as_stored = added
        self._added = additions.resolve(added, self.protocol["class_names"])
        self._class_list = additions.class_list(self._added, self.protocol["class_names"])
        self.__dict__.pop("rows", None)

    def duplicates(self, paths: list[str]) -> list[tuple[str, str]]:
        """(path, where its bytes already are) for each file whose content (SHA-256) is already in the run:
        a row of its data (train or test), an earlier ``--add``, or an earlier file of ``paths``."""
        stored_rows = stores.store_digests(self.config)
        return duplicates_of([(p, file_digest(p)) for p in paths], self._added, stored_rows)

    def add(self, images: np.ndarray, paths: list[str], label: str | None) -> None:
        """Appends the images embedded by the newest model (``additions.append``), under the class ``label``
        (a name, new or known, or a label number; ``label_and_name``); needs ``for_add``."""
        if self._additions is None:
            raise RuntimeError("Run(workdir, for_add=True) adds rows (while holding the additions' lock)")
        value, name = self.label_and_name(label, new=True)
        self.use_added(
            additions.append(
                self._additions,
                self._added,
                self.embed(images),
                np.full(len(paths), value, np.int32),
                [name] * len(paths),
                [os.path.abspath(p) for p in paths],
                [file_digest(p) for p in paths],
                self.session,
            )
        )

    def label_of(self, name: str | None) -> int:
        """The label of a class name (or label number) the run knows; ``label_and_name``."""
        return self.label_and_name(name)[0]

    def label_and_name(self, text: str | None, *, new: bool = False) -> tuple[int, str]:
        """``(label, class name)`` of ``--label``/``label=``: a class the run knows (the protocol's, or one
        only added rows carry), a label number, None (``(-1, "")``: unlabelled); ``new``: an unknown name
        is a new class (``check_new_class``), numbered after the known ones.  Else ``SearchError``."""
        if text is None:
            return -1, ""
        names = self.class_names
        if text in names:
            return names.index(text), text
        spelled = same_name(text, names)
        if spelled is not None:  # the same name to a reader: that class, under the name the run holds
            return names.index(spelled), spelled
        number = parse_int(text)
        if number is not None and -1 <= number < len(names):
            return number, names[number] if number >= 0 else ""
        if new:
            check_new_class(text, names)
            return len(names), text
        close = difflib.get_close_matches(text, names, n=1) or difflib.get_close_matches(
            text.lower(), [n.lower() for n in names], n=1
        )
        hint = f"did you mean {names[[n.lower() for n in names].index(close[0].lower())]!r}? " if close else ""
        raise SearchError(
            f"label {text!r} is neither a class name nor a label number of this run; {hint}known classes: "
            f"{', '.join(names[:10])}{', ...' if len(names) > 10 else ''}."
        )


NAME_MAX = 100  # characters of a new class's name (a folder name in a session's folder)
RESERVED_NAMES = ("train", "test")  # a folder of class folders would read them as its split folders


def same_name(name: str, known: list[str]) -> str | None:
    """The known class whose name is ``name`` in another Unicode form, else None: ``é`` as one code point (NFC,
    what a browser or a keyboard sends) or as ``e`` + a combining accent (NFD, how macOS wrote file names).
    They read the same, so a label of either names that class; ``/add?label=`` in the other form made a
    second class whose name looked identical."""
    if name in known:
        return None
    composed = {unicodedata.normalize("NFC", n): n for n in known}
    return composed.get(unicodedata.normalize("NFC", name))


def twin_class(name: str, known: list[str]) -> str | None:
    """The known class ``name`` differs from only in case, spaces or Unicode form (``lemon`` for ``Lemon``),
    else None: such a name is most likely that class mistyped, and as a class of its own a query of one counts
    the other's hits as wrong (``check_new_class``; ``update``'s class folders)."""
    if name in known:
        return None
    folded = {unicodedata.normalize("NFC", n.strip()).casefold(): n for n in known}
    return folded.get(unicodedata.normalize("NFC", name.strip()).casefold())


def check_new_class(name: str, known: list[str]) -> None:
    """Refuses (``SearchError``) a class name that cannot become a new class: one that only differs from a
    known class in case or spaces (most likely that class, mistyped), a number (labels are numbers), or
    one that cannot name the class's folder in the session made from the adds (``added_session``)."""
    twin = twin_class(name, known)
    if twin is not None:
        raise SearchError(
            f"label {name!r} is not a class of the run, but {twin!r} is; pass that name (names are matched exactly)."
        )
    digits = name.strip("+-")
    if digits and all(c.isnumeric() for c in digits):  # 7, 007, --1, ², ٣: a label number, or meant as one
        raise SearchError(
            f"label {name!r} reads as a number, and the run's labels are 0 to {len(known) - 1} (plain ASCII digits); "
            f"a new class needs a name that is not a number."
        )
    bad = (
        not name
        or name != name.strip()
        or len(name) > NAME_MAX
        or name.startswith(".")
        or name in RESERVED_NAMES
        or any(c in name for c in "/\\")
        or not name.isprintable()
    )
    if bad:
        raise SearchError(
            f"label {name!r} cannot name a new class: a class name is 1 to {NAME_MAX} printable characters, without "
            f"/ or \\, leading or trailing spaces or a leading '.', and not {' or '.join(RESERVED_NAMES)}."
        )


def _relative_inside(path: str, workdir: str) -> str:
    """``path`` relative to ``workdir`` when it lies inside it (an answer names no server folder)."""
    if not os.path.isabs(path):
        return path
    rel = os.path.relpath(path, os.path.abspath(workdir))
    return path if rel == ".." or rel.startswith(".." + os.sep) else rel


def duplicates_of(
    named: list[tuple[str, str]], added: additions.Added, stores_known: dict[str, str]
) -> list[tuple[str, str]]:
    """(name, where its bytes already are) for each (name, SHA-256 hex) whose content is already in the
    run: a row of its data (``stores_known``: ``stores.store_digests``), an added row, or an earlier name."""
    known = dict(zip(added.digests, added.sources))
    known.pop("", None)
    out = []
    for name, digest in named:
        where = known.get(digest) or stores_known.get(digest)
        if where is not None:
            out.append((name, where))
        known.setdefault(digest, name)
    return out


def load_each(paths: list[str], shape) -> tuple[np.ndarray, dict[str, SearchError]]:
    """The readable queries as uint8 [N, H, W, C] (in order) and the error of each unreadable one."""
    images, failed = [], {}
    for p in paths:
        try:
            images.append(load_images([p], shape)[0])
        except SearchError as e:
            failed[p] = e
    return (np.stack(images) if images else np.zeros((0, *shape), np.uint8)), failed
