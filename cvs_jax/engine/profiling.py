"""``--config.profile_steps=a:b``: a ``jax.profiler`` trace of the run's global training steps a..b
(1-based, inclusive) in ``<workdir>/profile`` (``rundir.paths.profile_dir``), to open in TensorBoard's
profile plugin or Perfetto (``*.trace.json.gz``).  The trace starts before the call that runs step a
and stops once the call that runs step b has finished on the device, so it holds whole calls."""

from __future__ import annotations

import jax

from cvs_jax.errors import ConfigError


def parse(spec: str) -> tuple[int, int] | None:
    """``"a:b"`` -> ``(a, b)``; ``""`` -> None (no trace).  Refuses anything else in one line."""
    if not spec:
        return None
    first, _, last = str(spec).partition(":")
    try:
        a, b = int(first), int(last)
    except ValueError:
        a, b = 0, -1
    if not 1 <= a <= b:
        raise ConfigError(
            f"profile_steps={spec!r} is not a step range; pass --config.profile_steps=a:b with 1 <= a <= b "
            "(global training steps, e.g. 10:20)."
        )
    return a, b


class StepProfiler:
    """Starts and stops one trace around the calls that run steps a..b of the run."""

    def __init__(self, spec: str, directory: str):
        self.steps, self.directory, self.active, self.done = parse(spec), directory, False, False

    def before(self, first_step: int, n: int) -> None:
        """Before the call that runs global steps ``first_step + 1 .. first_step + n``."""
        if self.steps is None or self.active or self.done:
            return
        a, b = self.steps
        if first_step < b and first_step + n >= a:
            jax.profiler.start_trace(self.directory)
            self.active = True

    def after(self, last_step: int, outputs) -> None:
        """After the call whose last global step is ``last_step`` (``outputs``: what it returned)."""
        if self.active and self.steps is not None and last_step >= self.steps[1]:
            self.stop(outputs)

    def stop(self, outputs=None) -> None:
        if self.active:
            jax.block_until_ready(outputs)
            jax.profiler.stop_trace()
            self.active, self.done = False, True
