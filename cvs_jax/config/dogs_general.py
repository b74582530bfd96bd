"""Stanford Dogs, general setup (S,C,M,L) = (60,20,30,4), memory budget 600 (paper §4.1).

120 classes, 100 training images each (TFDS ``stanford_dogs``: 12,000 train / 8,580 test; the
test split is the query set), 10% validation queries per session.  Data: the derived builder
``stanford_dogs_256`` reads TFDS ``stanford_dogs`` prepared (array_record) in ``data.data_dir``.
Recipe: ``cvs_jax/config/finegrained.py``.

Run::

    python -m cvs_jax.main --config configs/dogs_general.py --workdir workdirs/dogs --config.method=cvs \
        --config.data.data_dir=TFDS_DIR --config.model.pretrained=resnet50.npz

AR@1: not yet measured (no run of this config is recorded in RESULTS.md or BENCHMARKS.md); BENCHMARKS.md, "(a') The fine-grained recipe's step", puts its 100-epoch schedule at about 7 minutes of steps on one H100 from the measured 2,388 img/s.
"""

from cvs_jax.config import finegrained, variants


def get_config(variant: str = ""):
    c = finegrained.get_config()
    c.data.name = "stanford_dogs_256"
    c.data.num_sessions = 4
    c.data.first_classes = 60
    c.data.classes_per_session = 20
    c.data.old_class_percent = 30.0
    c.data.samples_per_new_class = None  # the largest count the 100 images per class allow
    c.data.val_fraction = 0.1
    c.memory.budget = 600
    return variants.apply(c, variant)
