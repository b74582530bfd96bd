r"""Train and evaluate one continual-visual-search method over the sessions of a config.

    python -m cvs_jax.main --config configs/<name>.py[:<variant>] --workdir DIR [--config.<field>=<value> ...]

Example (the offline Fashion-MNIST demo, CVS, 2 epochs per session):

    python -m cvs_jax.main --config configs/fashion_mnist_general.py --workdir workdirs/demo \
        --config.method=cvs --config.train.epochs=2

Fields you usually change (any field of cvs_jax/config/defaults.py works, and loss_weights.<term>; an unknown
one is refused before anything runs): ``method``, ``seed``, ``train.epochs``, ``train.lr``, ``train.batch_size``,
``memory.budget``, ``model.head``, ``data.manual_dir`` (where the dataset's files are), ``data.num_sessions``,
``population`` (N members of one method in one vmapped step).

Rerunning the same command resumes after the last checkpoint.  A problem to fix (config, data,
weights, a busy workdir) ends with one ``error: ...`` line and exit status 2.

Your own photos: ``--config configs/image_folder_general.py --config.data.manual_dir=PHOTOS`` (class
folders, train/ + test/ folders or a CSV manifest); then ``python -m cvs_jax.update --workdir W
--data NEW_PHOTOS`` for each later session, ``python -m cvs_jax.search --workdir W --images ...`` to
query the gallery and ``python -m cvs_jax.export --workdir W --out DIR`` for an ANN index.
"""

from __future__ import annotations

from absl import flags
from ml_collections import config_flags

from cvs_jax import cli
from cvs_jax.engine import determinism, runner
from cvs_jax.errors import ConfigError


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    config_flags.DEFINE_config_file("config", None, cli.config_help(), lock_config=True, flag_values=flag_values)
    flags.DEFINE_string(
        "workdir", None, "Directory for checkpoints, gallery, metrics and results.", flag_values=flag_values
    )
    flags.mark_flags_as_required(["config", "workdir"], flag_values=flag_values)


@cli.command
def main(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> int:
    if len(argv) > 1:
        raise ConfigError(f"unexpected arguments: {argv[1:]}; pass --config and --workdir only.")
    cli.quiet_logging()
    determinism.apply(flag_values.config.deterministic)  # before the first JAX computation
    runner.run(flag_values.config, flag_values.workdir)
    return 0


if __name__ == "__main__":
    cli.run(main, define_flags)
