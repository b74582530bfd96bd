"""Tests of the fine-grained builders: stanford_dogs_256, inat_m, product_m (no TensorFlow)."""

from __future__ import annotations

import collections
import csv
import io
import os
from unittest import mock

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

from cvs_jax.data import records, sources
from cvs_jax.data.builders import _tfds_source, inat_m, product10k, resize
from cvs_jax.data.builders.tfds_builders import ProductM, StanfordDogs256
from cvs_jax.errors import DataError
from cvs_jax.testing import tiny_data


@pytest.fixture
def small_images(monkeypatch):
    """Stores 32x32 images (the documented way for quick tests)."""
    monkeypatch.setattr(resize, "STORED_SIZE", 32)
    return 32


# --------------------------------------------------------------------------
# The resize rule.


def _direct(img: Image.Image, size: int) -> np.ndarray:
    """torchvision Resize(size) + CenterCrop(size), written out with PIL."""
    img = img.convert("RGB")
    w, h = img.size
    if w <= h:
        new = (size, int(size * h / w))
    else:
        new = (int(size * w / h), size)
    if new != (w, h):
        img = img.resize(new, Image.BILINEAR)
    left = int(round((new[0] - size) / 2.0))
    top = int(round((new[1] - size) / 2.0))
    return np.asarray(img.crop((left, top, left + size, top + size)))


@pytest.mark.parametrize(
    "shape,mode",
    [
        ((60, 101, 3), "RGB"),  # landscape, odd crop offset
        ((97, 50, 3), "RGB"),  # portrait
        ((45, 70), "L"),  # grey
        ((300, 400, 3), "RGB"),  # larger than 256: downscaled with antialiasing
        ((256, 256, 3), "RGB"),  # already the stored size: unchanged
    ],
)
def test_to_square_uint8_matches_pil(shape, mode):
    rng = np.random.default_rng(sum(shape))
    img = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode)
    got = resize.to_square_uint8(img, 256)
    assert got.shape == (256, 256, 3) and got.dtype == np.uint8
    np.testing.assert_array_equal(got, _direct(img, 256))
    if shape == (256, 256, 3):
        np.testing.assert_array_equal(got, np.asarray(img))
    if mode == "L":
        assert np.array_equal(got[..., 0], got[..., 2])
    # Its centre 224 is torchvision's Resize(256) + CenterCrop(224) of the original.
    rgb = img.convert("RGB")
    w, h = resize.resized_shape(rgb.width, rgb.height, 256)
    resized = rgb.resize((w, h), Image.BILINEAR) if (w, h) != rgb.size else rgb
    left, top = int(round((w - 224) / 2.0)), int(round((h - 224) / 2.0))
    np.testing.assert_array_equal(got[16:240, 16:240], np.asarray(resized.crop((left, top, left + 224, top + 224))))


def test_stored_size_is_read_at_call_time(small_images):
    img = Image.fromarray(np.zeros((50, 80, 3), np.uint8))
    assert resize.to_square_uint8(img).shape == (small_images, small_images, 3)
    assert resize.to_square_uint8(img, 256).shape == (256, 256, 3)


# --------------------------------------------------------------------------
# product_m.

# Fake class k has original id 3k+5; classes 2 (19 images) and 4 (3) are dropped.
_PER_CLASS = [20, 25, 19, 31, 3]
_KEPT = [0, 1, 3]


def _csv_rows(manual_dir):
    with open(os.path.join(manual_dir, "train.csv")) as f:
        return [(r["name"], int(r["class"])) for r in csv.DictReader(f)]


def _meta(ds) -> dict:
    """The builder's metadata as the record store keeps it, with each record's source per split."""
    info = records.read_info(ds.store)
    meta = dict(info["metadata"], **{k: v for k, v in info.items() if k != "metadata"})
    for split in ("train", "test"):
        meta[f"source_files_{split}"] = meta[f"source_ids_{split}"] = ds.source_names(split)
    return meta


def _as_stored(image: np.ndarray) -> np.ndarray:
    """What a record holds for a resized photo: its one JPEG re-encode (records.py), decoded."""
    return records.decode(records.encode(records.Example(image, 0, ""), "jpeg"), image.shape)


def _decode_file(manual_dir, name, size):
    with Image.open(os.path.join(manual_dir, "train", name)) as img:
        return resize.to_square_uint8(img, size)


def test_product_m_split_and_layouts(tmp_path):
    folder = tiny_data.write_fake_product10k(tmp_path / "folder", num_classes=5, per_class=_PER_CLASS, seed=3)
    zipped = tiny_data.write_fake_product10k(
        tmp_path / "zip", num_classes=5, per_class=_PER_CLASS, seed=3, layout="zip"
    )
    assert os.listdir(zipped) and not os.path.isdir(os.path.join(zipped, "train"))

    ds = sources.load_dataset("product_m", data_dir=str(tmp_path / "a"), manual_dir=folder)
    assert ds.name == "product_m"
    assert ds.class_names == ("5", "8", "14")  # sorted original ids, as strings
    assert ds.image_shape == (256, 256, 3)
    assert ds.train.images.dtype == np.uint8
    n = np.array([_PER_CLASS[k] for k in _KEPT])
    np.testing.assert_array_equal(np.bincount(ds.test.labels), n * 20 // 100)
    np.testing.assert_array_equal(np.bincount(ds.train.labels), n - n * 20 // 100)
    assert (np.diff(ds.train.labels) >= 0).all() and (np.diff(ds.test.labels) >= 0).all()

    meta = _meta(ds)
    assert meta["source_classes"] == [5, 8, 14]
    assert meta["skipped_train"] == [] and meta["skipped_test"] == []
    files = {s: meta[f"source_files_{s}"] for s in ("train", "test")}
    assert [len(files["train"]), len(files["test"])] == [len(ds.train), len(ds.test)]
    # Train + test partition each kept class's images exactly once.
    class_of = dict(_csv_rows(folder))
    expected = collections.defaultdict(list)
    for name, cls in _csv_rows(folder):
        expected[cls].append(name)
    got = collections.defaultdict(list)
    for s, split in (("train", ds.train), ("test", ds.test)):
        for name, label in zip(files[s], split.labels):
            assert class_of[name] == int(ds.class_names[label])
            got[class_of[name]].append(name)
    assert {c: sorted(v) for c, v in got.items()} == {c: sorted(expected[c]) for c in (5, 8, 14)}
    assert not set(files["train"]) & set(files["test"])
    # Within a class, stored by file name.
    for s, split in (("train", ds.train), ("test", ds.test)):
        for label in range(3):
            names = [f for f, l in zip(files[s], split.labels) if l == label]
            assert names == sorted(names)
    # Pixels: the resize rule applied to the file.
    for j in (0, len(ds.train) - 1):
        np.testing.assert_array_equal(ds.train.images[j], _as_stored(_decode_file(folder, files["train"][j], 256)))
    np.testing.assert_array_equal(ds.test.images[3], _as_stored(_decode_file(folder, files["test"][3], 256)))

    # The same files as train.zip, prepared again elsewhere: identical.
    again = sources.load_dataset("product_m", data_dir=str(tmp_path / "b"), manual_dir=zipped)
    np.testing.assert_array_equal(again.train.images, ds.train.images)
    np.testing.assert_array_equal(again.test.images, ds.test.images)
    np.testing.assert_array_equal(again.test.labels, ds.test.labels)
    meta_b = _meta(again)
    assert meta_b["source_files_test"] == files["test"]
    assert meta_b["source_fingerprint"] == meta["source_fingerprint"]
    assert meta_b["source_description"].endswith("train.zip")
    # ... so the first copy is reused for the zip too.
    with mock.patch.object(ProductM, "_split_generators", side_effect=AssertionError("rebuilt")):
        sources.load_dataset("product_m", data_dir=str(tmp_path / "a"), manual_dir=zipped)


def test_product_m_split_rule_is_seeded():
    rows = [(f"{k}_{i}.jpg", k) for k in range(3) for i in range(40)]
    params = dict(min_images_per_class=20, test_percent=20)
    a = product10k.split(rows, seed=0, **params)
    assert a == product10k.split(list(reversed(rows)), seed=0, **params)
    b = product10k.split(rows, seed=1, **params)
    assert a.source_classes == b.source_classes == (0, 1, 2)
    assert a.test != b.test and len(a.test) == len(b.test) == 24


def test_product_m_missing_files(tmp_path):
    def error(manual_dir):
        with pytest.raises(sources.DatasetNotFoundError) as info:
            sources.load_dataset("product_m", data_dir=str(tmp_path / "d"), manual_dir=str(manual_dir))
        return str(info.value)

    empty = tmp_path / "empty"
    empty.mkdir()
    message = error(empty)
    assert "train.csv" in message and "train/ (or train.zip)" in message
    assert str(empty) in message and "products-10k.github.io" in message

    full = tiny_data.write_fake_product10k(tmp_path / "full", num_classes=2, per_class=3)
    csv_only = tmp_path / "csv_only"
    csv_only.mkdir()
    (csv_only / "train.csv").write_bytes(open(os.path.join(full, "train.csv"), "rb").read())
    assert f"{str(csv_only)!r}: train/ (or train.zip). Expected" in error(csv_only)

    os.remove(os.path.join(full, "train.csv"))
    assert f"{full!r}: train.csv. Expected" in error(full)

    partial = tiny_data.write_fake_product10k(tmp_path / "partial", num_classes=2, per_class=3)
    os.remove(os.path.join(partial, "train", "1_2.jpg"))
    assert "1_2.jpg" in error(partial)


def test_product_m_corrupt_image(tmp_path, small_images):
    manual = tiny_data.write_fake_product10k(tmp_path / "p", num_classes=2, per_class=[21, 20])
    with open(os.path.join(manual, "train", "0_7.jpg"), "wb") as f:
        f.write(b"\xff\xd8 not a jpeg")
    kwargs = dict(data_dir=str(tmp_path / "d"), manual_dir=manual)
    with pytest.raises(sources.CorruptImagesError, match="0_7.jpg"):
        sources.load_dataset("product_m", **kwargs)
    ds = sources.load_dataset("product_m", on_corrupt="skip", **kwargs)
    assert ds.image_shape == (small_images, small_images, 3)
    meta = _meta(ds)
    skipped = meta["skipped_train"] + meta["skipped_test"]
    assert len(skipped) == 1 and skipped[0].startswith("0_7.jpg:")
    assert len(ds.train) + len(ds.test) == 40
    assert "0_7.jpg" not in meta["source_files_train"] + meta["source_files_test"]


# --------------------------------------------------------------------------
# stanford_dogs_256.


def _source_images(data_dir, name, split, key):
    """key -> (image as PIL decodes it, label), read through TFDS (no TF)."""
    builder = tfds.builder(name, data_dir=data_dir)
    out = {}
    for record in builder.as_data_source(split=split):
        k = record[key]
        k = k.decode() if isinstance(k, bytes) else str(k)
        out[k] = (np.asarray(record["image"]), int(record["label"]))
    return out


def test_stanford_dogs_256(tmp_path, small_images):
    data_dir = str(tmp_path / "tfds")
    tiny_data.write_fake_tfds_source(
        data_dir, "stanford_dogs", num_classes=3, train_per_class=[4, 5, 3], test_per_class=2
    )
    ds = sources.load_dataset("stanford_dogs_256", data_dir=data_dir)
    assert ds.name == "stanford_dogs_256"
    source_names = tfds.builder("stanford_dogs", data_dir=data_dir).info.features["label"].names
    assert ds.class_names == tuple(source_names) and ds.num_classes == 120
    assert ds.image_shape == (32, 32, 3)
    meta = _meta(ds)
    for s, split in (("train", ds.train), ("test", ds.test)):
        source = _source_images(data_dir, "stanford_dogs", s, "image/filename")
        ids = meta[f"source_ids_{s}"]
        assert ids == sorted(source) and len(split) == len(source)  # all, by file name
        for j, key in enumerate(ids):
            image, label = source[key]
            assert split.labels[j] == label  # same label ids
            np.testing.assert_array_equal(split.images[j], _as_stored(resize.to_square_uint8(Image.fromarray(image))))
    np.testing.assert_array_equal(np.bincount(ds.train.labels)[[3, 10, 17]], [4, 5, 3])
    assert meta["source_classes"] == list(range(120))

    # Reused, not rebuilt; another stored size is refused, not reused.
    with mock.patch.object(StanfordDogs256, "_split_generators", side_effect=AssertionError("rebuilt")):
        sources.load_dataset("stanford_dogs_256", data_dir=data_dir)
        with (
            mock.patch.object(resize, "STORED_SIZE", 48),
            pytest.raises(sources.SourceMismatchError, match="stored_size"),
        ):
            sources.load_dataset("stanford_dogs_256", data_dir=data_dir)


@pytest.mark.parametrize("derived,source", [("stanford_dogs_256", "stanford_dogs"), ("inat_m", "i_naturalist2017")])
def test_derived_refused_without_prepared_source(tmp_path, derived, source):
    with pytest.raises(sources.DatasetNotFoundError) as info:
        sources.load_dataset(derived, data_dir=str(tmp_path))
    message = str(info.value)
    assert derived in message and str(tmp_path) in message
    assert f"`tfds build {source} --data_dir=DIR --file_format=array_record`" in message
    assert "--config.data.data_dir" in message and "TensorFlow" in message


# --------------------------------------------------------------------------
# inat_m.

# Fake class k (source label FAKE_SOURCE_LABEL['i_naturalist2017'](k)); with
# the threshold at 7, class 2 (6 images) is not eligible.
_INAT_TRAIN = [9, 7, 6, 12, 8]
_INAT_VAL = [2, 3, 1, 2, 4]


@pytest.fixture
def small_inat(monkeypatch, small_images):
    monkeypatch.setattr(inat_m, "NUM_CLASSES", 3)
    monkeypatch.setattr(inat_m, "MIN_TRAIN_PER_CLASS", 7)
    monkeypatch.setattr(inat_m, "TRAIN_PER_CLASS", 7)


def test_inat_m(tmp_path, small_inat):
    label_of = tiny_data.FAKE_SOURCE_LABEL["i_naturalist2017"]
    data_dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    loaded, metas = [], []
    for data_dir in data_dirs:  # Two preparations from identical sources.
        tiny_data.write_fake_tfds_source(data_dir, "i_naturalist2017", 5, _INAT_TRAIN, _INAT_VAL, seed=4)
        loaded.append(sources.load_dataset("inat_m", data_dir=data_dir))
        metas.append(_meta(loaded[-1]))
    ds, meta = loaded[0], metas[0]
    eligible = sorted(label_of(k) for k, n in enumerate(_INAT_TRAIN) if n >= 7)
    chosen = meta["source_classes"]
    assert len(chosen) == 3 and chosen == sorted(chosen)
    assert set(chosen) <= set(eligible)
    # The documented rule: sorted(default_rng(SEED).choice(sorted(eligible), 3)).
    assert chosen == sorted(np.random.default_rng(inat_m.SEED).choice(eligible, 3, replace=False))
    inat_names = tfds.builder("i_naturalist2017", data_dir=data_dirs[0]).info.features["label"].names
    assert ds.class_names == tuple(inat_names[c] for c in chosen)
    np.testing.assert_array_equal(np.bincount(ds.train.labels), [7, 7, 7])

    train_src = _source_images(data_dirs[0], "i_naturalist2017", "train", "id")
    val_src = _source_images(data_dirs[0], "i_naturalist2017", "validation", "id")
    # test = all validation images of the chosen classes, in (label, id) order.
    expected_test = sorted((chosen.index(l), k) for k, (_, l) in val_src.items() if l in chosen)
    assert meta["source_ids_test"] == [k for _, k in expected_test]
    np.testing.assert_array_equal(ds.test.labels, [l for l, _ in expected_test])
    for s, split, src in (("train", ds.train, train_src), ("test", ds.test, val_src)):
        for j, key in enumerate(meta[f"source_ids_{s}"]):
            image, label = src[key]
            assert chosen[split.labels[j]] == label  # label remap
            np.testing.assert_array_equal(split.images[j], _as_stored(resize.to_square_uint8(Image.fromarray(image))))
    assert len(set(meta["source_ids_train"])) == 21

    # Deterministic: the second preparation stored the same.
    assert metas[1]["source_ids_train"] == meta["source_ids_train"]
    assert metas[1]["source_classes"] == chosen
    np.testing.assert_array_equal(loaded[1].train.images, ds.train.images)
    np.testing.assert_array_equal(loaded[1].test.images, ds.test.images)

    # Other selection constants are another dataset: refused, not reused.
    with mock.patch.object(inat_m, "SEED", 1), pytest.raises(sources.SourceMismatchError, match="seed"):
        sources.load_dataset("inat_m", data_dir=data_dirs[0])


def _split(keys, labels):
    return _tfds_source.SourceSplit(keys=tuple(keys), labels=np.asarray(labels, np.int64), read_encoded=None)


def test_inat_m_selection_ignores_record_order():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), [8, 3, 9, 10, 7, 8, 2, 9, 7, 11])
    keys = [f"{rng.integers(1 << 40):010x}" for _ in labels]
    val_labels = np.repeat(np.arange(10), 2)
    val_keys = [f"v{i:03d}" for i in range(20)]
    params = dict(seed=0, num_classes=4, min_train_per_class=7, train_per_class=7)
    names = [f"c{i}" for i in range(10)]
    plan = inat_m.select(_split(keys, labels), _split(val_keys, val_labels), names, **params)
    perm = rng.permutation(len(keys))
    shuffled = inat_m.select(
        _split([keys[p] for p in perm], labels[perm]), _split(val_keys[::-1], val_labels[::-1]), names, **params
    )
    assert len(plan.source_classes) == 4
    assert set(plan.source_classes) <= {0, 2, 3, 4, 5, 7, 8, 9}
    assert plan.class_names == tuple(f"c{c}" for c in plan.source_classes)
    to_key = lambda recs, ks: [(ks[p], l) for p, l in recs]  # noqa: E731
    shuffled_keys = [keys[p] for p in perm]
    assert to_key(plan.records["train"], keys) == to_key(shuffled.records["train"], shuffled_keys)
    assert to_key(plan.records["test"], val_keys) == to_key(shuffled.records["test"], val_keys[::-1])
    with pytest.raises(DataError, match="only 8 classes"):
        inat_m.select(_split(keys, labels), _split(val_keys, val_labels), names, **{**params, "num_classes": 9})


@pytest.mark.parametrize(
    "orientation, turn, back",  # turn: what a viewer does to the stored pixels; back: how a phone stored them
    [
        (6, Image.Transpose.ROTATE_270, Image.Transpose.ROTATE_90),
        (3, Image.Transpose.ROTATE_180, Image.Transpose.ROTATE_180),
    ],
)
def test_a_photo_is_stored_and_queried_upright_by_its_exif_orientation(orientation, turn, back):
    """A phone's portrait photo: pixels stored sideways, an EXIF tag saying how to turn them.  Gallery
    (``decode_keeping_source``), queries and thumbnails (``to_stored``) and uploads (``serve.uploads``)
    read it as viewers show it; it was stored and queried sideways."""
    from cvs_jax.serve import uploads

    rng = np.random.default_rng(orientation)
    upright = Image.fromarray(np.repeat(np.repeat(rng.integers(0, 256, (4, 6, 3), np.uint8), 8, 0), 8, 1))
    sideways = upright.transpose(back)
    exif = Image.Exif()
    exif[0x0112] = orientation  # EXIF Orientation
    buf = io.BytesIO()
    sideways.save(buf, format="JPEG", quality=95, exif=exif)
    data = buf.getvalue()
    as_stored = Image.fromarray(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))  # sideways, no tag
    want = resize.to_square_uint8(as_stored.transpose(turn), 16)
    assert not np.array_equal(want, resize.to_square_uint8(as_stored, 16))
    np.testing.assert_array_equal(resize.to_stored(Image.open(io.BytesIO(data)), (16, 16, 3)), want)
    got, passthrough = resize.decode_keeping_source(data, 16, exif=True)  # image_folder: users' photos
    np.testing.assert_array_equal(got, want)
    as_torchvision = resize.decode_keeping_source(data, 16)[0]  # the benchmark builders, as the reference reads
    np.testing.assert_array_equal(as_torchvision, resize.to_square_uint8(as_stored, 16))
    np.testing.assert_array_equal(uploads.decode("p.jpg", data, (16, 16, 3), 10**6).image, want)
    square = io.BytesIO()  # a turned JPEG of the stored size is re-encoded upright, not kept as it is
    sideways.resize((48, 48)).save(square, format="JPEG", exif=exif)
    assert resize.decode_keeping_source(square.getvalue(), 48, exif=True)[1] is False
    plain = io.BytesIO()
    sideways.resize((48, 48)).save(plain, format="JPEG")
    assert resize.decode_keeping_source(plain.getvalue(), 48)[1] is True


@pytest.mark.parametrize("mode", ["I;16", "I"])
def test_a_16_bit_greyscale_scan_is_stored_as_its_8_bit_picture(tmp_path, mode):
    """A 16-bit PNG (mode I;16, or I) was converted by Pillow's clip at 255: stored and queried white."""
    grey = np.random.default_rng(3).integers(0, 256, (20, 30), np.uint8)
    wide = Image.fromarray(grey.astype(np.uint16) * 257)  # mode I;16
    path = tmp_path / ("scan.png" if mode == "I;16" else "scan.tif")  # PNG: I;16; TIFF keeps 32-bit I
    (wide if mode == "I;16" else wide.convert("I")).save(path)
    with Image.open(path) as img:
        assert img.mode == mode
        got = resize.to_stored(img, (16, 16, 3))
    np.testing.assert_array_equal(got, resize.to_stored(Image.fromarray(grey, "L"), (16, 16, 3)))
    np.testing.assert_array_equal(
        resize.to_stored(Image.fromarray(grey.astype(np.int32)), (16, 16, 1))[..., 0],
        resize.to_stored(Image.fromarray(grey, "L"), (16, 16, 1))[..., 0],
    )


def test_a_photo_folder_is_prepared_upright_and_a_benchmark_as_stored(tmp_path):
    """``image_folder`` (users' photos) prepares a phone's EXIF-tagged portrait upright; the benchmark
    builders' decoding (``decode_blocks`` default) keeps torchvision's reading of the same bytes."""
    rng = np.random.default_rng(5)
    for split in ("train", "test"):
        for name in ("a", "b"):
            os.makedirs(tmp_path / "photos" / split / name)
            for i in range(2):
                Image.fromarray(rng.integers(0, 256, (24, 40, 3), np.uint8)).save(
                    tmp_path / "photos" / split / name / f"{i}.png"
                )
    upright = Image.fromarray(np.repeat(np.repeat(rng.integers(0, 256, (4, 6, 3), np.uint8), 8, 0), 8, 1))
    exif = Image.Exif()
    exif[0x0112] = 6  # EXIF Orientation: turn 90 degrees clockwise to view
    buf = io.BytesIO()
    upright.transpose(Image.Transpose.ROTATE_90).save(buf, format="JPEG", quality=95, exif=exif)
    (tmp_path / "photos" / "train" / "a" / "phone.jpg").write_bytes(buf.getvalue())
    options = {"stored_size": 16, "test_fraction": 0.2, "test_seed": 0}
    ds = sources.load_dataset(
        "image_folder", data_dir=str(tmp_path / "tfds"), manual_dir=str(tmp_path / "photos"), options=options
    )
    stored = ds.train.read(np.arange(len(ds.train.labels))).astype(np.int64)
    want, sideways = (
        resize.to_square_uint8(im, 16).astype(np.int64)
        for im in (upright, upright.transpose(Image.Transpose.ROTATE_90))
    )
    assert records.read_info(ds.train.store.directory)["metadata"]["exif_upright"] is True  # the feature cache's key
    phone = stored[np.argmin(np.abs(stored - want).mean(axis=(1, 2, 3)))]
    assert np.abs(phone - want).mean() < 6 < 20 < np.abs(phone - sideways).mean()  # a JPEG copy, upright
    (benchmark,) = [image for _, image, _, _ in resize.decode_blocks(["p"], lambda block: [buf.getvalue()], 16, [])]
    assert np.abs(benchmark.astype(np.int64) - sideways).mean() < 6
