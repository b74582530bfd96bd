"""LCE (ICCV 2021): align the classifier with the old class centres and keep features inside the old boundaries.

Transcribed from IrvingMeng/LCE (commit bb087e5):

* ``main.py`` 326-343 (``save_lcefeat``): with the old model's L2-normalised features f̂ of class k,
  c_k = normalize(mean f̂) and theta_k = min_i <f̂_i, c_k>; 125 the centres are normalised again on load;
* ``main.py`` 206: L_align = ``F.mse_loss(normalize(W), C_old)`` (mean over every entry) for the
  classifier's weights W; the code needs as many head rows as centres;
* ``main.py`` 207-212: cos = clamp(f C_old^T, -1, 1) on the raw feature f (the model's BN output,
  ``models/ResNet.py`` 21-27, not normalised), L_bound = mean_i max(theta_{y_i} - cos_{i, y_i}, 0);
* ``main.py`` 213: L = L_cls + lambda_a L_align + lambda_b L_bound; ``main.py`` 41-42 and
  ``configs/default.py`` 113-114: lambda_a = 100, lambda_b = 1.

In CVS's setting the old model's features of old classes are the stored gallery rows of earlier sessions
(as L_d's centres, ``policies.ClassCenters``): no old images and no old model in the step.  Classes
without a stored row have no centre: their head rows are left out of L_align and their samples out of
L_bound (the mean is over the rest), where LCE's code assumes every class has one.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from cvs_jax.methods.base import Method, StepInputs
from cvs_jax.methods.losses import _np_l2_normalize, _row_mean, l2_normalize
from cvs_jax.methods.seams import PolicyView
from cvs_jax.rundir.gallery import Gallery

LAMBDA_ALIGN = 100.0  # configs/default.py LCE.LAMBDA_A
LAMBDA_BOUND = 1.0  # configs/default.py LCE.LAMBDA_B
_BLOCK = 1 << 18  # gallery rows read at a time


def centres_and_boundaries(gallery_embeddings, gallery_labels, num_classes: int):
    """``(centres [K, D] float32, boundaries [K] float32, mask [K] bool)`` from stored rows: c_k the
    normalised mean of the normalised rows of class k, theta_k the smallest cosine of a row of class k to
    c_k; classes without a row get zeros and mask False.  Rows are read in blocks (two passes)."""
    labels = np.asarray(gallery_labels).reshape(-1).astype(np.int64)
    n = labels.shape[0]
    if len(gallery_embeddings.shape) != 2 or gallery_embeddings.shape[0] != n:
        raise ValueError("gallery_embeddings must be [N, D] with one label per row")
    if n and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"gallery labels must lie in [0, {num_classes})")
    d = gallery_embeddings.shape[1]
    sums = np.zeros((num_classes, d), np.float64)
    for start in range(0, n, _BLOCK):
        block = _np_l2_normalize(np.asarray(gallery_embeddings[start : start + _BLOCK], np.float64))
        np.add.at(sums, labels[start : start + _BLOCK], block)
    mask = np.bincount(labels, minlength=num_classes) > 0
    centres = np.where(mask[:, None], _np_l2_normalize(sums), 0.0)
    bounds = np.full(num_classes, np.inf)
    for start in range(0, n, _BLOCK):
        block = _np_l2_normalize(np.asarray(gallery_embeddings[start : start + _BLOCK], np.float64))
        rows = labels[start : start + _BLOCK]
        np.minimum.at(bounds, rows, np.sum(block * centres[rows], axis=1))
    bounds = np.where(mask, bounds, 0.0)
    return centres.astype(np.float32), bounds.astype(np.float32), mask


@dataclasses.dataclass(frozen=True)
class ClassBoundaries:
    """LCE's constants for the step (a ``seams.ConstantsPolicy``): centres, boundaries and their mask
    from the stored gallery rows of the earlier sessions."""

    normalize_features: bool = False  # lce.normalize_features: what the logged line calls the term's feature

    def __call__(self, view: PolicyView, gallery: Gallery, s: int = 0) -> dict:
        centres, bounds, mask = centres_and_boundaries(gallery.embeddings, gallery.labels, view.num_classes)
        if len(gallery):
            view.log(boundary_line(gallery.embeddings, gallery.labels, centres, bounds, self.normalize_features))
        return {
            "lce_centres": jnp.asarray(centres),
            "lce_boundaries": jnp.asarray(bounds),
            "lce_mask": jnp.asarray(mask),
        }


def boundary_activity(gallery_embeddings, gallery_labels, centres, bounds, normalize: bool) -> tuple[float, float]:
    """``(share of the stored rows inside the hinge, mean row norm)``: the rows r of old classes with
    theta_y - clamp(<f, c_y>, -1, 1) > 0, f = r (LCE's code) or normalize(r).  The stored rows are the old
    model's features, so this is L_bound's activity where the new model starts; with the normalised
    feature it is 0 by construction (theta_y is the smallest cosine), with the raw one it is 0 once
    |r| cos(r, c_y) >= 1 saturates the clamp."""
    labels = np.asarray(gallery_labels).reshape(-1).astype(np.int64)
    active, norms = 0, []
    for start in range(0, labels.shape[0], _BLOCK):
        rows = np.asarray(gallery_embeddings[start : start + _BLOCK], np.float64)
        norms.append(np.linalg.norm(rows, axis=1))
        f = _np_l2_normalize(rows) if normalize else rows
        y = labels[start : start + _BLOCK]
        cos = np.clip(np.sum(f * centres[y], axis=1), -1.0, 1.0)
        active += int(np.sum(bounds[y] - cos > 1e-6))
    norm = float(np.mean(np.concatenate(norms))) if norms else 0.0
    return active / max(labels.shape[0], 1), norm


def boundary_line(gallery_embeddings, gallery_labels, centres, bounds, normalize: bool) -> str:
    """The log's line on L_bound at a session's start (:func:`boundary_activity`)."""
    share, norm = boundary_activity(gallery_embeddings, gallery_labels, centres, bounds, normalize)
    feature = "normalised feature" if normalize else "raw feature, as LCE's code"
    line = f"lce: L_bound ({feature}) active on {100 * share:.1f}% of the stored rows (mean norm {norm:.2f})"
    if share == 0 and not normalize:
        line += "; the clamp saturates: the term is 0 unless the new features leave the boundary (metrics L_bound)"
    return line


def lce_align_loss(head_rows: jax.Array, centres: jax.Array, mask: jax.Array) -> jax.Array:
    """L_align = mean over the entries of the rows with a centre of (normalize(w_k) - c_k)^2."""
    w = l2_normalize(head_rows)
    c = jax.lax.stop_gradient(jnp.asarray(centres, w.dtype))
    mask = jnp.asarray(mask, bool)
    sq = jnp.sum((w - c) ** 2, axis=-1)
    return _row_mean(sq, mask, jnp.sum(mask) * w.shape[1])


def lce_boundary_loss(
    new_emb: jax.Array,
    labels: jax.Array,
    centres: jax.Array,
    boundaries: jax.Array,
    mask: jax.Array,
    *,
    normalize_features: bool = False,
) -> jax.Array:
    """L_bound = mean over the samples whose class has a centre of max(theta_y - clamp(<f, c_y>, -1, 1), 0).

    ``f`` is the raw embedding as in LCE's code; ``normalize_features=True`` takes the cosine the paper
    writes."""
    f = l2_normalize(new_emb) if normalize_features else new_emb
    labels = jnp.asarray(labels).astype(jnp.int32)
    c = jax.lax.stop_gradient(jnp.take(jnp.asarray(centres, f.dtype), labels, axis=0, mode="clip"))
    theta = jnp.take(jnp.asarray(boundaries, f.dtype), labels, mode="clip")
    sel = jnp.take(jnp.asarray(mask, bool), labels, mode="clip")
    cos = jnp.clip(jnp.sum(f * c, axis=-1), -1.0, 1.0)
    return _row_mean(jnp.maximum(theta - cos, 0.0), sel, jnp.sum(sel))


def lce_terms(x: StepInputs, *, normalize_features: bool = False):
    """``extra_terms`` of an ``lce`` method (constants from :class:`ClassBoundaries`, no old model):
    ``{"L_align", "L_bound"}``, weights ``LAMBDA_ALIGN`` and ``LAMBDA_BOUND``.  L_align reads the head's
    ``"head"`` rows (the cosine head's class weights)."""
    c, theta, mask = x.consts["lce_centres"], x.consts["lce_boundaries"], x.consts["lce_mask"]
    return {
        "L_align": lce_align_loss(x.head["head"], c, mask),
        "L_bound": lce_boundary_loss(x.new_emb, x.labels, c, theta, mask, normalize_features=normalize_features),
    }


def make_lce(config: ml_collections.ConfigDict) -> Method:
    """The ``lce`` method: L_c + L_align + L_bound from the stored rows, no old model, no replay;
    settings ``config.lce``."""
    return Method(
        name="lce",
        constants=(ClassBoundaries(config.lce.normalize_features),),
        extra_terms=functools.partial(lce_terms, normalize_features=config.lce.normalize_features),
        loss_terms={"L_align": LAMBDA_ALIGN, "L_bound": LAMBDA_BOUND},
        description="LCE: head rows aligned to the old class centres, features kept inside their boundaries",
    )
