"""CIFAR-100, disjoint: 20 new classes per session, all their images, no old class returns.

The paper's recipe (cvs_jax/config/defaults.py): ResNet-18 with the CIFAR stem, 5 sessions, batch 16,
256 epochs, memory budget 2000, 10% validation split.  Method defaults to cvs; pass
``--config.method=finetune|joint|...`` for the others and ``configs/cifar100_disjoint.py:<variant>``
for the ablations in ``cvs_jax/config/variants.py`` (and ``:smoke``).  Needs TFDS ``cifar100`` prepared in ArrayRecord format.

Run (a GPU run)::

    python -m cvs_jax.main --config configs/cifar100_disjoint.py --workdir workdirs/cifar100_disjoint --config.data.data_dir=TFDS_DIR

AR@1: not yet measured (no run of this config is recorded in RESULTS.md or BENCHMARKS.md).
"""

from cvs_jax.config import base, variants


def get_config(variant: str = ""):
    c = base.get_config()
    c.method = "cvs"
    c.data.name = "cifar100"
    c.data.split = "official"  # the official CVS session files (packaged); "generator": our seeded generator
    c.data.setup = "disjoint"
    c.data.num_sessions = 5
    c.augment.policy = "cifar10"  # AutoAugment CIFAR-10 policy after crop + flip
    c.data.first_classes = 20
    c.data.classes_per_session = 20
    c.data.samples_per_new_class = None  # all 500 images of each class
    return variants.apply(c, variant)
