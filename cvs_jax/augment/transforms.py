"""On-device preprocessing inside the jitted step: augmentation and normalisation.

Doing it on the accelerator keeps the host loop to an index gather, so input
never starves the step.  Randomness comes from the step key, so a resumed run
augments exactly as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import math
from typing import cast

import jax
import jax.numpy as jnp

from cvs_jax.augment import autoaugment
from cvs_jax.errors import ConfigError


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
    """Crop + flip, then the AutoAugment/RandAugment policy on uint8, then normalise (the official
    code's training transform: random crop with 4-pixel padding, flip, AutoAugment or RandAugment)."""
    crop_key, policy_key = jax.random.split(key)
    images = random_crop_flip(crop_key, images_u8, padding, flip)  # on uint8: zero padding = black, as torchvision
    return normalize(apply_policy(policy_key, images, policy), mean, std)


def apply_policy(key, images_u8, policy: str):
    """The AutoAugment CIFAR-10 policy, RandAugment, or nothing, on uint8 images."""
    if policy == "cifar10":  # without return_choices: the images only
        return cast(jax.Array, autoaugment.cifar10_policy(key, images_u8))
    if policy == "randaugment":
        return cast(jax.Array, autoaugment.rand_augment(key, images_u8))
    if policy != "none":
        raise ConfigError(f"augment.policy={policy!r} is unknown; choose one of {POLICIES}.")
    return images_u8


# ----------------------------------------------------------------- fine-grained recipe (official code)


def _resized_crop_box(key, height: int, width: int, scale, ratio, attempts: int = 10):
    """torchvision ``RandomResizedCrop.get_params``: (top, left, h, w) as int32 scalars.

    The ten tries are drawn at once and the first that fits is taken; if none fits,
    the centre crop with the aspect ratio clamped to ``ratio`` (torchvision's fallback).
    """
    k_area, k_ratio, k_top, k_left = jax.random.split(key, 4)
    area = height * width * jax.random.uniform(k_area, (attempts,), minval=scale[0], maxval=scale[1])
    log_r = jax.random.uniform(k_ratio, (attempts,), minval=math.log(ratio[0]), maxval=math.log(ratio[1]))
    r = jnp.exp(log_r)
    w = jnp.round(jnp.sqrt(area * r)).astype(jnp.int32)
    h = jnp.round(jnp.sqrt(area / r)).astype(jnp.int32)
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = jnp.argmax(fits)
    in_ratio = width / height
    if in_ratio < ratio[0]:
        fw, fh = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        fw, fh = int(round(height * ratio[1])), height
    else:
        fw, fh = width, height
    any_fit = jnp.any(fits)
    h_sel = jnp.where(any_fit, h[first], fh)
    w_sel = jnp.where(any_fit, w[first], fw)
    top = jnp.where(any_fit, jax.random.randint(k_top, (), 0, height - h_sel + 1), (height - fh) // 2)
    left = jnp.where(any_fit, jax.random.randint(k_left, (), 0, width - w_sel + 1), (width - fw) // 2)
    return top, left, h_sel, w_sel


def _crop_resize(image, top, left, h, w, size: int):
    """The box (top, left, h, w) of ``image`` resized to ``size x size`` (bilinear, antialiased)."""
    scale = jnp.stack([size / h, size / w]).astype(jnp.float32)
    translation = -jnp.stack([top, left]).astype(jnp.float32) * scale
    out = jax.image.scale_and_translate(
        image.astype(jnp.float32),
        (size, size, image.shape[2]),
        (0, 1),
        scale,
        translation,
        method="linear",
        antialias=True,
    )
    return jnp.clip(jnp.round(out), 0, 255).astype(jnp.uint8)


def random_resized_crop_flip(key, images_u8, size: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), flip: bool = True):
    """RandomResizedCrop(size, scale, ratio) + horizontal flip p=0.5, per image, on uint8."""
    n, height, width, _ = images_u8.shape

    def one(k, image):
        k_box, k_flip = jax.random.split(k)
        out = _crop_resize(image, *_resized_crop_box(k_box, height, width, scale, ratio), size)
        return jnp.where(jax.random.bernoulli(k_flip), out[:, ::-1, :], out) if flip else out

    return jax.vmap(one)(jax.random.split(key, n), images_u8)


def center_crop(images_u8, size: int):
    """torchvision CenterCrop(size) (top = round((H - size) / 2))."""
    h, w = images_u8.shape[1:3]
    if size > h or size > w:
        raise ConfigError(f"augment.size={size} is larger than the stored {h}x{w} images.")
    top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    return images_u8[:, top : top + size, left : left + size, :]


CROPS = ("pad", "resized")


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """The one description of train / eval preprocessing, built from ``config.augment`` and ``config.data``.

    ``crop="pad"`` (CIFAR, Tiny-ImageNet): RandomCrop with ``padding`` + flip + ``policy``; eval
    normalises only.  ``crop="resized"`` (fine-grained): RandomResizedCrop(``size``) + flip for
    training and CenterCrop(``size``) for evaluation, on images stored at 256x256 (shorter side resized
    to 256, centre square), i.e. torchvision's Resize(256) + CenterCrop(224) at eval time.
    """

    mean: tuple
    std: tuple
    crop: str = "pad"
    padding: int = 4
    flip: bool = True
    policy: str = "none"
    size: int | None = None

    @classmethod
    def from_config(cls, config) -> "Pipeline":
        a = config.augment
        return cls(
            mean=tuple(config.data.mean),
            std=tuple(config.data.std),
            crop=a.crop,
            padding=a.crop_padding,
            flip=a.flip,
            policy=a.policy,
            size=a.size,
        )

    @property
    def crop_size(self) -> int:
        """``size``, which the "resized" crops need."""
        if self.size is None:
            raise ConfigError('augment.crop="resized" needs augment.size (the crop\'s side, e.g. 224); it is unset.')
        return self.size

    def train(self, key, images_u8):
        if self.crop == "pad":
            return preprocess_train(
                key, images_u8, mean=self.mean, std=self.std, padding=self.padding, flip=self.flip, policy=self.policy
            )
        if self.crop == "resized":
            crop_key, policy_key = jax.random.split(key)
            images = random_resized_crop_flip(crop_key, images_u8, self.crop_size, flip=self.flip)
            return normalize(apply_policy(policy_key, images, self.policy), self.mean, self.std)
        raise ConfigError(f"augment.crop={self.crop!r} is unknown; choose one of {CROPS}.")

    def eval(self, images_u8):
        if self.crop == "resized":
            images_u8 = center_crop(images_u8, self.crop_size)
        return normalize(images_u8, self.mean, self.std)


@dataclasses.dataclass(frozen=True)
class CachedViews:
    """The pipeline of cached trunk features (``engine.features``): the transforms ran before the trunk,
    once per image. ``views=1``: a row is the evaluation view, used as it is. ``views=V>1``: a row holds
    V views, [V, ...]: view 0 is the evaluation view (``eval``), and ``train`` picks one per image with
    the step's key, so a resumed run picks the same views."""

    views: int = 1

    def train(self, key, x):
        if self.views == 1:
            return x
        pick = jax.random.randint(key, (x.shape[0],), 0, self.views)
        return x[jnp.arange(x.shape[0]), pick]

    def eval(self, x):
        return x if self.views == 1 else x[:, 0]


Views = Pipeline | CachedViews  # what the step, the embedder and the Fisher pass call ``train`` / ``eval`` on
