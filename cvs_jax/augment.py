"""On-device preprocessing inside the jitted step: augmentation and normalisation.

Doing it on the accelerator keeps the host loop to an index gather, so input
never starves the step.  Randomness comes from the step key, so a resumed run
augments exactly as an uninterrupted one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cvs_jax import autoaugment


def normalize(images_u8: jax.Array, mean, std) -> jax.Array:
    x = images_u8.astype(jnp.float32) / 255.0
    return (x - jnp.asarray(mean, jnp.float32)) / jnp.asarray(std, jnp.float32)


def _crop_flip_one(key, image, padding: int, flip: bool):
    h, w, _ = image.shape
    k1, k2, k3 = jax.random.split(key, 3)
    if padding:
        padded = jnp.pad(image, ((padding, padding), (padding, padding), (0, 0)))
        dy = jax.random.randint(k1, (), 0, 2 * padding + 1)
        dx = jax.random.randint(k2, (), 0, 2 * padding + 1)
        image = jax.lax.dynamic_slice(padded, (dy, dx, 0), (h, w, image.shape[2]))
    if flip:
        image = jnp.where(jax.random.bernoulli(k3), image[:, ::-1, :], image)
    return image


def random_crop_flip(key: jax.Array, images: jax.Array, padding: int, flip: bool) -> jax.Array:
    """RandomCrop(pad=padding, zero fill) + horizontal flip p=0.5, per image.

    Applied to normalised images; zero padding is applied *before* normalisation in
    torchvision, so callers pad the uint8 images (pad value 0) — see ``preprocess_train``.
    """
    keys = jax.random.split(key, images.shape[0])
    return jax.vmap(lambda k, im: _crop_flip_one(k, im, padding, flip))(keys, images)


POLICIES = ("none", "cifar10", "randaugment")


def preprocess_train(key, images_u8, *, mean, std, padding: int, flip: bool, policy: str = "none"):
    """Crop + flip, then the AutoAugment/RandAugment policy on uint8, then normalise (spec §1.6)."""
    crop_key, policy_key = jax.random.split(key)
    images = random_crop_flip(crop_key, images_u8, padding, flip)  # on uint8: zero padding = black, as torchvision
    if policy == "cifar10":
        images = autoaugment.cifar10_policy(policy_key, images)
    elif policy == "randaugment":
        images = autoaugment.rand_augment(policy_key, images)
    elif policy != "none":
        raise ValueError(f"augment.policy={policy!r} is unknown; choose one of {POLICIES}.")
    return normalize(images, mean, std)


def preprocess_eval(images_u8, *, mean, std):
    return normalize(images_u8, mean, std)
