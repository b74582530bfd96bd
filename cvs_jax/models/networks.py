"""Model zoo: ResNet, ViT and EfficientNet-Lite embedding networks and the growing cosine head."""

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
from flax import traverse_util

from cvs_jax.errors import ConfigError
from cvs_jax.models.efficientnet import LITE_ARCHITECTURES, EfficientNetLite
from cvs_jax.models.heads import CosineHead, grow_head, init_head, net_variables
from cvs_jax.models.pretrained import merge_pretrained
from cvs_jax.models.resnet import ARCHITECTURES, Bottleneck, ResNetEmbedding, TorchvisionResNet
from cvs_jax.models.vit import VIT_ARCHITECTURES, VisionTransformer
from cvs_jax.models.weight_packages import resolve

LAYOUTS = ("cifar", "imagenet", "torchvision")


def build_model(
    name: str,
    *,
    width: int,
    layout: str,
    embed_dim: int,
    dtype="float32",
    frozen_bn: bool = False,
    bn_eps: float | None = None,
    train_blocks: int | None = None,
    part: str = "full",
):
    """The embedding network ``name`` in ``layout``.

    * ``cifar`` / ``imagenet``: the official CIFAR / Tiny-ImageNet ResNets (``ResNetEmbedding``,
      BN eps 1e-6, basic blocks only).
    * ``torchvision``: ``TorchvisionResNet`` (torchvision block layout, BN eps ``bn_eps`` or 1e-5),
      the layout that ImageNet-pretrained weights (``models.pretrained``) load into.
    ``frozen_bn``: every BN uses its running statistics, also when ``train=True``.
    ``train_blocks`` / ``part``: a frozen trunk and its cut (``TorchvisionResNet``, ``VisionTransformer``).
    """
    if name in VIT_ARCHITECTURES:
        return VisionTransformer(
            VIT_ARCHITECTURES[name], embed_dim=embed_dim, dtype=dtype, train_blocks=train_blocks, part=part
        )
    if name in LITE_ARCHITECTURES:  # BatchNorms on running statistics unless frozen_bn=False and all train
        return EfficientNetLite(
            LITE_ARCHITECTURES[name],
            embed_dim=embed_dim,
            dtype=dtype,
            frozen_bn=frozen_bn,
            train_blocks=train_blocks,
            part=part,
        )
    if name not in ARCHITECTURES:
        known = sorted(ARCHITECTURES) + sorted(VIT_ARCHITECTURES) + sorted(LITE_ARCHITECTURES)
        raise ConfigError(
            f"model.name={name!r} is unknown; choose one of {known}, or 'vit' (the ViT model.pretrained holds)."
        )
    if layout not in LAYOUTS:
        raise ConfigError(f"model.layout={layout!r}: use one of {LAYOUTS}.")
    arch = dict(ARCHITECTURES[name])
    block = arch.pop("block", "basic")
    if layout == "torchvision":
        return TorchvisionResNet(
            block=block,
            width=width,
            embed_dim=embed_dim,
            dtype=dtype,
            frozen_bn=frozen_bn,
            bn_eps=1e-5 if bn_eps is None else bn_eps,
            train_blocks=train_blocks,
            part=part,
            **arch,
        )
    if train_blocks is not None:
        raise ConfigError(
            f"model.train_blocks freezes pretrained stages: use model.layout='torchvision', not {layout!r}."
        )
    if block != "basic":
        raise ConfigError(f"model.name={name!r} has {block} blocks, which exist only in model.layout='torchvision'.")
    if bn_eps is not None and bn_eps != 1e-6:
        raise ConfigError(
            f"bn_eps={bn_eps}: the {layout!r} layout uses the official eps 1e-6; "
            f"other values need model.layout='torchvision'."
        )
    return ResNetEmbedding(width=width, layout=layout, embed_dim=embed_dim, dtype=dtype, frozen_bn=frozen_bn, **arch)


def from_config(config, part: str = "full"):
    """The run's embedding network, from ``config.model`` (one place for every entry point). A named
    architecture needs no weight file; ``model.name='vit'`` reads the whole ViT from ``model.pretrained``
    (every time the network is built, search and export included). ``part``: the frozen ``"trunk"`` or
    the trained ``"top"`` of a network with ``model.train_blocks`` set."""
    m = config.model
    k = train_blocks(config)
    if m.name == "vit":
        from cvs_jax.models.backbones import check_pretrained  # pylint: disable=g-import-not-at-top

        found = check_pretrained(config)
        assert found is not None and found.vit is not None  # model.name='vit' needs model.pretrained, a ViT file
        spec = dataclasses.replace(found.vit, grid=None)
        return VisionTransformer(spec, embed_dim=m.embed_dim, dtype=m.dtype, train_blocks=k, part=part)
    return build_model(
        m.name,
        width=m.width,
        layout=m.layout,
        embed_dim=m.embed_dim,
        dtype=m.dtype,
        frozen_bn=m.frozen_bn,
        train_blocks=k,
        part=part,
    )


def train_blocks(config) -> int | None:
    """``model.train_blocks`` as the network takes it: None for "all", else the trained blocks k."""
    k = config.model.train_blocks
    return None if k == "all" else int(k)


def frozen_mask(model, params) -> dict:
    """``"frozen"`` / ``"train"`` for every leaf of the run's ``params`` (``{"net", head, extras}``): the
    labels of the optimizer that leaves the trunk untouched (``train_step.make_optimizer``)."""
    frozen = model.frozen_names() if getattr(model, "train_blocks", None) is not None else ()

    def label(path, _):
        top = path[1].key if len(path) > 1 and path[0].key == "net" else None
        return "frozen" if top in frozen else "train"

    return jax.tree_util.tree_map_with_path(label, params)


# On the CPU, XLA's backend optimisation level 1, not its default: the program is mostly threefry hashes (one per
# weight array), which LLVM's default pipeline takes ~1.3 s of CPU each to compile: ResNet-18 width 4's program
# took 27 s of CPU to compile, 5 s at level 1, ResNet-50 27 -> 10 s, EfficientNet-Lite0 18 -> 11 s, ViT-S 8 -> 6 s,
# with the same bits (float multiply-adds are still contracted at level 1; at level 0 they are not, and some
# weights move by 1 ulp). It runs once per run, so its speed does not matter (docs/testing.md). Other backends
# keep XLA's default: the bits at level 1 were checked on the CPU only. A level named in ``XLA_FLAGS`` wins (the test
# suite's 0, which compiles the tiny network's program in 1.8 s of CPU instead of 2.8: tests compare runs of the
# same suite, so the different bits change no verdict; cvs_jax/testing/xla_env.py).
INIT_COMPILER_OPTIONS = (
    {}
    if "--xla_backend_optimization_level" in os.environ.get("XLA_FLAGS", "")
    else {"xla_backend_optimization_level": 1}
)


def _draw(model, head, image_shape: tuple, num_classes: int, embed_dim: int, init_key, head_key):
    net = model.init(init_key, jnp.zeros((1,) + image_shape, jnp.float32), train=False)
    return net, head.init(head_key, num_classes, embed_dim)


_DRAW_ON_CPU = jax.jit(_draw, static_argnums=(0, 1, 2, 3, 4), compiler_options=INIT_COMPILER_OPTIONS)
_DRAW_ELSEWHERE = jax.jit(_draw, static_argnums=(0, 1, 2, 3, 4))


def _fresh(model, head, image_shape: tuple, num_classes: int, embed_dim: int, init_key, head_key):
    """Network and head drawn in one compiled program, kept per (model, head, shapes) for the process (a
    comparison initialises many runs): op by op, initialisation cost ~70 small ``jit`` compiles per
    process (0.6-2 s). The bits are the same (``resnet.unit_normal``; ``INIT_COMPILER_OPTIONS``)."""
    draw = _DRAW_ON_CPU if jax.default_backend() == "cpu" else _DRAW_ELSEWHERE
    return draw(model, head, image_shape, num_classes, embed_dim, init_key, head_key)


def _draw_part(model, head, image_shape: tuple, num_classes: int, embed_dim: int, paths: tuple, init_key, head_key):
    """``_draw``'s network leaves at ``paths`` (tuples of keys) and the head: XLA drops the draws of every other
    leaf, and each kept leaf has the bits of the whole draw (Flax derives a parameter's key from its path)."""
    net, arrays = _draw(model, head, image_shape, num_classes, embed_dim, init_key, head_key)
    flat = traverse_util.flatten_dict(net)
    return [flat[p] for p in paths], arrays


_DRAW_PART_ON_CPU = jax.jit(_draw_part, static_argnums=(0, 1, 2, 3, 4, 5), compiler_options=INIT_COMPILER_OPTIONS)
_DRAW_PART_ELSEWHERE = jax.jit(_draw_part, static_argnums=(0, 1, 2, 3, 4, 5))


def _pretrained_init(model, head, shape: tuple, sizes: tuple, image_shape, path: str, keys) -> tuple[dict, dict]:
    """A fresh pretrained network: the weight file's leaves, and drawn only the leaves it lacks (the new
    ``embedding``) with the head. Drawing all of EfficientNet-Lite0 to overwrite all but its last layer, the file's
    read included, took 2.5-2.6 s of CPU warm and 11-13 s on an empty compile cache (its program compiles every
    weight's hash); 1.2-1.5 and 1.9-2.1 s drawing only what the file lacks, with the same bits (2-core host;
    ``python benchmarks/pretrained_init.py --cold``; ``tests/models/test_pretrained_init.py``)."""
    template, _ = jax.eval_shape(functools.partial(_draw, model, head, shape, *sizes), *keys)
    weights = load_pretrained(model, path, image_shape)
    flat, given = traverse_util.flatten_dict(template), traverse_util.flatten_dict(weights)
    paths = tuple(p for p in flat if p not in given)
    draw = _DRAW_PART_ON_CPU if jax.default_backend() == "cpu" else _DRAW_PART_ELSEWHERE
    drawn, arrays = draw(model, head, shape, *sizes, paths, *keys)
    flat.update(zip(paths, drawn))
    # every other leaf from the file, or one clear error (a leaf the file lacks outside the new embedding)
    init = merge_pretrained(traverse_util.unflatten_dict(flat), weights)
    assert not any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(init)), "an undrawn leaf"
    return init, arrays


def init_variables(
    model, config, image_shape, num_classes: int, init_key, head_key, head=None, *, abstract: bool = False
) -> dict:
    """``{"params": {"net", <head's arrays>}, "batch_stats"}`` of a fresh run: the network (ImageNet
    weights merged in when ``model.pretrained`` names a file; then only the leaves the file lacks are drawn)
    and the head (``models.heads``; None: the cosine head) with a row for every class.  ``abstract``: the drawn
    leaves as their shapes and dtypes (``jax.eval_shape``: nothing compiled or run), the weight file's still read."""
    image_shape = input_shape(config, image_shape)
    head = CosineHead(config.train.temperature) if head is None else head
    shape = tuple(int(d) for d in image_shape)
    sizes = (int(num_classes), int(config.model.embed_dim))
    # a weight file is refused early by config_checks when absent or unfit
    path = None if config.model.pretrained is None else resolve(config.model.pretrained)
    if abstract:
        init, arrays = jax.eval_shape(functools.partial(_draw, model, head, shape, *sizes), init_key, head_key)
        if path is not None:
            init = merge_pretrained(init, load_pretrained(model, path, image_shape))
    elif path is not None:
        init, arrays = _pretrained_init(model, head, shape, sizes, image_shape, path, (init_key, head_key))
    else:
        init, arrays = _fresh(model, head, shape, *sizes, init_key, head_key)
    return {"params": {"net": init["params"], **arrays}, "batch_stats": init.get("batch_stats", {})}


def input_shape(config, image_shape) -> tuple[int, int, int]:
    """The network's input: the stored images, or their ``augment.size`` crops (``augment.crop="resized"``).
    A ViT's ``pos_embed`` is sized by it (a ResNet pools any size)."""
    if config.augment.crop == "resized" and config.augment.size:
        return (config.augment.size, config.augment.size, image_shape[-1])
    return tuple(image_shape)


def load_pretrained(model, path: str, image_shape) -> dict:
    """The variables a weight file gives ``model`` (all but its new ``embedding``): a ViT's, with
    ``pos_embed`` resampled to the input's patch grid, an EfficientNet-Lite's, or a torchvision/timm ResNet's."""
    from cvs_jax.models import backbones  # pylint: disable=g-import-not-at-top
    from cvs_jax.models.pretrained import load_torchvision_resnet  # pylint: disable=g-import-not-at-top

    if isinstance(model, EfficientNetLite):
        from cvs_jax.models.lite_weights import load_lite  # pylint: disable=g-import-not-at-top

        return load_lite(path, next(n for n, s in LITE_ARCHITECTURES.items() if s == model.spec))
    if isinstance(model, VisionTransformer):
        spec, variables = backbones.load_vit(path)
        grid = image_shape[0] // spec.patch
        pos = variables["params"]["pos_embed"]
        variables["params"]["pos_embed"] = backbones.resample_pos_embed(pos, spec, grid)
        return variables
    return load_torchvision_resnet(path, stage_sizes=model.stage_sizes, block=model.block, width=model.width)


__all__ = [
    "ARCHITECTURES",
    "Bottleneck",
    "LAYOUTS",
    "ResNetEmbedding",
    "TorchvisionResNet",
    "VIT_ARCHITECTURES",
    "VisionTransformer",
    "build_model",
    "from_config",
    "frozen_mask",
    "train_blocks",
    "init_variables",
    "input_shape",
    "load_pretrained",
    "net_variables",
    "grow_head",
    "init_head",
]
