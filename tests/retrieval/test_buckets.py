"""Bucketed chunks: a short batch runs in a small bucket, not a whole eval chunk, and what that changes
in a row's embedding stays within ``chunks.EXACTNESS``, so a stored image queried again still finds
its own row first with its stored score."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from configs import image_folder_general
from cvs_jax import distributed
from cvs_jax.augment import transforms as augment
from cvs_jax.data import chunks
from cvs_jax.engine import features
from cvs_jax.models import networks as models
from cvs_jax.retrieval import topk
from cvs_jax.retrieval.embedder import Embedder

VIT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "backbones", "vit_patch16.safetensors")
CHUNK = 256


def _config(kind: str):
    c = image_folder_general.get_config("cpu")
    c.train.eval_batch_size = CHUNK
    if kind == "resnet":  # the tests' tiny ResNet
        c.data.stored_size, c.augment.size, c.model.width, c.model.embed_dim = 16, 12, 4, 8
    else:  # the fixture ViT (depth 2, width 128) with a frozen trunk of one block
        c.model.name, c.model.pretrained, c.model.train_blocks = "vit", VIT, "1"
        c.data.stored_size, c.augment.size = 32, 32
    return c


@pytest.fixture(scope="module", params=["resnet", "vit"])
def net(request):
    c = _config(request.param)
    shape = (c.data.stored_size, c.data.stored_size, 3)
    model = models.from_config(c)
    k0, k1 = jax.random.split(jax.random.key(0))
    variables = jax.device_get(models.init_variables(model, c, shape, 10, k0, k1))

    def embedder(bucketed=True):
        mesh = distributed.data_mesh(jax.local_devices()[:1])
        pipeline = augment.Pipeline.from_config(c)
        return Embedder(model, pipeline, CHUNK, c.model.dtype, mesh, c.model.embed_dim, bucketed=bucketed)

    images = np.random.default_rng(0).integers(0, 256, (300, *shape), np.uint8)
    return embedder, variables, images


def test_bucket_schedule():
    shapes = {chunks.bucket(n, CHUNK) for n in range(1, CHUNK + 1)}
    assert chunks.bucket(1, CHUNK) == 1 and chunks.bucket(CHUNK, CHUNK) == CHUNK
    assert len(shapes) == 28  # four shapes per power of two: a bounded number of compiles
    for n in range(1, CHUNK + 1):
        b = chunks.bucket(n, CHUNK)
        assert n <= b <= CHUNK and b - n <= n / 4, (n, b)  # padding wastes at most a quarter
        m = chunks.bucket(n, CHUNK, multiple=8)
        assert m % 8 == 0 and n <= m <= CHUNK and chunks.bucket(n, CHUNK, 8) >= b
    x = np.arange(300)
    got = [(s, c.shape[0], n) for s, c, n in chunks.iter_chunks(x, CHUNK, bucketed=True)]
    assert got == [(0, 256, 256), (256, 48, 44)]
    (_, last, _) = list(chunks.iter_chunks(x, CHUNK, bucketed=True))[-1]
    np.testing.assert_array_equal(last, np.r_[np.arange(256, 300), np.zeros(4, int)])
    assert [c.shape[0] for _, c, _ in chunks.iter_chunks(x, CHUNK)] == [256, 256]  # the default: full chunks


def test_a_lone_query_runs_one_small_bucket(net):
    embedder, variables, images = net
    new, old = embedder(), embedder(bucketed=False)
    new(variables, images[:1])
    old(variables, images[:1])
    assert (new.rows_run, old.rows_run) == (1, CHUNK)
    new(variables, images)  # 300 images: one full chunk and 44 rows padded to 48, not to 256
    assert new.rows_run == 1 + 256 + 48


@pytest.mark.parametrize("n", [1, 3, 44, 300])
def test_bucketed_rows_equal_the_full_chunk_rows(net, n):
    embedder, variables, images = net
    new, old = embedder()(variables, images[:n]), embedder(bucketed=False)(variables, images[:n])
    assert new.shape == old.shape == (n, old.shape[1])
    np.testing.assert_allclose(new, old, rtol=0, atol=chunks.EXACTNESS * np.abs(old).max())
    if n == 300:  # the full chunk is the same program on both paths
        np.testing.assert_array_equal(new[:256], old[:256])


def test_a_stored_image_queried_again_finds_its_own_row_with_its_stored_score(net):
    """Rows stored as training stores them (300 images: a chunk of 256, then a bucket of 48); each image
    queried again alone (a bucket of 1) or with two others: its own row is the top hit, and its score is
    the stored row's score against itself."""
    embedder, variables, images = net
    embed = embedder()
    stored = embed(variables, images)
    gallery = topk.ShardedGallery(stored)
    unit = stored / np.linalg.norm(stored, axis=1, keepdims=True)
    own = (unit * unit).sum(1)  # the stored score of a row against itself
    for rows in ([0], [255], [256], [299], [3, 150, 290]):
        scores, idx = gallery.topk(embed(variables, images[rows]), 2)
        np.testing.assert_array_equal(idx[:, 0], rows)
        np.testing.assert_allclose(scores[:, 0], own[rows], rtol=0, atol=chunks.EXACTNESS)
        assert (scores[:, 1] < scores[:, 0] - 1e-3).all()  # not a near-tie: the test can tell rows apart


def test_feature_cache_pads_its_last_chunk_to_a_bucket(tmp_path):
    """The frozen trunk runs 256 + 48 rows for 300 images (not 512), and its features equal the
    full-chunk path's within EXACTNESS."""
    c = _config("vit")
    c.data.data_dir = str(tmp_path)
    images = np.random.default_rng(1).integers(0, 256, (300, 32, 32, 3), np.uint8)

    class Split:
        image_shape = (32, 32, 3)

        def __len__(self):
            return len(images)

        def read(self, idx):
            return images[idx]

    trunk = features.Trunk(c, (32, 32, 3))
    new = trunk.compute(Split(), "bucketed")
    trunk.bucketed = False
    old = trunk.compute(Split(), "full")
    assert features.TRUNK_IMAGES["bucketed"] == features.TRUNK_IMAGES["full"] == 300
    assert (features.TRUNK_ROWS["bucketed"], features.TRUNK_ROWS["full"]) == (256 + 48, 512)
    np.testing.assert_allclose(new, old, rtol=0, atol=chunks.EXACTNESS * np.abs(old).max())
