"""Tests for cvs_jax.data.folder_inventory: layouts, ignored entries, refusals, the drawn test split, fingerprint."""

import json
import math
import os

import numpy as np
import pytest
from PIL import Image

from cvs_jax.data import folder_inventory as fi
from cvs_jax.errors import DataError

FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP", ".bmp": "BMP"}


def img(path, size=(7, 5), color=(200, 30, 60)):
    """A tiny real image; the format follows the extension (case-insensitive)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new("RGB", size, color).save(path, format=FORMATS[os.path.splitext(path)[1].lower()])
    return path


def text(path, content="not an image"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(content)
    return path


def write_csv(path, lines):
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture
def class_tree(tmp_path):
    """root/<class>/... with odd names, nesting, every format and every kind of ignored entry."""
    root = tmp_path / "photos"
    img(root / "cat" / "a.png", (9, 4))
    img(root / "cat" / "sub dir" / "ünï b.JPG", (3, 8))
    img(root / "cat" / "sub dir" / "deeper" / "c.jpeg", (5, 5))
    img(root / "dog" / "x.webp", (6, 2))
    img(root / "dog" / "y y.bmp", (2, 6))
    img(root / "élan" / "z.png")
    img(root / "dog" / ".hidden.png")  # hidden file
    img(root / "dog" / ".cache" / "h.png")  # hidden folder: one entry
    img(root / ".git" / "k.png")  # hidden top-level folder: not a class
    text(root / "dog" / "notes.txt")  # not an image
    text(root / "README.txt")  # directly in the root
    img(root / "loose.png")  # directly in the root
    img(tmp_path / "outside" / "o.png")
    os.symlink(tmp_path / "outside" / "o.png", root / "dog" / "out.png")  # leaves the root
    os.symlink(tmp_path / "outside", root / "dog" / "outdir")  # folder symlink leaving the root
    os.symlink(root / "dog" / "x.webp", root / "cat" / "link.webp")  # stays inside: followed
    os.symlink(root / "cat", root / "cat" / "sub dir" / "loop")  # loop to a parent
    return root


# ---------------------------------------------------------------- class folders
def test_class_folders_layout(class_tree):
    inv = fi.scan(str(class_tree), test_fraction=0.0)
    assert inv.kind == "folders" and inv.root == str(class_tree) and not inv.test_given
    assert inv.class_names == ("cat", "dog", "élan")
    assert [(e.label, e.rel) for e in inv.train] == [
        (0, "cat/a.png"),
        (0, "cat/link.webp"),
        (0, "cat/sub dir/deeper/c.jpeg"),
        (0, "cat/sub dir/ünï b.JPG"),
        (1, "dog/x.webp"),
        (1, "dog/y y.bmp"),
        (2, "élan/z.png"),
    ]
    assert inv.test == ()
    for e in inv.train:
        assert os.path.isabs(e.path) and e.path == os.path.normpath(e.path) and os.path.isfile(e.path)
        assert e.path == os.path.join(str(class_tree), e.rel) and e.session is None
        assert e.size == os.path.getsize(e.path)
    assert inv.ignored == {
        "hidden": 3,
        "not an image": 1,
        "not in a class folder": 2,
        "symlink loop": 1,
        "symlink outside root": 2,
    }
    assert inv.sessions() is None
    assert inv.labels().tolist() == [0, 0, 0, 0, 1, 1, 2]
    d = inv.description()
    assert "3 classes" in d and "7 train / 0 test" in d and "2 symlink outside root" in d


def test_root_reached_through_a_symlink(tmp_path, class_tree):
    """The root reached through a symlink: links inside it still count as inside."""
    alias = tmp_path / "alias"
    os.symlink(class_tree, alias)
    inv = fi.scan(str(alias), test_fraction=0.0)
    assert len(inv.train) == 7 and inv.ignored["symlink outside root"] == 2


def _tree(root, sizes):
    for c, n in sizes.items():
        for i in range(n):
            img(root / c / f"{i:02d}.png", (2 + i % 3, 3))
    return root


def test_a_from_added_folders_record_is_not_an_ignored_photo(tmp_path):
    """``update --from_added`` lays its rows out as class folders with ``rows.json`` beside them: the child's
    log said "ignored: 1 not in a class folder" as if a photo were dropped. A real stray image in the root,
    and a ``rows.json`` inside a class folder, are still counted."""
    from cvs_jax.retrieval import added_session

    workdir = tmp_path / "run"
    rows = [(name, img(workdir / "uploads" / f"{name}{i}.png")) for name in ("ant", "bee") for i in range(2)]
    folder = added_session.make_folder(str(workdir), 2, list(range(len(rows))), rows)
    assert os.path.isfile(os.path.join(folder, added_session.ROWS_FILE))
    inv = fi.scan(folder, test_fraction=0.0)
    assert (len(inv.train), inv.ignored) == (4, {}) and "ignored" not in inv.description()
    img(os.path.join(folder, "stray.png"))
    text(os.path.join(folder, "ant", added_session.ROWS_FILE))
    inv = fi.scan(folder, test_fraction=0.0)
    assert len(inv.train) == 4 and inv.ignored == {"not in a class folder": 1, "not an image": 1}
    assert "ignored: 1 not an image, 1 not in a class folder" in inv.description()


def test_a_name_that_is_not_utf8_is_refused_naming_it_and_an_added_one_is_kept(tmp_path):
    """A latin-1 ``café.jpg`` (an old camera card, a zip without UTF-8 names) was a UnicodeEncodeError
    traceback from ``update`` after the listing (the fingerprint and the store's source list are UTF-8);
    added with ``search --add``, it blocked every session from the adds.  A folder refuses it, naming the
    bytes and the fix; the folder made from adds keeps it under a UTF-8 name."""
    from cvs_jax.retrieval import added_session

    for name in ("ant", "bee"):
        for i in range(2):
            img(tmp_path / "photos" / name / f"{i}.png")
    latin = os.fsdecode(os.path.join(os.fsencode(tmp_path), b"photos", b"ant", b"caf\xe9.png"))
    img(latin)
    with pytest.raises(DataError, match=r"caf\\xe9.png' has a name that is not UTF-8; rename it to UTF-8"):
        fi.scan(str(tmp_path / "photos"))
    rows = [("ant", latin), ("ant", str(tmp_path / "photos" / "ant" / "0.png"))]
    rows += [("bee", str(tmp_path / "photos" / "bee" / f"{i}.png")) for i in range(2)]
    folder = added_session.make_folder(str(tmp_path / "run"), 2, list(range(len(rows))), rows)
    assert sorted(os.listdir(os.path.join(folder, "ant"))) == ["0.png", "caf\ufffd.png"]
    assert len(fi.scan(folder, test_fraction=0.0).train) == 4


def test_drawn_split_matches_its_definition(tmp_path):
    sizes = {"a": 1, "b": 2, "c": 3, "d": 7, "e": 10, "f": 4}
    root = _tree(tmp_path / "r", sizes)
    f, seed = 0.3, 5
    inv = fi.scan(str(root), test_fraction=f, seed=seed)
    assert not inv.test_given and inv.test_fraction == f and inv.seed == seed
    rng = np.random.default_rng(seed)
    for label, c in enumerate(sorted(sizes)):
        n = sizes[c]
        k = min(math.floor(n * f), n - 1)
        rels = sorted(f"{c}/{i:02d}.png" for i in range(n))
        pick = rng.choice(n, k, replace=False)
        want_test = sorted(rels[i] for i in pick)
        got_test = [e.rel for e in inv.test if e.label == label]
        got_train = [e.rel for e in inv.train if e.label == label]
        assert got_test == want_test and len(got_test) == k
        assert sorted(got_train + got_test) == rels and len(got_train) >= 1
    # exact decimal arithmetic: floor(10 * 0.3) = 3, not 2
    assert sum(e.label == 4 for e in inv.test) == 3
    # ordered by (label, rel)
    for split in (inv.train, inv.test):
        assert list(split) == sorted(split, key=lambda e: (e.label, e.rel))


def test_drawn_split_deterministic_and_seeded(tmp_path):
    root = _tree(tmp_path / "r", {"a": 10, "b": 10, "c": 9})
    one = fi.scan(str(root), test_fraction=0.5, seed=1)
    again = fi.scan(str(root), test_fraction=0.5, seed=1)
    other = fi.scan(str(root), test_fraction=0.5, seed=2)
    assert one.test == again.test and one.train == again.train
    assert [e.rel for e in one.test] != [e.rel for e in other.test]
    assert [sum(e.label == c for e in one.test) for c in range(3)] == [5, 5, 4]
    assert one.fingerprint() == again.fingerprint() != other.fingerprint()


def test_test_fraction_caps_at_one_train_image(tmp_path):
    root = _tree(tmp_path / "r", {"a": 1, "b": 2, "c": 5})
    inv = fi.scan(str(root), test_fraction=0.99)
    assert [sum(e.label == c for e in inv.train) for c in range(3)] == [1, 1, 1]
    assert [sum(e.label == c for e in inv.test) for c in range(3)] == [0, 1, 4]


# ---------------------------------------------------------------- train/test folders
def test_train_test_folders(tmp_path):
    root = tmp_path / "ds"
    img(root / "train" / "b" / "1.png")
    img(root / "train" / "b" / "nested" / "2.jpg")
    img(root / "train" / "a" / "3.webp")
    img(root / "test" / "b" / "4.bmp")
    text(root / "train" / "stray.txt")
    img(root / "train" / "stray.png")
    img(root / "extra" / "5.png")
    text(root / "notes.md")
    inv = fi.scan(str(root), test_fraction=0.5, seed=3)
    assert inv.test_given and inv.test_fraction is None and inv.seed is None
    assert inv.class_names == ("a", "b")
    assert [(e.label, e.rel) for e in inv.train] == [
        (0, "train/a/3.webp"),
        (1, "train/b/1.png"),
        (1, "train/b/nested/2.jpg"),
    ]
    assert [(e.label, e.rel) for e in inv.test] == [(1, "test/b/4.bmp")]
    assert inv.ignored == {"not in a class folder": 2, "not in train/ or test/": 2}
    # the given split ignores the drawing parameters, also in the fingerprint
    assert fi.scan(str(root), test_fraction=0.1, seed=9).fingerprint() == inv.fingerprint()


def test_train_only_folder_draws_test(tmp_path):
    root = _tree(tmp_path / "ds" / "train", {"a": 5, "b": 5}).parent
    inv = fi.scan(str(root), test_fraction=0.2)
    assert not inv.test_given and len(inv.test) == 2 and inv.train[0].rel.startswith("train/a/")


def test_test_without_train_refused(tmp_path):
    img(tmp_path / "ds" / "test" / "a" / "1.png")
    with pytest.raises(DataError, match=r"has test/ but no train/"):
        fi.scan(str(tmp_path / "ds"))


def test_test_label_not_in_train_refused(tmp_path):
    img(tmp_path / "ds" / "train" / "a" / "1.png")
    img(tmp_path / "ds" / "test" / "a" / "2.png")
    img(tmp_path / "ds" / "test" / "zebra" / "3.png")
    with pytest.raises(DataError, match=r"class 'zebra' has test images .* but no train folder"):
        fi.scan(str(tmp_path / "ds"))


def test_empty_test_folder_refused(tmp_path):
    img(tmp_path / "ds" / "train" / "a" / "1.png")
    (tmp_path / "ds" / "test").mkdir()
    with pytest.raises(DataError, match=r"test'? holds no class folder.*remove test/"):
        fi.scan(str(tmp_path / "ds"))


# ---------------------------------------------------------------- refusals (folders)
def test_no_images_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"holds no class folder with images"):
        fi.scan(str(tmp_path / "empty"))
    text(tmp_path / "flat" / "a.txt")
    img(tmp_path / "flat" / "b.png")
    with pytest.raises(DataError, match=r"holds no class folder with images"):
        fi.scan(str(tmp_path / "flat"))


def test_empty_class_folder_refused(tmp_path):
    img(tmp_path / "r" / "a" / "1.png")
    text(tmp_path / "r" / "b" / "only.txt")
    img(tmp_path / "r" / "b" / ".hidden.png")
    with pytest.raises(DataError, match=r"class folder '.*/r/b' holds no image.*add images or remove the folder"):
        fi.scan(str(tmp_path / "r"))


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, float("nan"), "0.2", True])
def test_test_fraction_refused(tmp_path, bad):
    img(tmp_path / "r" / "a" / "1.png")
    with pytest.raises(DataError, match=r"test_fraction=.* must"):
        fi.scan(str(tmp_path / "r"), test_fraction=bad)


def test_missing_source_and_non_csv_file_refused(tmp_path):
    with pytest.raises(DataError, match=r"does not exist"):
        fi.scan(str(tmp_path / "nope"))
    path = img(tmp_path / "x.png")
    with pytest.raises(DataError, match=r"is a file but not a \.csv manifest"):
        fi.scan(str(path))


# ---------------------------------------------------------------- manifest
@pytest.fixture
def manifest_dir(tmp_path):
    d = tmp_path / "m"
    img(d / "imgs" / "ä 1.png", (4, 4))
    img(d / "imgs" / "b2.jpg", (8, 3))
    img(d / "imgs" / "deep" / "c3.webp", (3, 3))
    img(d / "imgs" / "d4.bmp")
    img(d / "imgs" / "e5.PNG")
    img(d / "cat" / "folder_image.png")  # a folder layout next to the manifest: not scanned
    img(tmp_path / "elsewhere" / "abs.png")
    return d


def test_manifest_with_split_and_session(manifest_dir, tmp_path):
    absolute = str(tmp_path / "elsewhere" / "abs.png")
    path = write_csv(
        manifest_dir / "manifest.csv",
        [
            "path,label,split,session",
            "imgs/ä 1.png,dog,train,2",
            '"imgs/b2.jpg",cat,train,1',
            "./imgs/deep/c3.webp, cat ,TEST,",
            "imgs/d4.bmp,dog,test,3",
            "",
            f"{absolute},bird,train,1",
            "imgs/e5.PNG,bird,train,2",
        ],
    )
    for source in (str(manifest_dir), path):  # the folder (manifest wins) or the file itself
        inv = fi.scan(source)
        assert inv.kind == "manifest" and inv.manifest == path and inv.root == str(manifest_dir) and inv.test_given
        assert inv.class_names == ("bird", "cat", "dog")
        assert [(e.label, e.rel, e.session) for e in inv.train] == [
            (0, absolute, 0),
            (0, "imgs/e5.PNG", 1),
            (1, "imgs/b2.jpg", 0),
            (2, "imgs/ä 1.png", 1),
        ]
        assert [(e.label, e.rel, e.session) for e in inv.test] == [
            (1, "imgs/deep/c3.webp", None),
            (2, "imgs/d4.bmp", 2),
        ]
        assert inv.train[0].path == absolute and os.path.isfile(inv.train[2].path)
        assert inv.sessions().tolist() == [0, 1, 0, 1]
        assert inv.ignored == {}
        assert "2 sessions" in inv.description()


def test_manifest_without_split_draws_test(manifest_dir):
    write_csv(
        manifest_dir / "list.csv",
        ["label,path", "a,imgs/ä 1.png", "a,imgs/b2.jpg", "a,imgs/deep/c3.webp", "b,imgs/d4.bmp", "b,imgs/e5.PNG"],
    )
    inv = fi.scan(str(manifest_dir / "list.csv"), test_fraction=0.5, seed=0)
    assert not inv.test_given and inv.class_names == ("a", "b")
    assert [sum(e.label == c for e in inv.test) for c in range(2)] == [1, 1]
    assert all(e.session is None for e in inv.train + inv.test) and inv.sessions() is None


def test_manifest_ignores_hidden_and_symlinks_leaving(manifest_dir, tmp_path):
    img(manifest_dir / ".hid" / "h.png")
    os.symlink(tmp_path / "elsewhere" / "abs.png", manifest_dir / "imgs" / "out.png")
    os.symlink(manifest_dir / "imgs" / "b2.jpg", manifest_dir / "imgs" / "in.jpg")
    write_csv(
        manifest_dir / "manifest.csv",
        ["path,label", "imgs/ä 1.png,a", ".hid/h.png,a", "imgs/out.png,a", "imgs/in.jpg,b", "imgs/b2.jpg,b"],
    )
    inv = fi.scan(str(manifest_dir), test_fraction=0.0)
    assert [e.rel for e in inv.train] == ["imgs/ä 1.png", "imgs/b2.jpg", "imgs/in.jpg"]
    assert inv.ignored == {"hidden": 1, "symlink outside root": 1}


@pytest.mark.parametrize(
    "lines, pattern",
    [
        (["path,label,notes", "imgs/b2.jpg,a,x"], r"unknown column\(s\) \['notes'\]"),
        (["file,label", "imgs/b2.jpg,a"], r"lacks column\(s\) \['path'\].*unknown column\(s\) \['file'\]"),
        (["path,label", "imgs/b2.jpg,a", "imgs/d4.bmp,b,extra"], r"manifest.csv:3: 3 field\(s\) but the header has 2"),
        (
            ["path,label", "imgs/b2.jpg,a", "./imgs/../imgs/b2.jpg,b"],
            r"manifest.csv:3: .* listed twice \(also on line 2\)",
        ),
        (["path,label,split", "imgs/b2.jpg,a,train", "imgs/d4.bmp,a,val"], r"manifest.csv:3: split 'val' is not"),
        (
            ["path,label,session", "imgs/b2.jpg,a,1", "imgs/d4.bmp,a,0"],
            r"manifest.csv:3: session '0' is not a positive",
        ),
        (["path,label,session", "imgs/b2.jpg,a,x"], r"manifest.csv:2: session 'x' is not a positive"),
        (["path,label,session", "imgs/b2.jpg,a,1.5"], r"manifest.csv:2: session '1.5' is not a positive"),
        (["path,label,session", "imgs/b2.jpg,a,1", "imgs/d4.bmp,b,"], r"manifest.csv:3: empty session for train image"),
        (["path,label,split,session", "imgs/b2.jpg,a,test,"], r"no train image"),
        (["path,label", "imgs/b2.jpg,"], r"manifest.csv:2: empty label"),
        (["path,label", "imgs/b2.jpg,a", "notes.txt,a"], r"manifest.csv:3: 'notes.txt' is not an image file"),
        (
            ["path,label,split", "imgs/b2.jpg,a,train", "imgs/d4.bmp,zebra,test"],
            r":3: label 'zebra' has test rows but no train",
        ),
        (["path,label,split", "imgs/b2.jpg,a,train"], r"split column but no row with split=test"),
        (["path,label"], r"has a header but no rows"),
        ([""], r"is empty"),
    ],
)
def test_manifest_refusals(manifest_dir, lines, pattern):
    text(manifest_dir / "notes.txt")
    write_csv(manifest_dir / "manifest.csv", lines)
    with pytest.raises(DataError, match=pattern):
        fi.scan(str(manifest_dir))


def test_manifest_missing_files_named(manifest_dir):
    rows = ["path,label", "imgs/b2.jpg,a"] + [f"gone/{i}.png,a" for i in range(5)]
    write_csv(manifest_dir / "manifest.csv", rows)
    with pytest.raises(DataError) as e:
        fi.scan(str(manifest_dir))
    msg = str(e.value)
    assert "5 row(s) name no existing file" in msg
    assert "gone/0.png' (line 3)" in msg and "gone/2.png' (line 5)" in msg and "gone/3.png" not in msg


def test_manifest_missing_directory_row(manifest_dir):
    (manifest_dir / "dir.png").mkdir()
    write_csv(manifest_dir / "manifest.csv", ["path,label", "imgs/b2.jpg,a", "dir.png,a"])
    with pytest.raises(DataError, match=r"1 row\(s\) name no existing file"):
        fi.scan(str(manifest_dir))


# ---------------------------------------------------------------- fingerprint
def test_fingerprint(tmp_path):
    root = _tree(tmp_path / "r", {"a": 3, "b": 3})
    base = fi.scan(str(root)).fingerprint()
    json.dumps(base)
    assert base["num_classes"] == 2 and base["num_train"] + base["num_test"] == 6 and len(base["sha256"]) == 64

    os.utime(root / "a" / "00.png", (1, 1))  # touched only
    assert fi.scan(str(root)).fingerprint() == base

    os.rename(root / "a" / "00.png", root / "a" / "zz.png")  # renamed
    renamed = fi.scan(str(root)).fingerprint()
    assert renamed["sha256"] != base["sha256"]
    os.rename(root / "a" / "zz.png", root / "a" / "00.png")
    assert fi.scan(str(root)).fingerprint() == base

    img(root / "b" / "new.png")  # added
    assert fi.scan(str(root)).fingerprint()["sha256"] != base["sha256"]
    os.remove(root / "b" / "new.png")

    img(root / "a" / "00.png", (40, 40), (1, 2, 3))  # rewritten with another size
    assert fi.scan(str(root)).fingerprint()["sha256"] != base["sha256"]


# ---------------------------------------------------------------- one scan per command
def test_a_command_scans_each_source_once_and_sees_later_changes_only_after_it(tmp_path, monkeypatch):
    """Within ``scans_held`` (``runner.run``, ``update``) a source is scanned once; outside it (a server) every
    call scans, so a changed folder is seen; a refused scan is not kept, and another drawing is another scan."""
    root = tmp_path / "photos"
    img(root / "cat" / "a.png")
    img(root / "dog" / "b.png")
    scanned = []
    real = fi._scan  # pylint: disable=protected-access
    monkeypatch.setattr(fi, "_scan", lambda source, frac, seed: scanned.append(source) or real(source, frac, seed))
    with fi.scans_held():
        first = fi.scan(str(root))
        with fi.scans_held():  # nested: the outer block's memory
            assert fi.scan(str(root) + "/") is first
        img(root / "cat" / "c.png")  # the command's view is the one it started with
        assert fi.scan(str(root)) is first and len(first.train) + len(first.test) == 2
        assert len(scanned) == 1
        fi.scan(str(root), seed=1)  # another test split drawn: scanned for it
        assert len(scanned) == 2
        for _ in range(2):
            with pytest.raises(DataError, match="does not exist"):
                fi.scan(str(tmp_path / "absent"))
        assert len(scanned) == 4
    later = fi.scan(str(root))
    assert len(later.train) + len(later.test) == 3 and fi.scan(str(root)) is not later
    assert len(scanned) == 6
