"""Offline demo: Fashion-MNIST (Debian's dataset-fashion-mnist), general setup (S,C,M,L)=(4,2,20,4).

Sized to finish on a 2-core CPU in a few minutes: a tiny ResNet (1 block per
stage, width 16) on 28x28 grey images, 300 images per new class, 6 epochs per
session with a plain cosine schedule.  Real images, real protocol.

Run (from the repository root; Debian's dataset-fashion-mnist in /usr/share/datasets)::

    python -m cvs_jax.main --config configs/fashion_mnist_general.py --workdir /tmp/cvs --config.method=cvs

Expected AR@1 of cvs, seed 0: 77.92 on the shared 2-core CPU (the nine-method comparison took about
16 min there), 79.23 on one H100 (all nine methods in 189 s): RESULTS.md, "Fashion-MNIST demo, general
(S,C,M,L) = (4,2,20,4), all methods" and "The same demo on one H100", row cvs.  Over 5 seeds on the
split of split_seed 0: 75.63 ± 2.98 (RESULTS.md, "Heads × methods on the demo", row cvs).
"""

from cvs_jax.config import base, variants


def get_config(variant: str = ""):
    c = base.get_config()
    c.data.name = "fashion_mnist_local"
    c.data.manual_dir = "/usr/share/datasets/fashion-mnist"
    c.data.setup = "general"
    c.data.num_sessions = 4
    c.data.first_classes = 4
    c.data.classes_per_session = 2
    c.data.old_class_percent = 20.0
    c.data.samples_per_new_class = 300
    c.data.mean = (0.2860,)
    c.data.std = (0.3530,)
    c.model.name = "tiny"
    c.model.width = 16
    c.model.embed_dim = 64
    c.train.epochs = 6
    c.train.batch_size = 32
    c.train.lr = 0.03
    c.train.schedule = "cosine"
    c.augment.crop_padding = 2
    c.augment.flip = True
    c.memory.budget = 200
    return variants.apply(c, variant)
