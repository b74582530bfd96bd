"""The classifier heads (``models.heads``) and which method trains with which (docs/methods.md, "Heads").

Rules pinned here, each by a test that a one-line bug breaks:
* ``linear_reset``'s loss is plain cross-entropy of e W^T + b over the seen classes (numpy reference),
  and it is what the jitted step minimises (L_c against a transcription of the step);
* at every session start the fork draws a fresh head: every row and the bias new, none kept;
  the cosine head keeps the rows of the classes it has seen;
* the EWC/RWalk penalty never reaches the head;
* Rainbow's votes and EWC's Fisher labels come from the head the method trains with;
* ``model.head="official"`` gives the fork's three baselines ``linear_reset``, the ivclab/CVS
  methods ``cosine``; a run recorded before ``model.head`` existed resumes only where its head stays.
"""

import json
import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvs_jax.config import recorded
from cvs_jax.config.stored import stored_config
from cvs_jax.engine import train_loop
from cvs_jax.engine.run_state import RunState
from cvs_jax.engine.train_step import TrainState
from cvs_jax.errors import ConfigError
from cvs_jax.methods import policies, regularizers
from cvs_jax.methods.base import StepInputs
from cvs_jax.methods.registry import METHODS, get_head, get_method, head_name
from cvs_jax.models.heads import CosineHead, LinearResetHead, head_params
from cvs_jax.retrieval import compatibility
from cvs_jax.testing.run_contexts import build_ctx
from cvs_jax.testing.tiny_data import tiny_config


def numpy_cross_entropy(logits: np.ndarray, labels: np.ndarray, valid: int) -> float:
    z = np.asarray(logits, np.float64)[:, :valid]
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(labels)), labels].mean())


def test_linear_reset_loss_is_plain_cross_entropy():
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(6, 5)).astype(np.float32) * 3
    head = LinearResetHead().init(jax.random.key(1), 7, 5)
    labels = np.array([0, 3, 2, 4, 1, 0])
    w, b = np.asarray(head["head"], np.float64), np.asarray(head["head_bias"], np.float64)
    want = numpy_cross_entropy(emb @ w.T + b, labels, valid=5)  # columns 5, 6 are classes not yet seen
    got = float(LinearResetHead().loss(head, jnp.asarray(emb), jnp.asarray(labels), 5))
    assert got == pytest.approx(want, rel=1e-5)
    # no normalisation, no temperature: scaling the embedding changes the loss (a cosine head's would not)
    assert float(LinearResetHead().loss(head, jnp.asarray(2 * emb), jnp.asarray(labels), 5)) != pytest.approx(got)
    cos = CosineHead(0.05)
    assert float(cos.loss(head, jnp.asarray(2 * emb), labels, 5)) == pytest.approx(
        float(cos.loss(head, jnp.asarray(emb), labels, 5)), rel=1e-5
    )


def test_official_heads_and_the_switch(manual_dir, tmp_path):
    fork = {"ewc", "rwalk", "rainbow"}  # the author's Rainbow-Memory fork: a fresh linear head every session
    simplex = {"cl2r", "hoc", "cores"}  # the d-Simplex line: a fixed simplex head
    for method in METHODS:  # every other registered method: ivclab/CVS's (and ours) train the cosine NormLayer
        want = "linear_reset" if method in fork else "simplex" if method in simplex else "cosine"
        c = tiny_config(manual_dir, tmp_path, method=method)
        assert c.model.head == "official" and head_name(c) == want, method
        c.model.head = "cosine" if want == "linear_reset" else "linear_reset"  # the paper's variant / the other
        assert get_head(c).name == c.model.head
    c.model.head = "linear"
    with pytest.raises(ConfigError, match="model.head='linear' is unknown"):
        head_name(c)


def _trained_variables(ctx, rng) -> dict:
    """The initial variables with every head array moved away from its initial draw (a trained head)."""
    v = jax.device_get(ctx.initial_variables())
    params = dict(v["params"])
    for k in ctx.head.keys:
        params[k] = np.asarray(params[k]) + rng.normal(size=np.shape(params[k])).astype(np.float32)
    return dict(v, params=params)


def test_linear_reset_head_is_new_at_every_session_start(manual_dir, tmp_path):
    ctx = build_ctx(manual_dir, tmp_path, method="ewc", sessions=3)
    assert ctx.head.name == "linear_reset"
    plan = ctx.proto.plan
    v = _trained_variables(ctx, np.random.default_rng(0))
    state = RunState.initial(v, 8)
    for s in (1, 2):
        ts = train_loop.initial_train_state(ctx, state, s)
        want = LinearResetHead().init(jax.random.fold_in(ctx.head_key, s), ctx.proto.num_classes, 8)
        for k in ("head", "head_bias"):
            np.testing.assert_array_equal(ts.params[k], want[k])
            old = np.asarray(v["params"][k])[: plan.sessions[s - 1].num_outputs]
            assert not np.any(np.isclose(np.asarray(ts.params[k])[: len(old)], old))  # no old row kept
        np.testing.assert_array_equal(jax.tree.leaves(ts.params["net"])[0], jax.tree.leaves(v["params"]["net"])[0])
        assert int(ts.step) == 0 and all(np.all(np.asarray(x) == 0) for x in jax.tree.leaves(ts.opt_state))
    ctx.close()


def test_cosine_head_keeps_old_rows(manual_dir, tmp_path):
    ctx = build_ctx(manual_dir, tmp_path, method="finetune", sessions=3)
    assert ctx.head.name == "cosine" and ctx.head.keys == ("head",)
    v = _trained_variables(ctx, np.random.default_rng(1))
    ts = train_loop.initial_train_state(ctx, RunState.initial(v, 8), 1)
    old, new = ctx.proto.plan.sessions[0].num_outputs, ctx.proto.plan.sessions[1].num_outputs
    np.testing.assert_array_equal(ts.params["head"][:old], v["params"]["head"][:old])
    assert not np.any(np.isclose(ts.params["head"][old:new], v["params"]["head"][old:new]))
    assert "head_bias" not in ts.params
    ctx.close()


def test_step_minimises_the_linear_heads_cross_entropy(manual_dir, tmp_path):
    """L_c of the jitted step equals a numpy cross-entropy of the train-mode embedding's linear logits."""
    ctx = build_ctx(manual_dir, tmp_path, method="rwalk")
    v = jax.device_get(ctx.initial_variables())
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, (16, 28, 28, 1), dtype=np.uint8)
    labels = rng.integers(0, 4, 16).astype(np.int32)
    key = jax.random.key(5)
    zeros = jax.tree.map(np.zeros_like, v["params"]["net"])
    state = TrainState(jnp.int32(0), v["params"], v["batch_stats"], ctx.tx.init(v["params"]), zeros)
    consts = {"valid_classes": jnp.int32(4), "old_classes": jnp.int32(0), "reg_slots": ()}
    x = ctx.pipeline.train(jax.random.fold_in(key, 0), jnp.asarray(images))
    emb, _ = ctx.model.apply(
        {"params": v["params"]["net"], "batch_stats": v["batch_stats"]}, x, train=True, mutable=["batch_stats"]
    )
    w, b = np.asarray(v["params"]["head"], np.float64), np.asarray(v["params"]["head_bias"], np.float64)
    want = numpy_cross_entropy(np.asarray(emb, np.float64) @ w.T + b, labels, valid=4)
    _, metrics = ctx.step_fn(state, None, {"images": jnp.asarray(images), "labels": jnp.asarray(labels)}, consts,
                             jnp.float32(0.01), key)  # fmt: skip
    assert float(metrics["L_c"]) == pytest.approx(want, rel=1e-4)
    ctx.close()


def test_penalty_leaves_the_head_alone(manual_dir, tmp_path):
    ctx = build_ctx(manual_dir, tmp_path, method="ewc")
    v = jax.device_get(ctx.initial_variables())
    slot = {
        "importance": jax.tree.map(lambda x: np.full_like(x, 0.5), v["params"]["net"]),
        "anchor": jax.tree.map(lambda x: x - 0.1, v["params"]["net"]),
    }

    def reg(params):
        inputs = StepInputs(
            params=params,
            new_emb=jnp.zeros((2, 8)),
            old_emb=None,
            labels=jnp.zeros(2, jnp.int32),
            classifier=ctx.head,
            head=head_params(ctx.head, params),
            old_head=head_params(ctx.head, params),
            consts={"reg_slots": (slot,)},
        )
        return ctx.method.extra_terms(inputs)["L_reg"]

    g = jax.grad(reg)(v["params"])
    assert set(g) == {"net", "head", "head_bias"}
    assert not np.any(np.asarray(g["head"])) and not np.any(np.asarray(g["head_bias"]))
    assert any(np.any(np.asarray(x)) for x in jax.tree.leaves(g["net"]))
    assert float(reg(v["params"])) == pytest.approx(float(regularizers.slots_penalty(v["params"]["net"], (slot,))))
    ctx.close()


def test_rainbow_votes_with_the_head_it_trains(manual_dir, tmp_path):
    """A large bias on class b makes b win every linear vote, for b = 1 and b = 2: the votes follow the
    linear head's logits (a cosine head has no bias that could do this)."""
    ctx = build_ctx(manual_dir, tmp_path, method="rainbow")
    assert ctx.head.name == "linear_reset"
    v = jax.device_get(ctx.initial_variables())
    predict = policies._make_perturbed_predict(ctx.model, ctx.pipeline, "randaugment", ctx.head)
    images = np.random.default_rng(3).integers(0, 256, (8, 28, 28, 1), dtype=np.uint8)
    for b in (1, 2):
        bias = np.zeros_like(v["params"]["head_bias"])
        bias[b] = 1e4
        biased = dict(v, params=dict(v["params"], head_bias=bias))
        assert np.asarray(predict(biased, jnp.asarray(images), jax.random.key(0), 4)).tolist() == [b] * 8
    ctx.close()


def test_lwf_copies_the_old_head_with_its_bias(manual_dir, tmp_path):
    c = tiny_config(manual_dir, tmp_path, method="lwf")
    c.model.head = "linear_reset"
    head = {"head": np.ones((3, 2)), "head_bias": np.arange(3.0)}
    assert get_method(c).extra_params({"net": {}, **head}, head) == {"lwf_head": head}


def test_old_config_resumes_only_where_its_head_stays(manual_dir, tmp_path):
    """A config.json written before model.head existed (every method trained the cosine head)."""
    for method, resumes in (("cvs", True), ("ewc", False)):
        wd = tmp_path / f"old-{method}"
        (wd / "checkpoints" / "sessions" / "0").mkdir(parents=True)
        c = tiny_config(manual_dir, tmp_path, method=method)
        old = json.loads(c.to_json())
        del old["model"]["head"]
        (wd / "config.json").write_text(json.dumps(old))
        assert stored_config(str(wd)).model.head == "cosine"
        if resumes:
            recorded.prepare(c, str(wd))
        else:
            with pytest.raises(ConfigError, match="model.head: 'cosine' -> 'linear_reset'"):
                recorded.prepare(c, str(wd))
            c.model.head = "cosine"  # the paper's variant: the run's own head, so it resumes
            recorded.prepare(c, str(wd))
        assert os.path.exists(wd / "config.json")


def test_mean_drop_definition():
    nan = None
    m = [[0.9, nan, nan], [0.6, 0.8, nan], [0.3, 0.7, 0.5]]
    # part 0: mean(0.6, 0.3) - 0.9 = -0.45; part 1: 0.7 - 0.8 = -0.1; part 2 has no newer model
    assert compatibility.mean_drop(m) == pytest.approx((-0.45 - 0.1) / 2)
    assert compatibility.mean_drop([[0.5]]) is None


def test_class_centres_pool_every_stored_part():
    """L_d's centre of a class is the mean of its normalised rows over every stored gallery part."""
    from cvs_jax.rundir.gallery import Gallery, GalleryPart

    rng = np.random.default_rng(4)
    g = Gallery.empty(3)
    rows, labels = [], []
    for s, lab in enumerate(([0, 0, 1], [0, 1, 1, 2])):  # classes 0 and 1 have rows in both parts
        e = rng.normal(size=(len(lab), 3)).astype(np.float32)
        g = g.with_part(GalleryPart(e, np.asarray(lab), np.arange(len(lab)) + 10 * s, s))
        rows.append(e)
        labels += lab
    rows, labels = np.concatenate(rows), np.asarray(labels)
    unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    out = policies.ClassCenters(per_session_mean=False)(types.SimpleNamespace(num_classes=4), g)
    for c in range(3):
        np.testing.assert_allclose(np.asarray(out["centers"])[c], unit[labels == c].mean(0), rtol=1e-5, atol=1e-6)
    assert np.asarray(out["center_mask"]).tolist() == [True, True, True, False]


def test_ablation_switches_build_the_policies(manual_dir, tmp_path):
    c = tiny_config(manual_dir, tmp_path, method="rainbow")
    m = get_method(c)
    assert isinstance(m.memory, policies.UncertaintyMemory) and isinstance(m.batches, policies.HalfMemoryBatches)
    c.rainbow.memory, c.rainbow.batches = "herding", "mixed"
    m = get_method(c)
    assert isinstance(m.memory, policies.HerdingMemory) and isinstance(m.batches, policies.MixedBatches)
    c.method = "cvs"
    assert isinstance(get_method(c).batches, policies.MixedBatches)
    c.cvs.batches = "half"
    assert isinstance(get_method(c).batches, policies.HalfMemoryBatches)
    c.cvs.batches = "halves"
    with pytest.raises(ConfigError, match="cvs.batches='halves' is unknown"):
        get_method(c)
