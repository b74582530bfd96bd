"""The record store (format 2): what it keeps, and how it refuses what it cannot trust."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from PIL import Image

from cvs_jax.data import records, sources
from cvs_jax.testing.tiny_data import write_fake_product10k, write_fashion_idx


def _fashion(tmp_path, **kw):
    manual = write_fashion_idx(str(tmp_path / "idx"), train_per_class=6, test_per_class=2)
    return sources.load_dataset("fashion_mnist_local", data_dir=str(tmp_path / "data"), manual_dir=manual, **kw)


def test_streamed_split_equals_decoded_and_names_its_sources(tmp_path):
    in_ram = _fashion(tmp_path)
    streamed = _fashion(tmp_path, memory_limit_mb=0.0)
    assert isinstance(streamed.train, records.StoreSplit) and isinstance(in_ram.train, sources.Split)
    idx = np.array([59, 0, 17, 17, 3])
    np.testing.assert_array_equal(streamed.train.read(idx), in_ram.train.images[idx])
    np.testing.assert_array_equal(streamed.train.labels, in_ram.train.labels)
    assert streamed.source_names("train") == in_ram.source_names("train")
    assert len(set(map(bytes, streamed.train.digests()))) == len(streamed.train)  # distinct images, distinct digests


def test_earlier_formats_are_rebuilt_with_a_message(tmp_path, capsys):
    # a copy in the earlier raw-pixel TFDS layout is named and left alone; the store is prepared anew
    old = tmp_path / "data" / "fashion_mnist_local" / "1.0.0"
    old.mkdir(parents=True)
    (old / "dataset_info.json").write_text("{}")
    ds = _fashion(tmp_path)
    assert "earlier raw-pixel TFDS format" in capsys.readouterr().out and old.exists()
    # a store of another format version is prepared again, never read
    info_path = os.path.join(ds.store, records.STORE_FILE)
    with open(info_path) as f:
        info = json.load(f)
    info["format_version"] = 1
    with open(info_path, "w") as f:
        json.dump(info, f)
    again = _fashion(tmp_path)
    assert "holds format 1" in capsys.readouterr().out
    np.testing.assert_array_equal(again.train.images, ds.train.images)
    assert records.read_info(ds.store)["format_version"] == records.FORMAT_VERSION


def test_missing_or_changed_record_file_stops_with_a_message(tmp_path):
    ds = _fashion(tmp_path, memory_limit_mb=0.0)
    path = ds.train.path
    data = open(path, "rb").read()
    with open(path, "wb") as f:  # truncated
        f.write(data[: len(data) // 2])
    with pytest.raises(records.StoreChangedError, match="changed on disk.*Delete"):
        _fashion(tmp_path, memory_limit_mb=0.0)
    os.remove(path)
    with pytest.raises(records.StoreChangedError, match="is missing"):
        _fashion(tmp_path, memory_limit_mb=0.0)


def test_changed_record_bytes_are_refused_when_read(tmp_path):
    ds = _fashion(tmp_path, memory_limit_mb=0.0)
    data = bytearray(open(ds.train.path, "rb").read())
    at = data.find(b"\x89PNG")  # the first record's image: same length, other bytes
    data[at + 20 : at + 60] = bytes(40)
    with open(ds.train.path, "wb") as f:
        f.write(bytes(data))
    reopened = _fashion(tmp_path, memory_limit_mb=0.0)
    with pytest.raises(records.StoreChangedError, match="record 0 .*does not decode|cannot be read"):
        reopened.train.read(np.array([0]))


def test_decompression_bomb_is_refused_or_skipped_with_its_path(tmp_path, monkeypatch):
    manual = write_fake_product10k(tmp_path / "p10k", num_classes=2, per_class=20, seed=1)
    big = Image.new("RGB", (300, 300), (10, 20, 30))
    big.save(os.path.join(manual, "train", "0_3.jpg"))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 300 * 300 // 2 - 1)  # 300x300 > 2x the limit: a bomb
    kwargs = dict(data_dir=str(tmp_path / "data"), manual_dir=manual)
    with pytest.raises(sources.CorruptImagesError, match=r"0_3\.jpg: DecompressionBombError"):
        sources.load_dataset("product_m", **kwargs)
    ds = sources.load_dataset("product_m", on_corrupt="skip", **kwargs)
    assert len(ds.train) + len(ds.test) == 39
    assert not any(n.endswith("0_3.jpg") for n in ds.source_names("train") + ds.source_names("test"))
