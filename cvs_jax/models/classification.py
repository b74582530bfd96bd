"""The head's classification loss L_c and the logits it reads (ivclab/CVS ``models/normlayer.py``,
``train.py`` 243-244; the fork's plain cross-entropy): what ``heads`` train with.  Pure ``jnp`` with
static shapes, so they live inside the jitted step; ``methods.losses`` builds the other terms on them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def safe_norm(x: jax.Array, axis: int = -1) -> jax.Array:
    """Euclidean norm whose gradient at 0 is 0 instead of NaN (torch behaviour)."""
    sq = jnp.sum(x * x, axis=axis)
    pos = sq > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, sq, 1.0)), 0.0)


def l2_normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
    """Row-wise ``x / max(||x||_2, eps)``, i.e. ``F.normalize(x, p=2, dim=-1)``."""
    norm = safe_norm(x, axis=-1)[..., None]
    return x / jnp.maximum(norm, eps)


def mean_or_zero(values: jax.Array) -> jax.Array:
    """Mean of all entries (sum / count), exactly 0 for an empty array, like :func:`_row_mean`."""
    if values.size == 0:
        return jnp.zeros((), values.dtype)
    return jnp.sum(values) / values.size


def cosine_logits(embeddings: jax.Array, class_weights: jax.Array) -> jax.Array:
    """``NormLayer`` output: cos(e_i, w_k) = ê_i · ŵ_k, no bias. Shapes [n,d],[K,d] -> [n,K]."""
    # HIGHEST: exact f32 on GPUs too (the default there is TF32, ~3e-4 relative error); the matmul is tiny.
    return jnp.matmul(l2_normalize(embeddings), l2_normalize(class_weights).T, precision=jax.lax.Precision.HIGHEST)


def masked_nll(logits: jax.Array, labels: jax.Array, valid_classes: jax.Array | int | None) -> jax.Array:
    """Per-row ``CrossEntropy(logits, y)`` [n] over the columns < ``valid_classes`` (the others masked
    to -inf, as if the head had exactly that many rows); +inf for a label >= valid_classes."""
    if valid_classes is not None:
        k = jnp.arange(logits.shape[-1])
        logits = jnp.where(k[None, :] < valid_classes, logits, -jnp.inf)
    logp = jax.nn.log_softmax(logits, axis=-1)
    labels = jnp.asarray(labels)
    return -jnp.take_along_axis(logp, labels[:, None].astype(jnp.int32), axis=1, mode="clip")[:, 0]


def cross_entropy_loss(logits: jax.Array, labels: jax.Array, valid_classes: jax.Array | int | None = None) -> jax.Array:
    """Plain ``CrossEntropyLoss(logits, y)``, mean over the batch, columns >= ``valid_classes`` masked
    (the fork's linear head: no normalisation, no temperature)."""
    return mean_or_zero(masked_nll(logits, labels, valid_classes))


def _softmax_nll(
    embeddings: jax.Array,
    class_weights: jax.Array,
    labels: jax.Array,
    temperature: float,
    valid_classes: jax.Array | int | None,
) -> jax.Array:
    """Per-row ``CrossEntropy(NormLayer(e) / temperature, y)`` [n]; +inf for a label >= valid_classes."""
    return masked_nll(cosine_logits(embeddings, class_weights) / temperature, labels, valid_classes)


def normalized_softmax_loss(
    embeddings: jax.Array,
    class_weights: jax.Array,
    labels: jax.Array,
    temperature: float = 0.05,
    valid_classes: jax.Array | int | None = None,
) -> jax.Array:
    """Official L_c: ``CrossEntropyLoss(NormLayer(e) / 0.05, y)``, mean over the batch.

    ``valid_classes`` (int scalar, may be traced) masks head rows >= valid_classes to
    -inf, which equals the official loss on a head with exactly ``class_list[s]`` rows
    while keeping the allocated head (and the jit shapes) fixed.
    """
    return mean_or_zero(_softmax_nll(embeddings, class_weights, labels, temperature, valid_classes))
