"""CVS: L = L_c + alpha L_m + beta L_d with herded replay (ivclab/CVS ``train.py``).

L_m (neighbor-session model coherence) ties the new embedding of each image to its
embedding by the frozen previous model, with the hardest other-label old embedding
of the batch as negative.  L_d (inter-session data coherence) pulls new embeddings of
old-class samples (current and replayed) to the per-class means of the stored gallery.
Both apply from the second session on; the first session is L_c only, as in the
official launch scripts.  The paper's ablations are switches of ``config.cvs``.
"""

from __future__ import annotations

import functools

import ml_collections

from cvs_jax.errors import ConfigError
from cvs_jax.methods import distillation, losses, policies
from cvs_jax.methods.base import Method, StepInputs

LM_LOSSES = (
    "triplet",
    "batch_hard",
    "dark_knowledge",
    "mlkd_absolute",
    "mlkd_relative",
    "rkd_distance",
    "rkd_angle",
    "darkrank",
)


def _lm(x: StepInputs, kind: str, margin: float, squared: bool):
    """L_m or one of the distillation losses the paper's supplement puts in its place."""
    assert x.old_emb is not None  # uses_old_model=True: the step passes the old model's rows
    if kind == "triplet":
        return losses.neighbor_session_triplet_loss(x.new_emb, x.old_emb, x.labels, margin=margin, squared=squared)
    if kind == "batch_hard":
        return distillation.batch_hard_triplet_loss(x.new_emb, x.old_emb, x.labels, margin=margin)
    if kind == "dark_knowledge":
        return distillation.dark_knowledge_loss(
            x.classifier.logits(x.head, x.new_emb),
            x.classifier.logits(x.old_head, x.old_emb),
            temperature=1.0,
            num_old_classes=x.consts["old_classes"],
        )
    simple = {
        "mlkd_absolute": distillation.mlkd_absolute_loss,
        "mlkd_relative": distillation.mlkd_relative_loss,
        "rkd_distance": distillation.rkd_distance_loss,
        "rkd_angle": distillation.rkd_angle_loss,
        "darkrank": distillation.darkrank_hard_loss,
    }
    return simple[kind](x.new_emb, x.old_emb)


def _terms(
    inputs: StepInputs, *, use_lm: bool, use_ld: bool, lm_loss: str, margin: float, squared: bool, per_batch: bool
):
    out = {}
    if use_lm:
        out["L_m"] = _lm(inputs, lm_loss, margin, squared)
    if use_ld:
        out["L_d"] = losses.inter_session_coherence_loss(
            inputs.new_emb, inputs.labels, inputs.consts["centers"], inputs.consts["center_mask"], per_batch=per_batch
        )
    return out


def make_cvs(config: ml_collections.ConfigDict) -> Method:
    c = config.cvs
    if not (c.use_lm or c.use_ld):
        raise ConfigError(
            "method=cvs with cvs.use_lm=False and cvs.use_ld=False is plain finetuning "
            "(plus replay if cvs.replay); use method=finetune, or enable a term."
        )
    if c.lm_loss not in LM_LOSSES:
        raise ConfigError(f"cvs.lm_loss={c.lm_loss!r} is unknown; choose one of {list(LM_LOSSES)}.")
    terms = functools.partial(
        _terms,
        use_lm=c.use_lm,
        use_ld=c.use_ld,
        lm_loss=c.lm_loss,
        margin=c.margin,
        squared=c.squared_triplet,
        per_batch=c.per_batch_coherence,
    )
    if c.batches not in policies.BATCHES:
        raise ConfigError(f"cvs.batches={c.batches!r} is unknown; choose one of {list(policies.BATCHES)}.")
    parts = ["L_c"] + ([f"L_m ({c.lm_loss})"] if c.use_lm else []) + (["L_d"] if c.use_ld else [])
    return Method(
        name="cvs",
        own_sections=("cvs",),
        uses_old_model=c.use_lm,
        memory=policies.HerdingMemory(config.memory.budget) if c.replay else policies.NoMemory(),
        batches=policies.batch_policy(c.batches),
        constants=(policies.ClassCenters(per_session_mean=c.per_session_centers),) if c.use_ld else (),
        extra_terms=terms,
        loss_terms={"L_m": 10.0, "L_d": 1.0},  # the official L = L_c + 10 L_m + 1 L_d
        description=" + ".join(parts)
        + (" with herded replay" if c.replay else " without replay")
        + (", half-memory batches" if c.batches == "half" else ""),
    )
