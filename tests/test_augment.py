"""On-device crop/flip against their definitions, and the policies wired into preprocessing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvs_jax import augment


def images(n=6, h=8, w=8, c=1, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, c), dtype=np.uint8)


def test_no_padding_no_flip_is_identity():
    x = images()
    out = augment.random_crop_flip(jax.random.key(0), jnp.asarray(x), padding=0, flip=False)
    np.testing.assert_array_equal(out, x)


def test_flip_gives_image_or_mirror_and_both_occur():
    x = images(n=64)
    out = np.asarray(augment.random_crop_flip(jax.random.key(1), jnp.asarray(x), padding=0, flip=True))
    same = [(o == i).all() for o, i in zip(out, x)]
    mirrored = [(o == i[:, ::-1]).all() for o, i in zip(out, x)]
    assert all(s or m for s, m in zip(same, mirrored)) and any(same) and any(mirrored)


def test_crop_is_a_window_of_the_zero_padded_image():
    x = images(n=16)
    p = 2
    out = np.asarray(augment.random_crop_flip(jax.random.key(2), jnp.asarray(x), padding=p, flip=False))
    for o, i in zip(out, x):
        padded = np.pad(i, ((p, p), (p, p), (0, 0)))
        windows = [padded[dy:dy + 8, dx:dx + 8] for dy in range(2 * p + 1) for dx in range(2 * p + 1)]
        assert any((o == w).all() for w in windows)


@pytest.mark.parametrize("policy", ["none", "cifar10", "randaugment"])
def test_preprocess_train_with_policy(policy):
    x = jnp.asarray(images(n=4, h=16, w=16, c=3))
    f = jax.jit(lambda k, im: augment.preprocess_train(k, im, mean=(0.5,) * 3, std=(0.25,) * 3, padding=2,
                                                       flip=True, policy=policy))
    a, b = f(jax.random.key(3), x), f(jax.random.key(3), x)
    assert a.shape == (4, 16, 16, 3) and a.dtype == jnp.float32 and bool(jnp.isfinite(a).all())
    np.testing.assert_array_equal(a, b)  # a function of the key: resumable
    assert float(jnp.abs(a).max()) <= (255 / 255 - 0.5) / 0.25 + 1e-6


def test_unknown_policy_refused():
    with pytest.raises(ValueError, match="augment.policy='autoaug'"):
        augment.preprocess_train(jax.random.key(0), jnp.asarray(images()), mean=(0.5,), std=(0.25,),
                                 padding=0, flip=False, policy="autoaug")
