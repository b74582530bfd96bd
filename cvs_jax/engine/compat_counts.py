"""The compatibility matrix and the negative flips of a run, counted once per model and query arrival.

``reporting.finish`` scores the probe queries (the last session's test queries) with every model against
every stored part, at the end of a run and of every ``update``.  Counted from scratch, that embeds every
query with every model: T x Q network passes at session T, with T and Q both growing (the ``:cpu`` photo
run of docs/your-images.md, 150 test photos a day: see ``BENCHMARKS.md``, "The compatibility counts").
But the queries that arrived in session s, and model i's top-1 answers to them on part j's rows, do not
change once they exist.  So the counts (per model i and part j: queries right at top 1 and queries scored;
per update: queries flipped and scored) are kept in ``checkpoints/compatibility_counts.json`` with digests
of what they were counted from: model i's weights and query maps, the rows of the parts it scores, and the
queries through the last arrival counted.  A finish embeds with an earlier model only the queries that
arrived since (of classes its parts hold), and counts again from the start whatever a digest no longer
matches (a session trained again, a gallery part that changed, a file damaged or deleted: it is only a
cache).  The newest model's embeddings of the queries are kept too (``checkpoints/compatibility_queries.npz``,
one model's worth): at the next finish that model is the one before the new one, and the new update's flips
need its answers to every query.

Each arrival's queries are embedded in a call of their own whether they are counted now or were counted
at an earlier finish, so the embeddings are the same bits; queries counted at different finishes are
searched in different batches, so a count could differ from one made from scratch only where two rows
tie to within float rounding.  A multi-process run counts from scratch: every process must embed the
same chunks, and each would read the file at its own moment.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import zipfile
from typing import Any, Mapping

import jax
import numpy as np

from cvs_jax.retrieval import compatibility
from cvs_jax.retrieval.compatibility import FirstParts
from cvs_jax.rundir import paths, run_files

VERSION = 1


def digest(*items: Any) -> str:
    """A short SHA-256 of strings and arrays (each array's dtype and shape included)."""
    h = hashlib.sha256()
    for x in items:
        if isinstance(x, str):
            h.update(f"s{len(x)}:{x}".encode())
        else:
            a = np.ascontiguousarray(x)
            h.update(f"a{a.dtype.str}{a.shape}:".encode())
            h.update(a.tobytes())
    return h.hexdigest()[:32]


@dataclasses.dataclass(frozen=True)
class Arrival:
    """The probe queries that first became test queries in ``session``."""

    session: int
    idx: np.ndarray  # indices into the test split
    labels: np.ndarray

    @property
    def digest(self) -> str:
        return digest(np.asarray(self.idx, np.int64), np.asarray(self.labels, np.int32))


def arrivals(proto, last: int) -> list[Arrival]:
    """Session ``last``'s test queries split by the first session whose test queries held each."""
    queries = np.asarray(proto.test_queries(last))
    first = np.full(len(queries), last)
    for s in range(last - 1, -1, -1):
        first[np.isin(queries, proto.test_queries(s))] = s
    return [
        Arrival(s, queries[first == s], np.asarray(proto.test_labels[queries[first == s]]))
        for s in range(last + 1)
        if (first == s).any()
    ]


def prefixes(chunks: list[Arrival]) -> list[str]:
    """``out[k]``: the digest of the first k arrivals (what an entry counted through k was counted on)."""
    out = [digest("arrivals")]
    for c in chunks:
        out.append(digest(out[-1], c.digest))
    return out


def parts_digests(gallery, last: int) -> list[str]:
    """``out[i]``: the digest of the parts made in sessions <= i (the rows model i's row of the matrix
    scores, and the update to model i + 1 flips on), in the dtypes a checkpoint stores: a session's part fresh in
    memory holds its labels as the dataset's int64, restored as int32, and the next finish must match it."""
    out, acc = [], digest("parts")
    for i in range(last + 1):
        for p in gallery.parts:
            if p.session == i:
                stored = p.as_dict()
                acc = digest(acc, str(p.session), str(p.replaces), stored["embeddings"], stored["labels"])
        out.append(acc)
    return out


def model_digest(variables: dict, trunk, maps: Mapping | None, i: int) -> str:
    """The digest of what model i embeds with: its network's weights (a frozen trunk by its file's SHA-256)
    and the query maps of sessions <= i.  The head is left out: it does not embed, and grows with classes."""
    stored = variables if trunk is None else trunk.without(variables)
    net = {"params": stored["params"]["net"], "batch_stats": stored["batch_stats"]}
    leaves = jax.tree_util.tree_flatten_with_path(net)[0]
    items: list[Any] = [trunk.digest if trunk is not None else "no trunk"]
    for path, leaf in leaves:
        items += [jax.tree_util.keystr(path), np.asarray(leaf)]
    for k, m in sorted((maps or {}).items()):
        if k <= i:
            items += [f"map {k} {m.kind}", m.matrix, m.bias]
    return digest(*items)


def read(path: str) -> dict:
    """The stored counts, or none when the file is missing, unreadable or of another version."""
    try:
        with open(path) as f:
            stored = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(stored, dict) or stored.get("version") != VERSION:
        return {}
    return stored


def write(path: str, counts: dict) -> None:
    """Writes the counts whole (``run_files.write_whole``: a kill leaves the old file or the new one)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    run_files.write_whole(path, lambda f: json.dump(counts, f, separators=(",", ":")))


def _stored_or_why(store) -> str:
    """``store()``, or why not: a cache not written costs the next finish time, never the run's results."""
    try:
        store()
    except OSError as e:
        return f" (not stored: {e.strerror or e})"
    return ""


def read_embeddings(path: str, model: str, chunks: list[Arrival]) -> dict[int, np.ndarray]:
    """``{arrival session: embeddings}`` stored by ``write_embeddings`` for the model with digest ``model``, of the
    arrivals whose digest still matches; none when the file is missing, damaged or of another model."""
    try:
        with np.load(path, allow_pickle=False) as f:
            if "model" not in f.files or str(f["model"]) != model:
                return {}
            out = {}
            for c in chunks:
                key = f"arrival_{c.session}"
                if key in f.files and str(f[f"digest_{c.session}"]) == c.digest:
                    emb = np.asarray(f[key], np.float32)
                    if emb.ndim == 2 and emb.shape[0] == len(c.idx):
                        out[c.session] = emb
            return out
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return {}


def write_embeddings(path: str, model: str, embedded: dict[int, np.ndarray], chunks: list[Arrival]) -> None:
    """The newest model's embeddings of each arrival, for the next finish: that model is then the one before the
    new one, whose update's flips need its answers to every query."""
    arrays: dict[str, Any] = {"model": np.asarray(model)}
    for c in chunks:
        if c.session in embedded:
            arrays[f"arrival_{c.session}"] = embedded[c.session]
            arrays[f"digest_{c.session}"] = np.asarray(c.digest)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    run_files.write_whole(path, lambda f: np.savez(f, **arrays), binary=True)


class ModelQueries:
    """Model i, restored once, and its embeddings of each arrival (one call per arrival)."""

    def __init__(self, ctx, maps, i: int, restore):
        self._ctx = ctx
        self.variables = restore(i)
        self.digest = model_digest(self.variables, ctx.trunk, maps, i)
        self._placed = None
        self._embedded: dict[int, np.ndarray] = {}
        self.rows = 0  # queries embedded
        self.loaded = 0  # queries whose embeddings were read (``read_embeddings``)

    def load(self, embedded: dict[int, np.ndarray]) -> None:
        """Embeddings of arrivals by this model read back (the same bits: one call per arrival either way)."""
        self._embedded.update(embedded)
        self.loaded += sum(len(e) for e in embedded.values())

    @property
    def embedded(self) -> dict[int, np.ndarray]:
        return dict(self._embedded)

    def embed(self, chunks: list[Arrival]) -> np.ndarray:
        out = []
        for c in chunks:
            if c.session not in self._embedded:
                if self._placed is None:
                    self._placed = self._ctx.embed.place(self.variables)
                images = self._ctx.proto.test_images(c.idx)
                self._embedded[c.session] = self._ctx.embed(self._placed, images, placed=True)
                self.rows += len(c.idx)
            out.append(self._embedded[c.session])
        return np.concatenate(out)


def _entry(stored: Any, key: dict, prefix: list[str]) -> tuple[int, Any]:
    """``(arrivals counted, counts)`` of a stored entry whose digests all match ``key`` and whose queries are
    the first arrivals of now; ``(0, None)`` (count from the start) otherwise."""
    if not isinstance(stored, dict) or any(stored.get(k) != v for k, v in key.items()):
        return 0, None
    through, counts = stored.get("through"), stored.get("counts")
    if not isinstance(through, int) or not 0 < through < len(prefix) or stored.get("queries") != prefix[through]:
        return 0, None
    pairs = list(counts.values()) if isinstance(counts, dict) else [counts]
    if isinstance(counts, dict) and not all(isinstance(j, str) and j.isdigit() for j in counts):
        return 0, None
    if not all(isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v) for v in pairs):
        return 0, None  # damaged: counted again
    return through, counts


def _labels(chunks: list[Arrival]) -> np.ndarray:
    return np.concatenate([c.labels for c in chunks]) if chunks else np.zeros(0, np.int32)


def _row(i: int, gallery, model: ModelQueries, chunks, maps, stored, first: FirstParts) -> dict[int, tuple[int, int]]:
    """Model i's counts per part: the stored ones (``(through, counts)``) plus the arrivals after them."""
    through, counts = stored
    out = {int(j): (int(h), int(n)) for j, (h, n) in (counts or {}).items()} if through else {}
    new = [c for c in chunks[through:] if first.any_by(c.labels, i)]  # an arrival no part scores adds nothing
    labels = _labels(new)
    if new:
        for j, (hits, n) in compatibility.row_counts(i, gallery, model.embed(new), labels, maps).items():
            old = out.get(j, (0, 0))
            out[j] = (old[0] + hits, old[1] + n)
    return out


def _flips(
    i: int, gallery, prev: ModelQueries, model: ModelQueries, chunks, maps, stored, first: FirstParts
) -> tuple[int, int]:
    """The update to model i's ``(queries flipped, queries scored)``: the stored ones plus the new arrivals'."""
    through, counts = stored
    flipped, n = (int(counts[0]), int(counts[1])) if through else (0, 0)
    new = [c for c in chunks[through:] if first.any_by(c.labels, i - 1)]
    labels = _labels(new)
    if new:
        got = compatibility.flip_counts(i, gallery, prev.embed(new), model.embed(new), labels, maps)
        if got is not None:
            flipped, n = flipped + got[0], n + got[1]
    return flipped, n


def count(ctx, state, restore) -> tuple[np.ndarray, list[float | None], str]:
    """``(matrix, flips, a line saying what was counted)`` of the run in ``state``: the values of
    ``compatibility.compatibility_matrix`` and ``negative_flips`` on its probe queries, from the stored
    counts and the arrivals they lack (``restore(i)``: the variables of model i).  Writes the counts, and the
    newest model's embeddings of the queries for the next finish's flips."""
    last = ctx.proto.plan.num_sessions - 1
    gallery, maps = state.gallery, state.query_maps or None
    chunks = arrivals(ctx.proto, last)
    prefix, parts, first = prefixes(chunks), parts_digests(gallery, last), FirstParts(gallery)
    path, queries_path = paths.compat_counts_file(ctx.workdir), paths.compat_queries_file(ctx.workdir)
    cached = jax.process_count() == 1
    stored = read(path) if cached else {}
    rows_in, flips_in = ({} if not isinstance(stored.get(k), dict) else stored[k] for k in ("rows", "flips"))
    out: dict[str, Any] = {"version": VERSION, "rows": {}, "flips": {}}
    matrix = np.full((last + 1, last + 1), np.nan)
    flips: list[float | None] = []
    embedded, loaded, reused, prev = 0, 0, 0, None
    for i in range(last + 1):
        model = ModelQueries(ctx, maps, i, restore)
        if cached and i == last - 1:  # the newest model of the finish before: its embeddings, if it stored them
            model.load(read_embeddings(queries_path, model.digest, chunks))
            loaded = model.loaded
        key = {"model": model.digest, "parts": parts[i]}
        stored_row = _entry(rows_in.get(str(i)), key, prefix)
        reused += stored_row[0] > 0
        row = _row(i, gallery, model, chunks, maps, stored_row, first)
        out["rows"][str(i)] = dict(
            key, through=len(chunks), queries=prefix[-1], counts={str(j): list(v) for j, v in row.items()}
        )
        for j, (hits, n) in row.items():
            matrix[i, j] = hits / n
        if prev is not None:
            key = {"models": [prev.digest, model.digest], "parts": parts[i - 1]}
            flipped, n = _flips(i, gallery, prev, model, chunks, maps, _entry(flips_in.get(str(i)), key, prefix), first)
            out["flips"][str(i)] = dict(key, through=len(chunks), queries=prefix[-1], counts=[flipped, n])
            flips.append(flipped / n if n else None)
            embedded += prev.rows
        prev = model
    unstored = ""
    if prev is not None:
        embedded += prev.rows
        if cached and jax.process_index() == 0:
            newest = prev
            unstored = _stored_or_why(lambda: write(path, out)) or _stored_or_why(
                lambda: write_embeddings(queries_path, newest.digest, newest.embedded, chunks)
            )
    total = sum(len(c.idx) for c in chunks)
    models = f"{reused} model{'s' * (reused != 1)}"
    read_from = f"the counts of {models} read from" if reused else "no stored counts used from"
    said = (
        f"compatibility: {total} probe queries x {last + 1} models; {embedded} query embeddings"
        f"{f' ({loaded} more read from {os.path.basename(queries_path)})' if loaded else ''}, "
        f"{read_from} {os.path.relpath(path, ctx.workdir)}{unstored}"
    )
    return matrix, flips, said
