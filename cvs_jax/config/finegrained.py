"""The paper's fine-grained recipe shared by Dogs, iNat-M and Product-M (the paper's text; no official script).

ImageNet-pretrained ResNet-50 (torchvision layout, every BatchNorm frozen on its ImageNet
statistics), 128-d embedding, 100 epochs per session at a constant SGD learning rate of 1e-4,
batch 64; RandomResizedCrop 224 + flip for training, Resize 256 + CenterCrop 224 for
evaluation (images are stored at 256x256, see ``cvs_jax/data/builders/resize.py``), ImageNet
mean/std.  The pretrained weights are the user's file: set ``--config.model.pretrained=PATH``
(torchvision ``resnet50-0676ba61.pth`` or its ``.npz`` conversion, docs/configs-and-data.md); without it
the network starts from random weights, which is not the paper's setting.

Not run by itself: ``dogs_general``, ``inat_general``, ``productm_general`` and
``image_folder_general`` build on it (their docstrings give the commands and results).
"""

from cvs_jax.config import base


def get_config():
    c = base.get_config()
    c.method = "cvs"
    c.data.setup = "general"
    c.data.data_dir = "~/tensorflow_datasets"
    c.data.shuffle_classes = True
    c.data.mean = (0.485, 0.456, 0.406)
    c.data.std = (0.229, 0.224, 0.225)
    c.model.name = "resnet50"
    c.model.layout = "torchvision"
    c.model.width = 64
    c.model.frozen_bn = True
    c.train.epochs = 100
    c.train.schedule = "constant"
    c.train.lr = 1e-4
    c.train.batch_size = 64
    c.train.eval_batch_size = 256
    c.augment.crop = "resized"
    c.augment.size = 224
    c.augment.flip = True
    c.augment.policy = "none"
    return c
