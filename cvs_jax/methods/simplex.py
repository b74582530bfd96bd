"""The d-Simplex family's training terms: CL²R's feature distillation and d-Simplex-HOC's InfoNCE-like term.

All three methods train on the fixed simplex head (``models.simplex_head``).

**CoReS** (NiccoBiondi/cores-compatibility, commit d43845b) adds no term: ``src/cores/train.py`` 19-20 is
cross-entropy on the simplex only, no old model; ``src/cores/main.py`` 73-79 re-creates the network at
every step (``SENet18Cifar(...)``, SGD 0.1, momentum 0.9, weight decay 5e-4) and ``src/cores/utils.py``
173-178 trains on the data of every step so far: a scope policy (retrain from scratch on all data seen).

**CL²R** (NiccoBiondi/CompatibleLifelongRepresentation, commit 8bd438b):

* ``src/cl2r/train.py`` 27-32: on the first ``batch_size // 2`` rows (the memory half) only,
  L_fd = ``cosine_embedding_loss(normalize(f_new), normalize(f_old), 1)`` = mean(1 - cos), added as
  ``loss + criterion_weight * L_fd``; 46-50 the loss itself;
* ``src/cl2r/utils.py`` 124-126: criterion_weight = base * sqrt(new classes / old classes), called at
  ``src/cl2r/main.py`` 123 with (classes seen before, classes of the task); ``config.yml`` 8: base 5;
* ``src/cl2r/utils.py`` 63-68: each batch is ``batch_size // 2`` memory rows then ``batch_size // 2``
  new rows; ``src/cl2r/main.py`` 82-86 and ``config.yml`` 9: a random memory of 20 images per class.

cvs-jax's half-memory batches put the stream first and the memory last (``policies.HalfMemoryEpochs``),
so the memory half is passed as a mask (:func:`memory_half_mask`).

**d-Simplex-HOC** (miccunifi/iamcl2r, commit 18495ac):

* ``src/iamcl2r/methods/hoc.py`` 32-65: with o = normalize(f_old), n = normalize(f_new) (``train.py``
  49-51), S = mu o n^T; L_HOC = mean_i [ -S_ii + logsumexp_j(S_ij * 1[y_i != y_j]) ].  Same-class
  entries, the diagonal included, are multiplied by 0, not removed: each adds exp(0) = 1 inside the
  log-sum-exp (the quirk, kept);
* ``src/iamcl2r/methods/hoc.py`` 10-11: mu = 10, lambda = 0.1; ``train.py`` 53: from the second task on
  L = lambda * CE + (1 - lambda) * L_HOC (the first task: CE alone, 45-48).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cvs_jax.methods.base import StepInputs
from cvs_jax.methods.losses import _row_mean, l2_normalize
from cvs_jax.methods.policies import half_memory_split

CL2R_BASE = 5.0  # config.yml criterion_weight_base
HOC_MU = 10.0  # hoc.py mu_
HOC_LAMBDA = 0.1  # hoc.py lambda_: L = lambda CE + (1 - lambda) L_HOC


def memory_half_mask(batch_size: int, memory_batches: str = "cycle") -> jax.Array:
    """[B] bool, True on the rows a half-memory batch draws from the replay memory (its last rows)."""
    stream, _ = half_memory_split(batch_size, memory_batches)
    return jnp.arange(batch_size) >= stream


def cl2r_weight_scale(new_classes, old_classes) -> jax.Array:
    """sqrt(new classes / old classes): CL²R's lambda without its base; 0 when no class is old."""
    new = jnp.asarray(new_classes, jnp.float32)
    old = jnp.asarray(old_classes, jnp.float32)
    return jnp.where(old > 0, jnp.sqrt(new / jnp.maximum(old, 1.0)), 0.0)


def cl2r_weight(new_classes, old_classes, base: float = CL2R_BASE) -> jax.Array:
    """CL²R's lambda = base * sqrt(new / old) (``utils.update_criterion_weight``)."""
    return base * cl2r_weight_scale(new_classes, old_classes)


def cl2r_distillation_loss(new_emb: jax.Array, old_emb: jax.Array, memory_mask: jax.Array) -> jax.Array:
    """L_fd = mean over the memory rows of 1 - cos(f_new, f_old); gradients reach ``new_emb`` only; 0 when
    no row is memory."""
    n = l2_normalize(new_emb)
    o = jax.lax.stop_gradient(l2_normalize(old_emb))
    mask = jnp.asarray(memory_mask, bool)
    return _row_mean(1.0 - jnp.sum(n * o, axis=-1), mask, jnp.sum(mask))


def hoc_loss(new_emb: jax.Array, old_emb: jax.Array, labels: jax.Array, mu: float = HOC_MU) -> jax.Array:
    """L_HOC with its zeroing quirk: same-class similarities become 0 and stay in the log-sum-exp."""
    o = jax.lax.stop_gradient(l2_normalize(old_emb))
    n = l2_normalize(new_emb)
    sim = jnp.matmul(o, n.T, precision=jax.lax.Precision.HIGHEST) * mu  # sim[i, j] = mu <o_i, n_j>
    labels = jnp.asarray(labels)
    other = labels[:, None] != labels[None, :]
    positive = -jnp.diagonal(sim)
    negative = jax.nn.logsumexp(sim * other, axis=1)
    return jnp.mean(positive + negative)


def cl2r_terms(x: StepInputs, *, memory_batches: str = "cycle"):
    """``extra_terms`` of a ``cl2r`` method (old model, half-memory batches): ``{"L_fd": sqrt(new / old) L_fd}``
    with the weight ``CL2R_BASE``, so that weight x term = lambda L_fd; the class counts come from the
    step's constants (classes introduced this session = valid_classes - old_classes)."""
    mask = memory_half_mask(x.new_emb.shape[0], memory_batches)
    scale = cl2r_weight_scale(x.consts["valid_classes"] - x.consts["old_classes"], x.consts["old_classes"])
    return {"L_fd": scale * cl2r_distillation_loss(x.new_emb, x.old_emb, mask)}


def hoc_terms(x: StepInputs, *, mu: float = HOC_MU):
    """``extra_terms`` of a ``hoc`` method (old model): ``{"L_hoc": L_HOC}``; its weight is 1 - lambda and
    L_c's lambda from the second session on (the step must be able to weight L_c)."""
    return {"L_hoc": hoc_loss(x.new_emb, x.old_emb, x.labels, mu)}
