"""ImageNet-pretrained torchvision ResNet weights -> ``TorchvisionResNet`` variables (no torch needed).

The official fine-grained code uses ``pretrainedmodels``' ResNet-50, which is torchvision's
ResNet-50 with the ImageNet weights ``resnet50-19c8e357.pth`` (= torchvision ``IMAGENET1K_V1``,
also published as ``resnet50-0676ba61.pth``) and ``fc`` renamed ``last_linear``.

Usage (the trainer)::

    model = build_model("resnet50", width=64, layout="torchvision", embed_dim=128, frozen_bn=True)
    variables = model.init(key, dummy, train=False)
    variables = merge_pretrained(variables, load_torchvision_resnet50(path))

Inputs must then be RGB, NHWC, scaled to [0, 1] and normalised with the ImageNet statistics
(mean 0.485, 0.456, 0.406; std 0.229, 0.224, 0.225), as for the torchvision weights.

The weights are read from a ``.safetensors`` file (timm's and Hugging Face's format, read with
``safetensors.numpy``: no torch), a ``.npz`` of the torchvision state dict (keys ``conv1.weight``,
``bn1.running_mean``, ``layer1.0.conv1.weight``, ``layer1.0.downsample.0.weight``, ...; the
classifier ``fc.*`` / ``last_linear.*`` and ``num_batches_tracked`` are ignored), or from a ``.pth``
(read without torch by ``torch_pickle``, which refuses any object other than tensors). Conv kernels are
transposed OIHW -> HWIO; BN ``weight``/``bias``/
``running_mean``/``running_var`` become Flax ``scale``/``bias`` (params) and ``mean``/``var``
(batch_stats). Module paths mirror the keys: ``layer1.0.downsample.1`` -> ``layer1_0/downsample_1``.
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping, Sequence

import numpy as np

from cvs_jax.errors import WeightsError
from cvs_jax.models.torch_pickle import RefusedPickle, read_pth

__all__ = [
    "CONVERT_ONE_LINER",
    "PretrainedWeightsError",
    "convert_torchvision_state_dict",
    "load_torchvision_resnet",
    "load_torchvision_resnet50",
    "merge_pretrained",
    "read_state_dict",
    "torchvision_resnet_shapes",
]

CONVERT_ONE_LINER = (
    'python -c \'import sys, torch, numpy as np; sd = torch.load(sys.argv[1], map_location="cpu", weights_only=True); '
    'sd = sd.get("state_dict", sd); np.savez(sys.argv[2], **{k: v.numpy() for k, v in sd.items()})\' '
    "resnet50-0676ba61.pth resnet50.npz"
)
_WHERE = (
    "torchvision's ImageNet ResNet-50 weights (IMAGENET1K_V1, "
    "https://download.pytorch.org/models/resnet50-0676ba61.pth, or pretrainedmodels' "
    "resnet50-19c8e357.pth)"
)
_IGNORED = re.compile(r"^(fc|last_linear)\.|(^|\.)num_batches_tracked$")
_EXPANSION = {"bottleneck": 4, "basic": 1}


class PretrainedWeightsError(WeightsError):
    """The weight file is missing, unreadable, or does not fit the architecture (wrong keys or shapes)."""


# ---------------------------------------------------------------- expected layout
def torchvision_resnet_shapes(
    stage_sizes: Sequence[int] = (3, 4, 6, 3), block: str = "bottleneck", width: int = 64
) -> dict[str, tuple[int, ...]]:
    """Torch key -> torch shape of every conv / BN tensor of a torchvision ResNet (no ``fc``)."""
    if block not in _EXPANSION:
        raise ValueError(f"block={block!r}: use one of {sorted(_EXPANSION)}")
    shapes: dict[str, tuple[int, ...]] = {}

    def bn(prefix, c):
        for s in ("weight", "bias", "running_mean", "running_var"):
            shapes[f"{prefix}.{s}"] = (c,)

    shapes["conv1.weight"] = (width, 3, 7, 7)
    bn("bn1", width)
    cin, exp = width, _EXPANSION[block]
    for i, blocks in enumerate(stage_sizes):
        planes = width * 2**i
        for b in range(blocks):
            p = f"layer{i + 1}.{b}"
            stride = 2 if (i > 0 and b == 0) else 1
            if block == "bottleneck":
                convs = [(planes, cin, 1), (planes, planes, 3), (planes * exp, planes, 1)]
            else:
                convs = [(planes, cin, 3), (planes, planes, 3)]
            for j, (o, ci, k) in enumerate(convs, 1):
                shapes[f"{p}.conv{j}.weight"] = (o, ci, k, k)
                bn(f"{p}.bn{j}", o)
            if stride != 1 or cin != planes * exp:
                shapes[f"{p}.downsample.0.weight"] = (planes * exp, cin, 1, 1)
                bn(f"{p}.downsample.1", planes * exp)
            cin = planes * exp
    return shapes


def module_path(mods: list[str]) -> list[str]:
    """PyTorch module names -> Flax's: a list index joins its parent (``layer1``, ``0`` -> ``layer1_0``)."""
    path: list[str] = []
    for m in mods:
        if m.isdigit() and path:
            path[-1] = f"{path[-1]}_{m}"
        else:
            path.append(m)
    return path


def _flax_location(key: str, ndim: int) -> tuple[str, tuple[str, ...]]:
    """``layer1.0.downsample.1.running_mean`` -> ``("batch_stats", ("layer1_0", "downsample_1", "mean"))``."""
    *mods, leaf = key.split(".")
    path = module_path(mods)
    if leaf == "weight":
        return "params", (*path, "kernel" if ndim == 4 else "scale")
    if leaf == "bias":
        return "params", (*path, "bias")
    if leaf == "running_mean":
        return "batch_stats", (*path, "mean")
    if leaf == "running_var":
        return "batch_stats", (*path, "var")
    raise PretrainedWeightsError(f"unexpected tensor {key!r}")


# ---------------------------------------------------------------- reading
def read_state_dict(path: str) -> dict[str, np.ndarray]:
    """A state dict as numpy arrays, from ``.safetensors``, ``.npz`` or ``.pth`` (read without torch,
    ``torch_pickle``). A weight package's name (``weight_packages.resolve``) is resolved by the caller."""
    path = os.path.expanduser(str(path))
    if not os.path.isfile(path):
        raise PretrainedWeightsError(
            f"pretrained weights {path!r} not found. Fix: on a machine with internet download {_WHERE}, "
            f"convert it to .npz with\n  {CONVERT_ONE_LINER}\nand pass the .npz path."
        )
    if path.endswith(".safetensors"):
        import safetensors.numpy  # pylint: disable=g-import-not-at-top

        try:
            sd = safetensors.numpy.load_file(path)
        except Exception as e:  # a truncated or foreign file, or bfloat16 (which numpy cannot hold)
            raise PretrainedWeightsError(
                f"cannot read {path!r} as safetensors of float32/float16 tensors ({type(e).__name__}: {e}). Fix: "
                "pass the model.safetensors of a timm or Hugging Face checkpoint, re-downloaded if it is truncated."
            ) from e
    elif path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as z:
            sd = {k: np.asarray(z[k]) for k in z.files}
    elif path.endswith((".pth", ".pt")):
        try:  # tensors and dicts only, without torch: a pickle naming anything else is refused
            sd = read_pth(path)
        except RefusedPickle as e:
            raise PretrainedWeightsError(
                f"cannot read {path!r} as a PyTorch state dict of tensors ({e}). Fix: pass a state dict saved "
                "with torch.save (objects other than tensors are refused, as unpickling them could run code)."
            ) from e
    else:
        raise PretrainedWeightsError(
            f"{path!r} is not a weight file: use a .safetensors (timm, Hugging Face), a .npz state dict or a .pth "
            "state dict of tensors"
        )
    return {(k[len("module.") :] if k.startswith("module.") else k): v for k, v in sd.items()}


# ---------------------------------------------------------------- conversion
def convert_torchvision_state_dict(
    state_dict: Mapping[str, np.ndarray],
    *,
    stage_sizes: Sequence[int] = (3, 4, 6, 3),
    block: str = "bottleneck",
    width: int = 64,
    source: str = "state dict",
) -> dict[str, dict]:
    """Torchvision state dict -> ``{"params": ..., "batch_stats": ...}`` of the TorchvisionResNet body."""
    want = torchvision_resnet_shapes(stage_sizes, block, width)
    have = {k: np.asarray(v) for k, v in state_dict.items() if not _IGNORED.search(k)}
    missing = [k for k in want if k not in have]
    unexpected = [k for k in have if k not in want]
    wrong = [
        f"{k}: file {tuple(have[k].shape)} vs model {want[k]}"
        for k in want
        if k in have and tuple(have[k].shape) != want[k]
    ]
    if missing or unexpected or wrong:
        parts = []
        for title, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", wrong)):
            if items:
                parts.append(f"{len(items)} {title} (first: {', '.join(items[:5])})")
        arch = f"stages {tuple(stage_sizes)}, {block} blocks, width {width}"
        raise PretrainedWeightsError(
            f"{source} does not fit the torchvision ResNet ({arch}): "
            + "; ".join(parts)
            + f". Fix: pass the state dict of {_WHERE} (keys like 'layer1.0.downsample.0.weight'), "
            f"converted with\n  {CONVERT_ONE_LINER}"
        )
    out: dict[str, dict] = {"params": {}, "batch_stats": {}}
    for k in want:
        v = have[k].astype(np.float32)
        if v.ndim == 4:
            v = np.ascontiguousarray(v.transpose(2, 3, 1, 0))  # OIHW -> HWIO
        collection, path = _flax_location(k, have[k].ndim)
        node = out[collection]
        for p in path[:-1]:
            node = node.setdefault(p, {})
        node[path[-1]] = v
    return out


def load_torchvision_resnet(path: str, *, stage_sizes: Sequence[int], block: str, width: int = 64) -> dict[str, dict]:
    return convert_torchvision_state_dict(
        read_state_dict(path), stage_sizes=stage_sizes, block=block, width=width, source=repr(str(path))
    )


def load_torchvision_resnet50(path: str) -> dict[str, dict]:
    """``{"params", "batch_stats"}`` of the ResNet-50 body (no ``embedding``) from a torchvision state dict."""
    return load_torchvision_resnet(path, stage_sizes=(3, 4, 6, 3), block="bottleneck", width=64)


def merge_pretrained(
    variables: Mapping[str, Any], pretrained: Mapping[str, Any], keep: Sequence[str] = ("params/embedding",)
) -> dict[str, Any]:
    """``variables`` (from ``model.init``) with every leaf present in ``pretrained`` replaced.

    Leaves under ``keep`` (the new ``embedding`` layer) keep their initial values. Every other
    leaf of ``variables`` must come from ``pretrained`` with the same shape, and every pretrained
    leaf must exist in ``variables`` (else ``PretrainedWeightsError``). Replaced leaves are numpy.
    """
    problems: list[str] = []

    def merge(dst, src, where):
        out = dict(dst)
        for k in dst:
            here = f"{where}/{k}"
            if k not in src and not any(here == p or here.startswith(p + "/") for p in keep):
                problems.append(f"{here} has no pretrained weights")
        for k, v in src.items():
            here = f"{where}/{k}"
            if k not in dst:
                problems.append(f"{here} not in the model")
            elif isinstance(v, Mapping):
                if not isinstance(dst[k], Mapping):
                    problems.append(f"{here} is a leaf in the model")
                else:
                    out[k] = merge(dst[k], v, here)
            elif tuple(np.shape(v)) != tuple(dst[k].shape):
                problems.append(f"{here}: weights {tuple(np.shape(v))} vs model {tuple(dst[k].shape)}")
            else:
                out[k] = np.asarray(v, dtype=dst[k].dtype)
        return out

    merged = {c: merge(variables[c], pretrained[c], c) if c in pretrained else variables[c] for c in variables}
    problems += [f"{c} not in the model" for c in pretrained if c not in variables]
    if problems:
        raise PretrainedWeightsError(
            f"pretrained weights do not fit the model ({len(problems)} problems, first: "
            f"{'; '.join(problems[:5])}); build it with layout='torchvision' and the "
            f"matching architecture"
        )
    return merged
