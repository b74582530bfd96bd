"""Vision Transformers (ViT-S/B/16, DINOv2 ViT-S/B/14) whose parameters load from timm's state dicts.

The forward pass is timm's ``VisionTransformer`` (timm/models/vision_transformer.py, timm 1.0):
  * patch embedding: a PxP conv with stride P and bias (``patch_embed.proj``), tokens in row-major order;
  * prefix tokens: ``cls_token`` then ``reg_token`` (DINOv2 "register" tokens, Darcet et al., "Vision
    Transformers Need Registers", ICLR 2024); ``pos_embed`` covers the prefix tokens too, unless the file was
    saved with ``no_embed_class`` (timm's DINOv2-with-registers files: the class token's position is folded
    into ``cls_token`` and the registers get none), which is read from ``pos_embed``'s length;
  * pre-norm blocks ``x + ls1(attn(norm1(x)))``, ``x + ls2(mlp(norm2(x)))``: LayerNorm eps 1e-6, fused
    ``qkv`` projection, softmax attention scaled by head_dim**-0.5, exact (erf) GELU MLP, and LayerScale
    ``ls1/ls2.gamma`` (per-channel scales) where the file has them (DINOv2: Oquab et al. 2023, section 4);
  * a final LayerNorm ``norm``; the image's feature is the class token (timm's ``global_pool="token"``,
    ``forward_head(pre_logits=True)``), which a new ``embedding`` Dense projects to ``embed_dim``.
Head dim is 64 in every ViT-S/B and DINOv2 model, so the head count is width / 64 (it is not in the keys).
LayerNorm eps is timm's 1e-6 for the named architectures, also for transformers' ViTModel files (which use
1e-12: 3e-5 apart on the fixture, tests/models/test_backbones.py); ``model.name='vit'`` takes the file's.
Module names mirror the keys (``blocks.3.attn.qkv.weight`` -> ``blocks_3/attn/qkv/kernel``) so that
``pretrained.convert_vit_state_dict`` is a rename plus a transpose. No dropout or stochastic depth:
the pretrained backbone is used for embeddings and fine-tuned gently.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from cvs_jax.models.resnet import _torch_linear_init, normal_init

HEAD_DIM = 64


@dataclasses.dataclass(frozen=True)
class ViTSpec:
    """What a ViT state dict fixes (read from its keys and shapes by ``pretrained.vit_spec``)."""

    width: int
    depth: int
    patch: int
    mlp_dim: int
    registers: int = 0
    layer_scale: bool = False
    no_embed_class: bool = False
    grid: int | None = None  # side of the pos_embed grid stored in the file (None: from the input size)
    head_dim: int = HEAD_DIM
    eps: float = 1e-6

    def describe(self) -> str:
        reg = f", {self.registers} registers" if self.registers else ""
        ls = ", LayerScale" if self.layer_scale else ""
        return f"ViT depth {self.depth}, width {self.width}, patch {self.patch}{reg}{ls}"


# Named architectures (timm's model names without the pretraining tag): the name fixes the network, so
# a trained run is rebuilt (search, export, update) without the weight file; a file that differs is
# refused. The stored pos_embed grid comes from the file (resampled at load).
_S: dict[str, Any] = dict(width=384, mlp_dim=1536)
_B: dict[str, Any] = dict(width=768, mlp_dim=3072)
_REG4: dict[str, Any] = dict(registers=4, no_embed_class=True)  # timm's *_reg4_dinov2 (Darcet et al. 2024)
VIT_ARCHITECTURES = {
    "vit_small_patch16": ViTSpec(depth=12, patch=16, **_S),
    "vit_base_patch16": ViTSpec(depth=12, patch=16, **_B),
    "vit_small_patch14_dinov2": ViTSpec(depth=12, patch=14, layer_scale=True, **_S),
    "vit_base_patch14_dinov2": ViTSpec(depth=12, patch=14, layer_scale=True, **_B),
    "vit_small_patch14_reg4_dinov2": ViTSpec(depth=12, patch=14, layer_scale=True, **_S, **_REG4),
    "vit_base_patch14_reg4_dinov2": ViTSpec(depth=12, patch=14, layer_scale=True, **_B, **_REG4),
}


class LayerScale(nn.Module):
    """timm's ``LayerScale``: x * gamma (per channel)."""

    @nn.compact
    def __call__(self, x):
        gamma = self.param("gamma", nn.initializers.constant(1e-5), (x.shape[-1],), jnp.float32)
        return x * gamma.astype(x.dtype)


class Attention(nn.Module):
    width: int
    heads: int
    dtype: DTypeLike = jnp.float32

    @nn.compact
    def __call__(self, x):
        b, n, _ = x.shape
        qkv = nn.Dense(3 * self.width, dtype=self.dtype, name="qkv")(x)
        # timm: qkv.reshape(B, N, 3, heads, head_dim)
        q, k, v = jnp.moveaxis(qkv.reshape(b, n, 3, self.heads, self.width // self.heads), 2, 0)
        scale = (self.width // self.heads) ** -0.5
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) * scale
        attn = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", attn, v).reshape(b, n, self.width)
        return nn.Dense(self.width, dtype=self.dtype, name="proj")(out)


class Mlp(nn.Module):
    hidden: int
    width: int
    dtype: DTypeLike = jnp.float32

    @nn.compact
    def __call__(self, x):
        x = nn.Dense(self.hidden, dtype=self.dtype, name="fc1")(x)
        x = jax.nn.gelu(x, approximate=False)  # torch nn.GELU() default: exact erf
        return nn.Dense(self.width, dtype=self.dtype, name="fc2")(x)


class Block(nn.Module):
    spec: ViTSpec
    dtype: DTypeLike = jnp.float32

    @nn.compact
    def __call__(self, x):
        s = self.spec
        ls = (lambda n: LayerScale(name=n)) if s.layer_scale else (lambda n: lambda y: y)
        y = nn.LayerNorm(s.eps, dtype=jnp.float32, name="norm1")(x)
        x = x + ls("ls1")(Attention(s.width, s.width // s.head_dim, self.dtype, name="attn")(y))
        y = nn.LayerNorm(s.eps, dtype=jnp.float32, name="norm2")(x)
        return x + ls("ls2")(Mlp(s.mlp_dim, s.width, self.dtype, name="mlp")(y))


class VisionTransformer(nn.Module):
    """timm-layout ViT -> class token after the final norm -> Dense(embed_dim) named ``embedding``.

    ``embed_dim=0`` returns the class-token feature itself (timm's pre-logits), as the fixture tests compare.
    ``train`` is accepted for the trainer's interface; nothing depends on it (no BatchNorm, no dropout).

    ``train_blocks`` (``model.train_blocks``; None: all): only the last k transformer blocks, the final
    norm (k >= 1) and ``embedding`` train; the patch embedding, tokens, ``pos_embed`` and the first
    depth - k blocks are the frozen *trunk* (``frozen_names``). The gradient stops at the split, so the
    trunk costs no backward pass. ``part`` cuts the network there with the same parameter names:
    ``"trunk"`` gives what the feature cache stores (the tokens after block depth - k, or the normed
    class token when k = 0), ``"top"`` takes that and gives the embedding; ``top(trunk(x)) == full(x)``.
    """

    spec: ViTSpec
    embed_dim: int = 128
    dtype: DTypeLike = jnp.float32
    train_blocks: int | None = None
    part: str = "full"  # "full" | "trunk" | "top"

    @nn.compact
    def __call__(self, x, train: bool = False):
        s = self.spec
        k = s.depth if self.train_blocks is None else self.train_blocks
        if self.part != "top":
            x = self._embed_tokens(x)
            for i in range(s.depth - k):
                x = Block(s, self.dtype, name=f"blocks_{i}")(x)
            if k == 0:
                x = nn.LayerNorm(s.eps, dtype=jnp.float32, name="norm")(x)[:, 0]
            if self.part == "trunk":
                return x
            if self.train_blocks is not None:
                x = jax.lax.stop_gradient(x)
        for i in range(s.depth - k, s.depth):
            x = Block(s, self.dtype, name=f"blocks_{i}")(x)
        feat = nn.LayerNorm(s.eps, dtype=jnp.float32, name="norm")(x)[:, 0] if k else x
        if not self.embed_dim:
            return feat
        return nn.Dense(
            self.embed_dim,
            kernel_init=_torch_linear_init(s.width),
            bias_init=_torch_linear_init(s.width),
            name="embedding",
        )(feat)

    def frozen_names(self) -> set[str]:
        """The top-level parameter names of the frozen trunk (``train_blocks`` set)."""
        assert self.train_blocks is not None
        return frozen_names(self.spec, self.train_blocks)

    def _embed_tokens(self, x):
        """Patch embedding, class (and register) tokens, positions: [B, H, W, C] -> [B, tokens, width]."""
        s = self.spec
        x = nn.Conv(
            s.width, (s.patch, s.patch), (s.patch, s.patch), padding="VALID", dtype=self.dtype, name="patch_embed_proj"
        )(x.astype(self.dtype))
        b, gh, gw, _ = x.shape
        x = x.reshape(b, gh * gw, s.width).astype(jnp.float32)
        init = normal_init(0.02)
        prefix = [jnp.broadcast_to(self.param("cls_token", init, (1, 1, s.width)), (b, 1, s.width))]
        if s.registers:
            prefix.append(
                jnp.broadcast_to(self.param("reg_token", init, (1, s.registers, s.width)), (b, s.registers, s.width))
            )
        n_pos = gh * gw + (0 if s.no_embed_class else 1 + s.registers)
        pos = self.param("pos_embed", init, (1, n_pos, s.width))
        if s.no_embed_class:
            return jnp.concatenate(prefix + [x + pos], axis=1)
        return jnp.concatenate(prefix + [x], axis=1) + pos


def frozen_names(spec: ViTSpec, train_blocks: int) -> set[str]:
    """The top-level parameter names of ``VisionTransformer``'s frozen trunk at ``train_blocks`` = k."""
    names = {"patch_embed_proj", "cls_token", "reg_token", "pos_embed"}
    names |= {f"blocks_{i}" for i in range(spec.depth - train_blocks)}
    return names | ({"norm"} if train_blocks == 0 else set())
