"""Writes tests/fixtures/backbones/: reduced timm backbones with random weights, and timm's embeddings.

Run where torch and timm are installed (not part of the test suite; CI has no torch):

    python scripts/make_backbone_fixtures.py [OUT_DIR]

For each architecture it builds timm's own model class in a reduced size with the real key layout,
draws random weights (LayerScale gammas and norms too, so that they matter), rounds them to float16
(the file stores float16 to stay small; the reference runs in float32 on the rounded weights), and
saves ``<name>.safetensors`` plus ``<name>.npz`` with the input images (NCHW float32, already
normalised) and timm's pre-logits features (``forward_head(forward_features(x), pre_logits=True)``).
Also ``<name>_hf.safetensors``: the ViT fixtures renamed to Hugging Face transformers' layout by the
mapping written out below (transformers is not installed here, so that file checks our reading of the
layout, not transformers itself).

timm 1.0 imports torchvision at import time only for names it does not use here (FrozenBatchNorm2d,
transforms); where no torchvision wheel exists for the installed torch, an import stub stands in for
it (``_stub_torchvision``): any use of a stubbed name raises, so a reference cannot silently depend on it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import types

import numpy as np


def _stub_torchvision():
    try:
        import torchvision  # noqa: F401

        return False
    except ImportError:
        pass

    class _Meta(type):
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            sub = _Meta(name, (cls,), {})
            setattr(cls, name, sub)
            return sub

        def __call__(cls, *a, **k):
            raise RuntimeError("torchvision is stubbed here; this reference must not use it")

    class _Missing(metaclass=_Meta):
        pass

    def _getattr(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(_Missing, name)

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name == "torchvision" or name.startswith("torchvision."):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            m = types.ModuleType(spec.name)
            m.__path__ = []
            m.__getattr__ = _getattr
            return m

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, _Finder())
    return True


STUBBED = _stub_torchvision()
import safetensors.torch  # noqa: E402
import timm  # noqa: E402
import torch  # noqa: E402
from timm.models.resnet import Bottleneck, ResNet  # noqa: E402
from timm.models.vision_transformer import VisionTransformer  # noqa: E402


def _randomise(model, seed):
    """Random float16-representable weights, BN statistics included."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for k, t in model.state_dict().items():
            if not t.is_floating_point():
                continue
            if k.endswith("running_var"):
                v = torch.rand(t.shape, generator=g) * 1.5 + 0.5
            elif k.endswith(("norm1.weight", "norm2.weight", "norm.weight")) or (".bn" in k and k.endswith("weight")):
                v = torch.rand(t.shape, generator=g) * 0.5 + 0.75
            elif k.endswith("gamma"):
                v = torch.rand(t.shape, generator=g) * 0.5 + 0.25
            elif t.ndim >= 2 and k not in ("cls_token", "reg_token", "pos_embed"):
                fan_in = int(np.prod(t.shape[1:]))
                v = torch.randn(t.shape, generator=g) / fan_in**0.5
            else:
                v = torch.randn(t.shape, generator=g) * 0.1
            t.copy_(v.half().float())
    return model.eval()


def _hf_layout(sd, registers):
    """timm ViT keys -> transformers' (ViTModel without registers, Dinov2WithRegistersModel with)."""
    out = {}
    for k, v in sd.items():
        if k.startswith("head."):
            continue
        if k.startswith("blocks."):
            _, i, rest = k.split(".", 2)
            p = f"encoder.layer.{i}."
            if rest.startswith("attn.qkv."):
                leaf = rest.rsplit(".", 1)[1]
                for name, part in zip(("query", "key", "value"), v.chunk(3, dim=0)):
                    out[f"{p}attention.attention.{name}.{leaf}"] = part.contiguous()
                continue
            dinov2 = any(".ls1." in key for key in sd)  # Dinov2Model names; else ViTModel's
            hf = {
                "norm1": "norm1" if dinov2 else "layernorm_before",
                "norm2": "norm2" if dinov2 else "layernorm_after",
                "attn.proj": "attention.output.dense",
                "mlp.fc1": "mlp.fc1" if dinov2 else "intermediate.dense",
                "mlp.fc2": "mlp.fc2" if dinov2 else "output.dense",
            }
            if rest == "ls1.gamma":
                out[f"{p}layer_scale1.lambda1"] = v
                continue
            if rest == "ls2.gamma":
                out[f"{p}layer_scale2.lambda1"] = v
                continue
            mod, leaf = rest.rsplit(".", 1)
            out[f"{p}{hf[mod]}.{leaf}"] = v
            continue
        top = {
            "cls_token": "embeddings.cls_token",
            "reg_token": "embeddings.register_tokens",
            "pos_embed": "embeddings.position_embeddings",
            "patch_embed.proj.weight": "embeddings.patch_embeddings.projection.weight",
            "patch_embed.proj.bias": "embeddings.patch_embeddings.projection.bias",
            "norm.weight": "layernorm.weight",
            "norm.bias": "layernorm.bias",
        }
        out[top[k]] = v
    if registers:  # transformers adds the class token's position to it; timm folded it into cls_token
        d = v.shape[-1]
        cls_pos = torch.zeros(1, 1, d)
        out["embeddings.position_embeddings"] = torch.cat([cls_pos, out["embeddings.position_embeddings"]], dim=1)
    out["embeddings.mask_token"] = torch.zeros(1, out["embeddings.cls_token"].shape[-1])
    layer_scale = any(".ls1." in k for k in sd)
    return {("dinov2." if layer_scale else "vit.") + k: t for k, t in out.items()}


def _images(n, size, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, size, size, generator=g).half().float()  # stored as float16


def _save(out, name, model, x, extra=None, hf_registers=None, timm_file=True):
    sd = {k: v.half().contiguous() for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    if timm_file:
        safetensors.torch.save_file(sd, os.path.join(out, f"{name}.safetensors"))
    with torch.no_grad():
        feat = model.forward_head(model.forward_features(x), pre_logits=True)
    arrays = {"images": x.half().numpy(), "features": feat.numpy()}
    for k, v in (extra or {}).items():
        arrays[k] = v.astype(np.float16) if k.startswith("images") else v
    np.savez_compressed(os.path.join(out, f"{name}.npz"), **arrays)
    if hf_registers is not None:
        hf = _hf_layout({k: v for k, v in sd.items()}, hf_registers)
        safetensors.torch.save_file(hf, os.path.join(out, f"{name}_hf.safetensors"))
    print(name, tuple(feat.shape), f"{sum(v.numel() for v in sd.values())} weights")


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    # ViT-S/B/16 layout (timm vit_*_patch16_224): class token in pos_embed, no LayerScale; 2 heads of 64
    vit = _randomise(
        VisionTransformer(
            img_size=48, patch_size=16, embed_dim=128, depth=2, num_heads=2, mlp_ratio=1.0, num_classes=10
        ),
        1,
    )
    _save(out, "vit_patch16", vit, _images(3, 48, 11))
    # the same layout, smaller (1 head), only in transformers' ViTModel layout
    vit_hf = _randomise(
        VisionTransformer(img_size=32, patch_size=16, embed_dim=64, depth=2, num_heads=1, mlp_ratio=2.0, num_classes=0),
        5,
    )
    _save(out, "vit_patch16_small", vit_hf, _images(2, 32, 16), hf_registers=0, timm_file=False)
    # DINOv2 ViT-S/B/14 with registers (timm vit_*_patch14_reg4_dinov2): LayerScale, no_embed_class
    dino_args = dict(
        img_size=42,
        patch_size=14,
        embed_dim=128,
        depth=2,
        num_heads=2,
        mlp_ratio=1.0,
        init_values=1e-5,
        reg_tokens=2,
        no_embed_class=True,
        num_classes=0,
    )
    dino = _randomise(VisionTransformer(**dino_args), 2)
    # the same weights on a 56x56 input (grid 4 instead of 3): timm resamples pos_embed itself
    dyn = VisionTransformer(**dino_args, dynamic_img_size=True)
    dyn.load_state_dict(dino.state_dict())
    dyn.eval()
    x56 = _images(2, 56, 13)
    with torch.no_grad():
        f56 = dyn.forward_head(dyn.forward_features(x56), pre_logits=True)
    _save(
        out,
        "dinov2_reg_patch14",
        dino,
        _images(3, 42, 12),
        extra={"images_56": x56.numpy(), "features_56": f56.numpy()},
        hf_registers=2,
    )
    # DINOv2 without registers (timm vit_*_patch14_dinov2): LayerScale, class token in pos_embed
    dino0 = _randomise(
        VisionTransformer(
            img_size=28,
            patch_size=14,
            embed_dim=64,
            depth=2,
            num_heads=1,
            mlp_ratio=2.0,
            init_values=1e-5,
            num_classes=0,
        ),
        3,
    )
    _save(out, "dinov2_patch14", dino0, _images(2, 28, 14), hf_registers=0)
    # ResNet-50 layout (timm resnet50 = torchvision key names): Bottleneck, reduced stages and widths
    # timm's plain stem is fixed at 64 channels (resnet.py: ``inplanes = ... else 64``); torchvision's, and
    # ours, is the base width. So the stem and layer1.0's two convs that read it are rebuilt at width 4.
    rn = ResNet(Bottleneck, layers=(1, 2, 1, 1), channels=(4, 8, 16, 32), num_classes=10)
    rn.conv1 = torch.nn.Conv2d(3, 4, kernel_size=7, stride=2, padding=3, bias=False)
    rn.bn1 = torch.nn.BatchNorm2d(4)
    rn.layer1[0].conv1 = torch.nn.Conv2d(4, 4, kernel_size=1, bias=False)
    rn.layer1[0].downsample[0] = torch.nn.Conv2d(4, 16, kernel_size=1, bias=False)
    rn = _randomise(rn, 4)
    _save(out, "resnet_bottleneck", rn, _images(3, 64, 15))
    with open(os.path.join(out, "VERSIONS.json"), "w") as f:
        json.dump(
            {
                "torch": torch.__version__,
                "timm": timm.__version__,
                "torchvision_stubbed": STUBBED,
                "numpy": np.__version__,
                "script": "scripts/make_backbone_fixtures.py",
            },
            f,
            indent=1,
        )
        f.write("\n")


if __name__ == "__main__":
    main(
        sys.argv[1]
        if len(sys.argv) > 1
        else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "backbones")
    )
