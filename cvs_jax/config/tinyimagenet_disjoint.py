"""Tiny-ImageNet, disjoint: 20 new classes per session, all their images (official session files).

Same recipe as ``tinyimagenet_general`` (ResNet-18 ImageNet stem, batch 64, budget 4000,
5% validation, RandAugment, 256 epochs); only the split differs.

Run (a GPU run)::

    python -m cvs_jax.main --config configs/tinyimagenet_disjoint.py --workdir workdirs/tinyimagenet_disjoint --config.method=cvs \
        --config.data.manual_dir=DIR_WITH_tiny-imagenet-200.zip

AR@1: not yet measured (no run of this config is recorded in RESULTS.md or BENCHMARKS.md).
"""

from cvs_jax.config import tinyimagenet_general, variants


def get_config(variant: str = ""):
    c = tinyimagenet_general.get_config()
    c.data.setup = "disjoint"
    c.data.samples_per_new_class = None  # all 500 images of each class
    return variants.apply(c, variant)
