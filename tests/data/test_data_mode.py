"""What a run says about its data and weights before it trains: the data mode (decoded in memory or
streamed from the record store, and why) and a warning when a recipe meant for ImageNet weights has none."""

import os
import tempfile

import pytest

from cvs_jax.config import inat_general
from cvs_jax.data import sources
from cvs_jax.engine import context_builder


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tfds"))  # prepared once, read three ways


@pytest.mark.parametrize("limit, mode", [(None, "in memory"), (1e6, "in memory"), (0.0, "streamed")])
def test_data_mode_says_where_images_are_read_from(manual_dir, data_dir, limit, mode):
    ds = sources.load_dataset("fashion_mnist_local", data_dir=data_dir, manual_dir=manual_dir, memory_limit_mb=limit)
    line = sources.data_mode(ds, limit)
    assert line.startswith(mode), line
    mb = (len(ds.train) + len(ds.test)) * 28 * 28 / 2**20
    assert f"{mb:,.0f} MB decoded" in line
    assert ("<=" in line) == (mode == "in memory") and ("data.in_memory_limit_mb" in line) == (limit is not None)


def test_frozen_batchnorm_without_weights_warns_once():
    c = inat_general.get_config()
    warning = context_builder.pretrained_warning(c)
    assert warning.startswith("warning: model.frozen_bn=True without model.pretrained: resnet50")
    assert "--config.model.pretrained=PATH" in warning and "\n" not in warning
    c.model.pretrained = "resnet50.safetensors"
    assert context_builder.pretrained_warning(c) is None
    c.model.pretrained, c.model.frozen_bn = (
        None,
        False,
    )  # a recipe that trains BatchNorm: random weights are its setting
    assert context_builder.pretrained_warning(c) is None


def test_inat_without_its_source_says_where_the_files_are_today(tmp_path, monkeypatch):
    """... and leaves no temporary folder: TFDS's builder of an unprepared dataset made an empty one and kept it."""
    from cvs_jax.data.builders import _tfds_source
    from cvs_jax.errors import DatasetNotFoundError

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    with pytest.raises(DatasetNotFoundError) as e:
        _tfds_source.describe_source("i_naturalist2017", str(tmp_path), ["train", "validation"], "inat_m")
    message = str(e.value)
    assert "https://ml-inat-competition-datasets.s3.amazonaws.com/2017/" in message
    assert "--manual_dir=FILES" in message and "\n" not in message
    assert os.listdir(temp) == []
