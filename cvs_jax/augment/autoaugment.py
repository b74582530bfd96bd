"""AutoAugment (CIFAR-10 policy) and RandAugment on device: jit-able, static shapes, per-image
randomness, uint8 in / uint8 out.

Reproduces the PIL-based training augmentations of the official code (ivclab/CVS):

* CIFAR-100: ``utils/augment.py`` ``CIFAR10Policy`` -- the widely copied DeepVoltaire AutoAugment
  code (same file in clovaai/rainbow-memory), fill colour 128  ->  :func:`cifar10_policy`.
* Tiny-ImageNet: ``RandAugment()`` of pip ``randaugment==1.0.2`` (jizongFox), the same
  ``SubPolicy`` machinery plus a ``Cutout`` op  ->  :func:`rand_augment`.

Images are uint8 ``[H, W, C]`` (C = 1 or 3), batches ``[B, H, W, C]``.  Each op follows the Pillow C
code path that the reference's call ends up in; agreement with Pillow 13 measured by
``tests/augment/test_autoaugment.py`` (CPU, inside jit + vmap):

=============  =========================================================================  ==========
op             reference call / what is reproduced                                        agreement
=============  =========================================================================  ==========
ShearX/Y       ``transform(AFFINE, (1,m,0,0,1,0) | (1,0,0,m,1,0), BICUBIC, fill 128)``;    >= 99.5 %,
               **bicubic** (Pillow's transform kernel a = -1, truncating), the             rest +-1
               sampling grid / in-image test from float64 host tables, the cubic in
               float32 (Pillow: float64)
TranslateX/Y   ``transform(AFFINE, (1,0,t,0,1,0) | (1,0,0,0,1,t))``, nearest, fill 128;   exact
               t = magnitude * W (or H), source index as ``ImagingScaleAffine``
Rotate         ``convert("RGBA").rotate(deg)`` composited on grey 128: nearest,            exact
               Pillow's 16.16 fixed-point affine path; **no random sign** in the reference
AutoContrast   ``ImageOps.autocontrast`` incl. its float64 ``int(ix*scale + offset)``      exact
               quirk (e.g. levels 0..25: 25 -> 254), via a host-built exception table
Invert         ``ImageOps.invert``                                                        exact
Equalize       ``ImageOps.equalize``: step = (N - h_last) // 255, LUT clipped to 255      exact
Solarize       ``ImageOps.solarize(img, thr)``: level < thr kept, else 255 - level        exact
Posterize      ``ImageOps.posterize(img, bits)``                                          exact
Contrast       ``ImageEnhance.Contrast``: blend with int(mean of L + 0.5)                  exact
Color          ``ImageEnhance.Color``: blend with L (= RGB->L ``(19595R+38470G+7471B+2**15)  exact
               >> 16``); identity for C = 1
Brightness     ``ImageEnhance.Brightness``: blend with black                               exact
Sharpness      ``ImageEnhance.Sharpness``: blend with the 3x3 SMOOTH filter (borders       exact
               copied)
Cutout         jizongFox ``Cutout(size)``: rows/cols [c - size//2, c + size//2) clipped,   exact
               colour (125, 122, 113) (C = 1: 125)
=============  =========================================================================  ==========

Blends are ``ImagingBlend``: ``(UINT8) clip(deg + f * (img - deg))`` in float32 with the product
rounded before the add (:func:`_mul_rn` keeps that true when XLA contracts to FMA).

Per-op functions ``op(image_u8[H,W,C], magnitude) -> image_u8`` take the *value* the reference
hands to PIL, sign applied: ``shear_x(img, 0.2)``, ``translate_x(img, -0.3)`` (fraction of the
width, like ``magnitude * img.size[0]``), ``rotate(img, 6.67)`` (degrees, counter-clockwise),
``solarize(img, 227.6)``, ``posterize(img, 5)``, ``contrast(img, 1.3)`` (the enhance factor
``1 +- magnitude``), ``auto_contrast(img)``, ..., and ``cutout(img, size, (cy, cx))``.  A concrete
(Python / NumPy) magnitude takes the host float64 path above; a traced one derives the grid in
float32 on device (geometric ops then lose a few boundary pixels: >= 98 % agreement).  The policies
always use host tables indexed by the traced magnitude index (the exact path); :func:`apply_op`
exposes that (op id, magnitude index, sign, cutout centre) interface directly.

Randomness: one ``jax.random.bits`` draw of uint32 words per batch, a fixed set of words per image
(sub-policy / op choice, apply-or-not ``u < p``, sign, cutout centre), so every image has its own
draws and a key fixes the whole batch.  The op is selected by ``lax.switch`` (under ``vmap``: all
branches computed, then selected), the two ops of a (sub-)policy run in a 2-step ``lax.scan``.

Deviations from the PyTorch/PIL pipelines that remain:
* ShearX/Y: float32 cubic instead of float64 -> +-1 level on ~0.1-0.5 % of pixels.
* Greyscale: the reference passes ``fillcolor=(128, 128, 128)`` / ``(125, 122, 113, 0)`` which
  Pillow rejects for mode L; here fill 128 and Cutout 125 are used.
* Random streams differ (JAX keys instead of Python ``random`` / NumPy), distributions are equal;
  integer draws use ``word % n`` (bias < n / 2**32), probabilities ``u < p`` on a 2**-24 grid.
* Rotate by exactly 90/180/270 degrees (never drawn) would use Pillow's transpose fast path there.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

# --------------------------------------------------------------------------------------------------
# Op identifiers and magnitude tables (AutoAugment, as in DeepVoltaire SubPolicy / jizongFox).
# --------------------------------------------------------------------------------------------------

OP_NAMES = (
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Rotate",
    "AutoContrast",
    "Invert",
    "Equalize",
    "Solarize",
    "Posterize",
    "Contrast",
    "Color",
    "Brightness",
    "Sharpness",
    "Cutout",
)
OP_ID = {name: i for i, name in enumerate(OP_NAMES)}
(
    SHEAR_X,
    SHEAR_Y,
    TRANSLATE_X,
    TRANSLATE_Y,
    ROTATE,
    AUTOCONTRAST,
    INVERT,
    EQUALIZE,
    SOLARIZE,
    POSTERIZE,
    CONTRAST,
    COLOR,
    BRIGHTNESS,
    SHARPNESS,
    CUTOUT,
) = range(15)

FILL = 128  # fillcolor=(128, 128, 128) of the geometric ops
CUTOUT_FILL = (125, 122, 113)  # jizongFox Cutout colour

#: magnitude index (0..9) -> value, as ``ranges`` in ``SubPolicy.__init__``
MAGNITUDES = {
    "ShearX": np.linspace(0, 0.3, 10),
    "ShearY": np.linspace(0, 0.3, 10),
    "TranslateX": np.linspace(0, 150 / 331, 10),
    "TranslateY": np.linspace(0, 150 / 331, 10),
    "Rotate": np.linspace(0, 30, 10),
    "Color": np.linspace(0.0, 0.9, 10),
    "Posterize": np.round(np.linspace(8, 4, 10), 0).astype(np.int64),
    "Solarize": np.linspace(256, 0, 10),
    "Contrast": np.linspace(0.0, 0.9, 10),
    "Sharpness": np.linspace(0.0, 0.9, 10),
    "Brightness": np.linspace(0.0, 0.9, 10),
    "AutoContrast": np.zeros(10),
    "Equalize": np.zeros(10),
    "Invert": np.zeros(10),
    "Cutout": np.round(np.linspace(0, 20, 10), 0).astype(np.int64),
}

#: CIFAR10Policy: 25 sub-policies (p1, op1, magnitude index 1, p2, op2, magnitude index 2)
CIFAR10_POLICY = (
    (0.1, "Invert", 7, 0.2, "Contrast", 6),
    (0.7, "Rotate", 2, 0.3, "TranslateX", 9),
    (0.8, "Sharpness", 1, 0.9, "Sharpness", 3),
    (0.5, "ShearY", 8, 0.7, "TranslateY", 9),
    (0.5, "AutoContrast", 8, 0.9, "Equalize", 2),
    (0.2, "ShearY", 7, 0.3, "Posterize", 7),
    (0.4, "Color", 3, 0.6, "Brightness", 7),
    (0.3, "Sharpness", 9, 0.7, "Brightness", 9),
    (0.6, "Equalize", 5, 0.5, "Equalize", 1),
    (0.6, "Contrast", 7, 0.6, "Sharpness", 5),
    (0.7, "Color", 7, 0.5, "TranslateX", 8),
    (0.3, "Equalize", 7, 0.4, "AutoContrast", 8),
    (0.4, "TranslateY", 3, 0.2, "Sharpness", 6),
    (0.9, "Brightness", 6, 0.2, "Color", 8),
    (0.5, "Solarize", 2, 0.0, "Invert", 3),
    (0.2, "Equalize", 0, 0.6, "AutoContrast", 0),
    (0.2, "Equalize", 8, 0.6, "Equalize", 4),
    (0.9, "Color", 9, 0.6, "Equalize", 6),
    (0.8, "AutoContrast", 4, 0.2, "Solarize", 8),
    (0.1, "Brightness", 3, 0.7, "Color", 0),
    (0.4, "Solarize", 5, 0.9, "AutoContrast", 3),
    (0.9, "TranslateY", 9, 0.7, "TranslateY", 9),
    (0.9, "AutoContrast", 2, 0.8, "Solarize", 3),
    (0.8, "Equalize", 8, 0.1, "Invert", 3),
    (0.7, "TranslateY", 9, 0.9, "AutoContrast", 1),
)

#: jizongFox RandAugment.get_trans_list() order (the order does not matter: ops are drawn uniformly)
RANDAUGMENT_OPS = (
    "Invert",
    "Cutout",
    "Sharpness",
    "AutoContrast",
    "Posterize",
    "ShearX",
    "TranslateX",
    "TranslateY",
    "ShearY",
    "Rotate",
    "Equalize",
    "Contrast",
    "Color",
    "Solarize",
    "Brightness",
)
RANDAUGMENT_PROB = 0.5
RANDAUGMENT_MAGNITUDES = tuple(range(1, 10))


def _is_concrete(v) -> bool:
    return not isinstance(v, Tracer) and np.ndim(v) == 0


def _check_image(image):
    if image.ndim != 3 or image.shape[-1] not in (1, 3):
        raise ValueError(f"expected an image [H, W, C] with C in (1, 3), got {image.shape}")
    if image.dtype != jnp.uint8:
        raise ValueError(f"expected uint8, got {image.dtype}")


def _fill_value(channels: int, colour=(FILL, FILL, FILL)):
    return jnp.asarray(colour[:channels] if channels == 3 else colour[:1], jnp.uint8)


# --------------------------------------------------------------------------------------------------
# Geometric ops.
# --------------------------------------------------------------------------------------------------


def _shear_grid_np(m: float, h: int, w: int, axis: int):
    """Pillow ``ImagingGenericTransform`` + ``affine_transform`` + bicubic head, in float64.

    Returns (base, frac, valid): the interpolation axis' ``floor(coord - 0.5)``, its fraction and
    the in-image test of the *un-shifted* coordinate (``xin < 0 || xin >= xsize`` -> fill).
    """
    xi = np.arange(w, dtype=np.float64)[None, :] + 0.5
    yi = np.arange(h, dtype=np.float64)[:, None] + 0.5
    if axis == 1:  # ShearX: a = (1, m, 0, 0, 1, 0)
        a = (1.0, float(m), 0.0, 0.0, 1.0, 0.0)
    else:  # ShearY: a = (1, 0, 0, m, 1, 0)
        a = (1.0, 0.0, 0.0, float(m), 1.0, 0.0)
    xs = (a[0] * xi + a[1] * yi) + a[2]
    ys = (a[3] * xi + a[4] * yi) + a[5]
    valid = (xs >= 0) & (xs < w) & (ys >= 0) & (ys < h)
    c = (xs if axis == 1 else ys) - 0.5
    base = np.floor(c)
    frac = c - base
    shape = (h, w)
    return (
        np.broadcast_to(base, shape).astype(np.int32),
        np.broadcast_to(frac, shape).astype(np.float32),
        np.broadcast_to(valid, shape),
    )


def _shear_grid_jnp(m, h: int, w: int, axis: int):
    m = jnp.asarray(m, jnp.float32)
    xi = jnp.arange(w, dtype=jnp.float32)[None, :] + 0.5
    yi = jnp.arange(h, dtype=jnp.float32)[:, None] + 0.5
    if axis == 1:  # same expression order as Pillow: (a0*x + a1*y) + a2, (a3*x + a4*y) + a5
        xs, ys = xi + m * yi, 0.0 * xi + yi
    else:
        xs, ys = xi + 0.0 * yi, m * xi + yi
    xs, ys = jnp.broadcast_to(xs, (h, w)), jnp.broadcast_to(ys, (h, w))
    valid = (xs >= 0) & (xs < w) & (ys >= 0) & (ys < h)
    c = (xs if axis == 1 else ys) - 0.5
    base = jnp.floor(c)
    return base.astype(jnp.int32), (c - base).astype(jnp.float32), valid


def _shear_core(image, base, frac, valid, axis: int):
    """1-D cubic convolution (Pillow's transform kernel, a = -1) along ``axis``, edge-clamped.

    For these shears the other coordinate sits exactly on a pixel centre (fraction 0), where
    Pillow's 2-D bicubic reduces exactly to this 1-D interpolation.
    """
    h, w, c = image.shape
    x = image.astype(jnp.float32)
    n = w if axis == 1 else h
    idx = [jnp.clip(base + o, 0, n - 1) for o in (-1, 0, 1, 2)]
    if axis == 1:
        rows = jnp.arange(h)[:, None]
        v1, v2, v3, v4 = (x[rows, i] for i in idx)
    else:
        cols = jnp.arange(w)[None, :]
        v1, v2, v3, v4 = (x[i, cols] for i in idx)
    d = frac[..., None]
    p2 = -v1 + v3
    p3 = 2.0 * (v1 - v2) + v3 - v4
    p4 = -v1 + v2 - v3 + v4
    v = v2 + d * (p2 + d * (p3 + d * p4))
    out = jnp.floor(jnp.clip(v, 0.0, 255.0)).astype(jnp.uint8)  # (UINT8)v after clipping
    return jnp.where(valid[..., None], out, _fill_value(c))


def _shear(image, m, axis):
    _check_image(image)
    h, w, _ = image.shape
    grid = _shear_grid_np(m, h, w, axis) if _is_concrete(m) else _shear_grid_jnp(m, h, w, axis)
    return _shear_core(image, *grid, axis=axis)


def shear_x(image, shear):
    """``img.transform(size, AFFINE, (1, shear, 0, 0, 1, 0), BICUBIC, fillcolor=128)``."""
    return _shear(image, shear, axis=1)


def shear_y(image, shear):
    """``img.transform(size, AFFINE, (1, 0, 0, shear, 1, 0), BICUBIC, fillcolor=128)``."""
    return _shear(image, shear, axis=0)


def _translate_index_np(t: float, n: int):
    """Pillow ``ImagingScaleAffine`` source indices (``xo = t + 0.5; xo += 1.0``), -1 = outside."""
    out = np.full((n,), -1, np.int32)
    xo = t + 1.0 * 0.5
    for i in range(n):
        src = -1 if xo < 0.0 else int(xo)
        if 0 <= src < n:
            out[i] = src
        xo += 1.0
    return out


def _translate_index_jnp(t, n: int):
    src = jnp.floor(jnp.arange(n, dtype=jnp.float32) + 0.5 + jnp.asarray(t, jnp.float32)).astype(jnp.int32)
    return jnp.where((src >= 0) & (src < n), src, -1)


def _translate_core(image, src, axis: int):
    c = image.shape[-1]
    valid = src >= 0
    safe = jnp.maximum(src, 0)
    if axis == 1:
        out, valid = image[:, safe], valid[None, :, None]
    else:
        out, valid = image[safe], valid[:, None, None]
    return jnp.where(valid, out, _fill_value(c))


def _translate(image, fraction, axis):
    _check_image(image)
    n = image.shape[axis]
    if _is_concrete(fraction):
        src = _translate_index_np(float(fraction) * n, n)
    else:
        src = _translate_index_jnp(fraction * n, n)
    return _translate_core(image, src, axis)


def translate_x(image, fraction):
    """``img.transform(size, AFFINE, (1, 0, fraction * W, 0, 1, 0), fillcolor=128)`` (nearest)."""
    return _translate(image, fraction, axis=1)


def translate_y(image, fraction):
    """``img.transform(size, AFFINE, (1, 0, 0, 0, 1, fraction * H), fillcolor=128)`` (nearest)."""
    return _translate(image, fraction, axis=0)


def _rotate_coeffs_np(degrees: float, h: int, w: int):
    """``Image.rotate`` matrix -> Pillow ``affine_fixed`` 16.16 coefficients (a0..a5)."""
    angle = -math.radians(float(degrees) % 360.0)
    a = [
        round(math.cos(angle), 15),
        round(math.sin(angle), 15),
        0.0,
        round(-math.sin(angle), 15),
        round(math.cos(angle), 15),
        0.0,
    ]
    cx, cy = w / 2, h / 2
    a[2] = a[0] * -cx + a[1] * -cy + a[2]
    a[5] = a[3] * -cx + a[4] * -cy + a[5]
    a[2] += cx
    a[5] += cy

    def fix(v):
        return math.floor(v * 65536.0 + 0.5)

    return np.asarray(
        [
            fix(a[0]),
            fix(a[1]),
            fix(a[2] + a[0] * 0.5 + a[1] * 0.5),
            fix(a[3]),
            fix(a[4]),
            fix(a[5] + a[3] * 0.5 + a[4] * 0.5),
        ],
        np.int32,
    )


def _rotate_coeffs_jnp(degrees, h: int, w: int):
    t = -jnp.deg2rad(jnp.asarray(degrees, jnp.float32))
    cos, sin = jnp.cos(t), jnp.sin(t)
    cx, cy = w / 2, h / 2
    a0, a1, a3, a4 = cos, sin, -sin, cos
    a2 = a0 * -cx + a1 * -cy + cx
    a5 = a3 * -cx + a4 * -cy + cy

    def fix(v):
        return jnp.floor(v * 65536.0 + 0.5).astype(jnp.int32)

    return jnp.stack([fix(a0), fix(a1), fix(a2 + a0 * 0.5 + a1 * 0.5), fix(a3), fix(a4), fix(a5 + a3 * 0.5 + a4 * 0.5)])


def _rotate_core(image, coeffs):
    h, w, c = image.shape
    a = jnp.asarray(coeffs, jnp.int32)
    y = jnp.arange(h, dtype=jnp.int32)[:, None]
    x = jnp.arange(w, dtype=jnp.int32)[None, :]
    xx = a[2] + y * a[1] + x * a[0]
    yy = a[5] + y * a[4] + x * a[3]
    xin = jnp.right_shift(xx, 16)  # arithmetic shift == floor, as Pillow's ``xx >> 16``
    yin = jnp.right_shift(yy, 16)
    valid = (xin >= 0) & (xin < w) & (yin >= 0) & (yin < h)
    out = image[jnp.clip(yin, 0, h - 1), jnp.clip(xin, 0, w - 1)]
    return jnp.where(valid[..., None], out, _fill_value(c))


def rotate(image, degrees):
    """``rotate_with_fill``: ``img.convert('RGBA').rotate(degrees)`` composited on grey 128.

    Counter-clockwise, nearest neighbour, centre (W/2, H/2), same size.
    """
    _check_image(image)
    h, w, _ = image.shape
    coeffs = _rotate_coeffs_np(degrees, h, w) if _is_concrete(degrees) else _rotate_coeffs_jnp(degrees, h, w)
    return _rotate_core(image, coeffs)


# --------------------------------------------------------------------------------------------------
# Histogram / LUT ops.
# --------------------------------------------------------------------------------------------------


def _histograms(image):
    """[C, 256] int32 per-channel histograms."""
    c = image.shape[-1]
    flat = image.reshape(-1, c).astype(jnp.int32)
    return jax.vmap(lambda ch: jnp.bincount(ch, length=256), in_axes=1)(flat).astype(jnp.int32)


def _apply_lut(image, lut):
    """lut [C, 256] -> image[..., c] mapped through lut[c]."""
    c = image.shape[-1]
    return lut[jnp.arange(c)[None, None, :], image.astype(jnp.int32)].astype(jnp.uint8)


@functools.lru_cache(maxsize=1)
def _autocontrast_exceptions():
    """Where Pillow's float64 ``int(ix * scale + offset)`` (scale = 255/(hi-lo), offset = -lo*scale)
    is one *below* the exact ``floor((ix - lo) * 255 / (hi - lo))``: exact integer results that land
    at k - 1e-14 (e.g. lo=0, hi=25 maps 25 -> 254).  12094 (lo, hi, ix) triples in 5958 (lo, hi)
    pairs, at most 17 per pair.

    Returns (row [65536] int32: row of pair lo*256+hi in ``ix_table`` or -1,
             ix_table [n_pairs, 17] int32: the exceptional ix, padded with -1).
    """
    per_pair = {}
    ix_all = np.arange(256, dtype=np.float64)
    for lo in range(256):
        for hi in range(lo + 1, 256):
            scale = 255.0 / (hi - lo)
            offset = -lo * scale
            got = np.trunc(ix_all[lo : hi + 1] * scale + offset)
            exact = (np.arange(hi - lo + 1) * 255) // (hi - lo)
            bad = np.nonzero(got != exact)[0]
            if bad.size:
                per_pair[lo * 256 + hi] = lo + bad
    width = max(len(v) for v in per_pair.values())
    row = np.full((65536,), -1, np.int32)
    ix_table = np.full((len(per_pair), width), -1, np.int32)
    for r, (pair, ixs) in enumerate(sorted(per_pair.items())):
        row[pair] = r
        ix_table[r, : len(ixs)] = ixs
    return row, ix_table


def auto_contrast(image, magnitude=None):
    """``ImageOps.autocontrast(img)`` (cutoff 0), per channel."""
    del magnitude
    _check_image(image)
    hist = _histograms(image)
    nz = hist > 0
    ix = jnp.arange(256, dtype=jnp.int32)
    lo = jnp.argmax(nz, axis=-1).astype(jnp.int32)  # [C]
    hi = (255 - jnp.argmax(nz[:, ::-1], axis=-1)).astype(jnp.int32)
    d = jnp.maximum(hi - lo, 1)
    exact = jnp.floor_divide((ix[None, :] - lo[:, None]) * 255, d[:, None])
    row_np, ix_np = _autocontrast_exceptions()
    row = jnp.asarray(row_np)[lo * 256 + hi]  # [C]
    cand = jnp.where((row >= 0)[:, None], jnp.asarray(ix_np)[jnp.maximum(row, 0)], -1)  # [C, 17]
    below = jnp.any(ix[None, :, None] == cand[:, None, :], axis=-1)  # [C, 256]
    lut = jnp.clip(exact - below.astype(jnp.int32), 0, 255)
    lut = jnp.where((hi <= lo)[:, None], ix[None, :], lut)
    return _apply_lut(image, lut)


def equalize(image, magnitude=None):
    """``ImageOps.equalize(img)`` per channel (Pillow's integer LUT, step = (N - h_last) // 255)."""
    del magnitude
    _check_image(image)
    hist = _histograms(image)
    n = image.shape[0] * image.shape[1]
    ix = jnp.arange(256, dtype=jnp.int32)
    nz = hist > 0
    last = jnp.max(jnp.where(nz, ix[None, :], -1), axis=-1)
    h_last = jnp.take_along_axis(hist, jnp.maximum(last, 0)[:, None], axis=-1)
    step = (n - h_last) // 255
    cum_excl = jnp.cumsum(hist, axis=-1) - hist
    lut = (step // 2 + cum_excl) // jnp.maximum(step, 1)
    lut = jnp.clip(lut, 0, 255)  # Image.point clips the LUT to 8 bits
    identity = (jnp.sum(nz, axis=-1, keepdims=True) <= 1) | (step == 0)
    lut = jnp.where(identity, ix[None, :], lut)
    return _apply_lut(image, lut)


def invert(image, magnitude=None):
    """``ImageOps.invert``."""
    del magnitude
    _check_image(image)
    return 255 - image


def _solarize_threshold_np(threshold) -> int:
    # integer x < float thr  <=>  x < ceil(thr)
    return int(math.ceil(float(threshold)))


def _solarize_core(image, thr_int):
    return jnp.where(image.astype(jnp.int32) < thr_int, image, 255 - image)


def solarize(image, threshold):
    """``ImageOps.solarize(img, threshold)``: invert every level >= threshold."""
    _check_image(image)
    if _is_concrete(threshold):
        return _solarize_core(image, _solarize_threshold_np(threshold))
    return jnp.where(image.astype(jnp.float32) < threshold, image, 255 - image)


def _posterize_core(image, bits):
    shift = 8 - jnp.asarray(bits, jnp.int32)
    mask = jnp.left_shift(jnp.right_shift(jnp.int32(255), shift), shift)
    return jnp.bitwise_and(image.astype(jnp.int32), mask).astype(jnp.uint8)


def posterize(image, bits):
    """``ImageOps.posterize(img, bits)``: keep the ``bits`` most significant bits."""
    _check_image(image)
    return _posterize_core(image, bits)


# --------------------------------------------------------------------------------------------------
# ImageEnhance ops: Image.blend(degenerate, image, factor).
# --------------------------------------------------------------------------------------------------


def _mul_rn(x, a):
    """float32 ``x * a`` correctly rounded *whatever the compiler does with the result*.

    Pillow rounds every float32 product before the following addition; XLA's LLVM back ends
    contract ``x * a + c`` into an FMA (no intermediate rounding), which moves the truncated result
    by one level on ~1% of pixels.  Here ``a`` is split into two halves of at most 12 significant
    bits each, so for integer-valued ``|x| < 4096`` both partial products are exact and
    ``x*a_hi + x*a_lo`` rounds once, to the same value, contracted or not.
    """
    a = jnp.asarray(a, jnp.float32)
    a_hi = jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(a, jnp.int32) & jnp.int32(-4096), jnp.float32)
    a_lo = a - a_hi
    return x * a_hi + x * a_lo


def _blend(degenerate_f32, image, factor):
    """``ImagingBlend``: (UINT8) clip(in1 + alpha * (in2 - in1)) in float32."""
    alpha = jnp.asarray(factor, jnp.float32)
    x = image.astype(jnp.float32)
    v = degenerate_f32 + _mul_rn(x - degenerate_f32, alpha)
    return jnp.floor(jnp.clip(v, 0.0, 255.0)).astype(jnp.uint8)


def _luma_i32(image):
    """Pillow RGB -> L: (R*19595 + G*38470 + B*7471 + 0x8000) >> 16; identity for C = 1."""
    x = image.astype(jnp.int32)
    if image.shape[-1] == 1:
        return x[..., 0]
    return jnp.right_shift(x[..., 0] * 19595 + x[..., 1] * 38470 + x[..., 2] * 7471 + 0x8000, 16)


def contrast(image, factor):
    """``ImageEnhance.Contrast(img).enhance(factor)``: blend with the rounded mean grey level."""
    _check_image(image)
    lum = _luma_i32(image)
    n = lum.size
    mean = (2 * jnp.sum(lum) + n) // (2 * n)  # int(mean + 0.5), exact
    return _blend(mean.astype(jnp.float32), image, factor)


def color(image, factor):
    """``ImageEnhance.Color(img).enhance(factor)``: blend with the greyscale version (C=1: identity)."""
    _check_image(image)
    if image.shape[-1] == 1:
        return image
    grey = _luma_i32(image).astype(jnp.float32)[..., None]
    return _blend(grey, image, factor)


def brightness(image, factor):
    """``ImageEnhance.Brightness(img).enhance(factor)``: blend with black."""
    _check_image(image)
    return _blend(jnp.zeros(image.shape, jnp.float32), image, factor)


def _smooth(image):
    """``img.filter(ImageFilter.SMOOTH)``: 3x3 kernel (1,1,1,1,5,1,1,1,1)/13, float32, rounded;
    the one-pixel border is copied unchanged (Pillow ``ImagingFilter3x3``)."""
    x = image.astype(jnp.float32)
    k = jnp.float32(1.0 / 13.0)
    k5 = jnp.float32(5.0 / 13.0)

    def row(r, kc):
        return (_mul_rn(r[:, :-2], k) + _mul_rn(r[:, 1:-1], kc)) + _mul_rn(r[:, 2:], k)

    ss = jnp.float32(0.0) + row(x[2:], k)
    ss = ss + row(x[1:-1], k5)
    ss = ss + row(x[:-2], k)
    inner = jnp.where(ss <= 0.0, 0.0, jnp.where(ss >= 255.0, 255.0, jnp.floor(ss + 0.5)))
    return x.at[1:-1, 1:-1].set(inner)


def sharpness(image, factor):
    """``ImageEnhance.Sharpness(img).enhance(factor)``: blend with the SMOOTH-filtered image."""
    _check_image(image)
    if image.shape[0] < 3 or image.shape[1] < 3:
        return image
    return _blend(_smooth(image), image, factor)


# --------------------------------------------------------------------------------------------------
# Cutout (jizongFox randaugment).
# --------------------------------------------------------------------------------------------------


def cutout(image, size, center):
    """jizongFox ``Cutout(size)`` with the centre given: ``center = (cy, cx)`` integer pixel.

    The box is rows ``[max(0, cy - size//2), min(H, cy + size//2))`` x the same for columns,
    painted (125, 122, 113) (greyscale: 125).  The reference draws ``cy ~ U{0..H-1}``,
    ``cx ~ U{0..W-1}``.
    """
    _check_image(image)
    h, w, c = image.shape
    half = jnp.asarray(size, jnp.int32) // 2
    cy, cx = jnp.asarray(center[0], jnp.int32), jnp.asarray(center[1], jnp.int32)
    rows = jnp.arange(h)[:, None]
    cols = jnp.arange(w)[None, :]
    inside = (
        (rows >= jnp.maximum(0, cy - half))
        & (rows < jnp.minimum(h, cy + half))
        & (cols >= jnp.maximum(0, cx - half))
        & (cols < jnp.minimum(w, cx + half))
    )
    return jnp.where(inside[..., None], _fill_value(c, CUTOUT_FILL), image)


#: name -> per-op function ``op(image_u8[H,W,C], magnitude_value) -> image_u8`` (Cutout: see doc)
OPS = {
    "ShearX": shear_x,
    "ShearY": shear_y,
    "TranslateX": translate_x,
    "TranslateY": translate_y,
    "Rotate": rotate,
    "AutoContrast": auto_contrast,
    "Invert": invert,
    "Equalize": equalize,
    "Solarize": solarize,
    "Posterize": posterize,
    "Contrast": contrast,
    "Color": color,
    "Brightness": brightness,
    "Sharpness": sharpness,
    "Cutout": cutout,
}


# --------------------------------------------------------------------------------------------------
# Policy machinery: (op id, magnitude index, key) -> op applied, via host-built float64 tables.
# --------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _tables(h: int, w: int):
    """Per-size parameter tables indexed [magnitude index 0..9, sign (0: -1, 1: +1)]."""
    t = {}
    for name, axis in (("ShearX", 1), ("ShearY", 0)):
        grids = [[_shear_grid_np(MAGNITUDES[name][i] * s, h, w, axis) for s in (-1, 1)] for i in range(10)]
        t[name] = tuple(np.stack([np.stack([g[j] for g in row]) for row in grids]) for j in range(3))
    for name, axis, n in (("TranslateX", 1, w), ("TranslateY", 0, h)):
        # reference: magnitude * img.size[0 or 1] * random.choice([-1, 1])
        t[name] = np.stack(
            [np.stack([_translate_index_np(MAGNITUDES[name][i] * n * s, n) for s in (-1, 1)]) for i in range(10)]
        )
    t["Rotate"] = np.stack([_rotate_coeffs_np(MAGNITUDES["Rotate"][i], h, w) for i in range(10)])
    t["Solarize"] = np.asarray([_solarize_threshold_np(v) for v in MAGNITUDES["Solarize"]], np.int32)
    t["Posterize"] = MAGNITUDES["Posterize"].astype(np.int32)
    t["Cutout"] = MAGNITUDES["Cutout"].astype(np.int32)
    for name in ("Contrast", "Color", "Brightness", "Sharpness"):
        # factor 1 + magnitude * sign in float64, handed to ImagingBlend as a C float
        t[name] = np.stack([np.asarray([1 + MAGNITUDES[name][i] * s for s in (-1, 1)]) for i in range(10)]).astype(
            np.float32
        )
    return t


def _branch(op_id: int, h: int, w: int):
    """fn(image, mag_idx, sign_idx, center) applying op ``op_id`` with the reference's magnitude.

    ``sign_idx`` (0: -1, 1: +1) is used by the signed ops only, ``center`` (cy, cx) by Cutout only.
    """
    name = OP_NAMES[op_id]
    tab = _tables(h, w)

    if op_id in (SHEAR_X, SHEAR_Y):
        base, frac, valid = (jnp.asarray(a) for a in tab[name])
        axis = 1 if op_id == SHEAR_X else 0

        def fn(image, m, s, center) -> jax.Array:
            return _shear_core(image, base[m, s], frac[m, s], valid[m, s], axis=axis)
    elif op_id in (TRANSLATE_X, TRANSLATE_Y):
        src = jnp.asarray(tab[name])
        axis = 1 if op_id == TRANSLATE_X else 0

        def fn(image, m, s, center) -> jax.Array:
            return _translate_core(image, src[m, s], axis=axis)
    elif op_id == ROTATE:
        coeffs = jnp.asarray(tab[name])

        def fn(image, m, s, center) -> jax.Array:
            return _rotate_core(image, coeffs[m])
    elif op_id in (AUTOCONTRAST, INVERT, EQUALIZE):
        f = OPS[name]

        def fn(image, m, s, center) -> jax.Array:
            return f(image)
    elif op_id == SOLARIZE:
        thr = jnp.asarray(tab[name])

        def fn(image, m, s, center) -> jax.Array:
            return _solarize_core(image, thr[m])
    elif op_id == POSTERIZE:
        bits = jnp.asarray(tab[name])

        def fn(image, m, s, center) -> jax.Array:
            return _posterize_core(image, bits[m])
    elif op_id in (CONTRAST, COLOR, BRIGHTNESS, SHARPNESS):
        factors = jnp.asarray(tab[name])
        f = OPS[name]

        def fn(image, m, s, center) -> jax.Array:
            return f(image, factors[m, s])
    elif op_id == CUTOUT:
        sizes = jnp.asarray(tab[name])

        def fn(image, m, s, center) -> jax.Array:
            return cutout(image, sizes[m], center)
    else:  # pragma: no cover
        raise ValueError(op_id)
    return fn


ALL_OPS = tuple(range(len(OP_NAMES)))


def apply_op(image, op_id, mag_idx, sign_idx=1, center=(0, 0), op_ids=ALL_OPS):
    """Apply op ``op_id`` (int, may be traced; one of ``op_ids``) at magnitude index ``mag_idx``
    (0..9) of the AutoAugment tables, with sign ``-1 if sign_idx == 0 else +1`` for the signed ops
    and Cutout centre ``center = (cy, cx)``.  Only the ops in ``op_ids`` get a ``lax.switch``
    branch.  Uses the host-built float64 tables (exact path)."""
    _check_image(image)
    h, w, _ = image.shape
    op_ids = tuple(sorted({int(o) for o in op_ids}))
    branches = [_branch(o, h, w) for o in op_ids]
    args = (
        jnp.asarray(mag_idx, jnp.int32),
        jnp.asarray(sign_idx, jnp.int32),
        tuple(jnp.asarray(c, jnp.int32) for c in center),
    )
    if len(branches) == 1:
        return branches[0](image, *args)
    compact = np.zeros((len(OP_NAMES),), np.int32)
    compact[list(op_ids)] = np.arange(len(op_ids))
    return jax.lax.switch(jnp.asarray(compact)[op_id], branches, image, *args)


# Randomness: one ``jax.random.bits`` draw of uint32 words per batch (a single threefry call keeps
# compile time down), turned into the reference's draws word by word.


def _randint(word, n: int):
    """Uniform in {0..n-1} (modulo bias < n / 2**32)."""
    return (word % jnp.uint32(n)).astype(jnp.int32)


def _uniform(word):
    """Uniform in [0, 1) on a 2**-24 grid, like ``random.random()`` for ``u < p`` tests."""
    return jnp.right_shift(word, jnp.uint32(8)).astype(jnp.float32) * jnp.float32(2.0**-24)


def _op_randomness(words, h: int, w: int):
    """(sign_idx, (cy, cx)) from 3 words: ``random.choice([-1, 1])`` and the Cutout centre."""
    return _randint(words[0], 2), (_randint(words[1], h), _randint(words[2], w))


def _apply_in_sequence(image, ops, mags, applied, op_words, op_ids):
    """op[i] (if applied[i]) for i = 0, 1 in order, op i's sign / centre from op_words[i] (3 words).
    A ``lax.scan`` so that the switch over the ops is compiled once, not once per slot."""
    h, w, _ = image.shape

    def body(img, xs):
        o, m, a, words = xs
        sign_idx, center = _op_randomness(words, h, w)
        return jnp.where(a, apply_op(img, o, m, sign_idx, center, op_ids), img), None

    out, _ = jax.lax.scan(body, image, (ops, mags, applied, op_words))
    return out


def _policy_arrays():
    p1 = np.asarray([sp[0] for sp in CIFAR10_POLICY], np.float32)
    o1 = np.asarray([OP_ID[sp[1]] for sp in CIFAR10_POLICY], np.int32)
    m1 = np.asarray([sp[2] for sp in CIFAR10_POLICY], np.int32)
    p2 = np.asarray([sp[3] for sp in CIFAR10_POLICY], np.float32)
    o2 = np.asarray([OP_ID[sp[4]] for sp in CIFAR10_POLICY], np.int32)
    m2 = np.asarray([sp[5] for sp in CIFAR10_POLICY], np.int32)
    return p1, o1, m1, p2, o2, m2


def _check_batch(images_u8):
    if images_u8.ndim != 4 or images_u8.shape[-1] not in (1, 3) or images_u8.dtype != jnp.uint8:
        raise ValueError(
            f"expected a uint8 batch [B, H, W, C] with C in (1, 3), got {images_u8.shape} {images_u8.dtype}"
        )


def cifar10_policy(key, images_u8, *, return_choices: bool = False):
    """AutoAugment ``CIFAR10Policy`` per image of a uint8 batch [B, H, W, C] -> same shape/dtype.

    Each image: one of the 25 sub-policies uniformly (``random.randint(0, 24)``), then op1 if
    ``u1 < p1`` and op2 if ``u2 < p2`` (magnitudes from the AutoAugment tables, random sign where the
    reference draws one).  ``return_choices=True`` also returns, per image, (sub-policy index,
    op1 applied, op2 applied).
    """
    _check_batch(images_u8)
    arrays = _policy_arrays()
    used = tuple(sorted(set(arrays[1].tolist()) | set(arrays[4].tolist())))  # 13 of the 15 ops
    p1, o1, m1, p2, o2, m2 = (jnp.asarray(a) for a in arrays)
    words = jax.random.bits(key, (images_u8.shape[0], 9), jnp.uint32)

    def one(wd, image):
        s = _randint(wd[0], len(CIFAR10_POLICY))
        applied = jnp.stack([_uniform(wd[1]) < p1[s], _uniform(wd[2]) < p2[s]])
        out = _apply_in_sequence(
            image, jnp.stack([o1[s], o2[s]]), jnp.stack([m1[s], m2[s]]), applied, wd[3:].reshape(2, 3), used
        )
        return out, (s, applied[0], applied[1])

    out, choices = jax.vmap(one)(words, images_u8)
    return (out, choices) if return_choices else out


def rand_augment(key, images_u8, *, return_choices: bool = False):
    """jizongFox ``RandAugment()`` (pip ``randaugment==1.0.2``) per image of a uint8 batch.

    The reference draws one of the 135 x 135 ordered pairs of (op, magnitude index) uniformly,
    i.e. op1, m1, op2, m2 independent, ops uniform over the 15 ops (the same op may repeat),
    magnitude index uniform in 1..9, and applies each op with p = 0.5 (``SubPolicy``).
    ``return_choices=True`` also returns, per image, (op1 id, m1, op1 applied, op2 id, m2,
    op2 applied), op ids indexing ``OP_NAMES``.
    """
    _check_batch(images_u8)
    op_table = jnp.asarray([OP_ID[n] for n in RANDAUGMENT_OPS], jnp.int32)
    n_ops, n_mag = len(RANDAUGMENT_OPS), len(RANDAUGMENT_MAGNITUDES)
    words = jax.random.bits(key, (images_u8.shape[0], 12), jnp.uint32)

    def one(wd, image):
        ops = op_table[_randint(wd[0:2], n_ops)]
        mags = _randint(wd[2:4], n_mag) + RANDAUGMENT_MAGNITUDES[0]
        applied = _uniform(wd[4:6]) < RANDAUGMENT_PROB
        out = _apply_in_sequence(image, ops, mags, applied, wd[6:].reshape(2, 3), ALL_OPS)
        return out, (ops[0], mags[0], applied[0], ops[1], mags[1], applied[1])

    out, choices = jax.vmap(one)(words, images_u8)
    return (out, choices) if return_choices else out
