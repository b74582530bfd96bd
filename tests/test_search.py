"""The search command on a tiny finished run: a gallery image finds itself and its class first."""

import os

import numpy as np
import pytest
from absl import flags
from PIL import Image

from cvs_jax import search, trainer
from cvs_jax import workdir as workdir_lib
from cvs_jax.data import sources
from tests.tiny_data import tiny_config, write_fashion_idx


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("search")
    manual = write_fashion_idx(str(root / "idx"), train_per_class=60, test_per_class=10)
    c = tiny_config(manual, root, sessions=2)
    wd = str(root / "run")
    trainer.run(c, wd)
    return wd, c


def test_gallery_image_finds_its_own_class_first(finished_run, tmp_path, capsys):
    wd, c = finished_run
    run = search.Run(wd)
    data = sources.load_dataset(c.data.name, data_dir=c.data.data_dir, manual_dir=c.data.manual_dir)
    paths, labels = [], []
    newest = np.flatnonzero(run.gallery.sessions == run.session)
    for row in (newest[0], newest[-1]):  # rows embedded by the same (newest) model as the queries
        src = int(run.gallery.source_ids[row])
        path = str(tmp_path / f"q{row}.png")
        Image.fromarray(data.train.images[src][..., 0]).save(path)
        paths.append(path)
        labels.append(int(run.gallery.labels[row]))
    assert _cli(["--workdir", wd, "--images", *paths, "--k", "3"]) == 0  # the README's form
    out = capsys.readouterr().out
    hits = run.search(search.load_images(paths, run.image_shape), k=3)
    for h, label in zip(hits, labels):
        assert h[0]["label"] == label
        assert h[0]["score"] > 0.999  # the identical stored row: same pixels, same model
    assert "1. score" in out and run.protocol["class_names"][labels[0]] in out


def test_add_ingests_images_with_the_newest_model(finished_run, tmp_path, capsys):
    wd, _ = finished_run
    before = search.Run(wd)
    img = (np.random.default_rng(0).uniform(0, 255, (28, 28))).astype(np.uint8)
    path = str(tmp_path / "new.png")
    Image.fromarray(img).save(path)
    name = before.protocol["class_names"][0]
    with workdir_lib.hold(wd):  # a live writer (the training run, or another --add): refused
        assert search.search_or_add(wd, [path], add=True, label=name) == 2
    assert "is in use by pid" in capsys.readouterr().err
    assert _cli(["--workdir", wd, "--images", path, "--add", "--label", name]) == 0
    after = search.Run(wd)
    assert len(after.added) == 1 and after.added.labels[0] == 0
    assert after.added.sessions[0] == before.session
    np.testing.assert_array_equal(after.gallery.embeddings, before.gallery.embeddings)  # stored rows untouched
    top = after.search(search.load_images([path], after.image_shape), k=1)[0][0]
    assert top["source"] == os.path.abspath(path) and top["score"] > 0.999


def _cli(args: list[str]) -> int:
    """The command as ``python -m cvs_jax.search ARGS`` runs it (absl flags, then ``main``)."""
    fv = flags.FlagValues()
    search.define_flags(fv)
    return search.main(fv(["search", *args]), fv)


def test_images_flag_takes_the_files_after_it_or_repeats(monkeypatch):
    seen = {}
    monkeypatch.setattr(search, "search_or_add", lambda workdir, paths, **kw: seen.update(paths=paths, **kw) or 0)
    assert _cli(["--workdir", "w", "--images", "a.png", "b.jpg", "--k", "3", "c.png"]) == 0
    assert seen == {"paths": ["a.png", "b.jpg", "c.png"], "k": 3, "add": False, "label": None}
    assert _cli(["--workdir", "w", "--images", "a.png", "--images", "b.jpg", "--add", "--label", "shirt"]) == 0
    assert seen == {"paths": ["a.png", "b.jpg"], "k": 5, "add": True, "label": "shirt"}


def test_errors_are_one_line(tmp_path, capsys):
    assert _cli(["--workdir", str(tmp_path), "--images", "x.png"]) == 2
    assert "holds no cvs_jax run" in capsys.readouterr().err
    assert search.search_or_add(str(tmp_path / "nope"), ["x.png"], add=True) == 2
    assert "holds no cvs_jax run" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "nope")  # --add did not create the folder for its lock
    assert search.search_or_add(str(tmp_path), []) == 2
    assert capsys.readouterr().err.startswith("error: no images given")
