"""A tiny photo run served in-process: one session, and a copy updated to two (the switch)."""

import shutil

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
