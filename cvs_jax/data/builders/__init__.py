"""Offline TFDS builders (no TensorFlow needed).

Local Fashion-MNIST and the Tiny-ImageNet zip; the fine-grained datasets of
the CVS paper stored as 256x256 arrays: `stanford_dogs_256` and `inat_m`
(derived from standard TFDS datasets prepared in data_dir) and `product_m`
(Product-10K files in a manual dir); `image_folder`, a user's own images.
"""

from cvs_jax.data.builders._common import LocalBuilder, SourceInfo
from cvs_jax.data.builders.fashion_mnist_local import FashionMnistLocal
from cvs_jax.data.builders.image_folder import ImageFolder
from cvs_jax.data.builders.inat_m import InatM
from cvs_jax.data.builders.product10k import ProductM
from cvs_jax.data.builders.stanford_dogs import StanfordDogs256
from cvs_jax.data.builders.tiny_imagenet import TinyImagenetZip
from cvs_jax.errors import DatasetNotFoundError, SourceMismatchError

__all__ = [
    "DatasetNotFoundError",
    "FashionMnistLocal",
    "ImageFolder",
    "InatM",
    "LocalBuilder",
    "ProductM",
    "SourceInfo",
    "SourceMismatchError",
    "StanfordDogs256",
    "TinyImagenetZip",
]
