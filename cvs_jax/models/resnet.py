"""ResNet backbones with a 128-d embedding, as in the official CVS code.

Two layouts (as in the official code):
  * ``cifar``: 3x3 stem, no max-pool; GDumb-derived block where every conv is
    conv-BN-ReLU, the residual branch ends with a ReLU and there is *no* ReLU
    after the addition; the projection shortcut is conv-BN-ReLU too.
  * ``imagenet``: 7x7/2 stem + 3x3/2 max-pool; block conv-BN-ReLU, conv-BN-ReLU,
    add, ReLU (a ReLU before and after the addition).
BatchNorm eps is 1e-6 and momentum 0.1 in PyTorch terms (0.9 in Flax terms).

A third family, ``TorchvisionResNet`` (``layout="torchvision"``), is the torchvision
ResNet used with ImageNet-pretrained weights for fine-grained data (the paper's fine-grained setting):
7x7/2 stem + 3x3/2 max-pool, torchvision BasicBlock or Bottleneck (v1.5: stride on the
3x3 conv, expansion 4), projection shortcut conv1x1+BN *without* ReLU, ReLU after the
addition, BN eps 1e-5; ``frozen_bn`` makes every BN use its running statistics also in
training (the official fine-grained code keeps all BN layers in eval mode). Its module
names mirror torchvision's state-dict keys (``conv1``, ``bn1``, ``layer1_0/conv1``,
``layer1_0/downsample_0``...) so that ``pretrained.py`` can import torchvision weights.
The network returns the raw (un-normalised) embedding, which is what the gallery
stores; the cosine classifier lives outside the module (see ``heads.py``) so
that an old head can be applied to a new embedding without re-tracing the net.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

# Named architectures (``model.name``). ``tiny`` is the test/demo model: same code path, 1 block per stage.
# ``resnet50`` (bottleneck blocks) exists only in the torchvision layout.
ARCHITECTURES = {
    "resnet18": dict(stage_sizes=(2, 2, 2, 2)),
    "resnet34": dict(stage_sizes=(3, 4, 6, 3)),
    "resnet50": dict(stage_sizes=(3, 4, 6, 3), block="bottleneck"),
    "tiny": dict(stage_sizes=(1, 1, 1)),
}


def unit_normal(key, shape, dtype=jnp.float32):
    """``jax.random.normal`` behind an optimization barrier: a scaled draw then has the same bits whether
    initialisation runs op by op or inside one ``jax.jit`` (there XLA would fold the draw's own sqrt(2)
    into the scale and change the last bit of some weights)."""
    return jax.lax.optimization_barrier(jax.random.normal(key, shape, dtype))


def kaiming_normal_fan_out(key, shape, dtype=jnp.float32):
    """PyTorch's kaiming_normal_(mode='fan_out', nonlinearity='relu'): the bits of Flax's
    ``variance_scaling(2.0, "fan_out", "normal")`` (same draw, same fan, same scale), jit or not."""
    fan_out = shape[-1] * (math.prod(shape) / shape[-2] / shape[-1])
    return unit_normal(key, shape, dtype) * jnp.sqrt(jnp.array(2.0 / fan_out, dtype=dtype))


def normal_init(stddev: float):
    """The bits of Flax's ``initializers.normal(stddev)``, jit or not."""

    def init(key, shape, dtype=jnp.float32):
        return unit_normal(key, shape, dtype) * jnp.array(stddev, dtype)

    return init


_conv_init = kaiming_normal_fan_out


def _torch_linear_init(fan_in: int):
    """PyTorch's default Linear init: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / jnp.sqrt(fan_in)

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


def global_average_pool(x):
    """Spatial mean in float32, behind an optimization barrier.

    The barrier keeps XLA from fusing the last residual add into the reduction: jax 0.12's CPU
    compiler miscompiles that bf16 fusion (conv + conv + add + mean gives NaN/inf, while jax 0.10 on
    CPU and jax 0.11 on an H100 agree with the unjitted result), which made bf16 embeddings NaN on CPU.
    The pool is a few KB per image, so the unfused add costs nothing measurable.  float32 features take the plain path.
    """
    if x.dtype != jnp.float32:
        x = jax.lax.optimization_barrier(x).astype(jnp.float32)
    return jnp.mean(x, axis=(1, 2))


class ConvBNReLU(nn.Module):
    """conv -> BN -> ReLU (the official ``ConvBlock``)."""

    features: int
    kernel: int
    stride: int
    relu: bool = True
    dtype: DTypeLike = jnp.float32
    frozen_bn: bool = False

    @nn.compact
    def __call__(self, x, train: bool):
        pad = (self.kernel - 1) // 2
        x = nn.Conv(
            self.features,
            (self.kernel, self.kernel),
            (self.stride, self.stride),
            padding=[(pad, pad), (pad, pad)],
            use_bias=False,
            kernel_init=_conv_init,
            dtype=self.dtype,
        )(x)
        x = nn.BatchNorm(use_running_average=self.frozen_bn or not train, momentum=0.9, epsilon=1e-6, dtype=self.dtype)(
            x
        )
        return nn.relu(x) if self.relu else x


class BasicBlock(nn.Module):
    features: int
    stride: int
    layout: str  # "cifar" or "imagenet"
    dtype: DTypeLike = jnp.float32
    frozen_bn: bool = False

    @nn.compact
    def __call__(self, x, train: bool):
        conv = functools.partial(ConvBNReLU, dtype=self.dtype, frozen_bn=self.frozen_bn)
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
    dtype: DTypeLike = jnp.float32
    frozen_bn: bool = False  # BN always uses running statistics (also when train=True)

    @nn.compact
    def __call__(self, x, train: bool):
        x = x.astype(self.dtype)
        if self.layout == "cifar":
            x = ConvBNReLU(self.width, 3, 1, dtype=self.dtype, frozen_bn=self.frozen_bn)(x, train)
        elif self.layout == "imagenet":
            x = ConvBNReLU(self.width, 7, 2, dtype=self.dtype, frozen_bn=self.frozen_bn)(x, train)
            # flax leaves max_pool unannotated, so pyright takes padding for a str (its default); pairs work
            x = nn.max_pool(x, (3, 3), (2, 2), padding=[(1, 1), (1, 1)])  # pyright: ignore[reportArgumentType]
        else:
            raise ValueError(f"model.layout={self.layout!r}: use 'cifar' or 'imagenet'.")
        for i, blocks in enumerate(self.stage_sizes):
            for b in range(blocks):
                stride = 2 if (i > 0 and b == 0) else 1
                x = BasicBlock(self.width * 2**i, stride, self.layout, dtype=self.dtype, frozen_bn=self.frozen_bn)(
                    x, train
                )
        x = global_average_pool(x)
        return embedding(x, self.embed_dim)


def embedding(x: jax.Array, embed_dim: int) -> jax.Array:
    """The ``embedding`` layer both ResNet layouts end in (called inside their ``nn.compact``): the
    official ``Linear(features, D)`` with bias and PyTorch's default init."""
    fan_in = x.shape[-1]
    return nn.Dense(
        embed_dim, kernel_init=_torch_linear_init(fan_in), bias_init=_torch_linear_init(fan_in), name="embedding"
    )(x)


# ------------------------------------------------------------------ torchvision layout
BOTTLENECK_EXPANSION = 4


def _tv_conv(features: int, kernel: int, stride: int, name: str, dtype) -> nn.Conv:
    pad = (kernel - 1) // 2
    return nn.Conv(
        features,
        (kernel, kernel),
        (stride, stride),
        padding=[(pad, pad), (pad, pad)],
        use_bias=False,
        kernel_init=_conv_init,
        dtype=dtype,
        name=name,
    )


def _tv_bn(name: str, train: bool, frozen: bool, eps: float, dtype) -> nn.BatchNorm:
    return nn.BatchNorm(use_running_average=frozen or not train, momentum=0.9, epsilon=eps, dtype=dtype, name=name)


class TorchvisionBasicBlock(nn.Module):
    """torchvision BasicBlock: conv3x3-BN-ReLU, conv3x3-BN, + shortcut (conv1x1-BN), ReLU."""

    planes: int
    stride: int
    bn_eps: float = 1e-5
    frozen_bn: bool = False
    dtype: DTypeLike = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool):
        bn = functools.partial(_tv_bn, train=train, frozen=self.frozen_bn, eps=self.bn_eps, dtype=self.dtype)
        y = nn.relu(bn("bn1")(_tv_conv(self.planes, 3, self.stride, "conv1", self.dtype)(x)))
        y = bn("bn2")(_tv_conv(self.planes, 3, 1, "conv2", self.dtype)(y))
        shortcut = x
        if self.stride != 1 or x.shape[-1] != self.planes:
            shortcut = bn("downsample_1")(_tv_conv(self.planes, 1, self.stride, "downsample_0", self.dtype)(x))
        return nn.relu(y + shortcut)


class Bottleneck(nn.Module):
    """torchvision Bottleneck (v1.5): conv1x1-BN-ReLU, conv3x3(stride)-BN-ReLU, conv1x1(4x)-BN,
    + shortcut (conv1x1(stride)-BN, no ReLU), ReLU after the addition."""

    planes: int
    stride: int
    bn_eps: float = 1e-5
    frozen_bn: bool = False
    dtype: DTypeLike = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool):
        out = self.planes * BOTTLENECK_EXPANSION
        bn = functools.partial(_tv_bn, train=train, frozen=self.frozen_bn, eps=self.bn_eps, dtype=self.dtype)
        y = nn.relu(bn("bn1")(_tv_conv(self.planes, 1, 1, "conv1", self.dtype)(x)))
        y = nn.relu(bn("bn2")(_tv_conv(self.planes, 3, self.stride, "conv2", self.dtype)(y)))
        y = bn("bn3")(_tv_conv(out, 1, 1, "conv3", self.dtype)(y))
        shortcut = x
        if self.stride != 1 or x.shape[-1] != out:
            shortcut = bn("downsample_1")(_tv_conv(out, 1, self.stride, "downsample_0", self.dtype)(x))
        return nn.relu(y + shortcut)


class TorchvisionResNet(nn.Module):
    """torchvision ResNet body -> global average pool -> Linear(embed_dim) named ``embedding``.

    ``block="bottleneck"`` with ``stage_sizes=(3, 4, 6, 3)`` is ResNet-50 (2048-d pooled features).
    Module names follow torchvision (``conv1``, ``bn1``, ``layer{i}_{b}``) for weight import.
    ``embed_dim=0`` returns the pooled features (timm's pre-logits), as the fixture tests compare.

    ``train_blocks`` = k (``model.train_blocks``; None: all) counts *stages* (torchvision's ``layer1`` to
    ``layer4``): the last k stages, ``embedding`` and the head train; the stem and the first stages are
    the frozen trunk, whose BatchNorms always use their running statistics (they are part of what is
    frozen). ``part`` cuts the network there, as ``VisionTransformer``'s: the trunk gives the feature map
    after stage 4 - k (k = 0: the pooled features).
    """

    stage_sizes: Sequence[int] = (3, 4, 6, 3)
    block: str = "bottleneck"  # "bottleneck" or "basic"
    width: int = 64
    embed_dim: int = 128
    bn_eps: float = 1e-5
    frozen_bn: bool = False
    dtype: DTypeLike = jnp.float32
    train_blocks: int | None = None
    part: str = "full"  # "full" | "trunk" | "top"

    @nn.compact
    def __call__(self, x, train: bool):
        if self.block not in ("bottleneck", "basic"):
            raise ValueError(f"block={self.block!r}: use 'bottleneck' or 'basic'.")
        stages = len(self.stage_sizes)
        k = stages if self.train_blocks is None else self.train_blocks
        trunk_train = train and self.train_blocks is None  # a frozen trunk's BatchNorms: running statistics
        if self.part != "top":
            x = x.astype(self.dtype)
            x = _tv_conv(self.width, 7, 2, "conv1", self.dtype)(x)
            x = nn.relu(_tv_bn("bn1", trunk_train, self.frozen_bn, self.bn_eps, self.dtype)(x))
            # flax leaves max_pool unannotated, so pyright takes padding for a str (its default); pairs work
            x = nn.max_pool(x, (3, 3), (2, 2), padding=[(1, 1), (1, 1)])  # pyright: ignore[reportArgumentType]
            x = self._stages(x, range(stages - k), trunk_train)
            if k == 0:
                x = global_average_pool(x)
            if self.part == "trunk":
                return x
            if self.train_blocks is not None:
                x = jax.lax.stop_gradient(x)
        x = self._stages(x, range(stages - k, stages), train)
        if k:
            x = global_average_pool(x)
        if not self.embed_dim:
            return x
        return embedding(x, self.embed_dim)

    def _stages(self, x, stages, train: bool):
        cls = Bottleneck if self.block == "bottleneck" else TorchvisionBasicBlock
        for i in stages:
            for b in range(self.stage_sizes[i]):
                stride = 2 if (i > 0 and b == 0) else 1
                x = cls(
                    self.width * 2**i,
                    stride,
                    bn_eps=self.bn_eps,
                    frozen_bn=self.frozen_bn,
                    dtype=self.dtype,
                    name=f"layer{i + 1}_{b}",
                )(x, train)
        return x

    def frozen_names(self) -> set[str]:
        """The top-level parameter names of the frozen trunk (``train_blocks`` set)."""
        assert self.train_blocks is not None
        stages = len(self.stage_sizes) - self.train_blocks
        return {"conv1", "bn1"} | {f"layer{i + 1}_{b}" for i in range(stages) for b in range(self.stage_sizes[i])}
