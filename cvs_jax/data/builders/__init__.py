"""Offline TFDS builders (no TensorFlow needed).

Local Fashion-MNIST and the Tiny-ImageNet zip; the fine-grained datasets of
the CVS paper stored as 256x256 arrays: `stanford_dogs_256` and `inat_m`
(derived from standard TFDS datasets prepared in data_dir) and `product_m`
(Product-10K files in a manual dir); `image_folder`, a user's own images.

Each dataset's module is its file half (a `_common.LocalSource`: where its files
are, what they hold, the record store they go to; `cvs_jax.data.stores.SOURCES`
lists them) and imports no tensorflow_datasets; `tfds_builders.py` is their TFDS
half (`BUILDERS`), imported only to prepare a store.  This package re-exports
nothing, so `search`, `info`, `export` and the server, which find a run's stores
through the file halves, never import tensorflow_datasets (0.1-0.35 s of CPU and ~10 MB of
peak memory per process: docs/testing.md).
"""
