"""Parameter importance (diagonal Fisher) of the previous session's model, for EWC and RWalk.

Computed once at the start of each session from the previous session's training
images (no augmentation, BatchNorm on running statistics) with the previous selected
model, so that it is a pure function of a completed session: a resumed run and a run
that shares session 1 with another method compute the same values.
* ``ewc``: F = sum_b g_b^2 * n_b / N with labels = the model's own predictions
  (Rainbow-Memory's ``EWC.calculate_importance``);
* ``rwalk``: EWC++ running average F <- 0.5 g_b^2 + 0.5 F over the batches with the
  true labels (the fork's training-time Fisher, replayed over the session's batches),
  continued across sessions.
The trainer divides either by its maximum before use when ``importance.normalize`` (the
default, as in the RWalk paper): unnormalised, RWalk's reached 1.6 and made SGD with
momentum diverge at weight 10, and EWC diverged in one of two H100 runs of the demo.
The network is regularized, the head is not (the fork excludes its head).  The loss, and the
predictions EWC takes as labels, are those of the head the run trains with (``models.heads``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from cvs_jax.augment import transforms as augment
from cvs_jax.data.chunks import iter_chunks
from cvs_jax.methods import regularizers
from cvs_jax.models.heads import Head, head_params, net_variables


def make_batch_grad_fn(model, pipeline: augment.Views, *, head: Head):
    """``grad_fn(variables, images, labels, valid_classes, use_predictions, key, slots, reg_weight)``:
    the network's gradient of L_c on one batch, BatchNorm on running statistics.  ``key``: None for
    un-augmented images, else train-time augmentation; ``slots``/``reg_weight``: the EWC penalty
    added to the loss (the fork's importance loss includes it)."""

    @jax.jit
    def grad_fn(variables, images, labels, valid_classes, use_predictions, key=None, slots=(), reg_weight=0.0):
        x = pipeline.eval(images) if key is None else pipeline.train(key, images)

        def loss(net):
            emb = model.apply(net_variables({"net": net}, variables["batch_stats"]), x, train=False)
            arrays = head_params(head, variables["params"])
            logits = head.logits(arrays, emb)
            masked = jnp.where(jnp.arange(logits.shape[1])[None] < valid_classes, logits, -jnp.inf)
            target = jnp.where(use_predictions, jnp.argmax(masked, axis=1), labels)
            value = head.loss(arrays, emb, target, valid_classes)
            if slots:
                value = value + reg_weight * regularizers.slots_penalty(net, slots)
            return value

        return jax.grad(loss)(variables["params"]["net"])

    return grad_fn


def session_fisher(
    kind: str,
    grad_fn,
    variables,
    images: np.ndarray,
    labels: np.ndarray,
    valid_classes: int,
    batch_size: int,
    running=None,
    augment_key=None,
    penalty=((), 0.0),
):
    """``ewc``: this session's Fisher.  ``rwalk``: the EWC++ running Fisher continued from
    ``running`` (the previous sessions' value): one running average over the whole stream.
    ``augment_key``: augment batch b with ``fold_in(augment_key, b)``; ``penalty``: (slots, weight)."""
    n = images.shape[0]
    fisher = jax.tree.map(jnp.zeros_like, variables["params"]["net"]) if running is None else running
    first = running is None
    slots, reg_weight = penalty
    for start, batch, _ in iter_chunks((images, labels), batch_size, drop_remainder=True):  # one compiled shape
        key = None if augment_key is None else jax.random.fold_in(augment_key, start)
        g = grad_fn(
            variables,
            jnp.asarray(batch[0]),
            jnp.asarray(batch[1], jnp.int32),
            jnp.int32(valid_classes),
            kind == "ewc",
            key,
            slots,
            jnp.float32(reg_weight),
        )
        if kind == "ewc":
            fisher = jax.tree.map(lambda f, gi: f + gi**2 * (batch_size / n), fisher, g)
        else:
            fisher = regularizers.update_ewcpp_importance(fisher, g, alpha=0.5, init_if_zero=first)
        first = False
    return fisher


def accumulate(kind: str, previous_raw, fisher):
    """The raw importance carried to the next session (host arrays).

    ``ewc``: previous raw + this session's Fisher (online EWC); ``rwalk``: the running Fisher
    that ``session_fisher`` continued.
    """
    if kind == "ewc" and previous_raw is not None:
        fisher = jax.tree.map(jnp.add, previous_raw, fisher)
    return jax.device_get(fisher)


def for_penalty(raw, *, normalize: bool):
    """The importance the penalty uses: raw / max(raw) when ``normalize``, else raw."""
    if not normalize:
        return raw
    top = max(float(np.max(x)) for x in jax.tree.leaves(raw))
    return jax.tree.map(lambda f: f / max(top, 1e-12), raw)


def describe(raw) -> str:
    leaves = [np.asarray(x) for x in jax.tree.leaves(raw)]
    return (
        f"max {max(float(x.max()) for x in leaves):.3g}, mean "
        f"{sum(float(x.sum()) for x in leaves) / sum(x.size for x in leaves):.3g} over "
        f"{sum(x.size for x in leaves)} weights"
    )
