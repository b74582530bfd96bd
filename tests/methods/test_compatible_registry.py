"""The compatible-training methods as registered: what each declares, and its config section wired
through to its term (a setting read but not passed on, or a check that lets a bad value through, fails)."""

import jax.numpy as jnp
import numpy as np
import pytest

from cvs_jax.config import fashion_mnist_general
from cvs_jax.engine import config_checks
from cvs_jax.errors import ConfigError
from cvs_jax.methods import lce, ract
from cvs_jax.methods.base import StepInputs
from cvs_jax.methods.registry import get_method
from cvs_jax.models.heads import CosineHead


def _config(method):
    c = fashion_mnist_general.get_config()
    c.method = method
    return c


def _inputs(seed=0, b=16, d=6, k=5):
    rng = np.random.default_rng(seed)
    head = {"head": jnp.asarray(rng.normal(size=(k, d)), jnp.float32)}
    return StepInputs(
        params={},
        new_emb=jnp.asarray(rng.normal(size=(b, d)), jnp.float32),
        old_emb=jnp.asarray(rng.normal(size=(b, d)), jnp.float32),
        labels=jnp.asarray(rng.integers(0, k, b)),
        classifier=CosineHead(0.05),
        head=head,
        old_head=head,
        consts={},
    )


def test_ract_declares_the_official_term_and_defaults():
    c = _config("ract")
    m = get_method(c)
    assert m.uses_old_model and not m.uses_memory and m.official_head == "cosine"
    assert dict(m.loss_terms) == {"L_ract": 1.0} and c.loss_weights.L_ract == 1.0
    assert (c.ract.temperature, c.ract.topk_neg, c.ract.variant) == (ract.TEMPERATURE, ract.TOPK_NEG, "contra_ract")


@pytest.mark.parametrize(
    "temperature,topk,variant", [(0.01, 10, "contra_ract"), (0.05, 3, "contra"), (0.02, -1, "contra_ract")]
)
def test_ract_config_reaches_the_term(temperature, topk, variant):
    c = _config("ract")
    c.ract.update(temperature=temperature, topk_neg=topk, variant=variant)
    x = _inputs()
    got = float(get_method(c).extra_terms(x)["L_ract"])
    want = float(
        ract.ract_loss(
            x.new_emb, x.old_emb, x.labels, temperature=temperature, topk_neg=topk, new_to_new=variant == "contra_ract"
        )
    )
    assert got == pytest.approx(want, rel=1e-6)


def test_ract_refuses_more_negatives_than_the_batch_before_the_run():
    c = _config("ract")
    c.train.batch_size = 8
    with pytest.raises(ConfigError, match=r"ract.topk_neg=10 exceeds train.batch_size=8") as e:
        config_checks.check(c, num_devices=1)
    assert "\n" not in str(e.value)
    c.ract.topk_neg = 8
    config_checks.check(c, num_devices=1)  # at most the batch: accepted
    c.ract.variant = "contra_plus"
    with pytest.raises(ConfigError, match="ract.variant='contra_plus' is unknown"):
        config_checks.check(c, num_devices=1)


def test_lce_declares_its_terms_constants_and_no_old_model():
    c = _config("lce")
    m = get_method(c)
    assert not m.uses_old_model and not m.uses_memory and m.official_head == "cosine"
    assert dict(m.loss_terms) == {"L_align": 100.0, "L_bound": 1.0}
    assert (c.loss_weights.L_align, c.loss_weights.L_bound) == (100.0, 1.0)
    assert [type(p) for p in m.constants] == [lce.ClassBoundaries]
    rng = np.random.default_rng(1)
    x = _inputs()
    consts = {
        "lce_centres": jnp.asarray(rng.normal(size=(5, 6)), jnp.float32),
        "lce_boundaries": jnp.asarray(rng.uniform(-0.5, 0.5, 5), jnp.float32),
        "lce_mask": jnp.asarray([True, True, False, True, False]),
    }
    x = StepInputs(**{**x.__dict__, "consts": consts})
    for normalize in (False, True):
        c.lce.normalize_features = normalize
        got = get_method(c).extra_terms(x)
        want = lce.lce_terms(x, normalize_features=normalize)
        assert float(got["L_bound"]) == pytest.approx(float(want["L_bound"]), rel=1e-6)
        assert float(got["L_align"]) == pytest.approx(float(want["L_align"]), rel=1e-6)
    assert float(lce.lce_terms(x, normalize_features=True)["L_bound"]) != pytest.approx(
        float(lce.lce_terms(x)["L_bound"])
    )
