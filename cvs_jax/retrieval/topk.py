"""Retrieval metric: recall@K of queries against a gallery by exact cosine search.

Equivalent to the official faiss ``IndexFlatIP`` search on L2-normalised vectors
(the official evaluation): recall@K is the fraction of queries for which at least one of the K
most similar gallery rows carries the query's label.

The search is exact and deterministic, and sharded over the ``data`` axis of a
device mesh (all devices by default):

* gallery rows are split over the devices and normalised once; each device holds
  a whole number of scan blocks of ``gallery_block`` rows (padded rows score -inf
  and never win), so a growing gallery recompiles only when it needs a new block;
* each device scans its rows block by block: one matmul of a query chunk against
  the block, ``lax.top_k``, and a merge with the running top-K, so device memory
  stays bounded by ``chunk x gallery_block`` scores whatever the gallery size;
* the K candidates of every device (K x n_devices per query) are merged into the
  global top-K, ties broken by the lowest global gallery index.  The matmul shape
  (``chunk x D x gallery_block``) does not depend on the device count, so for a
  given ``chunk`` and ``gallery_block`` the scores and indices are bitwise the same
  on any number of devices (and processes), and equal a stable sort of the scores;
* queries are processed in chunks of ``chunk`` rows, the last one zero-padded to its bucket
  (``chunks.bucket``: a lone query scores one row, with a compile per bucket shape);
* the block is ``default_block(mesh)`` unless given: 4,096 rows on CPUs, 65,536 on GPUs (measured below).

``recall_at_k_blocked`` streams a gallery that lives on disk (a memory-mapped
``.npy``, or any array-like read by row slices, e.g. a TensorStore/zarr array)
block by block, keeping at most two blocks in host memory and a running top-K
per query on the devices: a 10M x 128 gallery never sits in host memory whole.
"""

from __future__ import annotations

import concurrent.futures
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from cvs_jax import distributed
from cvs_jax.data.chunks import bucket
from cvs_jax.errors import NonFiniteError

_SENTINEL = np.iinfo(np.int32).max  # index of "no candidate yet"; sorts after every real row on ties
DEFAULT_PRECISION = jax.lax.Precision.HIGHEST  # exact f32 scores (no TF32 on GPUs), as faiss
DEFAULT_BLOCK = 4096  # gallery rows per device per scan step; also the recompile granularity
# A GPU runs each scan step as a few small kernels, so few large steps win there: serve's exact index on an
# H200 searched 1M rows in 10.50 ms (1 query) at 4,096 rows per step and 2.88 ms at 65,536, 10M rows in
# 81.6 vs 17.7 ms (benchmarks/index_scale.py, BENCHMARKS.md "search at scale"); on CPUs 4,096 is faster.
GPU_BLOCK = 65536


def _normalize(x):
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _merge_topk(vals, idx, k: int):
    """The k best (score desc, index asc) of candidate columns ``vals``/``idx`` ``[C, M]``."""
    neg, idx = jax.lax.sort((-vals, idx), dimension=1, num_keys=2)
    return -neg[:, :k], idx[:, :k]


def _pad_rows(x: np.ndarray, rows: int, fill=0):
    if x.shape[0] == rows:
        return x
    pad = np.full((rows - x.shape[0],) + x.shape[1:], fill, dtype=x.dtype)
    return np.concatenate([x, pad])


def _ceil_to(x: int, m: int) -> int:
    return -(-x // m) * m


@functools.lru_cache(maxsize=1)
def _default_mesh() -> Mesh:
    return distributed.data_mesh()


def default_block(mesh: Mesh | None = None) -> int:
    """Rows per device per scan step on ``mesh``'s devices (None: all): ``GPU_BLOCK`` on GPUs (where the
    step count, not the padding, costs), ``DEFAULT_BLOCK`` elsewhere.  Every search without an explicit
    block uses it, so ``search``, ``serve`` and the evaluator score with the same compiled shapes."""
    return GPU_BLOCK if _resolve_mesh(mesh).devices.flat[0].platform == "gpu" else DEFAULT_BLOCK


def resolve_block(gallery_block: int | None, mesh: Mesh | None = None) -> int:
    """``gallery_block`` as given, or ``default_block(mesh)`` when None (every public search's default)."""
    return default_block(mesh) if gallery_block is None else int(gallery_block)


def _resolve_mesh(mesh: Mesh | None) -> Mesh:
    """``mesh``, or the ``data`` mesh over all devices (the trainer's mesh: the same compiled search)."""
    return mesh if mesh is not None else _default_mesh()


def _n_dev(mesh: Mesh) -> int:
    return int(mesh.shape[distributed.DATA_AXIS])


def _host_to_mesh(x: Any, sharding: NamedSharding, rows: int, fill=0) -> jax.Array:
    """``x`` padded to ``rows`` rows, placed with ``sharding``: each device reads only its own slice.

    Works for numpy arrays, memory maps and ``_AsFloat32`` views alike, and with several processes (each
    process reads the rows of its own devices only).
    """
    n = x.shape[0]

    def piece(index):
        sl = index[0]
        start, stop = sl.start or 0, rows if sl.stop is None else sl.stop
        real = np.asarray(x[min(start, n) : min(stop, n)])
        if real.shape[0] == stop - start:
            return real
        return _pad_rows(real, stop - start, fill)

    return jax.make_array_from_callback((rows,) + x.shape[1:], sharding, piece)


@functools.lru_cache(maxsize=64)
def _search_fn(mesh: Mesh, k: int, rows_per_dev: int, scan_block: int, precision):
    """Jitted ``(q, g, base, n, run_vals, run_idx) -> (vals, idx)`` for one shape family.

    ``q`` [C, D] normalised queries (replicated), ``g`` [rows_per_dev * n_dev, D]
    normalised gallery rows sharded over ``data``, ``base`` the global index of
    ``g``'s first row, ``n`` the number of real gallery rows (global index < n);
    ``run_*`` [C, k] the running top-K, merged with the block's candidates.
    """
    n_blocks = rows_per_dev // scan_block
    k_blk = min(k, scan_block)

    def local(q, g, base, n):
        start = base + jax.lax.axis_index(distributed.DATA_AXIS) * rows_per_dev
        blocks = g.reshape(n_blocks, scan_block, g.shape[-1])
        offsets = jnp.arange(n_blocks, dtype=jnp.int32) * scan_block
        init = (jnp.full((q.shape[0], k), -jnp.inf, jnp.float32), jnp.full((q.shape[0], k), _SENTINEL, jnp.int32))
        # the carry varies over devices (each scans its own rows): say so for shard_map's type check.
        init = jax.lax.pcast(init, (distributed.DATA_AXIS,), to="varying")

        def body(carry, xs):
            block, off = xs
            scores = jnp.dot(q, block.T, precision=precision, preferred_element_type=jnp.float32)
            gidx = start + off + jnp.arange(scan_block, dtype=jnp.int32)
            scores = jnp.where((gidx < n)[None, :], scores, -jnp.inf)
            v, i = jax.lax.top_k(scores, k_blk)  # ties: lower index first
            return _merge_topk(jnp.concatenate([carry[0], v], 1), jnp.concatenate([carry[1], gidx[i]], 1), k), None

        if n_blocks == 1:
            out, _ = body(init, (blocks[0], offsets[0]))
        else:
            out, _ = jax.lax.scan(body, init, (blocks, offsets))
        return out

    sharded = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(P(), P(distributed.DATA_AXIS), P(), P()),
        out_specs=(P(None, distributed.DATA_AXIS), P(None, distributed.DATA_AXIS)),
    )
    replicated = NamedSharding(mesh, P())

    @functools.partial(jax.jit, out_shardings=(replicated, replicated))
    def search(q, g, base, n, run_vals, run_idx):
        vals, idx = sharded(q, g, base, n)  # [C, k * n_dev]: each device's top-K
        return _merge_topk(jnp.concatenate([run_vals, vals], 1), jnp.concatenate([run_idx, idx], 1), k)

    return search


@functools.lru_cache(maxsize=16)
def _normalize_fn(mesh: Mesh):
    return jax.jit(_normalize, out_shardings=NamedSharding(mesh, P(distributed.DATA_AXIS)))


@functools.lru_cache(maxsize=16)
def _normalize_replicated_fn(mesh: Mesh):
    return jax.jit(_normalize, out_shardings=NamedSharding(mesh, P()))


@functools.lru_cache(maxsize=16)
def _empty_topk(mesh: Mesh, rows: int, k: int):
    """A replicated running top-k with no candidates yet (-inf scores, sentinel indices)."""
    replicated = NamedSharding(mesh, P())
    return (
        _host_to_mesh(np.full((rows, k), -np.inf, np.float32), replicated, rows),
        _host_to_mesh(np.full((rows, k), _SENTINEL, np.int32), replicated, rows),
    )


def pow2(m: int) -> int:
    return 1 << max(int(m) - 1, 0).bit_length()


@functools.lru_cache(maxsize=16)
def _write_rows_fn(mesh: Mesh):
    """``(g, rows, start) -> g`` with ``rows`` written at row ``start`` (``g`` donated: in place)."""
    sharding = NamedSharding(mesh, P(distributed.DATA_AXIS))
    return jax.jit(
        lambda g, rows, start: jax.lax.dynamic_update_slice(g, rows, (start, 0)),
        out_shardings=sharding,
        donate_argnums=0,
    )


@functools.lru_cache(maxsize=16)
def _grow_fn(mesh: Mesh, rows: int):
    """``g -> g`` zero-padded to ``rows`` rows (the padding scores -inf)."""
    sharding = NamedSharding(mesh, P(distributed.DATA_AXIS))
    return jax.jit(lambda g: jnp.pad(g, ((0, rows - g.shape[0]), (0, 0))), out_shardings=sharding)


def _rows_per_device(n: int, n_dev: int, gallery_block: int) -> int:
    """Rows per device: the fewest whole scan blocks that hold ``n`` rows over ``n_dev`` devices.

    The scan block does not depend on the device count, so every score comes out of
    the same ``[chunk, D] x [D, gallery_block]`` matmul whatever the mesh: results are
    bitwise the same on 1 or 8 devices (a shape-dependent kernel choice, e.g. a
    split-K GEMM on a GPU, could otherwise flip near-ties).
    """
    return _ceil_to(max(n, 1), n_dev * gallery_block) // n_dev


class ShardedGallery:
    """A gallery normalised once and split over the ``data`` axis; ``topk`` runs exact searches.

    ``embeddings`` is a host array ``[N, D]`` (numpy or memory map: each device
    reads only its own rows) or, with one process, a ``jax.Array`` (padded and
    resharded on device, for benchmarks that generate data there).
    """

    def __init__(
        self,
        embeddings,
        *,
        mesh: Mesh | None = None,
        gallery_block: int | None = None,
        precision=DEFAULT_PRECISION,
        base: int = 0,
        rows_per_device: int | None = None,
    ):
        self.mesh = _resolve_mesh(mesh)
        self.n = int(embeddings.shape[0])
        if self.n == 0:
            raise ValueError("the gallery is empty: nothing to search")
        self.dim = int(embeddings.shape[1])
        self.base = base
        self.precision = precision
        n_dev = _n_dev(self.mesh)
        gallery_block = resolve_block(gallery_block, self.mesh)
        self.scan_block = gallery_block
        self.rows_per_dev = rows_per_device or _rows_per_device(self.n, n_dev, gallery_block)
        if self.rows_per_dev % gallery_block or self.rows_per_dev * n_dev < self.n:
            raise ValueError(
                f"rows_per_device={self.rows_per_dev} must be a multiple of gallery_block="
                f"{gallery_block} and hold the {self.n} rows over {n_dev} devices"
            )
        rows = self.rows_per_dev * n_dev
        sharding = NamedSharding(self.mesh, P(distributed.DATA_AXIS))
        if isinstance(embeddings, jax.Array):
            g = jnp.pad(embeddings.astype(jnp.float32), ((0, rows - self.n), (0, 0)))
            g = jax.device_put(g, sharding)
        else:
            plain = isinstance(embeddings, np.ndarray) and embeddings.dtype == np.float32
            g = _host_to_mesh(embeddings if plain else _AsFloat32(embeddings), sharding, rows)
        self.embeddings = _normalize_fn(self.mesh)(g)

    @property
    def capacity(self) -> int:
        """Rows the device arrays hold (the real ``n`` plus padding that scores -inf)."""
        return self.rows_per_dev * _n_dev(self.mesh)

    def append(self, embeddings: np.ndarray) -> None:
        """Adds raw rows ``[M, D]`` (normalised on device) after the ``n`` rows, in place.

        Rows are written into the padding while it holds them (the searched shapes stay: no recompile
        per added row); past it, the capacity doubles (one new compile of the search per doubling)."""
        m = int(embeddings.shape[0])
        if m == 0:
            return
        n_dev = _n_dev(self.mesh)
        while self.n + pow2(m) > self.capacity:  # written in power-of-two row counts: few compiles
            self.rows_per_dev *= 2
            self.embeddings = _grow_fn(self.mesh, self.capacity)(self.embeddings)
        new = _pad_rows(np.asarray(embeddings, np.float32), pow2(m))
        replicated = NamedSharding(self.mesh, P())
        new = _normalize_replicated_fn(self.mesh)(_host_to_mesh(new, replicated, new.shape[0]))
        self.embeddings = _write_rows_fn(self.mesh)(self.embeddings, new, np.int32(self.n))
        self.n += m
        assert self.rows_per_dev * n_dev >= self.n

    def search_chunk(self, q_normalized: jax.Array, k: int, run_vals=None, run_idx=None):
        """Top-k (scores, global indices) of one padded, normalised, replicated query chunk (device arrays).

        Global index = ``base`` + row; merged with a running top-k when given.
        """
        if run_vals is None:
            run_vals, run_idx = _empty_topk(self.mesh, q_normalized.shape[0], k)
        fn = _search_fn(self.mesh, k, self.rows_per_dev, self.scan_block, self.precision)
        return fn(q_normalized, self.embeddings, np.int32(self.base), np.int32(self.base + self.n), run_vals, run_idx)

    def topk(self, query_emb, k: int, *, chunk: int = 1024) -> tuple[np.ndarray, np.ndarray]:
        """``(scores [Q, k'], indices [Q, k'])`` of the ``k' = min(k, N)`` nearest rows (cosine)."""
        k_eff = min(k, self.n)
        # dispatch every chunk before fetching any result: host transfers overlap device work
        results = [(self.search_chunk(qn.array, k_eff), qn.rows) for qn in query_chunks(query_emb, chunk, self.mesh)]
        if not results:
            return np.zeros((0, k_eff), np.float32), np.zeros((0, k_eff), np.int32)
        idx = np.concatenate([np.asarray(i)[:rows] for (_, i), rows in results])
        return np.concatenate([np.asarray(v)[:rows] for (v, _), rows in results]), checked_indices(idx, self.n)


class _AsFloat32:
    """Row slices of an array-like as float32 numpy (memory maps stay on disk until sliced)."""

    def __init__(self, x):
        self._x = x
        self.shape = x.shape
        self.dtype = np.dtype(np.float32)

    def __getitem__(self, item):
        return np.asarray(_read_rows(self._x, item), np.float32)


def _read_rows(x, item):
    """``x[item]`` as numpy; TensorStore-like arrays (with ``.read()``) are read synchronously."""
    out = x[item]
    if hasattr(out, "read") and not isinstance(out, np.ndarray):
        out = out.read()
        out = out.result() if hasattr(out, "result") else out
    return np.asarray(out)


class _Chunk:
    def __init__(self, array, rows):
        self.array, self.rows = array, rows


def query_chunks(query_emb, chunk: int, mesh: Mesh):
    """Normalised, replicated query chunks of ``chunk`` rows, the last zero-padded to its bucket."""
    query_emb = np.asarray(query_emb, np.float32)
    replicated = NamedSharding(mesh, P())
    norm = _normalize_replicated_fn(mesh)
    one_device = mesh.devices.size == 1  # the jitted call places a host array itself: 13 us against 56 us
    for start in range(0, query_emb.shape[0], chunk):
        q = query_emb[start : start + chunk]
        rows = bucket(q.shape[0], chunk) if q.shape[0] < chunk else chunk
        padded = _pad_rows(q, rows)
        yield _Chunk(norm(padded if one_device else _host_to_mesh(padded, replicated, rows)), q.shape[0])


def checked_indices(idx: np.ndarray, n: int) -> np.ndarray:
    """Indices past the gallery: only NaN/inf scores lose to the -inf padding, so say that."""
    if idx.size and int(idx.max()) >= n:
        raise NonFiniteError(
            "the query or gallery embeddings contain NaN/inf: no real gallery row scored "
            "for some queries; check the model that embedded them"
        )
    return idx


def _pad_ranks(labels: np.ndarray, k: int) -> np.ndarray:
    """Fewer gallery rows than k: the missing ranks get label -1 and can never match."""
    if labels.shape[1] < k:
        labels = np.concatenate([labels, np.full((labels.shape[0], k - labels.shape[1]), -1, labels.dtype)], 1)
    return labels


def topk_indices(
    query_emb,
    gallery_emb,
    k: int,
    *,
    chunk: int = 1024,
    gallery_block: int | None = None,
    mesh: Mesh | None = None,
    precision=DEFAULT_PRECISION,
) -> tuple[np.ndarray, np.ndarray]:
    """``(scores, indices)`` ``[Q, min(k, N)]`` of the nearest gallery rows (cosine), best first."""
    gallery = ShardedGallery(gallery_emb, mesh=mesh, gallery_block=gallery_block, precision=precision)
    return gallery.topk(query_emb, k, chunk=chunk)


def topk_labels(
    query_emb,
    gallery_emb,
    gallery_labels,
    k: int,
    *,
    chunk: int = 1024,
    gallery_bucket: int | None = None,
    mesh: Mesh | None = None,
    precision=DEFAULT_PRECISION,
) -> np.ndarray:
    """Labels of the ``k`` nearest gallery rows (cosine) for every query, ``[Q, k]`` (-1: no row).

    ``gallery_bucket``: gallery rows per device per scan step (the padding and
    recompile granularity), ``gallery_block`` elsewhere.
    """
    gallery_labels = np.asarray(gallery_labels, np.int32)
    if np.shape(gallery_emb)[0] == 0:
        raise ValueError("the gallery is empty: nothing to search")
    _, idx = topk_indices(
        query_emb, gallery_emb, k, chunk=chunk, gallery_block=gallery_bucket, mesh=mesh, precision=precision
    )
    return _pad_ranks(gallery_labels[idx], k)


def _recall_from_labels(nearest: np.ndarray, query_labels: np.ndarray, ks) -> dict[int, float]:
    hits = nearest == query_labels[:, None]
    return {int(k): float(np.mean(np.any(hits[:, :k], axis=1))) for k in ks}


def recall_at_k(
    query_emb,
    query_labels,
    gallery_emb,
    gallery_labels,
    ks: Sequence[int] = (1, 2, 4),
    *,
    chunk: int = 1024,
    mesh: Mesh | None = None,
    gallery_block: int | None = None,
    precision=DEFAULT_PRECISION,
) -> dict[int, float]:
    """``{k: fraction of queries with a same-label row among their k nearest}``.

    The gallery is sharded over ``mesh``'s ``data`` axis (``None``: all devices).
    """
    query_labels = np.asarray(query_labels)
    if query_labels.shape[0] == 0:
        raise ValueError("no queries to evaluate")
    nearest = topk_labels(
        query_emb,
        gallery_emb,
        gallery_labels,
        max(ks),
        chunk=chunk,
        mesh=mesh,
        gallery_bucket=gallery_block,
        precision=precision,
    )
    return _recall_from_labels(nearest, query_labels, ks)


def open_gallery(path: str) -> np.ndarray:
    """A ``.npy`` gallery memory-mapped read-only: rows are read from disk only when sliced."""
    return np.load(path, mmap_mode="r")


def topk_indices_blocked(
    query_emb,
    gallery: Any,
    k: int,
    *,
    block_rows: int = 1 << 20,
    chunk: int = 1024,
    gallery_block: int | None = None,
    mesh: Mesh | None = None,
    precision=DEFAULT_PRECISION,
    prefetch: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k over a gallery streamed from disk in blocks of ``block_rows`` rows.

    ``gallery``: a path to a ``.npy`` file (memory-mapped), a ``np.memmap`` /
    ``np.ndarray``, or any array-like with ``.shape`` whose row slices convert to
    numpy (TensorStore arrays are ``.read()``).  Each block is read once from disk,
    sharded over the devices (each device receives only its rows), and every query
    chunk's running top-k (kept on the devices) is merged with the block's; the next
    block is read by a background thread meanwhile.  Host memory holds at most two
    blocks, device memory at most two blocks (plus their normalised copies), never
    the whole gallery.  Same result as ``topk_indices`` on the whole
    gallery (ties: lowest global index).
    """
    if isinstance(gallery, str):
        gallery = open_gallery(gallery)
    mesh = _resolve_mesh(mesh)
    n = int(gallery.shape[0])
    if n == 0:
        raise ValueError("the gallery is empty: nothing to search")
    k_eff = min(k, n)
    n_dev = _n_dev(mesh)
    gallery_block = resolve_block(gallery_block, mesh)
    # every block (the last, shorter one too) has the same per-device layout: one compile.
    block_rows = _ceil_to(min(block_rows, n), n_dev * gallery_block)
    chunks = list(query_chunks(query_emb, chunk, mesh))
    if not chunks:
        return np.zeros((0, k_eff), np.float32), np.zeros((0, k_eff), np.int32)
    running: list[tuple[Any, Any]] = [(None, None)] * len(chunks)

    def read(start):
        return np.asarray(_read_rows(gallery, slice(start, min(start + block_rows, n))), np.float32)

    starts = list(range(0, n, block_rows))
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(read, starts[0]) if prefetch else None
        for j, start in enumerate(starts):
            block = pending.result() if pending is not None else read(start)  # pending is set iff prefetch
            if prefetch and j + 1 < len(starts):
                pending = pool.submit(read, starts[j + 1])
            g = ShardedGallery(
                block,
                mesh=mesh,
                gallery_block=gallery_block,
                precision=precision,
                base=start,
                rows_per_device=block_rows // n_dev,
            )
            del block
            previous = running[-1]
            for c, qn in enumerate(chunks):
                running[c] = g.search_chunk(qn.array, k_eff, *running[c])
            del g
            # at most two blocks in flight on the devices: wait until the previous block is searched
            jax.block_until_ready(previous)
    vals = np.concatenate([np.asarray(v)[: qn.rows] for (v, _), qn in zip(running, chunks)])
    idx = np.concatenate([np.asarray(i)[: qn.rows] for (_, i), qn in zip(running, chunks)])
    return vals, checked_indices(idx, n)


def recall_at_k_blocked(
    query_emb, query_labels, gallery: Any, gallery_labels, ks: Sequence[int] = (1, 2, 4), **kwargs
) -> dict[int, float]:
    """``recall_at_k`` for a gallery streamed from disk in row blocks (see ``topk_indices_blocked``).

    ``gallery_labels`` may itself be a memory map (only the K winners' labels are read).
    """
    query_labels = np.asarray(query_labels)
    if query_labels.shape[0] == 0:
        raise ValueError("no queries to evaluate")
    if isinstance(gallery_labels, str):
        gallery_labels = open_gallery(gallery_labels)
    _, idx = topk_indices_blocked(query_emb, gallery, max(ks), **kwargs)
    # read only the winners' labels (sorted unique rows: one pass over a memory map)
    rows, inverse = np.unique(idx, return_inverse=True)
    nearest = _pad_ranks(np.asarray(gallery_labels[rows], np.int32)[inverse.reshape(idx.shape)], max(ks))
    return _recall_from_labels(nearest, query_labels, ks)


def average_recall(per_session: Sequence[dict[int, float]]) -> dict[int, float]:
    """AR@K: the mean over sessions of the per-session test recall@K (as the official code reports it)."""
    ks = per_session[0].keys()
    return {k: float(np.mean([r[k] for r in per_session])) for k in ks}
