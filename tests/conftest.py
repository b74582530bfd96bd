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


@pytest.fixture(scope="session")
def fashion_idx(tmp_path_factory):
    """The one Fashion-MNIST fixture factory: ``fashion_idx(train_per_class, test_per_class)`` -> a folder of
    learnable IDX files of that size (``cvs_jax.testing.tiny_data.write_fashion_idx``), written once per
    test process and shared read-only by every test that asks for that size."""
    from cvs_jax.testing.tiny_data import write_fashion_idx

    made: dict[tuple[int, int], str] = {}

    def make(train_per_class: int = 60, test_per_class: int = 10) -> str:
        key = (train_per_class, test_per_class)
        if key not in made:
            folder = str(tmp_path_factory.mktemp(f"idx{train_per_class}x{test_per_class}"))
            made[key] = write_fashion_idx(folder, train_per_class=train_per_class, test_per_class=test_per_class)
        return made[key]

    return make


@pytest.fixture(scope="module")
def manual_dir(fashion_idx):
    """60 train and 10 test images per class: the data of ``cvs_jax.testing.tiny_data.tiny_config``'s runs."""
    return fashion_idx(60, 10)


@pytest.fixture
def run_copy(run_to_copy, tmp_path):
    """A copy of the module's finished run (its ``run_to_copy`` fixture: a workdir) that a test may change."""
    import shutil

    wd = str(tmp_path / "run")
    shutil.copytree(run_to_copy, wd)
    return wd
