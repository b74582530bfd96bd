"""A fresh pretrained network draws only the leaves its weight file lacks (``networks._pretrained_init``), and
its variables keep the bits of drawing the whole network and overwriting it with the file's.

The whole draw of EfficientNet-Lite0 and the file's read cost 2.5-2.6 s of CPU warm and 11-13 s on an empty compile
cache, for weights the file then replaced; with the draw of its new ``embedding`` layer and the head alone 1.2-1.5 and
1.9-2.1 s (2-core host, ``python benchmarks/pretrained_init.py --cold``).
"""

import os

import jax
import numpy as np
import pytest

from cvs_jax.methods.registry import get_head
from cvs_jax.models import networks
from cvs_jax.models.pretrained import PretrainedWeightsError, merge_pretrained
from cvs_jax.models.weight_packages import resolve
from cvs_jax.testing.image_folders import backbone_config

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "backbones")


def _whole_draw_then_file(model, config, image_shape, classes, keys, head):
    """What a fresh pretrained run did before: every leaf drawn, then the file's leaves written over them."""
    shape = networks.input_shape(config, image_shape)
    net, arrays = networks._fresh(model, head, tuple(shape), classes, int(config.model.embed_dim), *keys)  # pylint: disable=protected-access
    net = merge_pretrained(net, networks.load_pretrained(model, resolve(config.model.pretrained), shape))
    return {"params": {"net": net["params"], **arrays}, "batch_stats": net.get("batch_stats", {})}


@pytest.mark.parametrize(
    "name,pretrained,image_shape,model",
    [
        ("efficientnet_lite0", "efficientnet_lite0", (64, 64, 3), {"embed_dim": 16}),
        ("vit", os.path.join(FIXTURES, "dinov2_reg_patch14.safetensors"), (56, 56, 3), {"embed_dim": 16}),
    ],
    ids=["efficientnet_lite0", "vit"],
)
def test_only_what_the_file_lacks_is_drawn_with_the_whole_draws_bits(monkeypatch, name, pretrained, image_shape, model):
    """At the suite's XLA level; also passed at the run's (``CVS_JAX_TEST_XLA_LEVEL=default``, 2026-12-07)."""
    config = backbone_config(name, pretrained, **model)
    config.augment.size = image_shape[0]
    net, head = networks.from_config(config), get_head(config)
    keys = tuple(jax.random.split(jax.random.key(7)))
    want = _whole_draw_then_file(net, config, image_shape, 5, keys, head)

    def no_whole_draw(*args):
        raise AssertionError("the whole network was drawn")

    monkeypatch.setattr(networks, "_fresh", no_whole_draw)
    drawn_paths = []
    real = networks._draw_part  # pylint: disable=protected-access

    def spy(model, head, image_shape, num_classes, embed_dim, paths, *keys):
        drawn_paths.append(paths)
        return real(model, head, image_shape, num_classes, embed_dim, paths, *keys)

    options = networks.INIT_COMPILER_OPTIONS  # as the run compiles it (level 1 on the CPU outside the suite)
    monkeypatch.setattr(
        networks, "_DRAW_PART_ON_CPU", jax.jit(spy, static_argnums=(0, 1, 2, 3, 4, 5), compiler_options=options)
    )
    got = networks.init_variables(net, config, image_shape, 5, *keys, head=head)
    assert drawn_paths and all(p[:2] == ("params", "embedding") for p in drawn_paths[0]), drawn_paths
    got_leaves, want_leaves = jax.tree_util.tree_leaves_with_path(got), jax.tree_util.tree_leaves_with_path(want)
    assert [p for p, _ in got_leaves] == [p for p, _ in want_leaves]
    differing = [
        jax.tree_util.keystr(p)
        for (p, a), (_, b) in zip(got_leaves, want_leaves)
        if np.asarray(a).dtype != np.asarray(b).dtype or np.asarray(a).tobytes() != np.asarray(b).tobytes()
    ]
    assert not differing
    # the drawn embedding is a draw (not zeros), and the file's leaves are the file's
    assert np.abs(np.asarray(jax.tree.leaves(got["params"]["net"]["embedding"])[0])).max() > 0


def test_a_file_that_lacks_a_trunk_leaf_is_still_one_error(monkeypatch):
    """The file is still checked leaf by leaf: a trunk leaf it lacks is refused, not drawn in silence."""
    config = backbone_config("vit", os.path.join(FIXTURES, "dinov2_reg_patch14.safetensors"), embed_dim=16)
    config.augment.size = 56
    net, head = networks.from_config(config), get_head(config)
    real = networks.load_pretrained

    def without_pos_embed(model, path, image_shape):
        variables = real(model, path, image_shape)
        del variables["params"]["pos_embed"]
        return variables

    monkeypatch.setattr(networks, "load_pretrained", without_pos_embed)
    with pytest.raises(PretrainedWeightsError, match="params/pos_embed has no pretrained weights"):
        networks.init_variables(net, config, (56, 56, 3), 5, jax.random.key(0), jax.random.key(1), head=head)
