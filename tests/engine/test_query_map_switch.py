"""The ``retrieval.query_map`` switch: its refusal, compare's ``method@procrustes`` entries, and the fitting
phase on a method's replay memory (phases.fit_query_map on its own, no training)."""

import types

import jax
import numpy as np
import pytest

from configs import fashion_mnist_general
from cvs_jax.engine import comparison, config_checks, phases, runner
from cvs_jax.engine.run_state import RunState
from cvs_jax.errors import ConfigError
from cvs_jax.methods.seams import ReplayMemory
from cvs_jax.retrieval import query_maps
from cvs_jax.testing.run_contexts import build_ctx


def test_an_unknown_query_map_is_refused_naming_the_choices():
    c = fashion_mnist_general.get_config()
    c.retrieval.query_map = "rotate"
    with pytest.raises(ConfigError, match=r"retrieval.query_map='rotate' is unknown; choose one of \['none', "):
        config_checks.check(c, num_devices=1)
    for kind in query_maps.KINDS:
        c.retrieval.query_map = kind
        config_checks.check(c, num_devices=1)


@pytest.mark.parametrize(
    "entry,want",
    [
        ("cvs@procrustes", ("cvs", None, {"retrieval.query_map": "procrustes"})),
        ("finetune@affine", ("finetune", None, {"retrieval.query_map": "affine"})),
        ("cvs@linear_reset@mean_shift", ("cvs", "linear_reset", {"retrieval.query_map": "mean_shift"})),
        ("ewc@cosine", ("ewc", "cosine", {})),
        (
            "cvs@procrustes+cvs.use_lm=False",
            ("cvs", None, {"retrieval.query_map": "procrustes", "cvs.use_lm": "False"}),
        ),
    ],
)
def test_method_at_query_map_sets_the_switch(entry, want):
    assert comparison.parse_entry(entry) == want
    c = comparison.entry_config(fashion_mnist_general.get_config(), entry, 0, None)
    assert c.retrieval.query_map == want[2].get("retrieval.query_map", "none")
    assert c.method == want[0]


def test_query_map_entries_pair_with_their_entry_without_the_map():
    config = fashion_mnist_general.get_config()
    methods = ["finetune", "finetune@procrustes", "cvs", "cvs@procrustes", "cvs@linear_reset"]
    pairs = comparison.entry_pairs(config, methods)
    assert ("finetune@procrustes", "finetune", "query map of finetune") in pairs
    assert ("cvs@procrustes", "cvs", "query map of cvs") in pairs
    assert ("cvs@linear_reset", "cvs", "head effect of cvs") in pairs  # the map entry does not take cvs's place


def test_a_bad_tag_after_at_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="after '@' name a head, one of .* or a query map"):
        runner.run_comparison(fashion_mnist_general.get_config(), str(tmp_path), ["cvs@rotate"], [0])


def test_the_map_is_fitted_on_the_replay_memory(manual_dir, tmp_path):
    """With a memory, map s is fitted on the memory's images embedded by the selected model (new) and by
    the previous session's model (old); ``none`` and session 1 fit nothing."""
    ctx = build_ctx(manual_dir, tmp_path, method="cvs")
    old = ctx.initial_variables()
    new = jax.tree.map(lambda x: x + 0.05 * np.sign(np.asarray(x)), old)  # another model of the same shape
    ids = np.asarray(ctx.proto.plan.sessions[0].train[:12], np.int64)
    state = RunState.initial(old, 8).replace(memory=ReplayMemory(ids, ctx.proto.train_labels[ids], built_after=0))
    selection = phases.Selection(new, 0.5, 0)
    assert phases.fit_query_map(ctx, state, types.SimpleNamespace(s=1), selection) is state  # config: none
    ctx.config.unlock()
    ctx.config.retrieval.query_map = "affine"
    assert phases.fit_query_map(ctx, state, types.SimpleNamespace(s=0), selection) is state  # nothing older
    fitted = phases.fit_query_map(ctx, state, types.SimpleNamespace(s=1), selection).query_maps
    images = ctx.proto.train_images(ids)
    want = query_maps.fit_query_map("affine", ctx.embed(new, images), ctx.embed(old, images))
    assert list(fitted) == [1] and fitted[1].kind == "affine"
    np.testing.assert_allclose(fitted[1].matrix, want.matrix, atol=1e-12)
    np.testing.assert_allclose(fitted[1].bias, want.bias, atol=1e-12)
    ctx.close()
