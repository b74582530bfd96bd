"""CL²R and d-Simplex-HOC as registered on the fixed d-simplex head.

* HOC's loss from the second session on is lambda CE + (1 - lambda) L_HOC on the reversed simplex
  (numpy reference: the step's L_c plus every term at its configured weight), for the official lambda
  and another one; session 1 is CE alone (the step adds no term there);
* CL²R's weighted term is 5 sqrt(new / old) mean(1 - cos) over the memory half (numpy reference; the
  class counts: tests/methods/test_compared_fairly.py);
* what each declares: head, memory, batches, terms; HOC's reversed head keeps its session 1 its own;
* a simplex that does not fit model.embed_dim is refused by the config check, K counted with head_block.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from cvs_jax.config import fashion_mnist_general
from cvs_jax.engine import config_checks
from cvs_jax.errors import ConfigError
from cvs_jax.methods import policies
from cvs_jax.methods.base import StepInputs
from cvs_jax.methods.class_memory import PerClassRandomMemory
from cvs_jax.methods.registry import get_head, get_method, head_name
from cvs_jax.models.simplex_head import SimplexHead, simplex_rows

K, D, B = 6, 8, 12


def _config(method):
    c = fashion_mnist_general.get_config()
    c.method = method
    return c


def _inputs(head, seed=0):
    rng = np.random.default_rng(seed)
    rows = {"head": simplex_rows(K, D)}
    return StepInputs(
        params={},
        new_emb=jnp.asarray(rng.normal(size=(B, D)) * 2, jnp.float32),
        old_emb=jnp.asarray(rng.normal(size=(B, D)), jnp.float32),
        labels=jnp.asarray(rng.integers(0, 4, B)),
        classifier=head,
        head=rows,
        old_head=rows,
        consts={"valid_classes": jnp.int32(4), "old_classes": jnp.int32(3), "cl2r_scale": jnp.float32(np.sqrt(5 / 3))},
    )


def _np_ce(logits, labels):
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return -logp[np.arange(len(labels)), labels].mean()


def _np_unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _np_hoc(new, old, labels, mu):
    sim = mu * _np_unit(old) @ _np_unit(new).T
    other = labels[:, None] != labels[None, :]
    z = sim * other  # same-class entries become 0 and stay in the log-sum-exp
    lse = np.log(np.exp(z).sum(axis=1))
    return np.mean(-np.diag(sim) + lse)


def _step_loss(config, x):
    """What the step minimises from the second session on: L_c + sum_t w_t L_t."""
    m = get_method(config)
    terms = m.extra_terms(x)
    assert set(terms) == set(m.loss_terms)
    l_c = x.classifier.loss(x.head, x.new_emb, x.labels, x.consts["valid_classes"])
    return float(l_c + sum(config.loss_weights[t] * v for t, v in terms.items()))


@pytest.mark.parametrize("ce_weight", [0.1, 0.3])
def test_hoc_loss_is_lambda_ce_plus_the_rest_hoc_on_the_reversed_simplex(ce_weight):
    c = _config("hoc")
    c.hoc.ce_weight = ce_weight  # the one setting: the HOC term's 1 - lambda follows it
    head = get_head(c)
    assert head == SimplexHead(reverse_labels=True)
    x = _inputs(head)
    new, old, labels = (np.asarray(a, np.float64) for a in (x.new_emb, x.old_emb, x.labels))
    labels = labels.astype(int)
    w = np.asarray(simplex_rows(K, D), np.float64)[::-1]  # class y on row K - 1 - y
    want = ce_weight * _np_ce(new @ w.T, labels) + (1 - ce_weight) * _np_hoc(new, old, labels, 10.0)
    assert _step_loss(c, x) == pytest.approx(want, rel=1e-5)


def test_hoc_official_weights():
    c = _config("hoc")
    assert (c.hoc.ce_weight, c.hoc.mu, c.hoc.per_class) == (0.1, 10.0, 20)
    assert c.loss_weights.L_hoc == 1.0 and c.loss_weights.L_c_hoc == 1.0  # both terms carry 1 - lambda


def test_cl2r_term_is_five_sqrt_new_over_old_on_the_memory_half():  # sqrt(new / old): the step's cl2r_scale
    c = _config("cl2r")
    x = _inputs(get_head(c))
    terms = get_method(c).extra_terms(x)
    new, old = np.asarray(x.new_emb, np.float64), np.asarray(x.old_emb, np.float64)
    memory = np.arange(B) >= B - B // 2  # half-memory batches: the stream first, the memory last
    want = 5.0 * np.sqrt(5 / 3) * np.mean(1 - np.sum(_np_unit(new) * _np_unit(old), axis=1)[memory])
    assert c.loss_weights.L_fd * float(terms["L_fd"]) == pytest.approx(want, rel=1e-5)


def test_what_each_declares():
    for name in ("cl2r", "hoc"):
        c = _config(name)
        m = get_method(c)
        assert head_name(c) == "simplex" and m.uses_old_model and m.trains
        assert m.memory == PerClassRandomMemory(20)
        assert m.batches == policies.HalfMemoryBatches("cycle")
    assert get_method(_config("cl2r")).shares_first_session
    assert get_head(_config("cl2r")) == SimplexHead(reverse_labels=False)
    assert not get_method(_config("hoc")).shares_first_session  # its reversed rows: its own session 1
    c = _config("cl2r")
    c.cl2r.per_class = 0
    with pytest.raises(ConfigError, match="cl2r.per_class=0"):
        get_method(c)


def test_a_simplex_wider_than_the_embedding_is_refused_by_the_config_check():
    c = _config("cl2r")  # 10 classes: 9 dimensions
    c.model.embed_dim = 8
    with pytest.raises(ConfigError, match=r"model.embed_dim=8 is too narrow .* 10 rows.*>= 9"):
        config_checks.check(c, num_devices=1)
    c.model.embed_dim = 9
    config_checks.check(c, num_devices=1)
    c.model.head_block = 8  # 10 classes in blocks of 8: 16 rows
    with pytest.raises(ConfigError, match=r"16 rows.*>= 15"):
        config_checks.check(c, num_devices=1)
    c.model.head = "cosine"  # another head: no simplex to fit
    config_checks.check(c, num_devices=1)


def test_cores_declares_the_simplex_and_no_term():
    c = _config("cores")
    m = get_method(c)
    assert head_name(c) == "simplex" and get_head(c) == SimplexHead(reverse_labels=False)
    assert not m.uses_old_model and m.extra_terms is None and not m.loss_terms
    assert m.uses_memory and m.batches == policies.MixedBatches() and m.shares_first_session
