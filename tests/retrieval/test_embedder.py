"""One jitted embed function per network and eval transform in a process (``embedder.shared_embed_fn``): the
runs of a comparison, a test process and a server's switches share its compiles, and a network or transform
that differs gets its own.  A server's many batch shapes trace the network once (``one_trace_embed_fn``)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from configs import fashion_mnist_general
from cvs_jax import distributed
from cvs_jax.augment import transforms as augment
from cvs_jax.models import networks as models
from cvs_jax.retrieval import embedder


def _config(embed_dim: int = 8):
    c = fashion_mnist_general.get_config()
    c.model.width, c.model.embed_dim = 4, embed_dim
    return c


def test_equal_networks_and_transforms_share_one_function_and_others_get_their_own():
    c = _config()
    shared = embedder.shared_embed_fn(models.from_config(c), augment.Pipeline.from_config(c))
    # equal but distinct objects, as each run builds its own
    assert embedder.shared_embed_fn(models.from_config(_config()), augment.Pipeline.from_config(_config())) is shared
    model, pipeline = models.from_config(c), augment.Pipeline.from_config(c)
    other_transform = dataclasses.replace(pipeline, mean=(0.5,))
    assert embedder.shared_embed_fn(model, other_transform) is not shared
    assert embedder.shared_embed_fn(models.from_config(_config(embed_dim=16)), pipeline) is not shared

    # ... and each embeds by its own network and transform
    k0, k1 = jax.random.split(jax.random.key(0))
    variables = models.init_variables(model, c, (28, 28, 1), 4, k0, k1)
    images = np.random.default_rng(0).integers(0, 256, (8, 28, 28, 1), np.uint8)
    params, stats = variables["params"], variables["batch_stats"]
    got = np.asarray(embedder.shared_embed_fn(model, other_transform)(params, stats, images))
    want = np.asarray(embedder.make_embed_fn(model, other_transform)(params, stats, images))
    np.testing.assert_array_equal(got, want)
    assert not np.allclose(got, np.asarray(shared(params, stats, images)))


@pytest.mark.parametrize("exportable", [True, False])
def test_compiled_batch_shapes_trace_the_network_once_and_embed_as_per_shape(monkeypatch, exportable):
    """``Embedder.compile`` of six batch shapes traces the network once (exported with a symbolic batch), runs
    nothing, and every shape then embeds as the per-shape function does; a network that cannot be exported so
    keeps tracing per shape, with the same embeddings."""
    c = _config(embed_dim=12 if exportable else 20)  # its own network: no other test's cached function
    model, pipeline = models.from_config(c), augment.Pipeline.from_config(c)
    k0, k1 = jax.random.split(jax.random.key(1))
    variables = models.init_variables(model, c, (28, 28, 1), 4, k0, k1)
    images = np.random.default_rng(1).integers(0, 256, (8, 28, 28, 1), np.uint8)
    traced, real = [], embedder.net_variables
    monkeypatch.setattr(embedder, "net_variables", lambda p, s: traced.append(1) or real(p, s))
    if not exportable:
        monkeypatch.setattr(embedder.export, "export", lambda fn: (_ for _ in ()).throw(ValueError("no rule")))
    embed = embedder.Embedder(
        model, pipeline, 16, "float32", distributed.data_mesh(jax.local_devices()[:1]), c.model.embed_dim
    )
    placed = embed.place(variables)
    sizes = [1, 2, 3, 5, 6, 8]
    embed.compile(placed, (28, 28, 1), sizes)
    assert len(traced) == (1 if exportable else len(sizes)) and embed.rows_run == 0
    per_shape = embedder.make_embed_fn(model, pipeline)
    for n in sizes:
        want = np.asarray(per_shape(variables["params"], variables["batch_stats"], images[:n]))
        np.testing.assert_allclose(embed(placed, images[:n], placed=True), want, rtol=1e-6, atol=1e-6)
    assert len(traced) == (1 if exportable else len(sizes)) + len(sizes)  # per_shape's own traces only
