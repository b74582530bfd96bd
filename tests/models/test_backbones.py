"""Pretrained backbones against timm without torch: fixtures made by scripts/make_backbone_fixtures.py.

Each fixture is a reduced timm model (real key layout, random float16 weights) saved as safetensors with
input images and timm's pre-logits features; tests/fixtures/backbones/VERSIONS.json names the torch and
timm versions. Tolerance: max |ours - timm| < 1e-4 in float32 (features are O(1): the final LayerNorm's
output for a ViT, pooled post-ReLU maps for the ResNet).
"""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvs_jax.engine import config_checks
from cvs_jax.errors import ConfigError
from cvs_jax.models import backbones
from cvs_jax.models.networks import from_config as model_from_config
from cvs_jax.models.networks import init_variables
from cvs_jax.models.pretrained import load_torchvision_resnet
from cvs_jax.models.resnet import TorchvisionResNet
from cvs_jax.models.vit import VisionTransformer
from cvs_jax.testing.image_folders import backbone_config

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "backbones")
TOL = 1e-4


def _fixture(name):
    with np.load(os.path.join(FIXTURES, f"{name}.npz")) as z:
        return {k: np.asarray(z[k], np.float32) for k in z.files}


def _nhwc(x):
    return jnp.asarray(x.transpose(0, 2, 3, 1))


def _vit_features(path, images, grid=None):
    spec, variables = backbones.load_vit(path)
    model = VisionTransformer(dataclasses.replace(spec, grid=None), embed_dim=0)
    if grid is not None:
        variables["params"]["pos_embed"] = backbones.resample_pos_embed(variables["params"]["pos_embed"], spec, grid)
    return spec, np.asarray(jax.jit(lambda v, x: model.apply(v, x))(variables, _nhwc(images)))


def test_fixtures_are_small_and_versioned():
    total = sum(os.path.getsize(os.path.join(FIXTURES, f)) for f in os.listdir(FIXTURES))
    assert total < 3 * 2**20
    versions = json.load(open(os.path.join(FIXTURES, "VERSIONS.json")))
    assert versions["torch"] and versions["timm"]


@pytest.mark.parametrize(
    "name,file,want",
    [
        # ViT-S/B/16 layout: class token inside pos_embed, no LayerScale, 2 heads of 64
        ("vit_patch16", "vit_patch16.safetensors", dict(patch=16, registers=0, layer_scale=False, grid=3)),
        # DINOv2 with registers: LayerScale, timm's no_embed_class pos_embed
        (
            "dinov2_reg_patch14",
            "dinov2_reg_patch14.safetensors",
            dict(patch=14, registers=2, layer_scale=True, no_embed_class=True, grid=3),
        ),
        ("dinov2_reg_patch14", "dinov2_reg_patch14_hf.safetensors", dict(patch=14, registers=2, no_embed_class=True)),
        # DINOv2 without registers: class token inside pos_embed
        ("dinov2_patch14", "dinov2_patch14.safetensors", dict(patch=14, registers=0, layer_scale=True, grid=2)),
        ("dinov2_patch14", "dinov2_patch14_hf.safetensors", dict(patch=14, layer_scale=True, eps=1e-6)),
        # transformers' ViTModel layout (separate query/key/value, layernorm_before/after, eps 1e-12)
        ("vit_patch16_small", "vit_patch16_small_hf.safetensors", dict(patch=16, layer_scale=False, eps=1e-12)),
    ],
)
def test_vit_matches_timm(name, file, want):
    fx = _fixture(name)
    path = os.path.join(FIXTURES, file)
    spec, ours = _vit_features(path, fx["images"])
    for k, v in want.items():
        assert getattr(spec, k) == v, (k, spec)
    assert backbones.identify(path).vit == spec  # the header alone says the same
    assert ours.shape == fx["features"].shape
    assert np.abs(ours - fx["features"]).max() < TOL


def test_dinov2_pos_embed_resampled_as_timm():
    """The file's 3x3 grid on 56x56 inputs (grid 4): timm's dynamic_img_size resampling (bicubic, antialias)."""
    fx = _fixture("dinov2_reg_patch14")
    _, ours = _vit_features(os.path.join(FIXTURES, "dinov2_reg_patch14.safetensors"), fx["images_56"], grid=4)
    assert np.abs(ours - fx["features_56"]).max() < TOL


def test_resnet_bottleneck_matches_timm():
    """timm's ResNet (Bottleneck, torchvision key names) from safetensors, reduced stages and widths."""
    fx = _fixture("resnet_bottleneck")
    path = os.path.join(FIXTURES, "resnet_bottleneck.safetensors")
    found = backbones.identify(path)
    assert found.family == "resnet" and found.resnet == ((1, 2, 1, 1), "bottleneck", 4)
    sizes, block, width = found.resnet
    variables = load_torchvision_resnet(path, stage_sizes=sizes, block=block, width=width)
    model = TorchvisionResNet(stage_sizes=sizes, block=block, width=width, embed_dim=0)
    ours = np.asarray(jax.jit(lambda v, x: model.apply(v, x, train=False))(variables, _nhwc(fx["images"])))
    assert ours.shape == fx["features"].shape == (3, 128)
    assert np.abs(ours - fx["features"]).max() < TOL


def test_preprocessing_specs():
    """Each backbone's evaluation transform, as its weights' source publishes it."""
    imagenet = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    for name in ("vit_small_patch16", "vit_base_patch16"):  # timm augreg: Inception mean/std, crop_pct 0.9
        p = backbones.preprocessing(name)
        assert (p.crop, p.resize, p.patch, p.interpolation) == (224, 248, 16, "bicubic")
        assert (p.mean, p.std) == ((0.5,) * 3, (0.5,) * 3)
    for name in ("vit_small_patch14_dinov2", "vit_base_patch14_dinov2"):  # DINOv2: 518 = 37 patches of 14
        p = backbones.preprocessing(name)
        assert (p.crop, p.resize, p.patch, (p.mean, p.std)) == (518, 518, 14, imagenet)
        assert p.crop % p.patch == 0
    p = backbones.preprocessing("resnet50")  # torchvision IMAGENET1K_V1
    assert (p.crop, p.resize, p.patch, p.interpolation, (p.mean, p.std)) == (224, 256, 0, "bilinear", imagenet)
    with pytest.raises(ConfigError, match="no preprocessing"):
        backbones.preprocessing("resnet18")


def test_vit_from_config_takes_the_file_and_resamples(tmp_path):
    """model.name='vit': the architecture from the file's keys; pos_embed resampled to the input's grid."""
    path = os.path.join(FIXTURES, "dinov2_reg_patch14.safetensors")
    config = backbone_config("vit", path, embed_dim=16)
    config.augment.size = 56  # crops of 56 = 4x4 patches; the file's grid is 3x3
    model = model_from_config(config)
    assert isinstance(model, VisionTransformer) and model.spec.registers == 2 and model.spec.grid is None
    variables = init_variables(model, config, (64, 64, 3), 5, jax.random.key(0), jax.random.key(1))
    assert variables["batch_stats"] == {}
    assert variables["params"]["net"]["pos_embed"].shape == (1, 16, 128)
    emb = model.apply({"params": variables["params"]["net"]}, jnp.zeros((2, 56, 56, 3)))
    assert emb.shape == (2, 16)


@pytest.mark.parametrize(
    "name,file,message",
    [
        (
            "vit_small_patch16",
            "absent.safetensors",
            "does not exist; model.name='vit_small_patch16' expects a ViT depth 12, width 384, patch 16",
        ),
        (
            "vit_small_patch16",
            "vit_patch16.safetensors",
            "holds a ViT depth 2, width 128, patch 16, but model.name='vit_small_patch16' expects",
        ),
        (
            "vit_base_patch14_dinov2",
            "resnet_bottleneck.safetensors",
            "holds a ResNet stages (1, 2, 1, 1), bottleneck blocks, width 4",
        ),
        (
            "resnet50",
            "dinov2_patch14.safetensors",
            "holds a ViT depth 2, width 64, patch 14, LayerScale, but model.name='resnet50' expects a ResNet",
        ),
        ("vit", "VERSIONS.json", "VERSIONS.json' is not a weight file"),
    ],
)
def test_wrong_or_missing_file_is_one_line(name, file, message):
    config = backbone_config(name, os.path.join(FIXTURES, file))
    with pytest.raises(ConfigError) as e:
        backbones.check_pretrained(config)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_refused_by_config_checks_before_any_work(tmp_path):
    config = backbone_config("vit_base_patch16", os.path.join(FIXTURES, "vit_patch16.safetensors"))
    config.data.manual_dir = str(tmp_path)
    with pytest.raises(ConfigError, match="holds a ViT depth 2"):
        config_checks.check(config, num_devices=1)


def test_a_named_vit_needs_no_file():
    """search and export rebuild a trained run's network from its config, after the weight file may be gone."""
    model = model_from_config(backbone_config("vit_small_patch14_reg4_dinov2", None))
    assert (model.spec.registers, model.spec.no_embed_class, model.spec.patch, model.spec.width) == (4, True, 14, 384)
    with pytest.raises(ConfigError, match="model.name='vit' takes its architecture from model.pretrained"):
        backbones.check_pretrained(backbone_config("vit", None))


def test_input_side_must_be_whole_patches():
    config = backbone_config("vit_small_patch14_dinov2", None)
    config.augment.size = 64
    with pytest.raises(ConfigError, match="augment.size=64 is not a multiple of the ViT's patch 14.*use 56 or 70"):
        backbones.check_pretrained(config)
    config.augment.size = 224
    assert backbones.check_pretrained(config) is None
