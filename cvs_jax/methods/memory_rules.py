"""``memory.rule``: each replay method's own memory, or another method's, so that methods can be compared at
equal memory as well as at their official one.

The official rules differ in size, not only in how images are chosen: cvs (and Rainbow, BCT on disjoint)
keep ``memory.budget`` images in all, ``budget // classes seen`` of each class; CL²R and d-Simplex-HOC keep
``<method>.per_class`` (20) random images of every class seen, a memory that grows with the classes; CoReS
replays every earlier training image.  ``memory.rule`` swaps the size rule and keeps the method's way of
choosing where it has one:

* ``official``: the method's own rule (the default);
* ``budget``: at most ``memory.budget`` images, ``budget // classes seen`` per class (cvs's count): herding
  stays herding, the random per-class memory draws at random, CoReS's all-images memory becomes random;
* ``per_class``: ``memory.per_class`` images of every class seen, no budget (CL²R's and HOC's count; cvs
  herds that many); the per-class methods keep their own ``<method>.per_class``;
* ``all``: every earlier training image (CoReS's).

A method without a replay memory refuses any rule but ``official``.
"""

from __future__ import annotations

import ml_collections

from cvs_jax.errors import ConfigError
from cvs_jax.methods import policies
from cvs_jax.methods.class_memory import AllSeenMemory, PerClassRandomMemory

RULES = ("official", "budget", "per_class", "all")


def choose(config: ml_collections.ConfigDict, official, method: str):
    """The memory policy of ``method`` under ``config.memory.rule`` (``official``: its own policy)."""
    m = config.memory
    rule = m.get("rule", "official")
    if rule not in RULES:
        raise ConfigError(f"memory.rule={rule!r} is unknown; choose one of {list(RULES)}.")
    if rule == "official":
        return official
    if not official.keeps_memory:
        raise ConfigError(
            f"memory.rule={rule} applies to a method with a replay memory; {method} keeps none here "
            "(leave memory.rule=official)."
        )
    if rule == "all":
        return AllSeenMemory()
    if rule == "budget":
        if isinstance(official, policies.HerdingMemory):
            return policies.HerdingMemory(m.budget)
        if isinstance(official, (PerClassRandomMemory, AllSeenMemory)):
            return PerClassRandomMemory(budget=m.budget)
        return official  # Rainbow's uncertainty memory, the reservoir: already memory.budget
    per_class = m.get("per_class", 20)
    if not isinstance(per_class, int) or per_class < 1:
        raise ConfigError(f"memory.per_class={per_class!r} must be a positive integer (CL²R's 20).")
    if isinstance(official, policies.HerdingMemory):
        return policies.HerdingMemory(m.budget, per_class=per_class)
    if isinstance(official, PerClassRandomMemory):
        return official
    if isinstance(official, AllSeenMemory):
        return PerClassRandomMemory(per_class)
    raise ConfigError(f"memory.rule=per_class is not defined for {method}'s memory; use official, budget or all.")


def rule_of(policy) -> str:
    """The size rule a memory policy follows: one of ``RULES[1:]``, or "none"."""
    if not policy.keeps_memory:
        return "none"
    if isinstance(policy, AllSeenMemory):
        return "all"
    if isinstance(policy, PerClassRandomMemory):
        return "budget" if policy.budget else "per_class"
    return "per_class" if getattr(policy, "per_class", 0) else "budget"


def describe(policy) -> str:
    """The size rule of a memory policy in a few words (``compare``'s table, ``info``)."""
    if isinstance(policy, AllSeenMemory):
        return "every earlier image"
    if isinstance(policy, PerClassRandomMemory):
        if policy.budget:
            return f"budget {policy.budget} (budget // classes each), random"
        return f"{policy.per_class} per class seen, random"
    if isinstance(policy, policies.HerdingMemory):
        if policy.per_class:
            return f"{policy.per_class} per class seen, herding"
        return f"budget {policy.budget} (budget // classes each), herding"
    budget = getattr(policy, "budget", None)
    if not policy.keeps_memory:
        return "none"
    return f"budget {budget}, {type(policy).__name__}" if budget is not None else type(policy).__name__
