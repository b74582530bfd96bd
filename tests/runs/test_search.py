"""The search command on a tiny finished run: a gallery image finds itself and its class first; queries
are prepared as the gallery was stored; hits say where each row came from; reads stay consistent."""

import json
import os
import shutil

import numpy as np
import pytest
from absl import flags
from PIL import Image

from cvs_jax import export, info, search
from cvs_jax.data import sources, stores
from cvs_jax.data.builders import resize
from cvs_jax.engine import runner
from cvs_jax.retrieval import run_reader, run_rows
from cvs_jax.rundir import workdir as workdir_lib
from cvs_jax.rundir.gallery import Gallery, GalleryPart
from cvs_jax.testing import file_tree
from cvs_jax.testing.tiny_data import fake_class_image, tiny_config


@pytest.fixture(scope="module")
def finished_run(fashion_idx, tmp_path_factory):
    root = tmp_path_factory.mktemp("search")
    manual = fashion_idx(60, 10)
    c = tiny_config(manual, root, sessions=2)
    wd = str(root / "run")
    runner.run(c, wd)
    return wd, c


@pytest.fixture(scope="module")
def train_images(finished_run):
    _, c = finished_run
    return sources.load_dataset(c.data.name, data_dir=c.data.data_dir, manual_dir=c.data.manual_dir).train.images


@pytest.fixture
def run_to_copy(finished_run):
    """What ``run_copy`` (tests/conftest.py) copies: the finished run."""
    return finished_run[0]


def _cli(args: list[str]) -> int:
    """The command as ``python -m cvs_jax.search ARGS`` runs it (absl flags, then ``main``)."""
    fv = flags.FlagValues()
    search.define_flags(fv)
    return search.main(fv(["search", *args]), fv)


def _command(module, *args: str) -> int:
    """``python -m cvs_jax.<module> ARGS`` as it runs (fresh flags, then ``main``)."""
    fv = flags.FlagValues()
    module.define_flags(fv)
    return module.main(fv([module.__name__, *args]), fv)


def _own_row_first(hits: list[dict], row: int) -> bool:
    """The row is the top hit, up to exact ties (rows with the top score)."""
    return row in [h["row"] for h in hits if h["score"] >= hits[0]["score"] - 1e-6]


# --- queries are prepared as the gallery was stored ------------------------------------------------


def test_to_stored_is_the_builders_rule(tmp_path):
    rgb = Image.fromarray(fake_class_image(np.random.default_rng(0), 3, (45, 70)))  # non-square, wide
    np.testing.assert_array_equal(resize.to_stored(rgb, (32, 32, 3)), resize.to_square_uint8(rgb, 32))
    tall = Image.fromarray(fake_class_image(np.random.default_rng(1), 1, (71, 40)))
    np.testing.assert_array_equal(resize.to_stored(tall, (24, 24, 3)), resize.to_square_uint8(tall, 24))
    grey = rgb.convert("L")
    want = np.asarray(grey.resize((int(28 * 70 / 45), 28), Image.BILINEAR), np.uint8)  # shorter side -> 28
    left = int(round((want.shape[1] - 28) / 2.0))  # torchvision's CenterCrop offset
    want = want[:, left : left + 28]
    got = resize.to_stored(grey, (28, 28, 1))
    assert got.shape == (28, 28, 1)
    np.testing.assert_array_equal(got[..., 0], want)
    np.testing.assert_array_equal(got[..., 0], resize.to_square_uint8(grey, 28)[..., 0])  # grey: equal channels
    # search reads files (RGB photo for a grey dataset, grey picture for an RGB one) and arrays the same way
    rgb.save(tmp_path / "wide.png")
    grey.save(tmp_path / "grey.png")
    np.testing.assert_array_equal(run_reader.load_images([str(tmp_path / "wide.png")], (28, 28, 1))[0], got)
    np.testing.assert_array_equal(
        run_reader.load_images([str(tmp_path / "grey.png")], (32, 32, 3))[0], resize.to_square_uint8(grey, 32)
    )
    stored = np.asarray(grey.resize((28, 28)), np.uint8)[..., None]
    np.testing.assert_array_equal(run_reader.prepare([stored, np.asarray(grey)], (28, 28, 1)), np.stack([stored, got]))


def test_gallery_image_finds_its_own_row_first(finished_run, train_images, tmp_path, capsys):
    wd, _ = finished_run
    run = run_reader.Run(wd)
    paths, rows = [], []
    newest = np.flatnonzero(run.gallery.sessions == run.session)
    for row in (newest[0], newest[-1]):  # rows embedded by the same (newest) model as the queries
        src = int(run.gallery.source_ids[row])
        path = str(tmp_path / f"q{row}.png")
        Image.fromarray(train_images[src][..., 0]).save(path)  # the pixels the builder stored
        paths.append(path)
        rows.append(int(row))
    # the same image inside a wider picture: the centre crop of the stored rule recovers it exactly
    row = int(newest[len(newest) // 2])
    wide = np.random.default_rng(0).integers(0, 256, (28, 40), dtype=np.uint8)
    wide[:, 6:34] = train_images[int(run.gallery.source_ids[row])][..., 0]
    Image.fromarray(wide).save(tmp_path / "wide.png")
    paths.append(str(tmp_path / "wide.png"))
    rows.append(row)
    # the README's form, with the newest model (the default is the gate's choice: tests/runs/test_served_model.py)
    assert _cli(["--workdir", wd, "--images", *paths, "--k", "3", "--session", "newest"]) == 0
    out = capsys.readouterr().out
    hits = run.search(run_reader.load_images(paths, run.image_shape), k=3)
    for h, row in zip(hits, rows):
        assert _own_row_first(h, row), (row, h)
        assert h[0]["score"] > 0.999 and h[0]["label"] == run.gallery.labels[row]
    assert "rank" in out and "arrived in session" in out and run.class_name(hits[0][0]["label"]) in out


def test_hits_show_source_class_and_sessions(finished_run, train_images, tmp_path, capsys, monkeypatch):
    wd, _ = finished_run
    run = run_reader.Run(wd)
    row = int(np.flatnonzero(run.gallery.sessions == run.session)[0])
    src = int(run.gallery.source_ids[row])
    path = str(tmp_path / "q.png")
    Image.fromarray(train_images[src][..., 0]).save(path)
    names = [f"/data/train/{i:05d}.png" for i in range(len(train_images))]
    monkeypatch.setattr(stores, "source_names", lambda data, split: names if split == "train" else None)
    assert _cli(["--workdir", wd, "--images", path, "--k", "4", "--json", "--session", "newest"]) == 0
    (answer,) = json.loads(capsys.readouterr().out)
    assert answer["query"] == path and answer["model_session"] == run.session + 1
    assert [h["rank"] for h in answer["hits"]] == [1, 2, 3, 4] and _own_row_first(answer["hits"], row)
    for h in answer["hits"]:
        j = h["row"]
        assert set(h) == {
            *("rank", "score", "row", "id", "label", "class_name", "arrival_session", "model_session", "source")
        }
        assert h["id"] == run.id_of_row(j)  # the row's stable id, as the server and export give it
        assert h["source"] == names[int(run.gallery.source_ids[j])]
        assert h["class_name"] == run.protocol["class_names"][h["label"]] and h["label"] == run.gallery.labels[j]
        # finetune keeps every part: a row arrives with the session whose model embedded it
        assert h["arrival_session"] == h["model_session"] == run.gallery.sessions[j] + 1
    # when the data layer cannot name the sources (a store gone): the train-split index
    monkeypatch.setattr(stores, "source_names", lambda data, split: None)
    top = run_reader.Run(wd).search(run_reader.load_images([path], run.image_shape), k=1)[0][0]
    assert top["source"] == f"train[{int(run.gallery.source_ids[top['row']])}]"


def test_arrival_session_is_the_first_part_holding_the_image():
    def part(session, ids, replaces=False):
        ids = np.asarray(ids, np.int64)
        return GalleryPart(np.ones((len(ids), 2), np.float32), np.zeros(len(ids), np.int32), ids, session, replaces)

    parts = [part(0, [5, 3]), part(1, [3, 5, 9], replaces=True), part(2, [9, 3, 5, 1], replaces=True)]
    gallery = Gallery.empty(2)
    for p in parts:
        gallery = gallery.with_part(p)
    log = [(p.session, p.source_ids) for p in parts]
    np.testing.assert_array_equal(run_rows.arrival_sessions(log, gallery), [1, 0, 0, 2])  # joint: all by model 2
    np.testing.assert_array_equal(gallery.sessions, [2, 2, 2, 2])
    kept = Gallery.empty(2).with_part(part(0, [5, 3])).with_part(part(1, [7]))
    np.testing.assert_array_equal(run_rows.arrival_sessions([(0, [5, 3]), (1, [7])], kept), [0, 0, 1])


# --- --add -------------------------------------------------------------------------------------------


def test_add_ingests_images_with_the_newest_model(run_copy, tmp_path, capsys, monkeypatch):
    wd = run_copy
    before = run_reader.Run(wd)
    img = (np.random.default_rng(0).uniform(0, 255, (28, 28))).astype(np.uint8)
    path = str(tmp_path / "new.png")
    Image.fromarray(img).save(path)
    name = before.protocol["class_names"][0]
    monkeypatch.setattr(workdir_lib, "ADD_WAIT_S", 0.3)
    with workdir_lib.hold_additions(wd):  # another adder (--add, a server's /add) past the wait: refused
        assert search.search_or_add(wd, [path], add=True, label=name) == 2
    err = capsys.readouterr().err
    assert f"another add (pid {os.getpid()} on " in err and "nothing was added: rerun this add" in err, err
    assert "resume" not in err and "search.py" not in err  # not a run to resume; no command line (folders)
    with workdir_lib.hold(wd):  # a training run (update) holds the run's lock: rows are added meanwhile
        assert _cli(["--workdir", wd, "--images", path, "--add", "--label", name, "--session", "newest"]) == 0
    after = run_reader.Run(wd)
    assert len(after.added) == 1 and after.added.labels[0] == 0
    assert after.added.sessions[0] == before.session
    np.testing.assert_array_equal(after.gallery.embeddings, before.gallery.embeddings)  # stored rows untouched
    top = after.search(run_reader.load_images([path], after.image_shape), k=1)[0][0]
    assert top["source"] == os.path.abspath(path) and top["score"] > 0.999
    assert top["row"] == len(after.gallery) and top["arrival_session"] == top["model_session"] == after.session + 1


def test_an_add_waits_for_another_adder(run_copy, tmp_path, capsys):
    """Two ``search --add`` at once (``xargs -P``): the second was refused at once (exit 2, its photo not
    added); it waits for the first, as the server's ``/add`` does."""
    import threading

    path = str(tmp_path / "waits.png")
    Image.fromarray(np.random.default_rng(1).uniform(0, 255, (28, 28)).astype(np.uint8)).save(path)
    held, release = threading.Event(), threading.Event()

    def first_adder():
        with workdir_lib.hold_additions(run_copy):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=first_adder)
    thread.start()
    held.wait(10)
    threading.Timer(0.5, release.set).start()
    try:
        assert search.search_or_add(run_copy, [path], add=True) == 0, capsys.readouterr().err
    finally:
        release.set()
        thread.join()
    assert len(run_reader.Run(run_copy).added) == 1


def test_added_rows_keep_the_session_of_their_model(run_copy, tmp_path):
    """Rows added while the run had one session keep that model's session when the run grows."""
    wd = run_copy
    sessions = os.path.join(wd, "checkpoints", "sessions")
    last = run_reader.Run(wd).session
    shutil.move(os.path.join(sessions, str(last)), tmp_path / "held")  # the run before its last session:
    results = os.path.join(wd, "results.json")  # its results.json records the sessions before it only
    shutil.copy(results, tmp_path / "results-held.json")
    with open(results) as f:
        before = json.load(f)
    with open(results, "w") as f:
        json.dump({**before, "per_session": before["per_session"][:last]}, f)
    paths = []
    for i in range(3):
        paths.append(str(tmp_path / f"a{i}.png"))
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (30, 28), dtype=np.uint8)).save(paths[-1])
    assert search.search_or_add(wd, paths[:2], add=True, session="newest") == 0
    shutil.move(tmp_path / "held", os.path.join(sessions, str(last)))  # the last session completes
    shutil.move(tmp_path / "results-held.json", results)
    assert search.search_or_add(wd, paths[2:], add=True, label="0", session="newest") == 0
    run = run_reader.Run(wd)
    n = len(run.gallery)
    assert [run.describe(n + j)["model_session"] for j in range(3)] == [last, last, last + 1]
    assert [run.source(n + j) for j in range(3)] == [os.path.abspath(p) for p in paths]
    np.testing.assert_array_equal(run.added.labels, [-1, -1, 0])


# --- what a reader restores ---------------------------------------------------------------------------


def test_restore_does_not_depend_on_the_class_count(finished_run, run_copy, train_images, tmp_path):
    """The session checkpoint's variables are restored as stored: a head that grew (or a protocol that
    names more classes than the head has rows) changes nothing."""
    proto_path = os.path.join(run_copy, "protocol.json")
    with open(proto_path) as f:
        proto = json.load(f)
    proto["class_names"] += ["extra class 1", "extra class 2", "extra class 3"]
    with open(proto_path, "w") as f:
        json.dump(proto, f)
    original, grown = run_reader.Run(finished_run[0]), run_reader.Run(run_copy)
    assert grown.variables["params"]["head"].shape == original.variables["params"]["head"].shape
    images = train_images[:5]
    np.testing.assert_array_equal(grown.embed(images), original.embed(images))
    assert grown.search(images, 3) == original.search(images, 3)


def test_search_reads_the_last_completed_session(run_copy, train_images):
    """A save in progress (orbax's ``<step>.orbax-checkpoint-tmp*`` folder, renamed when finalized) is
    neither read nor removed by a reader."""
    sessions = os.path.join(run_copy, "checkpoints", "sessions")
    before = run_reader.Run(run_copy)
    nxt = before.session + 1
    tmp_dirs = [
        os.path.join(sessions, f"{nxt}.orbax-checkpoint-tmp"),
        os.path.join(sessions, f"{nxt + 1}.orbax-checkpoint-tmp-1795461572"),
    ]
    shutil.copytree(os.path.join(sessions, str(before.session)), tmp_dirs[0])  # half-written: a piece missing
    shutil.rmtree(os.path.join(tmp_dirs[0], "gallery"))
    os.makedirs(tmp_dirs[1])
    run = run_reader.Run(run_copy)
    assert run.session == before.session and len(run.gallery) == len(before.gallery)
    hits = run.search(train_images[:4], 2)
    assert hits == before.search(train_images[:4], 2)
    assert all(os.path.isdir(d) for d in tmp_dirs)  # the writer's work in progress is left alone


# --- the command line -----------------------------------------------------------------------------------


def test_images_flag_takes_the_files_after_it_or_repeats(monkeypatch):
    seen = {}
    monkeypatch.setattr(search, "search_or_add", lambda workdir, paths, **kw: seen.update(paths=paths, **kw) or 0)
    assert _cli(["--workdir", "w", "--images", "a.png", "b.jpg", "--k", "3", "c.png"]) == 0
    assert seen == {"paths": ["a.png", "b.jpg", "c.png"], "k": 3, "add": False, "label": None, "as_json": False}
    assert _cli(["--workdir", "w", "--images", "a.png", "--images", "b.jpg", "--add", "--label", "shirt"]) == 0
    assert seen == {"paths": ["a.png", "b.jpg"], "k": 5, "add": True, "label": "shirt", "as_json": False}
    assert _cli(["--workdir", "w", "--images", "a.png", "--json"]) == 0 and seen["as_json"] is True
    assert _cli(["--workdir", "w", "--images", "a.png", "--html", "hits.html"]) == 0 and seen["html"] == "hits.html"


def test_errors_are_one_line(tmp_path, capsys):
    assert _cli(["--workdir", str(tmp_path), "--images", "x.png"]) == 2
    assert "holds no cvs_jax run" in capsys.readouterr().err
    assert search.search_or_add(str(tmp_path / "nope"), ["x.png"], add=True) == 2
    assert "holds no cvs_jax run" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "nope")  # --add did not create the folder for its lock
    assert search.search_or_add(str(tmp_path), []) == 2
    assert capsys.readouterr().err.startswith("error: no images given")


def test_info_describes_a_run_whose_newest_weights_are_damaged_and_search_and_export_refuse_it(
    run_copy, train_images, tmp_path, capsys
):
    """``info`` needs the gallery and the results, not the model: it refused the whole run (exit 2) when the
    newest session's weights were damaged.  Now it answers, with the gallery and recall of the intact run and
    one warning naming the unreadable checkpoint; search and export, which embed with that model, refuse."""
    assert _command(info, "--workdir", run_copy, "--json") == 0
    intact = json.loads(capsys.readouterr().out)
    assert intact.get("model_problem") is None
    newest = os.path.join(run_copy, "checkpoints", "sessions", str(intact["sessions_completed"] - 1))
    data = [os.path.join(r, n) for r, _, ns in os.walk(os.path.join(newest, "variables")) for n in ns]
    biggest = max((p for p in data if os.sep + "d" + os.sep in p), key=os.path.getsize)
    with open(biggest, "r+b") as f:
        f.write(b"\xcd" * 4096)  # bytes written over the weights' array data
    before = file_tree.checksums(run_copy)
    assert _command(info, "--workdir", run_copy, "--json") == 0
    described = json.loads(capsys.readouterr().out)
    assert described["model_problem"].startswith(f"checkpoint {newest} cannot be read")
    assert {k: v for k, v in described.items() if k != "model_problem"} == {
        k: v for k, v in intact.items() if k != "model_problem"
    }
    assert _command(info, "--workdir", run_copy) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[1].startswith(f"warning: the model of session {intact['sessions_completed']} cannot be read")
    query = str(tmp_path / "q.png")
    Image.fromarray(train_images[0][..., 0]).save(query)
    assert _cli(["--workdir", run_copy, "--images", query, "--session", "newest"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: checkpoint {newest} cannot be read"), err
    assert _command(export, "--workdir", run_copy, "--out", str(tmp_path / "exported"), "--session", "newest") == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: checkpoint {newest} cannot be read"), err
    assert not os.path.exists(tmp_path / "exported")  # refused before writing (no half export to --out)
    assert file_tree.checksums(run_copy) == before  # nothing moved aside or written
