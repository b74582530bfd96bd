"""RACT / Hot-refresh (ICLR 2022): the regression-alleviating compatible term, OpenCompatible's ``contra_ract``.

Transcribed from TencentARC/OpenCompatible (commit 6eb5499):

* ``model/loss.py`` 136-139: n = normalize(f_new), o = normalize(f_old).detach();
* ``model/loss.py`` 148-153: M_ij = 1[y_i = y_j] over the (global) batch, the diagonal included;
* ``model/loss.py`` 52-66 (``contra_ract``): logits of anchor i are
  [<n_i, o_i> ; <n_i, o_j> - 1e9 M_ij for all j ; <n_i, n_j> - 1e9 M_ij for all j] / T, optionally
  only the ``topk_neg`` largest of each negative block, then cross-entropy with target 0
  (``nn.CrossEntropyLoss``: mean over the anchors); ``contra`` (39-50) is the same without the
  new->new block;
* ``model/loss.py`` 14-18 and 142-145: with ``gather_all`` (``config.json`` 69: true) the negatives
  are all-gathered, and ``torch.distributed.all_gather`` carries no gradient: the new->new block's
  keys are constants, only its anchors get a gradient.  cvs-jax's step sees the global batch in one
  program, so the keys are ``stop_gradient``-ed to keep that rule;
* ``config.json`` 45 and 48: T = 0.01, ``topk_neg`` = 10; 50: weight 1.0;
* ``trainer/trainer.py`` 216 and 263: total = the classification loss + the compatible term.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections

from cvs_jax.errors import ConfigError
from cvs_jax.methods.base import Method, StepInputs
from cvs_jax.methods.losses import l2_normalize

TEMPERATURE = 0.01  # config.json comp_loss.temperature
TOPK_NEG = 10  # config.json comp_loss.topk_neg (-1: every negative)
MASK_PENALTY = 1e9  # loss.py: logits - masks * 1e9
VARIANTS = ("contra_ract", "contra")  # config.ract.variant; contra: without the new->new block


def ract_logits(
    new_emb: jax.Array,
    old_emb: jax.Array,
    labels: jax.Array,
    *,
    temperature: float = TEMPERATURE,
    topk_neg: int = TOPK_NEG,
    new_to_new: bool = True,
) -> jax.Array:
    """The ``contra_ract`` logits [B, 1 + 2k] (k = B, or ``topk_neg`` when > 0); column 0 is the positive.

    ``new_to_new=False`` is OpenCompatible's ``contra`` (no new->new block).  ``topk_neg`` must not
    exceed the batch (``torch.topk`` refuses it too)."""
    b = new_emb.shape[0]
    if topk_neg > b:
        raise ValueError(f"topk_neg={topk_neg} exceeds the batch of {b} rows")
    n = l2_normalize(new_emb)
    o = jax.lax.stop_gradient(l2_normalize(old_emb))
    labels = jnp.asarray(labels)
    mask = (labels[:, None] == labels[None, :]).astype(n.dtype)  # diagonal included
    hi = jax.lax.Precision.HIGHEST
    pos = jnp.sum(n * o, axis=-1, keepdims=True)
    blocks = [jnp.matmul(n, o.T, precision=hi) - mask * MASK_PENALTY]
    if new_to_new:
        blocks.append(jnp.matmul(n, jax.lax.stop_gradient(n).T, precision=hi) - mask * MASK_PENALTY)
    if topk_neg > 0:
        blocks = [jax.lax.top_k(x, topk_neg)[0] for x in blocks]
    return jnp.concatenate([pos] + blocks, axis=1) / temperature


def ract_loss(
    new_emb: jax.Array,
    old_emb: jax.Array,
    labels: jax.Array,
    *,
    temperature: float = TEMPERATURE,
    topk_neg: int = TOPK_NEG,
    new_to_new: bool = True,
) -> jax.Array:
    """L_comp: cross-entropy of :func:`ract_logits` with target 0, mean over the batch."""
    logits = ract_logits(new_emb, old_emb, labels, temperature=temperature, topk_neg=topk_neg, new_to_new=new_to_new)
    return -jnp.mean(jax.nn.log_softmax(logits, axis=-1)[:, 0])


def ract_terms(x: StepInputs, *, temperature: float = TEMPERATURE, topk_neg: int = TOPK_NEG, new_to_new: bool = True):
    """``extra_terms`` of a ``ract`` method (needs the old model): ``{"L_ract": L_comp}``, weight 1.0."""
    assert x.old_emb is not None  # uses_old_model=True: the step passes the old model's rows
    return {
        "L_ract": ract_loss(
            x.new_emb, x.old_emb, x.labels, temperature=temperature, topk_neg=topk_neg, new_to_new=new_to_new
        )
    }


def make_ract(config: ml_collections.ConfigDict) -> Method:
    """The ``ract`` method: L_c + L_ract with the frozen old model, no replay; settings ``config.ract``."""
    r = config.ract
    if r.variant not in VARIANTS:
        raise ConfigError(f"ract.variant={r.variant!r} is unknown; choose one of {list(VARIANTS)}.")
    if not r.temperature > 0:
        raise ConfigError(f"ract.temperature={r.temperature} must be positive (official 0.01).")
    if r.topk_neg > config.train.batch_size:
        raise ConfigError(
            f"ract.topk_neg={r.topk_neg} exceeds train.batch_size={config.train.batch_size}: the term keeps the "
            f"topk_neg largest negatives of a batch; lower ract.topk_neg (-1: every negative) or raise the batch."
        )
    terms = functools.partial(
        ract_terms, temperature=r.temperature, topk_neg=r.topk_neg, new_to_new=r.variant == "contra_ract"
    )
    return Method(
        name="ract",
        uses_old_model=True,
        extra_terms=terms,
        loss_terms={"L_ract": 1.0},  # config.json comp_loss weight 1.0
        description=f"RACT ({r.variant}, T={r.temperature}, topk_neg={r.topk_neg}): contrastive term new -> old",
    )
