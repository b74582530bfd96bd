"""CVS: L = L_c + alpha L_m + beta L_d with herded replay (spec §3-§4).

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

from cvs_jax import losses
from cvs_jax.methods.base import Method, StepInputs


def _terms(inputs: StepInputs, *, use_lm: bool, use_ld: bool, margin: float, squared: bool, per_batch: bool):
    out = {}
    if use_lm:
        out["L_m"] = losses.neighbor_session_triplet_loss(inputs.new_emb, inputs.old_emb, inputs.labels,
                                                          margin=margin, squared=squared)
    if use_ld:
        out["L_d"] = losses.inter_session_coherence_loss(inputs.new_emb, inputs.labels, inputs.aux["centers"],
                                                         inputs.aux["center_mask"], per_batch=per_batch)
    return out


def make_cvs(config: ml_collections.ConfigDict) -> Method:
    c = config.cvs
    if not (c.use_lm or c.use_ld):
        raise ValueError("method=cvs with cvs.use_lm=False and cvs.use_ld=False is plain finetuning "
                         "(plus replay if cvs.replay); use method=finetune, or enable a term.")
    terms = functools.partial(_terms, use_lm=c.use_lm, use_ld=c.use_ld, margin=c.margin,
                              squared=c.squared_triplet, per_batch=c.per_batch_coherence)
    parts = ["L_c"] + (["L_m"] if c.use_lm else []) + (["L_d"] if c.use_ld else [])
    return Method(name="cvs", uses_old_model=c.use_lm, uses_memory=c.replay, uses_centers=c.use_ld,
                  extra_terms=terms,
                  description=" + ".join(parts) + (" with herded replay" if c.replay else " without replay"))
