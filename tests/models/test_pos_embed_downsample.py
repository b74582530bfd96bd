"""``backbones.resample_pos_embed`` when the input's patch grid is smaller than the file's: shrinking needs
antialiasing (timm: ``F.interpolate(mode="bicubic", antialias=True)``), which upsampling never exercises.
The reference is PIL's bicubic resize of each channel (a = -0.5, the kernel widened when shrinking, as
torch's antialiased bicubic)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from PIL import Image

from cvs_jax.models import backbones

VIT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "backbones", "vit_patch16.safetensors")


def _pil_resize(grid: np.ndarray, side: int) -> np.ndarray:
    return np.stack(
        [
            np.asarray(Image.fromarray(grid[..., c], mode="F").resize((side, side), Image.BICUBIC))
            for c in range(grid.shape[-1])
        ],
        -1,
    )


@pytest.mark.parametrize("src, dst", [(8, 3), (7, 5), (4, 2)])
def test_shrunk_pos_embed_is_the_antialiased_bicubic_resize(src, dst):
    spec, _ = backbones.load_vit(VIT)
    spec = dataclasses.replace(spec, grid=src)
    width = 6
    rng = np.random.default_rng(src)
    n_prefix = 0 if spec.no_embed_class else 1 + spec.registers
    pos = rng.normal(size=(1, n_prefix + src * src, width)).astype(np.float32)
    got = backbones.resample_pos_embed(pos, spec, dst)
    assert got.shape == (1, n_prefix + dst * dst, width)
    np.testing.assert_array_equal(got[:, :n_prefix], pos[:, :n_prefix])  # the class token kept as it is
    want = _pil_resize(pos[0, n_prefix:].reshape(src, src, width), dst).reshape(dst * dst, width)
    np.testing.assert_allclose(got[0, n_prefix:], want, atol=1e-5)
