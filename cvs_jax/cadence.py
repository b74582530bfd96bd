"""When a training step ends an epoch, writes a mid-epoch checkpoint or prints a progress line."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Events:
    epoch_end: bool  # validation, model selection, metrics line and a progress checkpoint
    checkpoint: bool  # a mid-epoch progress checkpoint (``train.checkpoint_every_steps``)
    log: bool  # a mid-epoch progress line with the ETA (``log_every_steps``)


@dataclasses.dataclass(frozen=True)
class Cadence:
    steps_per_epoch: int
    log_every: int = 0  # 0: never mid-epoch
    checkpoint_every: int = 0  # 0: at epoch ends only

    def after(self, step: int) -> Events:
        """The events after ``step`` steps of the session (1-based count); mid-epoch events never
        coincide with an epoch end, which has its own line and checkpoint."""
        end = step % self.steps_per_epoch == 0
        return Events(
            epoch_end=end,
            checkpoint=not end and bool(self.checkpoint_every) and step % self.checkpoint_every == 0,
            log=not end and bool(self.log_every) and step % self.log_every == 0,
        )
