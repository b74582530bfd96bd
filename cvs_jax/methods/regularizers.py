"""Parameter-space regularizers of the EWC and RWalk baselines (pure pytree math).

The CVS paper re-runs EWC (Kirkpatrick et al. PNAS 2017) and RWalk (Chaudhry et al. ECCV
2018) with the Rainbow-Memory code base (the author's fork
``bigchou/rainbow-memory`` ``methods/regularization.py``, itself adapted from
GT-RIPL/Continual-Learning-Benchmark). This module only provides the math on parameter
pytrees; which parameters are regularized, when importances are computed and the λ
(``reg_coef``) multiplication are the trainer's job.

What the fork does (read from ``methods/regularization.py``; useful for a faithful trainer):

* ``self.params`` = all trainable parameters EXCEPT the last two named ones (the head);
  pass zero importance (or a sub-pytree) for the parameters that are not regularized.
* Penalty ``reg_coef · Σ_tasks Σ_θ importance · (θ − θ*)²`` -- NO ½ -- with one
  (importance, θ*) slot per finished task (``online`` stream envs keep a single slot).
  :func:`ewc_penalty` is one slot; sum it over the slots.
* EWC importance (``EWC.calculate_importance``, end of each task): model in eval mode, loop
  over the TRAIN loader's mini-batches (not single examples), loss = CE(logits, argmax
  prediction) + the current regularization loss, ``F += grad_batch² · len(x) / N``
  (:func:`cvs_jax.methods.fisher.session_fisher`); with per-example gradients (batch size 1)
  it is the usual diagonal Fisher.
* RWalk Fisher: EWC++ running average of the squared TRAINING-step gradients,
  ``F ← (1−α)F + α g²`` with α = 0.5 and ``F ← g²`` the first time (tensor all zero):
  :func:`update_ewcpp_importance` with ``init_if_zero=True``.
* RWalk score (``RWalk.update_fisher_and_score``): ``s += (g_new − g_old) / (½ F Δθ² + 1e-3)``
  where ``g_old``/``old_params`` are captured with ``p.grad.detach()`` / ``p.detach()``
  BEFORE ``backward()``/``optimizer.step()``. Both are views that share storage with the
  tensors that are then updated in place (PyTorch 1.x ``zero_grad`` zeroes in place and
  backward accumulates in place; SGD steps in place), so in the fork g_new − g_old = 0 and
  Δθ = 0 and the score stays exactly 0: the fork's RWalk is effectively
  "EWC++-Fisher + replay" with importance F, which is what this package reproduces (the
  RWalk paper's path-integral score is not implemented).
* Importance at the end of a task: ``F + s`` with s averaged ½(s_prev + s_task) from the
  second task on, no normalization (the paper / official RWalk code min-max normalizes F
  and s); with s = 0 that is F.

All functions are pure ``jnp`` over pytrees (``jax.tree_util``), jit-able; anchors and
importances are treated as constants (``stop_gradient``).
"""

from __future__ import annotations

from typing import cast

import jax
import jax.numpy as jnp

tree_map = jax.tree_util.tree_map
tree_leaves = jax.tree_util.tree_leaves
sg = jax.lax.stop_gradient


# --------------------------------------------------------------------------
# EWC penalty, EWC++ running Fisher
# --------------------------------------------------------------------------


def ewc_penalty(params, anchor_params, importance) -> jax.Array:
    """Σ_leaves Σ_entries importance · (θ − θ*)²  (no ½; the caller multiplies by λ).

    Formula of Rainbow-Memory's ``L2.regularization_loss`` (shared by EWC and RWalk):
    ``task_reg_loss += (importance[n] * (p - task_param[n]) ** 2).sum()``; the ½ of the
    EWC paper is absorbed into λ there. ``params``, ``anchor_params`` (θ*, the parameters
    at the end of the previous task) and ``importance`` must share one pytree structure;
    gradients flow to ``params`` only. Zero exactly at ``params == anchor_params``.
    """
    terms = tree_map(
        lambda p, a, f: jnp.sum(sg(f) * (p - sg(a)) ** 2),
        params,
        anchor_params,
        importance,
    )
    leaves = tree_leaves(terms)
    if not leaves:
        return jnp.zeros(())
    return cast(jax.Array, sum(leaves[1:], leaves[0]))  # arrays, started from one


def update_ewcpp_importance(importance, grads, alpha: float = 0.5, init_if_zero: bool = False):
    """EWC++ running Fisher (Chaudhry et al. ECCV 2018): F ← α · g² + (1 − α) · F.

    ``grads`` = the gradient pytree of the current step (or a per-step Fisher estimate's
    square root -- the update squares it). ``init_if_zero=True`` reproduces the
    Rainbow-Memory fork: a leaf whose running Fisher is still all zero is SET to g²
    (``if (epoch_fisher == 0).all(): epoch_fisher = new_grad ** 2``), per leaf. α = 0.5 is
    the fork's (and the official RWalk code's) value.
    """

    def leaf(f, g):
        g2 = sg(g) ** 2
        upd = alpha * g2 + (1.0 - alpha) * f
        if init_if_zero:
            upd = jnp.where(jnp.all(f == 0), g2, upd)
        return upd

    return tree_map(leaf, importance, grads)


def slots_penalty(params, slots) -> jax.Array:
    """Σ_slots :func:`ewc_penalty` over ``slots`` = ``({"importance", "anchor"}, ...)``: the fork keeps one
    slot per finished task (``regularization_terms[task]``); 0 for no slots."""
    total = jnp.zeros(())
    for slot in slots:
        total = total + ewc_penalty(params, slot["anchor"], slot["importance"])
    return total


__all__ = [
    "ewc_penalty",
    "slots_penalty",
    "update_ewcpp_importance",
]
