"""What a continual-learning method contributes to the shared trainer.

Every method trains with the normalized-softmax loss L_c on a growing cosine head;
a method adds named loss terms (each with its weight), says which data it trains
on, whether it needs the frozen previous model in the step, and whether it keeps
a replay memory or re-extracts the gallery.  The trainer, data, gallery and
evaluator are shared, so all methods run on identical splits and seeds.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax


@dataclasses.dataclass(frozen=True)
class StepInputs:
    """Everything a method's loss terms may read inside the jitted step."""

    params: Mapping[str, Any]  # current parameters: "net", "head" and any method extras
    new_emb: jax.Array  # [B, D] current model, train mode
    old_emb: jax.Array | None  # [B, D] frozen previous model, eval mode (None if unused)
    labels: jax.Array  # [B] protocol labels
    head: jax.Array  # [K, D] current cosine head
    old_head: jax.Array | None  # [K, D] previous session's head (frozen)
    aux: Mapping[str, jax.Array]  # per-session constants: valid_classes, old_classes, centers, ...


# A term function returns {name: scalar}; its weights come from the config.
TermFn = Callable[[StepInputs], dict]


@dataclasses.dataclass(frozen=True)
class Method:
    name: str
    train_on: str = "session"  # "session": the session's data; "cumulative": all data seen so far
    reextract_gallery: bool = False  # True only for the joint upper bound
    uses_old_model: bool = False  # run the frozen previous model in the step (sessions >= 1)
    memory_policy: str = "none"  # "herding" (iCaRL), "reservoir", "rainbow" (uncertainty) or "none"
    half_memory_batches: bool = False  # Rainbow: every batch half session data, half memory
    uses_centers: bool = False  # per-class centres of the stored gallery (L_d)
    importance: str = "none"  # "ewc" / "rwalk": parameter importance for a quadratic penalty
    extra_params: Callable[[Mapping[str, Any]], dict] | None = None  # trainable extras from the frozen params
    extra_terms: TermFn | None = None  # added to L_c from session 1 on
    description: str = ""

    @property
    def uses_memory(self) -> bool:
        return self.memory_policy != "none"
