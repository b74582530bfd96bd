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
  ``src/cl2r/main.py`` 123 with (``memory.seen_classes``: the classes of the earlier tasks' data, 156;
  ``train_task_set.nb_classes``: the classes present in the task's own data); ``config.yml`` 8: base 5
  (``cl2r.class_count="introduced"`` counts the classes introduced instead: 0 new on blurry);
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

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from cvs_jax.errors import ConfigError
from cvs_jax.methods import policies
from cvs_jax.methods.base import Method, StepInputs
from cvs_jax.methods.class_memory import AllSeenMemory, PerClassRandomMemory
from cvs_jax.methods.losses import _row_mean, l2_normalize
from cvs_jax.methods.policies import half_memory_split
from cvs_jax.methods.seams import PolicyView
from cvs_jax.rundir.gallery import Gallery

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


CLASS_COUNTS = ("present", "introduced")  # config.cl2r.class_count


def cl2r_class_counts(plan, train_labels, s: int, count: str = "present") -> tuple[int, int]:
    """``(new, old)`` of CL²R's lambda at session ``s``.

    ``"present"`` (CL²R's code): new = the classes present in the session's own training data
    (``train_task_set.nb_classes``, ``main.py`` 123, taken before the memory is added), old = the classes
    present in the earlier sessions' data (``memory.seen_classes``, 156).  On a general setup old classes
    come back in later sessions and count as new; on blurry every class is present every session.
    ``"introduced"``: the classes first seen this session and the classes seen before (the head's outputs),
    which is 0 new classes on blurry."""
    if count == "introduced":
        old = plan.old_classes(s)
        return plan.sessions[s].num_outputs - old, old
    labels = np.asarray(train_labels)
    earlier = [labels[plan.sessions[j].train] for j in range(s)]
    old = np.unique(np.concatenate(earlier)).size if earlier else 0
    return int(np.unique(labels[plan.sessions[s].train]).size), int(old)


@dataclasses.dataclass(frozen=True)
class Cl2rWeight:
    """CL²R's per-session constant ``cl2r_scale`` = sqrt(new / old) (a ``seams.ConstantsPolicy``); logs the
    session's lambda, and says so when it is 0 (no distillation that session)."""

    count: str = "present"

    def __call__(self, view: PolicyView, gallery: Gallery, s: int = 0) -> dict:
        new, old = cl2r_class_counts(view.plan, view.train_labels, s, self.count)
        scale = float(cl2r_weight_scale(new, old))
        if s > 0:
            counted = "present" if self.count == "present" else "introduced"
            line = f"cl2r: lambda = {CL2R_BASE:g} sqrt({new}/{old}) = {CL2R_BASE * scale:.2f} ({counted} classes)"
            if scale == 0:
                line += "; lambda = 0: no feature distillation this session (cl2r.class_count=present counts the data)"
            view.log(line)
        return {"cl2r_scale": jnp.float32(scale)}


def cl2r_terms(x: StepInputs, *, memory_batches: str = "cycle"):
    """``extra_terms`` of a ``cl2r`` method (old model, half-memory batches): ``{"L_fd": sqrt(new / old) L_fd}``
    with the weight ``CL2R_BASE``, so that weight x term = lambda L_fd; sqrt(new / old) is the step's
    constant ``cl2r_scale`` (:class:`Cl2rWeight`)."""
    assert x.old_emb is not None  # uses_old_model=True: the step passes the old model's rows
    mask = memory_half_mask(x.new_emb.shape[0], memory_batches)
    return {"L_fd": x.consts["cl2r_scale"] * cl2r_distillation_loss(x.new_emb, x.old_emb, mask)}


def hoc_terms(x: StepInputs, *, mu: float = HOC_MU, ce_weight: float = HOC_LAMBDA):
    """``extra_terms`` of a ``hoc`` method (old model):
    ``{"L_hoc": (1 - lambda) L_HOC, "L_c_hoc": -(1 - lambda) L_c}``, both at weight 1.

    The step adds every term to L_c, from the second session on; ``"L_c_hoc"`` leaves lambda L_c of it, so
    the loss is iamcl2r's lambda CE + (1 - lambda) L_HOC with lambda = ``hoc.ce_weight`` alone (one
    setting); ``loss_weights.L_hoc`` multiplies the HOC part on top (1: the paper).  Session 1 is CE
    alone, as ``train.py`` 45-48."""
    assert x.old_emb is not None  # uses_old_model=True: the step passes the old model's rows
    ce = x.classifier.loss(x.head, x.new_emb, x.labels, x.consts["valid_classes"])
    return {
        "L_hoc": (1.0 - ce_weight) * hoc_loss(x.new_emb, x.old_emb, x.labels, mu),
        "L_c_hoc": -(1.0 - ce_weight) * ce,
    }


HALF_BATCHES = "cycle"  # CL²R's and HOC's batches: batch_size // 2 memory rows, the memory cycling


def _per_class(config: ml_collections.ConfigDict, section: str) -> int:
    per_class = config[section].per_class
    if not isinstance(per_class, int) or per_class < 1:
        raise ConfigError(f"{section}.per_class={per_class!r} must be a positive integer (official 20).")
    return per_class


def make_cl2r(config: ml_collections.ConfigDict) -> Method:
    """CL²R on the fixed simplex: random per-class memory, half-memory batches, L_fd on the memory half."""
    per_class = _per_class(config, "cl2r")
    count = config.cl2r.class_count
    if count not in CLASS_COUNTS:
        raise ConfigError(
            f"cl2r.class_count={count!r} is unknown; choose one of {list(CLASS_COUNTS)} "
            "(present: CL²R's code, classes in the session's data)."
        )
    return Method(
        name="cl2r",
        official_head="simplex",
        uses_old_model=True,
        memory=PerClassRandomMemory(per_class),
        batches=policies.HalfMemoryBatches(HALF_BATCHES),
        constants=(Cl2rWeight(count),),
        extra_terms=functools.partial(cl2r_terms, memory_batches=HALF_BATCHES),
        loss_terms={"L_fd": CL2R_BASE},  # weight x term = 5 sqrt(new / old) L_fd
        description=f"CL²R: fixed d-simplex head, {per_class} random images per class, feature distillation",
    )


def make_hoc(config: ml_collections.ConfigDict) -> Method:
    """d-Simplex-HOC: the simplex written from its end, per-class memory, half-memory batches,
    lambda CE + (1 - lambda) L_HOC from the second session on."""
    h = config.hoc
    per_class = _per_class(config, "hoc")
    if not 0 <= h.ce_weight <= 1:
        raise ConfigError(f"hoc.ce_weight={h.ce_weight} (lambda) must lie in [0, 1] (official 0.1).")
    if not h.mu > 0:
        raise ConfigError(f"hoc.mu={h.mu} must be positive (official 10).")
    return Method(
        name="hoc",
        official_head="simplex",
        reverse_labels=True,
        uses_old_model=True,
        memory=PerClassRandomMemory(per_class),
        batches=policies.HalfMemoryBatches(HALF_BATCHES),
        extra_terms=functools.partial(hoc_terms, mu=h.mu, ce_weight=h.ce_weight),
        # both carry (1 - hoc.ce_weight) themselves: the one setting is hoc.ce_weight
        loss_terms={"L_hoc": 1.0, "L_c_hoc": 1.0},
        description=f"d-Simplex-HOC: reversed fixed d-simplex head, lambda={h.ce_weight} CE + L_HOC (mu={h.mu})",
    )


def make_cores(config: ml_collections.ConfigDict) -> Method:
    """CoReS on the fixed simplex: L_c only, every earlier training image replayed (all data seen so far),
    the session's own rows added to the gallery.  The reference re-creates the network at every step;
    here each session starts from the previous model (the engine has no per-session re-initialisation)."""
    return Method(
        name="cores",
        official_head="simplex",
        memory=AllSeenMemory(),
        description="CoReS: fixed d-simplex head, trained on all data seen so far (warm start), no extra term",
    )
