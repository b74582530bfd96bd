"""Parameter-space regularizers of the EWC and RWalk baselines (pure pytree math).

The CVS paper re-runs EWC (Kirkpatrick et al. PNAS 2017) and RWalk (Chaudhry et al. ECCV
2018) with the Rainbow-Memory code base (spec Sec. 6; the author's fork
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
  prediction) + the current regularization loss, ``F += grad_batch² · len(x) / N``.
  That is ``fisher_diagonal(stacked_batch_grads, weights=batch_sizes / N)``; with
  per-example gradients (batch size 1) it is the usual diagonal Fisher.
* RWalk Fisher: EWC++ running average of the squared TRAINING-step gradients,
  ``F ← (1−α)F + α g²`` with α = 0.5 and ``F ← g²`` the first time (tensor all zero):
  :func:`update_ewcpp_importance` with ``init_if_zero=True``.
* RWalk score (``RWalk.update_fisher_and_score``): ``s += (g_new − g_old) / (½ F Δθ² + 1e-3)``
  where ``g_old``/``old_params`` are captured with ``p.grad.detach()`` / ``p.detach()``
  BEFORE ``backward()``/``optimizer.step()``. Both are views that share storage with the
  tensors that are then updated in place (PyTorch 1.x ``zero_grad`` zeroes in place and
  backward accumulates in place; SGD steps in place), so in the fork g_new − g_old = 0 and
  Δθ = 0 and the score stays exactly 0: the fork's RWalk is effectively
  "EWC++-Fisher + replay" with importance F. To reproduce the fork use
  ``rwalk_importance(fisher, zeros, normalize=False)``; the functions below implement the
  RWalk paper's intended formula.
* Importance at the end of a task: ``F + s`` with s averaged ½(s_prev + s_task) from the
  second task on, no normalization (the paper / official RWalk code normalizes, see
  :func:`rwalk_importance`).

All functions are pure ``jnp`` over pytrees (``jax.tree_util``), jit-able; anchors and
importances are treated as constants (``stop_gradient``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

tree_map = jax.tree_util.tree_map
tree_leaves = jax.tree_util.tree_leaves
sg = jax.lax.stop_gradient

# RWalk damping in the score denominator (Rainbow-Memory fork: epsilon=0.001; official
# RWalk/A-GEM code: PARAM_XI_STEP = 1e-3).
RWALK_EPS = 1e-3


# --------------------------------------------------------------------------
# EWC
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
    return sum(leaves[1:], leaves[0])


def fisher_diagonal(per_example_grads, weights=None):
    """Diagonal (empirical) Fisher from stacked gradients: F = Σ_i w_i · g_i².

    ``per_example_grads``: pytree whose leaves carry a leading axis of size m (e.g. from
    ``jax.vmap(jax.grad(loss))`` over examples). ``weights`` [m] defaults to 1/m, i.e.
    F = mean_i g_i² (the EWC paper's diagonal Fisher when g_i is the gradient of
    −log p(ŷ_i|x_i) for one example). Rainbow-Memory's estimate uses mini-batch MEAN
    gradients g_b and ``weights = n_b / N`` (``p += grad² · len(x) / len(dataset)``);
    pass those to reproduce it. Which label is used (argmax prediction in Rainbow,
    ``empFI=False``; ground truth for the empirical Fisher) is the gradient producer's choice.
    """

    def leaf(g):
        m = g.shape[0]
        w = jnp.full((m,), 1.0 / m, g.dtype) if weights is None else jnp.asarray(weights, g.dtype)
        return jnp.tensordot(w, g * g, axes=1)

    return tree_map(leaf, per_example_grads)


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


# --------------------------------------------------------------------------
# RWalk
# --------------------------------------------------------------------------


def rwalk_update_score(score, grads, params_before, params_after, fisher, eps: float = RWALK_EPS):
    """One optimizer step of RWalk's path-integral importance (Chaudhry et al. ECCV 2018):

        Δθ = θ_after − θ_before
        s  ← s + ( −g ⊙ Δθ ) / ( ½ · F ⊙ Δθ² + ε )

    −g·Δθ is the first-order loss decrease of the step, ½FΔθ² the KL distance it moved in
    the Riemannian (Fisher) metric. ``grads`` g = gradient used for the step (the task
    loss gradient, evaluated at ``params_before``), ``fisher`` F = the running EWC++ Fisher
    (the Rainbow fork divides by the Fisher BEFORE this step's EWC++ update; the caller
    decides which one to pass), ε = 1e-3. Negative contributions are kept here and clipped
    at importance time (:func:`rwalk_importance`, ``relu=True``). All inputs are constants.
    """

    def leaf(s, g, p0, p1, f):
        d = sg(p1) - sg(p0)
        return s + (-sg(g) * d) / (0.5 * sg(f) * d * d + eps)

    return tree_map(leaf, score, grads, params_before, params_after, fisher)


def _minmax_normalize(tree, eps: float):
    leaves = tree_leaves(tree)
    if not leaves:
        return tree
    lo = jnp.min(jnp.stack([jnp.min(x) for x in leaves]))
    hi = jnp.max(jnp.stack([jnp.max(x) for x in leaves]))
    return tree_map(lambda x: (x - lo) / (hi - lo + eps), tree)


def rwalk_importance(
    fisher,
    score,
    prev_score=None,
    normalize: bool = True,
    relu: bool = True,
    norm_eps: float = 1e-32,
):
    """RWalk importance at the end of a task (Chaudhry et al. ECCV 2018):

        s_task = max(s, 0)                        (``relu``: only positive contributions)
        s̄      = ½ (s_prev + s_task)              (if ``prev_score`` is given, i.e. task ≥ 2)
        Ω      = N(F) + N(s̄)                     penalty λ Σ Ω (θ − θ*)² (:func:`ewc_penalty`)

    N = min-max normalization to [0, 1] over ALL leaves jointly,
    N(x) = (x − min x) / (max x − min x + ``norm_eps``), as the official RWalk code
    (facebookresearch/agem ``normalize_fisher_at_minima`` / ``normalize_scores``, with
    ``EPSILON = 1e-32``) does so that Fisher and score are commensurate.
    ``normalize=False`` gives Ω = F + s̄ (Rainbow-Memory fork, which also does not clip;
    use ``relu=False`` there).

    Returns ``(importance, s̄)``: keep s̄ (un-normalized) as ``prev_score`` for the next task
    and reset the running score to zero.
    """
    s = tree_map(lambda x: jnp.maximum(sg(x), 0.0), score) if relu else tree_map(sg, score)
    if prev_score is not None:
        s = tree_map(lambda p, x: 0.5 * (sg(p) + x), prev_score, s)
    f = tree_map(sg, fisher)
    if normalize:
        fn, sn = _minmax_normalize(f, norm_eps), _minmax_normalize(s, norm_eps)
    else:
        fn, sn = f, s
    importance = tree_map(lambda a, b: a + b, fn, sn)
    return importance, s


__all__ = [
    "ewc_penalty",
    "fisher_diagonal",
    "update_ewcpp_importance",
    "rwalk_update_score",
    "rwalk_importance",
]
