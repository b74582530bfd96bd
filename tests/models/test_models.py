"""Model shapes, both stems, small grey inputs, and head growth."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvs_jax.errors import ConfigError
from cvs_jax.models.networks import build_model, grow_head, init_head


@pytest.mark.parametrize(
    "layout,shape", [("cifar", (2, 28, 28, 1)), ("imagenet", (2, 64, 64, 3)), ("cifar", (2, 32, 32, 3))]
)
def test_tiny_resnet_embeds(layout, shape):
    """Shapes only, so traced by ``jax.eval_shape`` (the same code, nothing compiled): run op by op it compiled
    ~170 single-operation programs, 23 s of CPU on a cold XLA cache (docs/testing.md)."""
    model = build_model("tiny", width=8, layout=layout, embed_dim=16)
    x = jnp.ones(shape)
    variables = jax.eval_shape(lambda: model.init(jax.random.key(0), x, train=False))
    emb = jax.eval_shape(lambda v: model.apply(v, x, train=False), variables)
    assert emb.shape == (2, 16)
    emb_train, updates = jax.eval_shape(lambda v: model.apply(v, x, train=True, mutable=["batch_stats"]), variables)
    assert emb_train.shape == (2, 16) and "batch_stats" in updates


def test_resnet18_structure():
    model = build_model("resnet18", width=64, layout="cifar", embed_dim=128)
    variables = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.ones((1, 32, 32, 3)), train=False))
    n_params = sum(np.prod(p.shape) for p in jax.tree.leaves(variables["params"]))
    # ResNet-18 CIFAR body (11.17M) + 512x128 embedding; shortcut convs keep BN+ReLU as in GDumb.
    assert 11.1e6 < n_params < 11.3e6
    assert variables["params"]["embedding"]["kernel"].shape == (512, 128)


def test_unknown_model_refused():
    with pytest.raises(ConfigError, match="model.name"):
        build_model("resnet7", width=8, layout="cifar", embed_dim=16)


def test_head_growth_keeps_old_rows_and_reinitialises_new():
    head = init_head(jax.random.key(0), 10, 8)
    grown = grow_head(head, jax.random.key(1), old_classes=4, new_classes=6)
    np.testing.assert_array_equal(grown[:4], head[:4])
    assert not np.allclose(grown[4:6], head[4:6])
    np.testing.assert_array_equal(grown[6:], head[6:])
    assert np.abs(np.asarray(grown)).max() <= 1 / np.sqrt(8)
    with pytest.raises(ValueError):
        grow_head(head, jax.random.key(1), old_classes=6, new_classes=4)


def test_schedule_matches_official_values():
    from cvs_jax.engine.schedules import epoch_lr

    want = {
        0: 0.003,
        1: 0.03,
        2: 0.03,
        3: 0.01515,
        4: 0.03,
        5: 0.025651,
        7: 0.004649,
        15: 0.00143,
        31: 0.000585,
        127: 0.000318,
        191: 0.015514,
        255: 0.000304,
    }
    for e, lr in want.items():
        assert epoch_lr("official", e, 0.03, 256) == pytest.approx(lr, abs=2e-6), e
    assert epoch_lr("cosine", 0, 0.03, 10) == pytest.approx(0.03)
    assert epoch_lr("cosine", 5, 0.03, 10) == pytest.approx((0.03 + 0.0003) / 2)


def test_one_jit_initialisation_has_the_bits_of_flax_op_by_op(monkeypatch, request):
    """``init_variables`` draws network and head in one ``jax.jit`` (~70 fewer compiles per process); a run's
    initial weights, hence its results, must keep the bits of Flax's stock initializers run op by op.
    Without ``resnet.unit_normal``'s barrier XLA regroups ``normal * scale`` and conv kernels move by 1 ulp.
    The op-by-op side is XLA's default code, so the test runs in a process at XLA's default level."""
    import flax.linen as nn

    from cvs_jax.testing import xla_env

    if not xla_env.default_compiler(request.node.nodeid):
        return  # it ran, and passed, in a process of its own

    from cvs_jax.config import fashion_mnist_general
    from cvs_jax.methods.registry import get_head
    from cvs_jax.models import networks, resnet

    config = fashion_mnist_general.get_config()  # the tests' tiny model: width 4, embedding 8
    config.model.width, config.model.embed_dim = 4, 8
    model, head = networks.from_config(config), get_head(config)
    k_net, k_head = jax.random.split(jax.random.key(3))
    got = networks.init_variables(model, config, (28, 28, 1), 10, k_net, k_head, head=head)
    monkeypatch.setattr(resnet, "_conv_init", nn.initializers.variance_scaling(2.0, "fan_out", "normal"))
    net = model.init(k_net, jnp.zeros((1, 28, 28, 1)), train=False)  # op by op, Flax's own initializer
    want = {"params": {"net": net["params"], **head.init(k_head, 10, 8)}, "batch_stats": net["batch_stats"]}
    got_leaves, want_leaves = jax.tree_util.tree_leaves_with_path(got), jax.tree_util.tree_leaves_with_path(want)
    assert [p for p, _ in got_leaves] == [p for p, _ in want_leaves]
    differing = [
        jax.tree_util.keystr(p)
        for (p, a), (_, b) in zip(got_leaves, want_leaves)
        if np.asarray(a).tobytes() != np.asarray(b).tobytes()
    ]
    assert not differing
