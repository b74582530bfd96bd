"""Per-epoch learning rates.  The LR is constant within an epoch (the official
code steps its scheduler once per epoch).

``official``: the GDumb-style schedule of the official code: epoch 0 at 0.1*lr,
epoch 1 at lr, then ``CosineAnnealingWarmRestarts(T_0=1, T_mult=2,
eta_min=0.01*lr)`` stepped once per epoch, i.e. restarts at epochs 2, 4, 8, 16, ...
each cycle as long as its start epoch.  ``cosine``: one cosine decay from lr to
0.01*lr over the session.  ``constant``: the fine-grained recipe (fixed lr).
"""

from __future__ import annotations

import math

from cvs_jax.errors import ConfigError

SCHEDULES = ("official", "cosine", "constant")


def _cos(base: float, lo: float, frac: float) -> float:
    return lo + (base - lo) * (1.0 + math.cos(math.pi * frac)) / 2.0


def epoch_lr(name: str, epoch: int, base_lr: float, epochs: int) -> float:
    """Learning rate of ``epoch`` (0-based) in a session of ``epochs`` epochs."""
    lo = 0.01 * base_lr
    if name == "official":
        if epoch == 0:
            return 0.1 * base_lr
        if epoch == 1:
            return base_lr
        start = 2 ** int(math.floor(math.log2(epoch)))
        return _cos(base_lr, lo, (epoch - start) / start)
    if name == "cosine":
        return _cos(base_lr, lo, epoch / max(epochs, 1))
    if name == "constant":
        return base_lr
    raise ConfigError(f"train.schedule={name!r} is unknown; choose one of {SCHEDULES}.")
