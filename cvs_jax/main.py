"""Train and evaluate one method: ``python -m cvs_jax.main --config configs/<name>.py[:<variant>] --workdir DIR``.

Any config field can be overridden with ``--config.<key>=<value>``; an unknown key
is refused by ml_collections before anything runs.  Rerunning the same command
resumes after the last completed session.  A problem to fix (config, data, weights,
a busy workdir) ends with one ``error: ...`` line and exit status 2.

Your own photos: ``--config configs/image_folder_general.py --config.data.manual_dir=PHOTOS`` (class
folders, train/ + test/ folders or a CSV manifest); then ``python -m cvs_jax.update --workdir W
--data NEW_PHOTOS`` for each later session, ``python -m cvs_jax.search --workdir W --images ...`` to
query the gallery and ``python -m cvs_jax.export --workdir W --out DIR`` for an ANN index.
"""

from __future__ import annotations

import sys

import tensorflow_datasets as tfds
from absl import flags
from ml_collections import config_flags

from cvs_jax import cli
from cvs_jax.engine import determinism, runner
from cvs_jax.errors import ConfigError, UserError

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command's flags (defined when it runs, so that tests can import every entry point together)."""
    config_flags.DEFINE_config_file("config", None, cli.config_help(), lock_config=True)
    flags.DEFINE_string("workdir", None, "Directory for checkpoints, gallery, metrics and results.")
    flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    if len(argv) > 1:
        sys.exit(cli.report(ConfigError(f"unexpected arguments: {argv[1:]}; pass --config and --workdir only.")))
    cli.quiet_logging()
    tfds.disable_progress_bar()  # one-off dataset preparation; our own progress lines follow
    determinism.apply(FLAGS.config.deterministic)  # before the first JAX computation
    try:
        runner.run(FLAGS.config, FLAGS.workdir)
    except UserError as e:  # a problem the user must fix: one line, no traceback; anything else is a bug
        sys.exit(cli.report(e))


if __name__ == "__main__":
    define_flags()
    cli.run(main)
