"""Tiny-ImageNet, blurry30: every session holds all 200 classes, 70% from its 20 major classes (official session files).

Same recipe as ``tinyimagenet_general`` (ResNet-18 ImageNet stem, batch 64, budget 4000,
5% validation, RandAugment, 256 epochs); only the split differs.

Run (a GPU run)::

    python -m cvs_jax.main --config configs/tinyimagenet_blurry.py --workdir workdirs/tinyimagenet_blurry --config.method=cvs \
        --config.data.manual_dir=DIR_WITH_tiny-imagenet-200.zip

AR@1: not yet measured (no run of this config is recorded in RESULTS.md or BENCHMARKS.md).
"""

from cvs_jax.config import tinyimagenet_general, variants


def get_config(variant: str = ""):
    c = tinyimagenet_general.get_config()
    c.data.setup = "blurry"
    c.data.blurry_minor_percent = 30.0  # "blurry30": 70% major / 30% minor, 336 + 9 x 16 images per class
    c.data.samples_per_new_class = None
    return variants.apply(c, variant)
