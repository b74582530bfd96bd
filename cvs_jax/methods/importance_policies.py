"""Parameter-importance policies of the EWC and RWalk baselines (part of ``methods.policies``).

The penalty is ``L_reg = Σ_slots Σ_params importance · (θ − θ_anchor)²`` over the network (the
cosine head is not regularized), weighted by ``loss_weights.L_reg``.  Two modes
(``importance.mode``):

``fork`` (default): the author's Rainbow-Memory fork, rule by rule (docs/deviations.md).
* one slot per finished session, each with its own anchor = the network at the end of that
  session's training (its **last** epoch, not the best-validation one);
* EWC: the slot's importance is the diagonal Fisher computed after the session with the last-epoch
  model in eval mode over the session's training batches (train-time augmentation, the model's own
  predictions as labels, the loss including the current penalty), F = Σ_b g_b² n_b / N;
* RWalk: an EWC++ running Fisher F ← ½F + ½g² updated after every training step from that step's
  gradients (train-mode BatchNorm, augmented images, the full loss with the penalty), set to g² the
  first time, continued across sessions; a slot's importance is its value at the session's last
  step (the fork's path-integral score is identically 0, see ``regularizers``);
* raw values (no normalisation), ``loss_weights.L_reg`` = 100.
Since session 1 already carries these statistics, EWC and RWalk train their own session 1 (as in
the fork) instead of sharing it with other methods in ``cvs_jax.compare``.

``online``: the stabilised variant of earlier cvs-jax versions: after each session one summed (EWC)
or running (RWalk, replayed over the session's un-augmented images) Fisher of the selected model in
eval mode, one slot whose anchor is the selected model, normalised to max 1 when
``importance.normalize``; it diverged less often at weight 10 (docs/deviations.md).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from cvs_jax.methods import fisher as importance
from cvs_jax.methods import regularizers
from cvs_jax.methods.seams import ImportanceState, PolicyView, TrainedSession
from cvs_jax.methods.seams import NoImportance as NoImportance


def _penalty_slots(state: ImportanceState, normalize: bool) -> dict:
    if not state.slots:
        return {}
    return {
        "reg_slots": tuple(
            {"importance": importance.for_penalty(slot["importance"], normalize=normalize), "anchor": slot["anchor"]}
            for slot in state.slots
        )
    }


def _grad_fn(view: PolicyView):
    return view.compiled(
        "fisher_grad", lambda model, pipeline, head: importance.make_batch_grad_fn(model, pipeline, head=head)
    )


@dataclasses.dataclass(frozen=True)
class OnlineFisher:
    """``importance.mode=online``: one summed (EWC) or running (RWalk) Fisher, anchor = selected model."""

    kind: str  # "ewc" | "rwalk"
    normalize: bool  # importance.normalize: the penalty reads the importance divided by its maximum
    shares_first_session = True

    def update(self, view: PolicyView, state: ImportanceState, variables, s: int) -> ImportanceState:
        prev = view.plan.sessions[s - 1]
        raw = state.slots[0]["importance"] if state.slots else None
        fisher = importance.session_fisher(
            self.kind,
            _grad_fn(view),
            variables,
            view.train_images(prev.train),
            view.train_labels[prev.train],
            prev.num_outputs,
            view.batch_size,
            running=raw if self.kind == "rwalk" else None,
        )
        raw = importance.accumulate(self.kind, raw, fisher)
        view.log(
            f"importance ({self.kind}, online) after session {s}: {importance.describe(raw)}"
            + (", normalised to max 1" if self.normalize else "")
        )
        slot = {"importance": raw, "anchor": jax.device_get(variables["params"]["net"])}
        return ImportanceState((slot,), None, s - 1)

    def after_session(
        self, view: PolicyView, state: ImportanceState, trained: TrainedSession, s: int
    ) -> ImportanceState:
        return state

    def constants(self, view: PolicyView, state: ImportanceState) -> dict:
        return _penalty_slots(state, self.normalize)

    def tracked_init(self, state, net_params) -> dict:
        return {}

    def track(self, tracked, net_grads):
        return tracked


@dataclasses.dataclass(frozen=True)
class ForkFisher:
    """``importance.mode=fork``: one slot per session from the last epoch (EWC: Fisher after the
    session; RWalk: the running Fisher of the training steps)."""

    kind: str  # "ewc" | "rwalk"
    normalize: bool  # importance.normalize: the penalty reads the importance divided by its maximum
    shares_first_session = False  # session 1 carries the slot's statistics: each trains its own

    def update(self, view: PolicyView, state: ImportanceState, variables, s: int) -> ImportanceState:
        return state  # slots are made at the end of each session (after_session)

    def tracked_init(self, state: ImportanceState, net_params) -> dict:
        if self.kind != "rwalk":
            return {}
        if state.running is not None:
            return state.running
        return jax.tree.map(np.zeros_like, jax.device_get(net_params))

    def track(self, tracked, net_grads):
        if self.kind != "rwalk":
            return tracked
        return regularizers.update_ewcpp_importance(tracked, net_grads, alpha=0.5, init_if_zero=True)

    def after_session(
        self, view: PolicyView, state: ImportanceState, trained: TrainedSession, s: int
    ) -> ImportanceState:
        last = trained.last
        if self.kind == "rwalk":
            running = trained.tracked
            slot_importance = running  # + the path-integral score, which is 0 in the fork
        else:
            running = None
            sess = view.plan.sessions[s]
            slot_importance = importance.session_fisher(
                "ewc",
                _grad_fn(view),
                last,
                view.train_images(sess.train),
                view.train_labels[sess.train],
                sess.num_outputs,
                view.batch_size,
                augment_key=jax.random.fold_in(jax.random.key(view.seed), 1000 + s),
                penalty=(_penalty_slots(state, self.normalize).get("reg_slots", ()), view.loss_weights["L_reg"]),
            )
        assert last is not None  # a trained session's last model (phases.Selection.last)
        slot = {"importance": jax.device_get(slot_importance), "anchor": jax.device_get(last["params"]["net"])}
        view.log(f"importance ({self.kind}, fork) of session {s + 1}: {importance.describe(slot['importance'])}")
        return ImportanceState(state.slots + (slot,), running, s)

    def constants(self, view: PolicyView, state: ImportanceState) -> dict:
        return _penalty_slots(state, self.normalize)
