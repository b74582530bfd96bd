"""CIFAR-100, blurry10: every session holds all 100 classes, 90% of a session from its 20 major classes.

The paper's recipe (cvs_jax/config/defaults.py): ResNet-18 with the CIFAR stem, 5 sessions, batch 16,
256 epochs, memory budget 2000, 10% validation split.  Method defaults to cvs; pass
``--config.method=finetune|joint|...`` for the others and ``configs/cifar100_blurry.py:<variant>``
for the ablations in ``cvs_jax/config/variants.py`` (and ``:smoke``).  Needs TFDS ``cifar100`` prepared in ArrayRecord format.

Run (a GPU run)::

    python -m cvs_jax.main --config configs/cifar100_blurry.py --workdir workdirs/cifar100_blurry --config.data.data_dir=TFDS_DIR

AR@1: not yet measured (no run of this config is recorded in RESULTS.md or BENCHMARKS.md).
"""

from cvs_jax.config import cifar100_general, variants


def get_config(variant: str = ""):
    c = cifar100_general.get_config()  # the recipe and the official session files; only the split differs
    c.data.setup = "blurry"
    c.data.samples_per_new_class = None
    c.data.blurry_minor_percent = 10.0  # "blurry10": 90% major / 10% minor
    return variants.apply(c, variant)
