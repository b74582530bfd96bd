"""Gallery rows in Milvus: the same code on Milvus Lite (a local file, embedded in the process) and on
a Milvus server or cluster (``uri="http://host:19530"``, with ``token`` where it needs one).

One collection holds the gallery. Each row carries its row id (the primary key), its embedding
(normalised: the ``IP`` metric is then the project's cosine), the session its image arrived in and the
session of the model that embedded it. The collection outlives the process: a reopened index reads the
row ids it already holds, and ``add`` writes only rows it does not hold, so after an ``update`` (or an
``/add``) only the new rows travel. Searches read at ``Session`` consistency: a search sees every row
this process wrote and every row it read when it opened the collection (a write of nothing then, the
``_barrier``, is the point they wait for), without ``Strong``'s wait for the server's next time tick
(200 ms per search on the 2.3.5 server against 1 ms: benchmarks/milvus_replicas.py).  A replica answers
only rows it holds, and holds only rows it wrote itself (an upsert) or read at opening.

Several replicas may share one collection (docs/index-backends.md, "Several replicas"): each writes the
rows it learns of with ``upsert`` (Milvus does not refuse a second row with the same primary key; an
upsert of the same row replaces it), so a row added through one replica and later read by another stays
one row.  A server that does not answer within ``timeout_s`` raises ``IndexUnavailableError`` naming
the URI (the HTTP server's 503), not the client library's exception.

A gallery that is re-embedded (a ``joint`` session's part replaces every row: ``generation`` is that
session) gets a collection of its own, ``<collection>_g<generation>``: the ids are the same, the vectors
are not, and a replica still serving the older model keeps searching the older collection during a
rolling switch.  ``drop_generations_before`` drops this gallery's older ones: the collections named
``<collection>`` or ``<collection>_g<N>`` with a smaller N and this gallery's fields and width (so never
name another run's collection ``<collection>_g<N>``; the default names end in a hash of the run's path).
"""

from __future__ import annotations

import logging
import re

import numpy as np

from cvs_jax.errors import IndexBackendError, IndexUnavailableError
from cvs_jax.index.base import RowIds, empty_results, normalized, padded

VECTOR, ROW, ARRIVAL, MODEL = "embedding", "row", "arrival_session", "model_session"
INSERT_BATCH = 2048  # rows per insert call (bounded message size)
MAX_K = 16384  # Milvus's largest search limit
READS = "Session"  # the consistency of searches (module docstring)
log = logging.getLogger(__name__)


def generation_name(collection: str, generation: int) -> str:
    """The collection of a gallery re-embedded at session ``generation`` (0: the gallery as first made)."""
    return collection if not generation else f"{collection}_g{int(generation)}"


def _generation_of(collection: str, name: str) -> int | None:
    """N when ``name`` is ``generation_name(collection, N)``, else None."""
    m = re.fullmatch(re.escape(collection) + r"(?:_g([1-9][0-9]*))?", name)
    return None if m is None else int(m.group(1) or 0)


def _pymilvus():
    try:
        import pymilvus
    except ImportError as e:
        raise IndexBackendError(
            f"--index milvus needs pymilvus ({e}); pip install pymilvus milvus-lite (or the `milvus` extra)."
        ) from None
    return pymilvus


class MilvusIndex:
    """A Milvus collection of gallery rows (``index_type`` ``FLAT``: exact; ``HNSW``/``IVF_FLAT``/
    ``AUTOINDEX`` where the server offers them, with ``search_params`` such as ``{"ef": 128}``)."""

    def __init__(
        self,
        dim: int,
        *,
        uri: str,
        collection: str = "cvs_gallery",
        generation: int = 0,
        token: str = "",
        index_type: str = "FLAT",
        index_params: dict | None = None,
        search_params: dict | None = None,
        timeout_s: float = 10.0,
    ):
        pymilvus = _pymilvus()
        self._ids = RowIds(dim)
        self._base, self._generation = collection, int(generation)
        self._name, self._uri, self._timeout = generation_name(collection, generation), uri, float(timeout_s)
        self._search_params = {"metric_type": "IP", "params": dict(search_params or {})}
        try:
            self._client = pymilvus.MilvusClient(uri=uri, token=token)
        except Exception as e:  # pymilvus raises its own exception types, or OSError for a bad path
            raise IndexBackendError(f"cannot open Milvus at {uri!r} ({e}); pass a local file path or http://host:port.")
        if self._client.has_collection(self._name):
            self._reopen(dim)
        else:
            self._create(pymilvus.DataType, index_type, dict(index_params or {}))

    def _call(self, what: str, *args, **kwargs):
        """``self._client.<what>(...)`` within ``timeout_s``; a failure (server down, or not answering)
        becomes one ``IndexUnavailableError`` line naming the server."""
        try:
            try:
                return getattr(self._client, what)(*args, timeout=self._timeout, **kwargs)
            except Exception as e:  # noqa: BLE001 -- a restarted server holds the collection unloaded
                if "not loaded" not in str(e):
                    raise
                self._client.load_collection(self._name, timeout=self._timeout)
                return getattr(self._client, what)(*args, timeout=self._timeout, **kwargs)
        except Exception as e:  # noqa: BLE001 -- pymilvus's MilvusException and gRPC errors alike
            why = " ".join(str(e).split())[:200]
            raise IndexUnavailableError(
                f"the Milvus server at {self._uri} did not answer ({what}: {why}; each call waits up to "
                f"{self._timeout:g} s); retry when it is back (acknowledged rows are kept in the run's folder)."
            ) from None

    def check_reachable(self) -> None:
        """Raises ``IndexUnavailableError`` unless the server answers now (``/add`` asks before it writes)."""
        self._call("has_collection", self._name)

    def _create(self, types, index_type: str, index_params: dict) -> None:
        schema = self._client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field(ROW, types.INT64, is_primary=True)
        schema.add_field(VECTOR, types.FLOAT_VECTOR, dim=self._ids.dim)
        schema.add_field(ARRIVAL, types.INT32)
        schema.add_field(MODEL, types.INT32)
        index = self._client.prepare_index_params()
        index.add_index(field_name=VECTOR, index_type=index_type, metric_type="IP", params=index_params)
        self._client.create_collection(self._name, schema=schema, index_params=index, consistency_level="Strong")

    def _layout(self, name: str) -> tuple[list[str], int]:
        """The collection's field names and vector width."""
        fields = {f["name"]: f for f in self._call("describe_collection", name)["fields"]}
        return sorted(fields), int(fields.get(VECTOR, {}).get("params", {}).get("dim", -1))

    def _reopen(self, dim: int) -> None:
        fields, have = self._layout(self._name)
        if fields != sorted([ROW, VECTOR, ARRIVAL, MODEL]) or have != dim:
            raise IndexBackendError(
                f"the Milvus collection {self._name!r} holds fields {fields} (dim {have}), not this "
                f"gallery's (dim {dim}); pass another collection name or drop it."
            )
        self._client.load_collection(self._name)
        it = self._client.query_iterator(self._name, batch_size=10000, filter=f"{ROW} >= 0", output_fields=[ROW])
        try:
            while batch := it.next():
                self._ids.hold([r[ROW] for r in batch])
        finally:
            it.close()
        self._barrier()

    def _barrier(self) -> None:
        """Deletes row -1 (there is none): pymilvus keeps the write's timestamp per collection, and every
        later ``Session`` search waits until the server has applied everything written before it."""
        self._call("delete", self._name, ids=[-1])

    @property
    def collection(self) -> str:
        return self._name

    def drop_generations_before(self, generation: int) -> list[str]:
        """Drops this gallery's collections of generations older than ``generation`` (not this one's);
        returns their names.  A replica switching to a re-embedded gallery calls it with the generation
        it leaves, so the one it leaves stays for replicas still serving it (a rolling switch)."""
        dropped, mine = [], (sorted([ROW, VECTOR, ARRIVAL, MODEL]), self._ids.dim)
        for name in self._call("list_collections"):
            g = _generation_of(self._base, name)
            if g is not None and g < generation and name != self._name and self._layout(name) == mine:
                self._call("drop_collection", name)
                dropped.append(name)
        if dropped:
            log.warning("dropped the Milvus collection(s) %s (older re-embeddings of this gallery)", dropped)
        return dropped

    def __len__(self) -> int:
        return len(self._ids)

    def check_rows(self, ids: np.ndarray, embeddings_of, sample: int = 32) -> None:
        """Refuses a collection that is not this run's: one holding a row id the run lacks, or whose
        vectors for ids both hold differ from the run's (another copy of the run served on the same
        Milvus).  ``embeddings_of(ids)``: the run's raw embeddings of those ids."""
        held = self._ids._sorted  # noqa: SLF001 -- the ids read at reopening
        ids = np.asarray(ids, np.int64)
        extra = held[~np.isin(held, ids)]
        shared = held[np.isin(held, ids)]
        differ = 0
        if not extra.size and shared.size:
            pick = np.unique(np.concatenate([shared[:: max(1, shared.size // sample)], shared[-4:]]))
            got = self._client.query(self._name, filter=f"{ROW} in {pick.tolist()}", output_fields=[ROW, VECTOR])
            stored = {int(r[ROW]): np.asarray(r[VECTOR], np.float32) for r in got}
            want = normalized(np.asarray(embeddings_of(pick), np.float32))
            missing = np.zeros(want.shape[1:], np.float32)  # a row Milvus lacks compares as zeros
            differ = sum(not np.allclose(stored.get(int(i), missing), w, atol=1e-3) for i, w in zip(pick, want))
        if extra.size or differ:
            what = f"{extra.size} row id(s) this run lacks" if extra.size else f"{differ} sampled row(s) unlike its own"
            raise IndexBackendError(
                f"the Milvus collection {self._name!r} holds {held.size} rows, {what}; this run has {ids.size} "
                f"rows: it is another run's (or another copy's) gallery. Pass --milvus-collection with a new name "
                f"(the default is derived from the run's folder), or drop the collection."
            )

    def count(self) -> int:
        """Rows in the collection, as Milvus counts them (what tests compare with ``len``)."""
        out = self._call("query", self._name, filter="", output_fields=["count(*)"])
        return int(out[0]["count(*)"])

    def add(self, rows, embeddings, arrival_session, model_session) -> None:
        rows, emb, arrival, model = self._ids.new(rows, embeddings, arrival_session, model_session)
        emb = normalized(emb)
        try:
            for s in range(0, rows.size, INSERT_BATCH):
                part = slice(s, s + INSERT_BATCH)
                data = [
                    {ROW: int(r), VECTOR: e.tolist(), ARRIVAL: int(a), MODEL: int(m)}
                    for r, e, a, m in zip(rows[part], emb[part], arrival[part], model[part])
                ]
                self._call("upsert", self._name, data)
        except BaseException:  # the server went down: these rows are written again at the next add (poll)
            self._ids.release(rows)
            raise

    def search(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        q = self._ids.queries(queries, k)
        limit = min(int(k), len(self), MAX_K)
        if not q.shape[0] or not limit:
            return empty_results(q.shape[0], k)
        hits = self._call(
            "search",
            self._name,
            data=normalized(q).tolist(),
            limit=limit,
            anns_field=VECTOR,
            search_params=self._search_params,
            consistency_level=READS,
            output_fields=[ROW],  # the row as an output field: read the same way by pymilvus 2.5 and 3
        )
        scores, rows = empty_results(q.shape[0], limit)
        for i, found in enumerate(hits):
            for j, hit in enumerate(found):
                scores[i, j], rows[i, j] = hit["distance"], hit["entity"][ROW]
        return padded(scores, rows, int(k))

    def close(self) -> None:
        self._client.close()
