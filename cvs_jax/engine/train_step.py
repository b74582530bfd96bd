"""The one jit-compiled training step (the jitted embedding function is ``retrieval.embedder``'s).

The step is a pure function of (state, frozen previous model, batch, per-session
constants, lr, key): the current model runs in train mode and, when the method
needs it, the frozen previous model (its parameters a pytree argument, BatchNorm
on running statistics, no gradient) runs on the same augmented batch in the same
compiled program.  Under ``jax.jit`` with the batch sharded over a ``data`` mesh
axis, BatchNorm statistics and batch-wide losses see the global batch, so results
do not depend on the number of devices.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from cvs_jax import distributed
from cvs_jax.augment import transforms as augment
from cvs_jax.errors import ConfigError
from cvs_jax.methods.base import Method, StepInputs
from cvs_jax.models.heads import Head, head_params, net_variables


@struct.dataclass
class TrainState:
    step: jax.Array
    params: Any  # {"net": backbone + embedding params, the head's arrays ("head" [K, D], ...), method extras}
    batch_stats: Any
    opt_state: Any
    tracked: Any  # what the method's importance policy tracks over the steps (RWalk: running Fisher); {} if none


def make_optimizer(
    *, momentum: float, nesterov: bool, weight_decay: float, labels=None
) -> optax.GradientTransformation:
    """Coupled L2 decay + SGD(Nesterov) with unit LR; the step scales by the epoch's LR.

    Passing the LR as an argument keeps one compiled step for every epoch and session.
    Adding ``wd * param`` to the gradient before momentum is PyTorch's SGD weight decay.
    ``labels`` (``params -> "train" | "frozen"`` per leaf, ``models.frozen_mask``): frozen leaves get a
    zero update (no decay, no momentum), so a frozen trunk stays bit-identical whatever its gradient.
    """
    tx = optax.chain(optax.add_decayed_weights(weight_decay), optax.sgd(1.0, momentum=momentum, nesterov=nesterov))
    if labels is None:
        return tx
    return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)


def make_train_step(
    model,
    tx: optax.GradientTransformation,
    method: Method,
    *,
    head: Head,
    loss_weights: Mapping[str, float],
    pipeline: augment.Views,
    steps_per_call: int | None = None,
    population: int | None = None,
    unroll: bool = True,
    mesh=None,
):
    """Returns ``step(state, frozen, batch, consts, lr, key) -> (state, metrics)`` (jitted, state donated).

    ``steps_per_call`` (set, even to 1): the step runs the training steps of a stack of batches
    (``batch`` leaves ``[n, B, ...]``, n read from the shape, normally k) in one call with ``lax.scan``;
    ``lr`` is a scalar or ``[n]`` (one per step), and every metric gets a leading ``[n]`` axis.  Each
    step folds ``state.step`` into the key as a single step does, so the k steps draw the same
    augmentation.  ``population=N``: N independent members at once, ``jax.vmap`` over a leading member
    axis of the state, the frozen model, the batch, the constants and the key (``lr`` shared); the
    metrics get a leading ``[N]`` axis (before ``[n]``).

    ``mesh`` (the run's data mesh): the jit states its shardings instead of taking them from its
    committed inputs: the batch split over the data axis after its leading (steps, members) axes,
    everything else, and every output, replicated."""

    missing = [term for term in method.loss_terms if term not in loss_weights]
    if missing:
        raise ConfigError(
            f"method {method.name!r} declares loss term(s) {missing} that config.loss_weights lacks; build the "
            "config after registering the method (its loss_terms give config.loss_weights' defaults)."
        )

    def loss_fn(params, batch_stats, frozen, images, labels, consts):
        emb, new_vars = model.apply(net_variables(params, batch_stats), images, train=True, mutable=["batch_stats"])
        terms = {"L_c": head.loss(head_params(head, params), emb, labels, consts["valid_classes"])}
        total = terms["L_c"]
        if frozen is not None and method.extra_terms is not None:
            old_emb = None
            if method.uses_old_model:
                old_emb = model.apply(net_variables(frozen["params"], frozen["batch_stats"]), images, train=False)
                old_emb = jax.lax.stop_gradient(old_emb)
            inputs = StepInputs(
                params=params,
                new_emb=emb,
                old_emb=old_emb,
                labels=labels,
                classifier=head,
                head=head_params(head, params),
                old_head=jax.lax.stop_gradient(head_params(head, frozen["params"])),
                consts=consts,
            )
            for name, value in method.extra_terms(inputs).items():
                if name not in method.loss_terms:
                    raise ConfigError(
                        f"method {method.name!r} returns loss term {name!r}, which it does not declare; add it to "
                        "its loss_terms with a default weight."
                    )
                terms[name] = value
                total = total + loss_weights[name] * value
        return total, (terms, new_vars["batch_stats"])

    def step(state: TrainState, frozen, batch, consts, lr, key):
        key = jax.random.fold_in(key, state.step)
        images = pipeline.train(key, batch["images"])
        (total, (terms, batch_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params, state.batch_stats, frozen, images, batch["labels"], consts
        )
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = jax.tree.map(lambda p, u: p + lr * u, state.params, updates)
        metrics = dict(terms, loss=total, grad_norm=optax.tree.norm(grads), lr=lr)
        tracked = method.importance.track(state.tracked, grads["net"])
        state = TrainState(
            step=state.step + 1, params=params, batch_stats=batch_stats, opt_state=opt_state, tracked=tracked
        )
        return state, metrics

    fn = step if steps_per_call is None else scan_steps(step, unroll=unroll)
    if population is not None:
        fn = jax.vmap(fn, in_axes=(0, 0, 0, 0, None, 0))
    if mesh is None:
        return jax.jit(fn, donate_argnums=0)  # the state is replaced every call: reuse its buffers
    lead = (steps_per_call is not None) + (population is not None)
    rep, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P(*([None] * lead), distributed.DATA_AXIS))
    return jax.jit(
        fn, donate_argnums=0, in_shardings=(rep, rep, rows, rep, rep, rep), out_shardings=(rep, rep)
    )  # (state, frozen, batch, consts, lr, key) -> (state, metrics)


def scan_steps(step, unroll: bool = True):
    """``steps(state, frozen, batches, consts, lrs, key)``: ``step`` over the leading axis of ``batches``
    (``lrs``: a scalar or one per step), in one ``lax.scan``; metrics stacked ``[n]``.

    ``unroll=True`` (the engine's): the scan is unrolled into k copies of the step.  A rolled scan
    compiles its body as a loop, whose float code differs from the single step's on CPU (measured on
    the tiny CVS model: parameters 6e-6 apart after 3 steps, enough to flip a near-tie recall); the
    unrolled steps stay within 3e-8 and give the single steps' recalls.  The price is compile time
    (k copies of the step) and program size."""

    def steps(state, frozen, batches, consts, lrs, key):
        n = jax.tree.leaves(batches)[0].shape[0]
        lrs = jnp.broadcast_to(jnp.asarray(lrs, jnp.float32), (n,))
        return jax.lax.scan(
            lambda st, xs: step(st, frozen, xs[0], consts, xs[1], key), state, (batches, lrs), unroll=unroll
        )

    return steps
