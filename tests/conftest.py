"""Test set-up: a persistent XLA compilation cache (compiles dominate CPU test time).

Set through the environment, before jax is imported, so that every process a test starts (``main``,
``update``, ``compare``, multi-device and multi-host workers) reads and fills the same cache: a
subprocess without it compiled its whole program anew (the README walkthrough's two updates took
78 s each, mostly compiling what ``main`` had just compiled)."""

import os

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ.get("CVS_JAX_TEST_CACHE", "/tmp/cvs_jax_xla_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")  # jax reads these when imported

import pytest


@pytest.fixture(scope="module")
def manual_dir(tmp_path_factory):
    """Learnable Fashion-MNIST IDX files (60 train and 10 test images per class), written once per test
    module: the data of ``cvs_jax.testing.tiny_data.tiny_config``'s runs."""
    from cvs_jax.testing.tiny_data import write_fashion_idx

    return write_fashion_idx(str(tmp_path_factory.mktemp("idx")), train_per_class=60, test_per_class=10)
