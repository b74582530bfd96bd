"""Product-M (Product-10K classes with >= 20 images: 2,743), general (S,C,M,L) = (1343,700,40,3).

Memory budget 3000 (1-2 exemplars per class), batch 32, and 2 validation queries per class and
session instead of a fraction (paper §4.1).  Classes hold 16 to hundreds of images, so the general
split's counts scale with class size (``data.general_shares="proportional"``): the uniform rule would
give every class what the smallest allows and leave most images unused.  Data: the manual builder ``product_m`` reads the
official Product-10K ``train.csv`` + ``train/`` (or ``train.zip``) from ``data.manual_dir``;
its labelled training set is split into train/test per class (``cvs_jax/data/builders/product10k.py``).
Recipe: ``cvs_jax/config/finegrained.py``.

Run::

    python -m cvs_jax.main --config configs/productm_general.py --workdir workdirs/productm --config.method=cvs \
        --config.data.manual_dir=PRODUCT10K --config.model.pretrained=resnet50.npz

AR@1: not yet measured (no run of this config is recorded in RESULTS.md or BENCHMARKS.md); docs/configs-and-data.md gives only the peak memory of a tiny two-session run.
"""

from cvs_jax.config import finegrained, variants


def get_config(variant: str = ""):
    c = finegrained.get_config()
    c.data.name = "product_m"
    c.data.manual_dir = "~/tensorflow_datasets/downloads/manual/product10k"
    c.data.num_sessions = 3
    c.data.first_classes = 1343
    c.data.classes_per_session = 700
    c.data.old_class_percent = 40.0
    c.data.samples_per_new_class = None
    c.data.general_shares = "proportional"  # long-tailed: each class's counts scale with its size
    c.data.val_fraction = 0.0
    c.data.val_per_class = 2
    c.train.batch_size = 32
    c.memory.budget = 3000
    return variants.apply(c, variant)
