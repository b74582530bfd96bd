"""Offline TFDS builders (no TensorFlow needed): local Fashion-MNIST, Tiny-ImageNet zip."""

from cvs_jax.data.builders._common import DatasetNotFoundError
from cvs_jax.data.builders._common import LocalBuilder
from cvs_jax.data.builders._common import SourceInfo
from cvs_jax.data.builders._common import SourceMismatchError
from cvs_jax.data.builders.fashion_mnist_local import FashionMnistLocal
from cvs_jax.data.builders.tiny_imagenet import TinyImagenetZip
