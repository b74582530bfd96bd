"""iNat-M (200 iNaturalist-2017 classes x 527 images), general (S,C,M,L) = (100,25,30,5), budget 4000.

5% validation queries per session (paper §4.1); the test queries are the iNat-2017 validation
images of the 200 classes.  Data: the derived builder ``inat_m`` reads TFDS ``i_naturalist2017``
prepared (array_record) in ``data.data_dir`` and draws the classes and images with a fixed seed
(``cvs_jax/data/builders/inat_m.py``).  The Caltech URLs TFDS registers for ``i_naturalist2017`` are
reported dead: without the prepared source the run stops with one line naming the AWS Open Data bucket
that serves the 2017 files today and how to hand them to ``tfds build`` as a manual dir.  Without
``model.pretrained`` the run warns that ResNet-50 starts from random weights (the paper: ImageNet).
Recipe: ``cvs_jax/config/finegrained.py``.

Run::

    python -m cvs_jax.main --config configs/inat_general.py --workdir workdirs/inat --config.method=cvs \
        --config.data.data_dir=TFDS_DIR --config.model.pretrained=resnet50.npz

AR@1: not yet measured (no run of this config is recorded in RESULTS.md or BENCHMARKS.md).
"""

from cvs_jax.config import finegrained, variants


def get_config(variant: str = ""):
    c = finegrained.get_config()
    c.data.name = "inat_m"
    c.data.num_sessions = 5
    c.data.first_classes = 100
    c.data.classes_per_session = 25
    c.data.old_class_percent = 30.0
    c.data.samples_per_new_class = None
    c.data.val_fraction = 0.05
    c.memory.budget = 4000
    return variants.apply(c, variant)
