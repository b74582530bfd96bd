"""The run as served: its newest model, its rows in the index, adds, and the switch to a new session.

``Served(workdir)`` reads the run as ``search`` does (``run_reader.Run``: newest completed session,
its model, every gallery part, the added rows) and puts every row's stored embedding into the index
under a row key that never changes: a session row's key is its place in the session gallery, an added
row's is ``ADDED_BASE`` + its place among the added rows.  The row numbers a client sees are
``search``'s (session rows, then added rows), mapped from the keys with the model session that answers.

The switch: a watcher thread polls the workdir (a directory listing of the session checkpoints and
of the additions).  When a newer session is complete it reads that run in the background (model,
gallery), runs the new model once (its compile happens there, not in a request), then hands the
switch to the batcher's thread, which adds only the new session's rows to the index (stored
embeddings; no row is re-embedded) and replaces the run between two batches.  Only a ``joint``
session, which re-embeds the whole gallery, makes a new index (on Milvus a collection of that
generation: ``_generation``; the collections before the one left are dropped after the switch).

Everything that reads or changes ``run`` and ``index`` runs under the batcher's lock (on its thread, or
a lone search on the event loop's: ``Batcher.now``); adds write their rows under the additions' lock
(``workdir.hold_additions``), durably, before they are answered.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import threading
from collections import Counter
from typing import Any, Callable

import numpy as np

from cvs_jax.data import chunks, stores
from cvs_jax.errors import IndexBackendError, NotWritableError, SearchError, not_writable
from cvs_jax.index import registry as index_registry
from cvs_jax.retrieval import additions, gate, query_maps, run_reader, topk
from cvs_jax.retrieval.run_reader import ADDED_BASE
from cvs_jax.rundir import paths
from cvs_jax.rundir import workdir as workdir_lib
from cvs_jax.rundir.gallery import Gallery
from cvs_jax.serve import uploads as uploads_lib
from cvs_jax.serve.batcher import Batcher

WARM_K = 5  # the default k: its top-K is compiled for every batch bucket at the start
log = logging.getLogger("cvs_jax.serve")


def _read_only(workdir: str) -> str | None:
    """Why this server cannot write into ``workdir`` (a read-only mount, another user's run), found at start,
    or None.  Such a run is served read-only: searches, pages and pins work; ``/add`` and ``POST /sessions``
    answer 403 (a refusal retrying cannot cure), while a disk that refuses a write later (full) answers 503."""
    try:
        workdir_lib.check_writable(workdir)
    except NotWritableError as e:
        log.warning("%s Serving it read-only: /add and POST /sessions answer 403.", e)
        return e.cause
    return None


class Duplicate(SearchError):
    """Images whose bytes are already in the run (answered 409)."""


@dataclasses.dataclass(frozen=True)
class Query:
    images: np.ndarray  # uint8 [n, H, W, C], prepared
    k: int
    label: int | None  # only hits of this label, when given


@dataclasses.dataclass(frozen=True)
class Answer:
    model_session: int  # 1-based
    gallery_rows: int
    hits: list[list[dict]]  # per image, as ``search --json``


def _extends(old: Gallery, new: Gallery) -> bool:
    """``new`` is ``old`` plus appended parts (not a ``joint`` re-embedding of everything)."""
    k = len(old.parts)
    return len(new.parts) >= k and all(
        len(a) == len(b) and a.session == b.session and not b.replaces for a, b in zip(old.parts, new.parts)
    )


def _generation(gallery: Gallery) -> int:
    """The session whose re-embedding ``gallery`` is (a ``joint`` part replaces every row before it), 0
    for a gallery that only appends: what names a Milvus collection, the same ids holding other vectors."""
    first = gallery.parts[0] if gallery.parts else None
    return first.session if first is not None and first.replaces else 0


def _close(index) -> None:
    """Lets go of an index no longer searched (a Milvus client's connection)."""
    close = getattr(index, "close", None)
    if close is not None:
        close()


QUERY_CHUNK = 1024  # the exact index's query chunk (``index.exact``): batches up to it are one chunk


def warm_sizes(max_batch: int, chunk: int) -> list[int]:
    """One batch size per bucket (``data.chunks.bucket``) that batches of 1..``max_batch`` images fall in."""
    return sorted({chunks.bucket(min(n, chunk), chunk) for n in range(1, max_batch + 1)})


class Served:
    def __init__(
        self,
        workdir: str,
        *,
        make_index: Callable[..., Any] = functools.partial(index_registry.make_index, "exact"),
        max_wait_s: float = 0.005,
        max_batch: int = 64,
        poll_s: float = 1.0,
        thresholds: gate.Thresholds = gate.Thresholds(),
        max_k: int = 100,
        warm_all: bool = False,
        announce: Callable[[str], None] | None = None,
    ):
        """``make_index(dim, generation=...)``: the index (``index.registry.make_index``'s arguments);
        ``thresholds``: the compatibility gate on each switch; ``warm_all``: compile every k bucket up to
        ``max_k`` (and the label path's) in a background thread, so that no request compiles; ``announce``:
        told one line once the run is read, before the compiles (the command prints it)."""
        self.workdir = workdir
        self._workdir_abs = os.path.abspath(workdir)
        self.thresholds = thresholds
        self.gate: dict | None = None  # the last verdict (``/info``)
        self.gate_counts: Counter = Counter()
        self._pin: int | None = None  # the pinned session (0-based), None: follow the newest through the gate
        self.read_only = _read_only(workdir)  # why this server may not write the run (then /add is off), or None
        self.run = self._first_run()  # restores a recorded pin
        if announce is not None:
            announce(
                f"loading {workdir} (model of session {self.run.session + 1}): compiling it for batches of 1 to "
                f"{max_batch} images before serving (the first start on this machine compiles; later starts read "
                "the compile cache) ..."
            )
        self.run.preload()
        self._record()
        self.dim = int(self.run.config.model.embed_dim)
        self._make_index = make_index
        self.index = make_index(self.dim, generation=_generation(self.run.gallery))
        check = getattr(self.index, "check_rows", None)
        if check is not None:  # a store that outlives the process (Milvus): it must hold this run's rows
            check(self.run.ids, self._embeddings_of)  # before anything is written to it
        self._in_gallery = 0  # session rows in the index
        self._in_added = 0  # added rows in the index
        self._added_step = None
        self._written: additions.Added | None = None  # the added rows as this server last wrote them
        self._writer = None  # the additions' writer that wrote them (``_writer_and_rows``)
        self._index_gallery(self.run)
        self._sync_added(self.run.stored_added)
        self.switches = 0
        self._add_lock = threading.Lock()
        self._stores: tuple[int, dict] | None = None
        self.batcher = Batcher(self._answer, max_wait_s=max_wait_s, max_images=max_batch)
        self._max_batch = max_batch
        self._warm(self.run)
        for n in warm_sizes(max_batch, QUERY_CHUNK):  # the index's query buckets, compiled before serving
            self.index.search(np.zeros((n, self.dim), np.float32), WARM_K)
        self._stop = threading.Event()
        self._switching = threading.Lock()  # one switch or pin at a time (the watcher, a request)
        self.warmed = threading.Event()  # set when ``warm_all``'s compiles are done
        if warm_all:
            threading.Thread(target=self._warm_ks, args=(max_k,), name="warm-k", daemon=True).start()
        self._poll_s = poll_s
        self._watcher = threading.Thread(target=self._watch, name="watcher", daemon=True)
        if poll_s > 0:
            self._watcher.start()

    def _first_run(self) -> run_reader.Run:
        """The run to serve at start: the model ``gate.served_model`` chooses (a pin recorded in
        ``served.json`` holds; otherwise the sessions completed since the model it records, or since
        session 1 for a run never served, go through the gate), logged as the watcher logs its verdicts."""
        newest = gate.newest_session(self.workdir)
        if newest is None:
            return run_reader.Run(self.workdir)  # refused, with the reader's one line
        # decided from the listing, so the run (its gallery: one restore per session) is read once
        choice = gate.served_model(self.workdir, newest, self.thresholds)
        run = run_reader.Run(self.workdir, model_session=choice.model)
        if run.gallery_session != newest:  # a session completed meanwhile: it goes through the gate too
            choice = gate.served_model(self.workdir, run.gallery_session, self.thresholds)
            if choice.model != run.session:
                run = run_reader.Run(self.workdir, model_session=choice.model)
        for line in choice.notes:
            log.warning("at start, %s", line)
        for verdict in choice.verdicts:
            self.gate = verdict
            self.gate_counts[verdict["decision"]] += 1
        for text in gate.lines(choice.verdicts):
            log.warning("at start, %s", text)
        self._pin = choice.pin
        return run

    def _record(self) -> None:
        """Writes ``served.json`` (the served model and gallery sessions and the pin, 0-based), replaced
        atomically; a workdir this server cannot write to only loses the restart's gate and pin (logged)."""
        path = paths.served_file(self.workdir)
        tmp = f"{path}.{os.getpid()}.tmp"
        record = {
            "model_session": self.run.session,
            "gallery_session": self.run.gallery_session,
            "pinned_session": self._pin,
        }
        try:
            with open(tmp, "w") as f:
                json.dump(record, f)
            os.replace(tmp, path)
        except OSError as e:
            log.warning("cannot record the served sessions in %s (%s): a restart serves the newest model", path, e)

    @property
    def model_session(self) -> int:
        return self.run.session + 1

    def status(self) -> dict:
        """What ``/info`` adds: the served model, the pin and the gate's last verdict (sessions 1-based)."""
        return {
            "model_session": self.model_session,
            "pinned_session": None if self._pin is None else self._pin + 1,
            "gate": self.gate,
        }

    def close(self) -> None:
        self._stop.set()
        self.batcher.close()
        with self._add_lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    # --- searching (under the batcher's lock) ------------------------------------------------------

    def search(self, images: np.ndarray, k: int, label: int | None = None) -> Answer:
        return self.batcher.submit(Query(images, k, label), len(images)).result()

    def public_path(self, path: str) -> str:
        """A source as an answer shows it: relative to the workdir (``../photos/x.jpg`` for a run's photo
        folder beside it), so that no answer names a server folder; ``train[i]`` and relative paths as
        they are."""
        if not os.path.isabs(path):
            return path
        return os.path.relpath(path, self._workdir_abs)

    def _rows(self, keys: np.ndarray, run: run_reader.Run) -> np.ndarray:
        """Rows of index keys; a key this replica has not read yet (a row another replica added to a shared
        Milvus collection, before this one's next poll) is left out (-1), as a missing hit."""
        n_gallery, added = len(run.gallery), keys >= ADDED_BASE
        known = np.where(added, keys - ADDED_BASE < len(run.rows) - n_gallery, (keys >= 0) & (keys < n_gallery))
        return np.where(known, np.where(added, n_gallery + keys - ADDED_BASE, keys), -1)

    def _answer(self, queries: list[Query]) -> list[Answer]:
        run = self.run  # one model and one index for the whole batch
        emb = run.embed(np.concatenate([q.images for q in queries]))
        k_fetch = max(q.k * (4 if q.label is not None else 1) for q in queries)
        scores, rows = self._top(emb, k_fetch, run)
        out, start = [], 0
        for q in queries:
            hits = []
            for i in range(start, start + len(q.images)):
                s, r = scores[i], rows[i]
                if q.label is not None:
                    s, r = self._of_label(emb[i], s, r, q, run, k_fetch)
                found = run.hits(s[None, : q.k], r[None, : q.k])[0]
                for hit in found:
                    hit["source"] = self.public_path(hit["source"])
                hits.append(found)
            out.append(Answer(run.session + 1, len(run.rows), hits))
            start += len(q.images)
        return out

    def _of_label(self, emb, s, r, q: Query, run, k_fetch: int):
        """The hits of ``q.label`` alone: more candidates are fetched until ``k`` of them, or all rows."""
        labels = run.rows.labels
        while True:
            keep = (r >= 0) & (labels[np.maximum(r, 0)] == q.label)
            if keep.sum() >= q.k or k_fetch >= len(self.index):
                return s[keep], r[keep]
            k_fetch = min(k_fetch * 4, len(self.index))
            s2, r2 = self._top(emb[None], k_fetch, run)
            s, r = s2[0], r2[0]

    def _top(self, emb: np.ndarray, k: int, run: run_reader.Run) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows) of the top ``k``: the index's, or, for a run with query maps, ``search``'s own
        mapped search (each part scored with the query mapped into its model's space; no index can hold
        one vector per query for that)."""
        if not run.query_maps:
            return self._top_known(emb, k, run)
        parts = [(p.session, p.embeddings) for p in run.gallery.parts + run.added.parts]
        return query_maps.mapped_topk_indices(emb, parts, run.query_maps, run.session, k)

    def _top_known(self, emb: np.ndarray, k: int, run: run_reader.Run) -> tuple[np.ndarray, np.ndarray]:
        """The index's top ``k`` among the rows this replica knows: keys it has not read yet (rows another
        replica put in a shared collection) are skipped, fetching more until ``k`` known rows or all."""
        fetch = k
        while True:
            scores, keys = self.index.search(emb, fetch)
            rows = self._rows(keys, run)
            unknown = int(((keys >= 0) & (rows < 0)).sum(axis=1).max(initial=0))
            if not unknown:
                return scores, rows
            if fetch >= len(self.index):
                break
            fetch = min(fetch + unknown, len(self.index))
        order = np.argsort(rows < 0, axis=1, kind="stable")[:, :k]  # known rows first, in score order
        return np.take_along_axis(scores, order, 1), np.take_along_axis(rows, order, 1)

    # --- the index (under the batcher's lock) ------------------------------------------------------

    def _index_gallery(self, run: run_reader.Run) -> None:
        start, stop = self._in_gallery, len(run.gallery)
        if stop > start:
            self.index.add(
                np.arange(start, stop, dtype=np.int64),
                run.gallery.embeddings[start:stop],
                run.rows.arrival[start:stop],
                run.gallery.sessions[start:stop],
            )
        self._in_gallery = stop

    def exact_copy(self):
        """An exact index holding the rows the served index holds, under the same keys: what an approximate
        index's recall is measured against (``--index faiss-*``/``milvus`` print it at start)."""
        return self._fill(index_registry.make_index("exact", self.dim), self.run)

    def _embeddings_of(self, ids: np.ndarray) -> np.ndarray:
        """The stored embeddings of rows by id (float32 [N, D])."""
        run = self.run
        out = []
        for i in ids:
            r = run.row_of_id(int(i))
            assert r is not None  # check_rows asks only for ids the run holds
            out.append(np.asarray(run.rows.embeddings[r : r + 1], np.float32)[0])
        return np.stack(out)

    @staticmethod
    def _fill(index, run: run_reader.Run):
        """``index`` with every row of ``run`` under its id."""
        g, added = run.gallery, run.stored_added
        index.add(np.arange(len(g), dtype=np.int64), g.embeddings, run.rows.arrival[: len(g)], g.sessions)
        if len(added):
            s = added.gallery.sessions
            index.add(ADDED_BASE + np.arange(len(added), dtype=np.int64), added.gallery.embeddings, s, s)
        return index

    def _sync_added(self, added: additions.Added) -> None:
        """Puts the added rows the index lacks into it (``added``: what is stored now)."""
        if len(added) < len(self.run.added_sources):
            return  # an older read than what is served
        start, stop = self._in_added, len(added)
        if stop > start:
            sessions = added.gallery.sessions[start:stop]
            self.index.add(
                ADDED_BASE + np.arange(start, stop, dtype=np.int64),
                added.gallery.embeddings[start:stop],
                sessions,
                sessions,
            )
        self._in_added = stop
        self._added_step = added.step
        self.run.use_added(added)

    def _switch(self, new: run_reader.Run, index=None) -> None:
        """Serves ``new`` (a newer gallery, or another model: a pin); ``index``: a new index already filled
        beside serving (a ``joint`` session re-embeds every row)."""
        old = self.run
        if new.gallery_session < old.gallery_session or (
            new.gallery_session == old.gallery_session and new.session == old.session
        ):
            return
        if len(old.stored_added) > len(new.stored_added):  # rows added while the new run was read
            new.use_added(old.added_as_stored)
        if index is not None:
            self.index, self._in_gallery, self._in_added = index
        elif not _extends(old.gallery, new.gallery):  # joint, and no index made beside serving
            self.index = self._make_index(self.dim, generation=_generation(new.gallery))
            self._in_gallery = self._in_added = 0
        self.run = new
        self._index_gallery(new)
        self._in_added = min(self._in_added, len(new.stored_added))
        self._sync_added(new.stored_added)
        self.switches += new.session != old.session
        self._record()
        log.warning("serving the model of session %d (%d rows)", new.session + 1, len(new.rows))

    # --- watching the workdir -----------------------------------------------------------------------

    def _warm(self, run: run_reader.Run) -> None:
        """Compiles the model for every batch bucket a request can hit, so that no compile happens in a
        request (a new session's model too, before the switch)."""
        run.network.compile(warm_sizes(self._max_batch, int(run.config.train.eval_batch_size)))

    def _warm_ks(self, max_k: int) -> None:
        """Compiles, beside serving, the index's search of one query (a lone request, and every step of
        a label's wider fetch) for every k bucket up to ``4 max_k`` and the whole gallery: a request
        with a new k or a label compiles nothing.  Batches of several images are warmed at k=5 only:
        every warmed shape is compiled again at each growth past a power of two (``prepare``), so all
        ~20 batch buckets x 11 k buckets would cost minutes of CPU per growth on a small host."""
        warm = getattr(self.index, "warm", None)
        if warm is None:
            return
        ks = sorted({1 << e for e in range(topk.pow2(4 * max_k).bit_length())} | {len(self.index)})
        for n in (1,):
            for k in ks:
                if self._stop.is_set():
                    return
                if k < 1:
                    continue
                try:
                    warm(n, k)
                except Exception:  # noqa: BLE001 -- a warm-up only: the request would compile it itself
                    log.exception("warming the search for k=%d failed", k)
                    return
        self.warmed.set()

    def poll(self) -> None:
        """Takes a newer completed session through the gate (or at the pinned model), and the rows added
        by others (``search --add``)."""
        newest = gate.newest_session(self.workdir)
        if newest is not None and newest > self.run.gallery_session:
            with self._switching:
                self._take(newest)
        step = additions.newest_step(self.workdir)
        written = self._written  # a step this server wrote is taken in by its add (not read back here)
        if step is not None and step != self._added_step and (written is None or step != written.step):
            added = additions.read(self.workdir, self.dim, held=self.run.added_as_stored)  # the new segments
            prepare = getattr(self.index, "prepare", None)
            if prepare is not None:
                prepare([len(added) - self._in_added])
            self.batcher.call(lambda: self._sync_added(added)).result()

    def _take(self, newest: int) -> None:
        """Serves session ``newest``'s gallery with the model the gate (or the pin) chooses."""
        if newest <= self.run.gallery_session:
            return
        model = self._pin
        if model is None:
            verdict = gate.for_workdir(self.workdir, newest, self.run.session, self.thresholds)
            if verdict["decision"] == "pending":
                return  # the run writes its scores with the session: read them at the next poll
            self.gate = verdict
            self.gate_counts[verdict["decision"]] += 1
            log.warning("%s", gate.line(verdict))
            model = None if verdict["decision"] == "switched" else self.run.session
        self._install(run_reader.Run(self.workdir, model_session=model, added=self.run.added_as_stored))

    def _install(self, new: run_reader.Run) -> None:
        """Everything slow beside serving (the model's first runs, a bigger index's compiles, or a whole new
        index for ``joint``), then the switch itself between two batches."""
        new.preload(same_model=self.run)  # the rows, the sources, the network when the model stays
        if new.session != self.run.session:
            self._warm(new)
        index = None
        if not _extends(self.run.gallery, new.gallery):
            fresh = self._make_index(self.dim, generation=_generation(new.gallery))
            self._fill(fresh, new)
            for n in warm_sizes(self._max_batch, QUERY_CHUNK):
                fresh.search(np.zeros((n, self.dim), np.float32), WARM_K)
            index = (fresh, len(new.gallery), len(new.stored_added))
        else:
            prepare = getattr(self.index, "prepare", None)
            if prepare is not None:
                prepare([len(new.gallery) - self._in_gallery, len(new.stored_added) - self._in_added])
        old, left = self.index, _generation(self.run.gallery)
        self.batcher.call(lambda: self._switch(new, index)).result()
        if index is not None and self.index is index[0]:
            self._retire(old, left)
        elif index is not None:  # not taken (a newer run was served meanwhile)
            _close(index[0])

    def _retire(self, old, left: int) -> None:
        """Closes the index left; on a store shared by replicas, drops the re-embeddings older than the
        generation ``left`` (that one stays: a replica still serving the older model searches it until it
        switches too).  A failure there is logged: the switch has happened."""
        drop = getattr(self.index, "drop_generations_before", None)
        try:
            if drop is not None:
                drop(left)
        except IndexBackendError:
            log.exception("dropping the older collections failed; they stay (drop them by hand)")
        _close(old)

    def pin(self, session: int | None) -> dict:
        """Serves the model of completed session ``session`` (0-based), past the gate; None: follows the
        newest session again (through the gate).  Says how many rows a newer model than the served one
        embedded: those are searched across models (docs/serve.md has what that cost when measured)."""
        with self._switching:
            newest = gate.newest_session(self.workdir)
            if session is not None and (newest is None or session > newest):
                raise SearchError(
                    f"session {session + 1} has not completed; pass one of 1 to {0 if newest is None else newest + 1}."
                )
            self._pin = session
            if session is None:
                model = self.run.session
                if newest is not None and newest != self.run.session:
                    verdict = gate.for_workdir(self.workdir, newest, self.run.session, self.thresholds)
                    self.gate = verdict
                    self.gate_counts[verdict["decision"]] += 1
                    log.warning("%s", gate.line(verdict))
                    model = None if verdict["decision"] == "switched" else self.run.session  # pending: stay
            else:
                model = session
            self._install(run_reader.Run(self.workdir, model_session=model, added=self.run.added_as_stored))
            self._record()  # the pin (or its end) also when the served model stays
            run = self.run
        newer = int(np.sum(run.rows.model > run.session))
        return {
            "model_session": run.session + 1,
            "pinned_session": None if self._pin is None else self._pin + 1,
            "gallery_rows": len(run.rows),
            "rows_by_newer_models": newer,
            "note": (
                f"{newer} of {len(run.rows)} rows were embedded by a newer model than session {run.session + 1}'s "
                f"and are searched across models (docs/serve.md, 'Pinning a model', has what that costs)."
                if newer
                else "every row was embedded by this model or an older one"
            ),
        }

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 -- a half-written session or a transient read: next poll
                log.exception("reading the workdir failed; trying again at the next poll")

    # --- adding rows ---------------------------------------------------------------------------------

    def _store_digests(self, run: run_reader.Run) -> dict[str, str]:

        if self._stores is None or self._stores[0] != run.session:
            self._stores = (run.session, stores.store_digests(run.config))
        return self._stores[1]

    def add(
        self, uploads: list[uploads_lib.Upload], label: str | None, force: bool, wait_s: float | None = None
    ) -> dict:
        """Embeds the uploads with the served model and appends them as ``search --add`` does (same
        duplicate-bytes rule, same row layout); returns when the rows are on disk and searchable."""
        run = self.run
        label_value, name = run.label_and_name(label, new=True)  # a new name is a new class
        new_class = bool(name) and name not in run.class_names
        named = [(u.name, u.digest) for u in uploads]
        with self._add_lock:
            self._refuse_duplicates(named, run.stored_added, run, force)
            check = getattr(self.index, "check_reachable", None)
            if check is not None:  # a Milvus server down: refused (503) before anything is written
                check()
            images = np.stack([u.image for u in uploads])
            emb, session = self.batcher.call(lambda: (self.run.embed(images), self.run.session)).result()
            with workdir_lib.hold_additions(self.workdir, wait_s=wait_s):
                writer, current = self._writer_and_rows()
                try:
                    if current is not self._written or len(current) != len(run.stored_added):
                        self._refuse_duplicates(named, current, run, force)  # rows the check above lacked
                    sources = [uploads_lib.save(self.workdir, u) for u in uploads]
                    stored = additions.append(
                        writer,
                        current,
                        emb,
                        np.full(len(uploads), label_value, np.int32),
                        [name] * len(uploads),
                        sources,
                        [u.digest for u in uploads],
                        session,
                    )
                except BaseException as e:
                    self._writer, self._written = None, None  # the next add opens and reads the store afresh
                    writer.close()  # also a fresh writer whose rows held a duplicate (a 409)
                    refusal = not_writable(e) if isinstance(e, OSError) else None
                    if refusal is None:
                        raise
                    raise refusal from None  # a full disk: 503, not 500 (no row was acknowledged)
                self._writer, self._written = writer, stored
            n, first = len(uploads), len(stored) - len(uploads)
            prepare = getattr(self.index, "prepare", None)
            if prepare is not None:  # a bigger index's compiles here, beside serving, not under the lock
                prepare([len(stored) - self._in_added])

            def integrate():
                self._sync_added(stored)
                rows = [len(self.run.gallery) + i for i in range(first, first + n)]
                return rows, int(self.run.rows.labels[rows[0]])  # the label the name has now

            rows, label_value = self.batcher.call(integrate).result()
        return {
            "added": n,
            "ids": [ADDED_BASE + i for i in range(first, first + n)],
            "rows": rows,
            "label": label_value,
            "class_name": name or None,
            "new_class": new_class,
            "model_session": session + 1,
            "gallery_rows": len(self.run.rows),
        }

    def _writer_and_rows(self) -> tuple[Any, additions.Added]:
        """The additions' writer and the rows to append to (the caller holds the additions' lock): the ones
        this server last wrote, with the writer that wrote them, while no other writer has written since;
        else a fresh writer and those rows with the segments other writers wrote since.  A writer opened and
        closed per add kept ~170 kB per save inside orbax at 100,000 rows; one kept open keeps nothing."""
        current = self.added_now()
        if current is not None and self._writer is not None:
            return self._writer, current
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        writer = additions.writer(self.workdir)
        try:  # the rows it holds are stored (rows are only appended): only the other writers' segments are read
            held = max((a for a in (self._written, self.run.added_as_stored) if a is not None), key=len)
            return writer, additions.read_for_append(writer, self.dim, held=held)
        except BaseException:
            writer.close()
            raise

    def added_now(self) -> additions.Added | None:
        """The added rows as stored now, as this server last wrote them (labels as stored, not resolved by
        name), when no other writer (``search --add``, another replica) has written a step since; else None
        (read them).  Each read of the store restored every added row and kept ~330 kB per read at 100,000
        rows inside orbax/tensorstore: an /add read it once, a labelled add under ``--learn_after`` twice."""
        mine = self._written
        if mine is None or additions.newest_step(self.workdir) != mine.step:
            return None
        return mine

    def _refuse_duplicates(self, named, added: additions.Added, run, force: bool) -> None:
        if force:
            return
        dup = run_reader.duplicates_of(named, added, self._store_digests(run))
        if dup:
            raise Duplicate(
                f"{len(dup)} of the images are already in the run (same bytes), e.g. {dup[0][0]} = "
                f"{self.public_path(dup[0][1])}; "
                f"each would be a second gallery row of one image. Leave them out, or pass force=true."
            )
