"""CPU-sized experiment on the 200-class Tiny-ImageNet mini subset (100 train images per class).

Same protocol as ``tinyimagenet_general`` (10 sessions, (20,20,30,10), 5% validation),
but the new-class share is derived from the 100 images per class, the memory budget is
~5% of the data used (1000), and a tiny ResNet (1 block per stage, width 16) is trained
for 16 epochs per session with a cosine schedule, crop + flip only, so that a run fits a 2-core CPU.
Reads ``../shared/data/tiny-imagenet-200-mini.zip`` (run from the repository root).
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
