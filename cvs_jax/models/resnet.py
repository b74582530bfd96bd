"""ResNet backbones with a 128-d embedding, as in the official CVS code.

Two layouts (spec §1.5):
  * ``cifar``: 3x3 stem, no max-pool; GDumb-derived block where every conv is
    conv-BN-ReLU, the residual branch ends with a ReLU and there is *no* ReLU
    after the addition; the projection shortcut is conv-BN-ReLU too.
  * ``imagenet``: 7x7/2 stem + 3x3/2 max-pool; block conv-BN-ReLU, conv-BN-ReLU,
    add, ReLU (a ReLU before and after the addition).
BatchNorm eps is 1e-6 and momentum 0.1 in PyTorch terms (0.9 in Flax terms).
The network returns the raw (un-normalised) embedding, which is what the gallery
stores; the cosine classifier lives outside the module (see ``heads.py``) so
that an old head can be applied to a new embedding without re-tracing the net.
"""

from __future__ import annotations

import functools
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

# PyTorch's kaiming_normal_(mode='fan_out', nonlinearity='relu').
_conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")


def _torch_linear_init(fan_in: int):
    """PyTorch's default Linear init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / jnp.sqrt(fan_in)

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


class ConvBNReLU(nn.Module):
    """conv -> BN -> ReLU (the official ``ConvBlock``)."""

    features: int
    kernel: int
    stride: int
    relu: bool = True
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool):
        pad = (self.kernel - 1) // 2
        x = nn.Conv(self.features, (self.kernel, self.kernel), (self.stride, self.stride),
                    padding=[(pad, pad), (pad, pad)], use_bias=False,
                    kernel_init=_conv_init, dtype=self.dtype)(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-6,
                         dtype=self.dtype)(x)
        return nn.relu(x) if self.relu else x


class BasicBlock(nn.Module):
    features: int
    stride: int
    layout: str  # "cifar" or "imagenet"
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool):
        conv = functools.partial(ConvBNReLU, dtype=self.dtype)
        y = conv(self.features, 3, self.stride)(x, train)
        y = conv(self.features, 3, 1)(y, train)
        shortcut = x
        if self.stride != 1 or x.shape[-1] != self.features:
            shortcut = conv(self.features, 1, self.stride)(x, train)
        out = y + shortcut
        return nn.relu(out) if self.layout == "imagenet" else out


class ResNetEmbedding(nn.Module):
    """ResNet backbone -> global average pool -> Linear(embed_dim)."""

    stage_sizes: Sequence[int] = (2, 2, 2, 2)
    width: int = 64
    layout: str = "cifar"
    embed_dim: int = 128
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool):
        x = x.astype(self.dtype)
        if self.layout == "cifar":
            x = ConvBNReLU(self.width, 3, 1, dtype=self.dtype)(x, train)
        elif self.layout == "imagenet":
            x = ConvBNReLU(self.width, 7, 2, dtype=self.dtype)(x, train)
            x = nn.max_pool(x, (3, 3), (2, 2), padding=[(1, 1), (1, 1)])
        else:
            raise ValueError(f"model.layout={self.layout!r}: use 'cifar' or 'imagenet'.")
        for i, blocks in enumerate(self.stage_sizes):
            for b in range(blocks):
                stride = 2 if (i > 0 and b == 0) else 1
                x = BasicBlock(self.width * 2**i, stride, self.layout, dtype=self.dtype)(x, train)
        x = jnp.mean(x, axis=(1, 2)).astype(jnp.float32)
        fan_in = x.shape[-1]
        return nn.Dense(self.embed_dim, kernel_init=_torch_linear_init(fan_in),
                        bias_init=_torch_linear_init(fan_in), name="embedding")(x)
