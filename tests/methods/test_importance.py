"""EWC / RWalk as the author's fork (``importance.mode=fork``), pinned against direct transcriptions.

* RWalk's Fisher is an EWC++ running average of the *training-step* gradients (full loss, penalty
  included), set to g² the first time: F ← ½F + ½g².
* One slot per session, anchored at the session's last epoch (not the selected model); the penalty
  sums over the slots, raw.
* EWC's slot importance: Σ_b g_b² n_b / N over the session's batches with predicted labels and the
  current penalty in the loss.
Both train with the fork's head (``linear_reset``: plain cross-entropy of e W^T + b), transcribed here.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvs_jax.augment import transforms as augment
from cvs_jax.engine import phases, train_loop
from cvs_jax.engine.run_state import RunState
from cvs_jax.engine.train_step import TrainState, make_optimizer, make_train_step
from cvs_jax.methods import baselines, regularizers
from cvs_jax.methods.importance_policies import ForkFisher, OnlineFisher
from cvs_jax.methods.seams import ImportanceState
from cvs_jax.models import networks as models
from cvs_jax.models.heads import LinearResetHead
from cvs_jax.testing.run_contexts import build_ctx, tree_equal
from cvs_jax.testing.tiny_data import tiny_config


def linear_ce(emb, params, labels, valid: int):
    """The fork's loss, transcribed: CrossEntropy(e W^T + b) over the classes seen."""
    logits = (emb @ params["head"].T + params["head_bias"])[:, :valid]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))


PIPE = augment.Pipeline(mean=(0.5,), std=(0.5,), crop="pad", padding=0, flip=False, policy="none")


def tiny_setup(tmp_path, kind="rwalk"):
    cfg = tiny_config(str(tmp_path), tmp_path, method=kind)  # only the config: no data is read
    method = baselines.make_rwalk(cfg) if kind == "rwalk" else baselines.make_ewc(cfg)
    model = models.build_model("tiny", width=4, layout="cifar", embed_dim=8)
    variables = models.init_variables(
        model, cfg, (8, 8, 1), 5, jax.random.key(0), jax.random.key(1), head=LinearResetHead()
    )
    return cfg, method, model, jax.device_get(variables)


def test_rwalk_running_fisher_is_the_training_step_gradients(tmp_path):
    cfg, method, model, v = tiny_setup(tmp_path, "rwalk")
    assert isinstance(method.importance, ForkFisher) and not method.shares_first_session
    tx = make_optimizer(momentum=0.9, nesterov=True, weight_decay=1e-4)
    weight = 100.0
    step = make_train_step(model, tx, method, head=LinearResetHead(), loss_weights={"L_reg": weight}, pipeline=PIPE)
    rng = np.random.default_rng(0)
    anchor = jax.tree.map(lambda x: x + 0.05, v["params"]["net"])  # a previous slot, so the penalty is active
    slot_imp = jax.tree.map(lambda x: np.full_like(x, 0.3), v["params"]["net"])
    consts = {
        "valid_classes": jnp.int32(5),
        "old_classes": jnp.int32(2),
        "reg_slots": ({"importance": slot_imp, "anchor": anchor},),
    }
    frozen = jax.tree.map(jnp.asarray, v)
    zeros = jax.tree.map(np.zeros_like, v["params"]["net"])
    state = TrainState(jnp.int32(0), v["params"], v["batch_stats"], tx.init(v["params"]), zeros)
    key = jax.random.key(3)

    def transcribed_loss(net, params, batch_stats, images, labels):  # L_c + weight * penalty, train-mode BN
        emb, _ = model.apply({"params": net, "batch_stats": batch_stats}, images, train=True, mutable=["batch_stats"])
        lc = linear_ce(emb, params, labels, 5)
        return lc + weight * regularizers.ewc_penalty(net, anchor, slot_imp)

    grad = jax.jit(jax.grad(transcribed_loss))
    fisher = None
    for t in range(3):
        images = rng.integers(0, 256, (4, 8, 8, 1), dtype=np.uint8)
        labels = rng.integers(0, 5, 4).astype(np.int32)
        x = PIPE.train(jax.random.fold_in(key, t), jnp.asarray(images))
        params, batch_stats = jax.device_get(state.params), jax.device_get(state.batch_stats)
        g = grad(params["net"], params, batch_stats, x, jnp.asarray(labels))
        g2 = jax.tree.map(lambda a: np.asarray(a, np.float64) ** 2, g)
        fisher = g2 if fisher is None else jax.tree.map(lambda f, q: 0.5 * f + 0.5 * q, fisher, g2)
        state, _ = step(
            state,
            frozen,
            {"images": jnp.asarray(images), "labels": jnp.asarray(labels)},
            consts,
            jnp.float32(0.01),
            key,
        )
        for got, want in zip(jax.tree.leaves(jax.device_get(state.tracked)), jax.tree.leaves(fisher)):
            np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-12)
    assert max(float(np.max(x)) for x in jax.tree.leaves(fisher)) > 0


def test_slots_one_per_session_anchored_at_the_last_epoch(manual_dir, tmp_path, monkeypatch):
    """The selected model is epoch 1 of 3; the slot's anchor must be epoch 3's network (the fork anchors
    each task at the end of its training) and slots accumulate, one per session."""
    ctx = build_ctx(manual_dir, tmp_path, method="rwalk", epochs=3)
    seen = []

    def scripted_search(ctx_, view):
        def search(variables, query_images, query_labels, new_rows=None):
            seen.append(jax.device_get(variables))
            return {1: (0.9, 0.5, 0.4)[len(seen) - 1]}

        return search

    monkeypatch.setattr(train_loop, "make_search", scripted_search)
    state = RunState.initial(ctx.initial_variables(), 8)
    view = phases.session_view(ctx, state, 0)
    sel = phases.train(ctx, state, view, phases.session_constants(ctx, state, view))
    assert sel.epoch == 0
    imp = ctx.method.importance.after_session(ctx.policy_view, state.importance, sel, 0)
    assert len(imp.slots) == 1 and imp.built_after == 0
    assert tree_equal(imp.slots[0]["anchor"], seen[2]["params"]["net"])  # last epoch
    assert not tree_equal(imp.slots[0]["anchor"], sel.variables["params"]["net"])  # not the selected one
    assert tree_equal(imp.slots[0]["importance"], imp.running)  # RWalk: the running Fisher at the last step
    # a second session appends its own slot; the penalty sums both, raw
    sel2 = phases.Selection(sel.variables, 0.5, 0, last=seen[0], tracked=jax.tree.map(lambda x: 2 * x, sel.tracked))
    imp2 = ctx.method.importance.after_session(ctx.policy_view, imp, sel2, 1)
    assert len(imp2.slots) == 2 and tree_equal(imp2.slots[0], imp.slots[0])
    assert tree_equal(imp2.slots[1]["anchor"], seen[0]["params"]["net"])
    consts = ctx.method.importance.constants(ctx.policy_view, imp2)
    net = jax.tree.map(lambda x: x + 0.1, seen[1]["params"]["net"])
    want = sum(
        float(np.sum(np.asarray(i, np.float64) * (np.asarray(p, np.float64) - np.asarray(a, np.float64)) ** 2))
        for slot in imp2.slots
        for i, p, a in zip(jax.tree.leaves(slot["importance"]), jax.tree.leaves(net), jax.tree.leaves(slot["anchor"]))
    )
    got = float(regularizers.slots_penalty(net, consts["reg_slots"]))
    assert got == pytest.approx(want, rel=1e-4)
    # the state round-trips through the session checkpoint item
    back = ImportanceState.from_item(jax.device_get(imp2.to_item()), imp2.built_after)
    assert len(back.slots) == 2 and tree_equal(back.slots[1], imp2.slots[1]) and tree_equal(back.running, imp2.running)
    ctx.close()


def test_ewc_slot_fisher_transcribed(manual_dir, tmp_path):
    """Σ_b g_b² n_b/N, g_b the gradient of L_c with predicted labels on augmented images (eval-mode BN)
    plus the current penalty; full batches only."""
    ctx = build_ctx(manual_dir, tmp_path, method="ewc")
    c = ctx.config
    v = jax.device_get(ctx.initial_variables())
    prev_slot = {
        "importance": jax.tree.map(lambda x: np.full_like(x, 0.2), v["params"]["net"]),
        "anchor": jax.tree.map(lambda x: x - 0.01, v["params"]["net"]),
    }
    state = ImportanceState((prev_slot,), None, 0)
    sel = phases.Selection(v, 0.5, 0, last=v, tracked={})
    imp = ctx.method.importance.after_session(ctx.policy_view, state, sel, 1)
    assert len(imp.slots) == 2 and imp.running is None
    sess = ctx.proto.plan.sessions[1]
    images = ctx.proto.train_images(sess.train)
    n, bs, k = len(images), c.train.batch_size, jax.random.fold_in(jax.random.key(c.seed), 1000 + 1)

    def loss(net, x):
        emb = ctx.model.apply({"params": net, "batch_stats": v["batch_stats"]}, x, train=False)
        logits = emb @ v["params"]["head"].T + v["params"]["head_bias"]
        pred = jnp.argmax(logits[:, : sess.num_outputs], 1)
        lc = linear_ce(emb, v["params"], pred, sess.num_outputs)
        return lc + c.loss_weights.L_reg * regularizers.ewc_penalty(net, prev_slot["anchor"], prev_slot["importance"])

    want = jax.tree.map(lambda x: np.zeros(x.shape, np.float64), v["params"]["net"])
    grad = jax.jit(jax.grad(loss))
    for start in range(0, n - bs + 1, bs):
        x = ctx.pipeline.train(jax.random.fold_in(k, start), jnp.asarray(images[start : start + bs]))
        g = grad(v["params"]["net"], x)
        want = jax.tree.map(lambda w, gi: w + np.asarray(gi, np.float64) ** 2 * bs / n, want, g)
    for got, w in zip(jax.tree.leaves(imp.slots[1]["importance"]), jax.tree.leaves(want)):
        np.testing.assert_allclose(got, w, rtol=2e-3, atol=1e-10)
    assert tree_equal(imp.slots[1]["anchor"], v["params"]["net"])
    ctx.close()


def test_online_mode_keeps_one_normalised_slot(manual_dir, tmp_path):
    ctx = build_ctx(manual_dir, tmp_path, method="ewc")
    ctx.config.unlock()
    ctx.config.importance.mode, ctx.config.importance.normalize = "online", True
    method = baselines.make_ewc(ctx.config)
    assert isinstance(method.importance, OnlineFisher) and method.shares_first_session
    state = RunState.initial(ctx.initial_variables(), 8)
    imp = method.importance.update(ctx.policy_view, state.importance, state.variables, 1)
    imp = method.importance.update(ctx.policy_view, imp.__class__(imp.slots, None, -1), state.variables, 2)
    assert len(imp.slots) == 1  # summed, not appended
    used = method.importance.constants(ctx.policy_view, imp)["reg_slots"][0]["importance"]
    assert max(float(np.max(x)) for x in jax.tree.leaves(used)) == pytest.approx(1.0)
    assert tree_equal(imp.slots[0]["anchor"], state.variables["params"]["net"])
    with pytest.raises(Exception, match="importance.mode"):
        ctx.config.importance.mode = "nope"
        baselines.make_ewc(ctx.config)
    ctx.close()
