"""One jitted embed function per network and eval transform in a process (``embedder.shared_embed_fn``): the
runs of a comparison, a test process and a server's switches share its compiles, and a network or transform
that differs gets its own."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from configs import fashion_mnist_general
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
