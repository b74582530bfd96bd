"""Offline TFDS builders (no TensorFlow needed).

Local Fashion-MNIST and the Tiny-ImageNet zip; the fine-grained datasets of
the CVS paper stored as 256x256 arrays: `stanford_dogs_256` and `inat_m`
(derived from standard TFDS datasets prepared in data_dir) and `product_m`
(Product-10K files in a manual dir); `image_folder`, a user's own images.

Import the builders from their modules (`cvs_jax.data.sources.BUILDERS` lists
them): this package re-exports nothing, so importing `builders.resize` (as
`search`, `info`, `export` and the server do) does not import
tensorflow_datasets (~0.2-0.4 s) with every builder.
"""
