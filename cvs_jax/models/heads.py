"""Classifier heads over the embedding: the official cosine ``NormLayer`` and the fork's linear reset.

Retrieval never uses a head (it searches the embedding); a head exists to train the embedding, and
what it does at a session start changes what the embedding learns.  Three heads, chosen by
``config.model.head`` (``"official"``: the head the method's reference code trains with):

* ``cosine`` (ivclab/CVS ``NormLayer``): bias-free, logits cos(e, w_k) / T.  Rows of
  classes not yet introduced are masked out of the softmax; a session that introduces classes
  re-initialises their rows (uniform +-1/sqrt(D), as a fresh ``NormLayer``) and keeps the old rows.
* ``linear_reset`` (the author's fork for EWC, RWalk and Rainbow): a plain
  ``Linear(D, classes seen)`` with bias on the raw embedding, plain cross-entropy (no
  normalisation, no temperature), **every row and the bias re-initialised at every session start**
  (PyTorch's default ``nn.Linear`` init, uniform +-1/sqrt(D)); old rows are not kept.
* ``simplex`` (CoReS, CL²R, d-Simplex-HOC; ``models.simplex_head``): K fixed d-simplex rows, logits
  z W^T on the raw embedding over all K rows, never trained, grown or reset (the optimizer gives its
  array a zero update: ``simplex_head.optimizer_labels``).

``make_head`` (``models.head_choice``) builds the head a name chooses; ``Head`` is what every head
provides, a Protocol so that this module, imported low in the package, need not import each head.

The head is a few arrays kept next to the network parameters (``Head.keys``), allocated for every
class the run will see so that the compiled step keeps one shape across sessions.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Mapping, Protocol

import jax
import jax.numpy as jnp

from cvs_jax.models import classification

HEADS = ("cosine", "linear_reset", "simplex")


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


@dataclasses.dataclass(frozen=True)
class CosineHead:
    """The official ``NormLayer`` at temperature ``temperature`` (0.05)."""

    temperature: float
    name: ClassVar[str] = "cosine"
    keys: ClassVar[tuple[str, ...]] = ("head",)
    trainable: ClassVar[bool] = True

    def init(self, key: jax.Array, rows: int, embed_dim: int) -> dict:
        return {"head": init_head(key, rows, embed_dim)}

    def logits(self, head: Mapping[str, jax.Array], emb: jax.Array) -> jax.Array:
        """What the softmax sees: cos(e, w_k) / T, [n, K]."""
        return classification.cosine_logits(emb, head["head"]) / self.temperature

    def loss(self, head: Mapping[str, jax.Array], emb, labels, valid_classes) -> jax.Array:
        return classification.normalized_softmax_loss(emb, head["head"], labels, self.temperature, valid_classes)

    def at_session_start(self, head: Mapping[str, jax.Array], key, old_classes: int, new_classes: int) -> dict:
        """New classes get fresh rows; the rows of classes seen before are kept."""
        return {"head": grow_head(head["head"], key, old_classes, new_classes)}


@dataclasses.dataclass(frozen=True)
class LinearResetHead:
    """The fork's ``nn.Linear(D, n_seen)`` with bias, plain cross-entropy, new at every session."""

    name: ClassVar[str] = "linear_reset"
    keys: ClassVar[tuple[str, ...]] = ("head", "head_bias")
    trainable: ClassVar[bool] = True

    def init(self, key: jax.Array, rows: int, embed_dim: int) -> dict:
        k_w, k_b = jax.random.split(key)
        bound = 1.0 / jnp.sqrt(embed_dim)  # torch.nn.Linear: kaiming_uniform(a=sqrt 5) = U(+-1/sqrt(in)), bias too
        return {
            "head": init_head(k_w, rows, embed_dim),
            "head_bias": jax.random.uniform(k_b, (rows,), jnp.float32, -bound, bound),
        }

    def logits(self, head: Mapping[str, jax.Array], emb: jax.Array) -> jax.Array:
        """e W^T + b on the raw embedding, [n, K]."""
        # HIGHEST: exact f32 on GPUs too, as cosine_logits; the matmul is tiny.
        return jnp.matmul(emb, head["head"].T, precision=jax.lax.Precision.HIGHEST) + head["head_bias"]

    def loss(self, head: Mapping[str, jax.Array], emb, labels, valid_classes) -> jax.Array:
        return classification.cross_entropy_loss(self.logits(head, emb), labels, valid_classes)

    def at_session_start(self, head: Mapping[str, jax.Array], key, old_classes: int, new_classes: int) -> dict:
        """Every row and the bias drawn afresh, whatever the classes (the fork's ``before_task``)."""
        rows, embed_dim = head["head"].shape
        if not 0 <= old_classes <= new_classes <= rows:
            raise ValueError(f"cannot hold {new_classes} classes in a head of {rows} rows")
        return self.init(key, rows, embed_dim)


class Head(Protocol):
    """What the engine and the methods read of a head (``CosineHead``, ``LinearResetHead``,
    ``simplex_head.SimplexHead``)."""

    name: ClassVar[str]
    keys: ClassVar[tuple[str, ...]]  # its arrays in the parameters, each with a row per class
    trainable: ClassVar[bool]  # False: the optimizer gives its arrays a zero update

    def init(self, key: jax.Array, rows: int, embed_dim: int) -> dict: ...

    def logits(self, head: Mapping[str, jax.Array], emb: jax.Array) -> jax.Array: ...

    def loss(self, head: Mapping[str, jax.Array], emb, labels, valid_classes) -> jax.Array: ...

    def at_session_start(self, head: Mapping[str, jax.Array], key, old_classes: int, new_classes: int) -> dict: ...


# every head array: a row per class (the simplex head's one array is "head" too)
ROW_KEYS = tuple(dict.fromkeys(CosineHead.keys + LinearResetHead.keys))


def net_variables(params, batch_stats) -> dict:
    """The Flax variables of the embedding network alone (the cosine head and method extras left out)."""
    return {"params": params["net"], "batch_stats": batch_stats}


def head_params(head: Head, params: Mapping[str, jax.Array]) -> dict:
    """The head's arrays out of a parameter dict that also holds the network and method extras."""
    return {k: params[k] for k in head.keys}
