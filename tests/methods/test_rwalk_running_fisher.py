"""RWalk's EWC++ running Fisher is one running average over the whole stream: a session continues the
previous session's value (F <- 0.5 F + 0.5 g^2 from it), it never restarts from zero (where the fork's
rule would set it to g^2)."""

from __future__ import annotations

import types

import jax
import numpy as np

from cvs_jax.methods import fisher as importance
from cvs_jax.methods import importance_policies
from cvs_jax.methods.importance_policies import ForkFisher, OnlineFisher
from cvs_jax.methods.seams import ImportanceState

RUNNING = {"w": np.full((3,), 4.0, np.float32), "b": np.array([2.0, 0.5], np.float32)}
GRADS = [
    {"w": np.array([1.0, 2.0, 3.0], np.float32), "b": np.array([1.0, -1.0], np.float32)},
    {"w": np.ones(3, np.float32), "b": np.zeros(2, np.float32)},
]


def _continued(start, grads):
    f = {k: np.asarray(v, np.float64) for k, v in start.items()}
    for g in grads:
        f = {k: 0.5 * f[k] + 0.5 * np.asarray(g[k], np.float64) ** 2 for k in f}
    return f


def _assert_tree(got, want):
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=1e-6)


def test_fork_mode_continues_the_previous_sessions_running_fisher():
    policy = ForkFisher("rwalk", normalize=False)
    net = {k: np.ones_like(v) for k, v in RUNNING.items()}
    tracked = policy.tracked_init(ImportanceState((), RUNNING, 0), net)
    for g in GRADS:  # the training steps of the next session
        tracked = policy.track(tracked, g)
    _assert_tree(tracked, _continued(RUNNING, GRADS))
    first = policy.tracked_init(ImportanceState(), net)  # session 1: zeros, then set to g^2 (the fork's rule)
    _assert_tree(policy.track(first, GRADS[0]), {k: np.asarray(v, np.float64) ** 2 for k, v in GRADS[0].items()})


def test_session_fisher_continues_from_running():
    grads = iter(GRADS)
    variables = {"params": {"net": {k: np.ones_like(v) for k, v in RUNNING.items()}}}
    images, labels = np.zeros((4, 2, 2, 1), np.uint8), np.zeros(4, np.int32)
    got = importance.session_fisher(
        "rwalk", lambda *a: next(grads), variables, images, labels, 2, batch_size=2, running=RUNNING
    )
    _assert_tree(got, _continued(RUNNING, GRADS))


def test_online_mode_passes_the_previous_running_fisher(monkeypatch):
    seen = {}

    def fake_session_fisher(kind, grad_fn, variables, images, labels, valid, batch, running=None, **kw):
        seen["running"] = running
        return jax.tree.map(lambda x: x + 1.0, running)

    monkeypatch.setattr(importance_policies.importance, "session_fisher", fake_session_fisher)
    monkeypatch.setattr(importance_policies, "_grad_fn", lambda view: None)
    sess = types.SimpleNamespace(train=np.arange(4), num_outputs=2)
    view = types.SimpleNamespace(
        plan=types.SimpleNamespace(sessions=[sess, sess]),
        train_images=lambda idx: np.zeros((len(idx), 2, 2, 1), np.uint8),
        train_labels=np.zeros(4, np.int32),
        batch_size=2,
        log=lambda *a: None,
    )
    net = {k: np.ones_like(v) for k, v in RUNNING.items()}
    state = ImportanceState(({"importance": RUNNING, "anchor": net},), None, 0)
    out = OnlineFisher("rwalk", normalize=False).update(view, state, {"params": {"net": net}}, 2)
    assert seen["running"] is RUNNING
    _assert_tree(out.slots[0]["importance"], {k: np.asarray(v, np.float64) + 1 for k, v in RUNNING.items()})
