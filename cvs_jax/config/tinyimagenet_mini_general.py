"""CPU-sized experiment on the 200-class Tiny-ImageNet mini subset (100 train images per class).

Same protocol as ``tinyimagenet_general`` (10 sessions, (20,20,30,10), 5% validation),
but the new-class share is derived from the 100 images per class, the memory budget is
~5% of the data used (1000), and a tiny ResNet (1 block per stage, width 16) is trained
for 16 epochs per session with a cosine schedule, crop + flip only, so that a run fits a 2-core CPU.
Reads ``../shared/data/tiny-imagenet-200-mini.zip`` (run from the repository root).

Run (from the repository root)::

    python -m cvs_jax.main --config configs/tinyimagenet_mini_general.py --workdir /tmp/tiny --config.method=cvs

Expected AR@1 of cvs, seed 0: 9.18 on the 2-core CPU (its sessions took 797 s; the finetune, cvs and
joint comparison 3,494 s): RESULTS.md, "Tiny-ImageNet mini (200 classes, 100 train images per class),
general (20,20,30,10)", row cvs; over 3 seeds 8.78 ± 0.35 (RESULTS.md, "Tiny-ImageNet mini × 3 seeds").
``:gpu``: not yet measured (RESULTS.md, "Tiny-ImageNet mini on one GPU (`:gpu`): not run yet").
"""

from cvs_jax.config import tinyimagenet_general, variants


def get_config(variant: str = ""):
    c = tinyimagenet_general.get_config()
    c.data.manual_dir = "../shared/data"
    c.data.samples_per_new_class = None  # the largest count the 100 images per class allow
    c.model.name = "tiny"
    c.model.width = 16
    c.train.epochs = 16
    c.train.schedule = "cosine"
    c.memory.budget = 1000
    c.augment.policy = "none"  # crop + flip only: RandAugment slows this CPU run and needs more epochs
    return variants.apply(c, variant)
