"""The fixed d-simplex classifier of CoReS, CL²R and d-Simplex-HOC: K unit rows, pairwise cosine -1/(K-1).

``dsimplex()`` is the same function in the three reference repositories (NiccoBiondi/cores-compatibility
``src/cores/model.py`` 136-148, NiccoBiondi/CompatibleLifelongRepresentation ``src/cl2r/model.py`` 146-158,
miccunifi/iamcl2r ``src/iamcl2r/models/__init__.py`` 107-119): for K classes and n = K - 1, T =
[I_n ; ((1 - sqrt(1 + n)) / n) 1^T], its columns centred, its rows divided by (L2 norm + 1e-8).

The head is never trained, grown or reset: the reference code copies the rows into a bias-free
``nn.Linear`` with ``requires_grad = False`` (cores ``model.py`` 153-155; iamcl2r
``models/__init__.py`` 161-165), K preallocated for the whole run (CoReS 100 rows for 99-d features,
iamcl2r 1,024 rows, ``methods/hoc.py`` 9).  Logits are z W^T on the unnormalised feature z
(cores ``model.py`` 128-133), cross-entropy over all K rows, none masked (cores ``main.py`` 80 and
``train.py`` 20; iamcl2r ``train.py`` 43); retrieval uses normalize(z) (cores ``utils.py`` 26).

Here the K rows are stored as the head's array (``"head"``, [K, D]) so that checkpoints, exports and the
row bookkeeping of the engine see them; D may exceed K - 1, and the columns past K - 1 are zero (the
reference projects to exactly K - 1; see :func:`check_simplex_width`).  The logits read the rows through
``stop_gradient`` and the optimizer must label the array ``"frozen"`` (:func:`optimizer_labels`): a
zero gradient alone still lets weight decay shrink the rows.

``reverse_labels=True`` is iamcl2r's target transform (``dataset/__init__.py`` 42: y' = K - 1 - y, the
classes written from the end of the simplex); logits column y is still class y.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from cvs_jax.errors import ConfigError
from cvs_jax.models import classification

SIMPLEX_EPS = 1e-8  # t.div_(torch.norm(t, p=2, dim=1, keepdim=True) + 1e-8)


def dsimplex(num_rows: int) -> np.ndarray:
    """The reference ``dsimplex(num_classes=K)``: [K, K - 1] float64, unit rows, pairwise cosine -1/(K-1)."""
    if num_rows < 2:
        raise ValueError(f"a d-simplex needs at least 2 rows, not {num_rows}")
    n = num_rows - 1
    t = np.zeros((n + 1, n), np.float64)
    t[:-1] = np.eye(n)
    t[-1, :] += (1.0 - np.sqrt(1.0 + n)) / n
    t -= t.mean(axis=0)
    return t / (np.linalg.norm(t, axis=1, keepdims=True) + SIMPLEX_EPS)


def check_simplex_width(embed_dim: int, num_rows: int) -> None:
    """Refuses an embedding narrower than the simplex needs (K rows live in K - 1 dimensions)."""
    if embed_dim < num_rows - 1:
        raise ConfigError(
            f"model.embed_dim={embed_dim} is too narrow for a fixed d-simplex head of {num_rows} rows: "
            f"it needs model.embed_dim >= {num_rows - 1} (the rows are preallocated for every class of the "
            f"run's plan); set --config.model.embed_dim={num_rows - 1} or more, or use a run with fewer classes."
        )


def simplex_rows(num_rows: int, embed_dim: int) -> jax.Array:
    """The K simplex rows as a [K, embed_dim] float32 array, zero past column K - 2."""
    check_simplex_width(embed_dim, num_rows)
    rows = np.zeros((num_rows, embed_dim), np.float32)
    rows[:, : num_rows - 1] = dsimplex(num_rows)
    return jnp.asarray(rows)


@dataclasses.dataclass(frozen=True)
class SimplexHead:
    """The fixed d-simplex head (``models.heads`` Head protocol); ``trainable = False``."""

    reverse_labels: bool = False
    name: ClassVar[str] = "simplex"
    keys: ClassVar[tuple[str, ...]] = ("head",)
    trainable: ClassVar[bool] = False

    def init(self, key: jax.Array, rows: int, embed_dim: int) -> dict:
        """The rows; ``key`` is unused (nothing is random)."""
        return {"head": simplex_rows(rows, embed_dim)}

    def logits(self, head: Mapping[str, jax.Array], emb: jax.Array) -> jax.Array:
        """z W^T on the raw embedding, [n, K]; column y is class y (row K - 1 - y when reversed)."""
        w = jax.lax.stop_gradient(head["head"])
        if self.reverse_labels:
            w = w[::-1]
        return jnp.matmul(emb, w.T, precision=jax.lax.Precision.HIGHEST)

    def loss(self, head: Mapping[str, jax.Array], emb, labels, valid_classes) -> jax.Array:
        """Cross-entropy over all K rows: the references mask none (``valid_classes`` is not used)."""
        return classification.cross_entropy_loss(self.logits(head, emb), labels, None)

    def at_session_start(self, head: Mapping[str, jax.Array], key, old_classes: int, new_classes: int) -> dict:
        """The rows as they are: never grown, never reset."""
        rows = head["head"].shape[0]
        if not 0 <= old_classes <= new_classes <= rows:
            raise ValueError(f"cannot hold {new_classes} classes in a simplex of {rows} rows")
        return dict(head)


def optimizer_labels(head: Any, labels: Mapping[str, Any]) -> dict:
    """``labels`` (``"train"`` / ``"frozen"`` per leaf, as ``models.frozen_mask``) with the arrays of a
    head that is not trainable marked ``"frozen"``: ``train_step.make_optimizer`` gives them zero updates."""
    out = dict(labels)
    if not getattr(head, "trainable", True):
        for key in head.keys:
            out[key] = jax.tree.map(lambda _: "frozen", out[key])
    return out
