"""Tiny-ImageNet, general setup (S,C,M,L) = (20,20,30,10): the paper's recipe (official launch script and session files).

ResNet-18 with the ImageNet stem on 64x64 inputs, batch 64, memory budget 4000,
5% validation split, 225 images per new class, official SGDR schedule, 256 epochs.
Expects the official ``tiny-imagenet-200.zip`` in ``data.manual_dir``.

Run (a GPU run: ResNet-18, 256 epochs per session)::

    python -m cvs_jax.main --config configs/tinyimagenet_general.py --workdir workdirs/tiny --config.method=cvs \
        --config.data.manual_dir=DIR_WITH_tiny-imagenet-200.zip

AR@1: not yet measured (no run of this config is recorded in RESULTS.md or BENCHMARKS.md) (the paper reports 38.78 for CVS, as RESULTS.md recalls).
"""

from cvs_jax.config import base, variants


def get_config(variant: str = ""):
    c = base.get_config()
    c.method = "cvs"
    c.data.name = "tiny_imagenet_zip"
    c.data.manual_dir = "~/tensorflow_datasets/downloads/manual"
    c.data.setup = "general"
    c.data.num_sessions = 10
    c.data.first_classes = 20
    c.data.classes_per_session = 20
    c.data.old_class_percent = 30.0
    c.data.samples_per_new_class = 225
    c.data.val_fraction = 0.05
    c.data.shuffle_classes = False  # official: sorted wnid order
    c.data.mean = (0.4802, 0.4481, 0.3975)
    c.data.std = (0.2302, 0.2265, 0.2262)
    c.model.layout = "imagenet"
    c.train.batch_size = 64
    c.memory.budget = 4000
    c.augment.policy = "randaugment"
    return variants.apply(c, variant)
