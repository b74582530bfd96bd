"""Entry point: ``python -m cvs_jax.main --config configs/<name>.py --workdir DIR``.

Any config field can be overridden with ``--config.<key>=<value>``; an unknown key
is refused by ml_collections before anything runs.  Rerunning the same command
resumes after the last completed session.
"""

from __future__ import annotations

import sys

import tensorflow_datasets as tfds
from absl import app, flags, logging
from ml_collections import config_flags

from cvs_jax import determinism, trainer

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a configs/<name>.py file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, gallery, metrics and results.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
    tfds.disable_progress_bar()  # one-off dataset preparation; our own progress lines follow
    determinism.apply(_CONFIG.value.deterministic)  # before the first JAX computation
    try:
        trainer.run(_CONFIG.value, _WORKDIR.value)
    except (ValueError, FileNotFoundError, FloatingPointError) as e:
        # Configuration and data problems: one clear message, no traceback.
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    app.run(main)
