"""CIFAR-100, disjoint: 20 new classes per session, all their images, no old class returns.

The paper's recipe (cvs_jax/config/defaults.py): ResNet-18 with the CIFAR stem, 5 sessions, batch 16,
256 epochs, memory budget 2000, 10% validation split.  Method defaults to cvs; pass
``--config.method=finetune|joint|...`` for the others and ``configs/cifar100_disjoint.py:<variant>``
for the ablations in ``cvs_jax/config/variants.py`` (and ``:smoke``).  Needs TFDS ``cifar100`` prepared in ArrayRecord format.

Run (a GPU run)::

    python -m cvs_jax.main --config configs/cifar100_disjoint.py --workdir workdirs/cifar100_disjoint --config.data.data_dir=TFDS_DIR

AR@1: not yet measured (no run of this config is recorded in RESULTS.md or BENCHMARKS.md).
"""

from cvs_jax.config import cifar100_general, variants


def get_config(variant: str = ""):
    c = cifar100_general.get_config()  # the recipe and the official session files; only the split differs
    c.data.setup = "disjoint"
    c.data.samples_per_new_class = None  # all 500 images of each class
    return variants.apply(c, variant)
