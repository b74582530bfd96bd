"""On-device crop/flip against their definitions, and the policies wired into preprocessing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvs_jax.augment import transforms as augment
from cvs_jax.errors import ConfigError


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
        windows = [padded[dy : dy + 8, dx : dx + 8] for dy in range(2 * p + 1) for dx in range(2 * p + 1)]
        assert any((o == w).all() for w in windows)


@pytest.mark.parametrize("policy", ["none", "cifar10", "randaugment"])
def test_preprocess_train_with_policy(policy):
    x = jnp.asarray(images(n=4, h=16, w=16, c=3))
    f = jax.jit(
        lambda k, im: augment.preprocess_train(
            k, im, mean=(0.5,) * 3, std=(0.25,) * 3, padding=2, flip=True, policy=policy
        )
    )
    a, b = f(jax.random.key(3), x), f(jax.random.key(3), x)
    assert a.shape == (4, 16, 16, 3) and a.dtype == jnp.float32 and bool(jnp.isfinite(a).all())
    np.testing.assert_array_equal(a, b)  # a function of the key: resumable
    assert float(jnp.abs(a).max()) <= (255 / 255 - 0.5) / 0.25 + 1e-6


def test_unknown_policy_refused():
    with pytest.raises(ConfigError, match="augment.policy='autoaug'"):
        augment.preprocess_train(
            jax.random.key(0), jnp.asarray(images()), mean=(0.5,), std=(0.25,), padding=0, flip=False, policy="autoaug"
        )


# ----------------------------------------------------------------- RandomResizedCrop (fine-grained)


def test_resized_crop_boxes_follow_torchvision_rules():
    """Every box lies inside the image; when a try fits, area share in [0.08, 1] and w/h in [3/4, 4/3]."""
    h, w = 40, 60
    boxes = jax.vmap(lambda k: jnp.stack(augment._resized_crop_box(k, h, w, (0.08, 1.0), (3 / 4, 4 / 3))))(
        jax.random.split(jax.random.key(3), 500)
    )
    top, left, bh, bw = np.asarray(boxes).T
    assert (top >= 0).all() and (left >= 0).all() and (top + bh <= h).all() and (left + bw <= w).all()
    assert (bh > 0).all() and (bw > 0).all()
    share, ratio = bh * bw / (h * w), bw / bh
    # rounding of h and w moves the area and the ratio slightly
    assert share.min() > 0.06 and share.max() <= 1.0
    assert ratio.min() > 0.7 and ratio.max() < 1.4
    assert len({(a, b) for a, b in zip(top, left)}) > 100  # boxes vary


def test_resized_crop_falls_back_to_the_clamped_centre_crop():
    """No try can fit (scale > 1): torchvision takes the centre crop with the ratio clamped."""
    top, left, bh, bw = (
        int(v) for v in augment._resized_crop_box(jax.random.key(0), 40, 100, (2.0, 3.0), (3 / 4, 4 / 3))
    )
    assert (bh, bw) == (40, round(40 * 4 / 3)) and top == 0 and left == (100 - bw) // 2


def test_crop_resize_matches_pil_and_is_exact_at_scale_one():
    from PIL import Image

    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
    same = augment._crop_resize(jnp.asarray(img), 8, 16, 32, 32, 32)
    np.testing.assert_array_equal(np.asarray(same), img[8:40, 16:48])  # a pure crop at scale 1
    for box, size in (((5, 7, 30, 41), 24), ((0, 0, 48, 64), 20), ((10, 3, 12, 18), 40)):  # down- and upsampling
        top, left, h, w = box
        ours = np.asarray(augment._crop_resize(jnp.asarray(img), top, left, h, w, size)).astype(float)
        ref = np.asarray(
            Image.fromarray(img).resize((size, size), Image.BILINEAR, box=(left, top, left + w, top + h))
        ).astype(float)
        # same triangle filter, antialiased when shrinking; edges are handled slightly differently
        assert np.abs(ours - ref).mean() < 2.0, box


def test_pipeline_resized_train_and_centre_crop_eval():
    x = images(n=5, h=32, w=32, c=3)
    pipe = augment.Pipeline(mean=(0.5,) * 3, std=(0.25,) * 3, crop="resized", size=24)
    out = np.asarray(jax.jit(pipe.train)(jax.random.key(0), jnp.asarray(x)))
    assert out.shape == (5, 24, 24, 3) and np.isfinite(out).all()
    ev = np.asarray(pipe.eval(jnp.asarray(x)))
    np.testing.assert_allclose(ev, (x[:, 4:28, 4:28] / 255.0 - 0.5) / 0.25, rtol=1e-6, atol=1e-6)
    with pytest.raises(ConfigError, match="larger than the stored"):
        augment.Pipeline(mean=(0.5,), std=(0.25,), crop="resized", size=40).eval(jnp.asarray(x))


def test_resized_crop_without_a_size_is_refused_in_one_line():
    """augment.crop="resized" with augment.size unset (a placeholder in config/defaults.py) stops with a
    ConfigError naming the field, not a TypeError from inside the crop (found by pyright)."""
    x = jnp.asarray(images(n=2, h=16, w=16, c=3))
    pipe = augment.Pipeline(mean=(0.5,), std=(0.25,), crop="resized")
    for run in (lambda: pipe.eval(x), lambda: pipe.train(jax.random.key(0), x)):
        with pytest.raises(ConfigError, match="augment.size"):
            run()
