"""A tiny photo run served in-process: one session, and a copy updated to two (the switch)."""

import importlib.util
import os
import shutil
import sys

import pytest

from cvs_jax import update
from cvs_jax.testing.image_folders import photo_run


@pytest.fixture(scope="session")
def photo_runs(tmp_path_factory):
    """(one-session run, the same run after ``update`` with the next folder, that folder)."""
    root = tmp_path_factory.mktemp("serve")
    one, folder = photo_run(root)
    two = str(root / "run2")
    shutil.copytree(one, two)
    assert update.update(two, folder) == 0
    return one, two, folder


@pytest.fixture
def run_to_copy(photo_runs):
    """What ``run_copy`` (tests/conftest.py) copies: the one-session run."""
    return photo_runs[0]


@pytest.fixture(scope="session")
def benchmark_module():
    """``load(name)``: ``benchmarks/<name>.py`` imported as a module (with ``benchmarks/`` on the path while it
    imports, for its ``_common``)."""
    bench = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

    def load(name: str):
        sys.path.insert(0, bench)
        try:
            spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(bench, f"{name}.py"))
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(bench)
        return module

    return load
