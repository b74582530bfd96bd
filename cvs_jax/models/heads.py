"""Bias-free cosine classifier (the official ``NormLayer``) whose rows grow with the classes.

The head is a plain ``[max_classes, embed_dim]`` array kept next to the network
parameters.  It is allocated for every class the run will ever see so that the
compiled training step keeps one shape across sessions; rows of classes not yet
introduced are masked out of the softmax (``valid_classes``).  When a session
introduces new classes, their rows are re-initialised exactly as the official code
initialises a fresh ``NormLayer`` (uniform +-1/sqrt(embed_dim)) while old rows are
kept (spec §3.1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def init_head(key: jax.Array, num_rows: int, embed_dim: int) -> jax.Array:
    bound = 1.0 / jnp.sqrt(embed_dim)
    return jax.random.uniform(key, (num_rows, embed_dim), jnp.float32, -bound, bound)


def grow_head(head: jax.Array, key: jax.Array, old_classes: int, new_classes: int) -> jax.Array:
    """Re-initialise rows ``old_classes:new_classes``; keep rows below ``old_classes``."""
    if not 0 <= old_classes <= new_classes <= head.shape[0]:
        raise ValueError(f"cannot grow a head of {head.shape[0]} rows from {old_classes} to {new_classes} classes")
    if new_classes == old_classes:
        return head
    fresh = init_head(key, head.shape[0], head.shape[1])
    rows = jnp.arange(head.shape[0])[:, None]
    grown = (rows >= old_classes) & (rows < new_classes)
    return jnp.where(grown, fresh, head)
