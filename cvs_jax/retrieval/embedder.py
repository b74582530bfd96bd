"""Embeds host images with a model's eval-mode network, in device-sharded chunks of a few shapes
(``chunks.iter_chunks`` with ``bucketed``: its docstring states what that keeps exact)."""

from __future__ import annotations

import logging
from typing import Any, Iterable

import jax
import numpy as np
from jax import export

from cvs_jax import distributed
from cvs_jax.augment import transforms as augment
from cvs_jax.data.chunks import bucket, iter_chunks
from cvs_jax.errors import NonFiniteError
from cvs_jax.models.heads import net_variables

log = logging.getLogger(__name__)


def make_embed_fn(model, pipeline: augment.Views):
    """``embed(params, batch_stats, images_u8) -> raw embeddings`` in eval mode (jitted)."""

    @jax.jit
    def embed(params, batch_stats, images):
        x = pipeline.eval(images)
        return model.apply(net_variables(params, batch_stats), x, train=False)

    return embed


_SHARED: dict[tuple[str, str], Any] = {}  # (network, eval transform) -> its jitted embed function


def shared_embed_fn(model, pipeline):
    """One jitted embed function per network architecture and eval transform in a process (their reprs name
    every field), its weights an argument, so its compiles are shared: a server switching to each new session
    built a new one, traced and compiled every batch bucket again, and XLA kept each compile's memory (20-40 MB
    per switch measured on a tiny photo run, at 24 sessions); every run of a ``compare`` traced its own."""
    key = (repr(model), repr(pipeline))
    if key not in _SHARED:
        _SHARED[key] = make_embed_fn(model, pipeline)
    return _SHARED[key]


_ONE_TRACE: dict[tuple, Any] = {}  # (network, transform, input shapes) -> its batch-polymorphic embed, or None
ONE_TRACE_MIN_SHAPES = 4  # below this, tracing per shape costs less than exporting once (about two traces)


def one_trace_embed_fn(model, pipeline, variables: dict, image_shape: tuple[int, ...]):
    """The embed function traced once for every batch size (``jax.export`` with a symbolic batch dimension),
    jitted: a new batch shape then lowers the exported module instead of tracing the network again (0.07 s
    against 0.65 s per shape for EfficientNet-Lite0 on this 2-core host; the outputs of all 20 serving
    buckets were bitwise those of tracing per shape).  None for a network whose ops cannot be exported with
    a symbolic batch: it traces per shape, as ``shared_embed_fn``.  One per network, transform and input
    shapes in a process, as ``shared_embed_fn``."""
    weights = (variables["params"], variables["batch_stats"])
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), weights)
    shapes = (jax.tree.structure(abstract), tuple(jax.tree.leaves(abstract)))
    key = (repr(model), repr(pipeline), tuple(image_shape), shapes)
    if key not in _ONE_TRACE:
        (batch,) = export.symbolic_shape("b")
        images = jax.ShapeDtypeStruct((batch, *image_shape), np.uint8)
        try:
            exported = export.export(shared_embed_fn(model, pipeline))(*abstract, images)
        except Exception as error:  # noqa: BLE001 -- an op without a symbolic-batch rule: trace per shape
            log.info("embedding traces once per batch shape: %s", error)
            _ONE_TRACE[key] = None
        else:
            _ONE_TRACE[key] = jax.jit(exported.call)
    return _ONE_TRACE[key]


class Embedder:
    """``embed(variables, images_u8) -> float32 [N, D]``: chunks of ``chunk`` rows, the last one padded
    only to its bucket (``bucketed=False``: to ``chunk``, as before buckets); one compile per chunk shape;
    each process feeds its own rows of every chunk, and every process gets all embeddings back.
    ``rows_run`` counts the rows (padding included) passed through the network."""

    def __init__(
        self,
        model,
        pipeline: augment.Views,
        chunk: int,
        dtype: str,
        mesh,
        embed_dim: int,
        bucketed: bool = True,
    ):
        self._fn = shared_embed_fn(model, pipeline)
        self._model, self._pipeline = model, pipeline
        self._chunk = chunk
        self._dtype = dtype
        self._mesh = mesh
        self._dim = embed_dim
        self.bucketed = bucketed
        self.rows_run = 0
        self._slices = {}  # chunk rows -> this process's [lo, hi) rows of such a chunk

    def place(self, variables: dict) -> dict:
        """``variables`` replicated on the mesh, for callers that embed many times with the same model
        (``__call__(..., placed=True)``): putting the ~100 leaves of a small model on the device took
        most of a lone query's 3.3 ms embed on this 2-core CPU host."""
        return distributed.replicate(variables, self._mesh)

    def _batch(self, chunk: np.ndarray):
        """This process's rows of ``chunk`` as the global batch the network runs on."""
        rows = chunk.shape[0]
        if rows not in self._slices:
            self._slices[rows] = distributed.process_slice(rows, self._mesh)
        lo, hi = self._slices[rows]
        return distributed.global_batch(chunk[lo:hi], self._mesh)

    def compile(self, variables: dict, image_shape: tuple[int, ...], sizes: Iterable[int]) -> None:
        """Compiles (or reads from the compile cache) the chunk shape each call of ``sizes`` images runs,
        without running the network (``variables`` as placed by ``place``): a served EfficientNet-Lite0
        photo run ran 548 zero images through it to warm its 20 batch buckets, about 15 of the 30 s its
        start took with a warm cache on this 2-core host, and a switch ran them again.  Four shapes or more on
        one device switch this embedder to ``one_trace_embed_fn``, which traces the network once for all."""
        devices, sizes = self._mesh.devices.size, sorted(set(sizes))
        if len(sizes) >= ONE_TRACE_MIN_SHAPES and devices == 1 and jax.process_count() == 1:
            self._fn = one_trace_embed_fn(self._model, self._pipeline, variables, image_shape) or self._fn
        for n in sizes:
            rows = self._chunk if n >= self._chunk or not self.bucketed else bucket(n, self._chunk, devices)
            batch = self._batch(np.zeros((rows, *image_shape), np.uint8))
            self._fn.lower(variables["params"], variables["batch_stats"], batch).compile()

    def __call__(self, variables: dict, images: Any, *, placed: bool = False) -> np.ndarray:
        # images: uint8 [N, H, W, C], or rows read when sliced (engine.protocol.LazyRows), as iter_chunks takes
        if not placed:
            variables = self.place(variables)  # once per call, not once per chunk
        out = [np.zeros((0, self._dim), np.float32)]
        devices = self._mesh.devices.size
        for _, chunk, n in iter_chunks(images, self._chunk, bucketed=self.bucketed, multiple=devices):
            batch = self._batch(chunk)
            self.rows_run += chunk.shape[0]
            emb = self._fn(variables["params"], variables["batch_stats"], batch)
            out.append(np.asarray(distributed.to_host(emb)[:n], np.float32))
        emb = np.concatenate(out)
        if not np.isfinite(emb).all():  # a finite loss does not guarantee finite eval-mode embeddings
            raise NonFiniteError(
                f"{int((~np.isfinite(emb).all(axis=1)).sum())} of {emb.shape[0]} embeddings are NaN/inf "
                f"(model.dtype={self._dtype}); lower train.lr, or use model.dtype=float32 if the compiler "
                f"mishandles reduced precision on this backend. Nothing was written to the gallery."
            )
        return emb
