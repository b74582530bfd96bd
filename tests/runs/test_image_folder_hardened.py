"""Your own images, hardened: refusals leave the workdir as it was, a run needs only its
workdir and record stores (not the folders it was made from), one ``error:`` line for every input
mistake, the same duplicate rules for ``update`` and ``search --add``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import unicodedata

import numpy as np
import pytest
from absl import flags
from ml_collections import config_flags
from PIL import Image

from cvs_jax import cli, export, info, search, update
from cvs_jax.config import recorded
from cvs_jax.data import sources, stores, user_sessions
from cvs_jax.engine import runner
from cvs_jax.errors import ConfigError, DataError
from cvs_jax.retrieval import run_reader
from cvs_jax.rundir import paths
from cvs_jax.testing.file_tree import checksums
from cvs_jax.testing.image_folders import SESSIONS, folder_config, folder_image, write_folder

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finetune run (no replay: its sessions train on their own images only) on a folder of its own,
    which a test may move; and the folder of a good next session."""
    root = tmp_path_factory.mktemp("hardened")
    first = write_folder(root / "day1", SESSIONS[0], 4, seed=0)
    second = write_folder(root / "day2", SESSIONS[1], 4, seed=1)
    c = folder_config(root, first)
    c.method = "finetune"
    wd = str(root / "run")
    runner.run(c, wd)
    return wd, first, second, root


@pytest.fixture
def run_to_copy(trained):
    """What ``run_copy`` (tests/conftest.py) copies."""
    return trained[0]


def _train_image(folder) -> str:
    ant = os.path.join(folder, "train", "ant") if os.path.isdir(os.path.join(folder, "train")) else f"{folder}/ant"
    return os.path.join(ant, sorted(os.listdir(ant))[0])


def class_folders(root, classes: dict[str, int], seed: int) -> str:
    """``root/<class>/`` folders of PNGs (the test split is drawn)."""
    rng = np.random.default_rng(seed)
    for name, n in classes.items():
        os.makedirs(os.path.join(root, name))
        for i in range(n):
            folder_image(sum(map(ord, name)) % 97, rng).save(os.path.join(root, name, f"{i}.png"))
    return str(root)


# --- item 1: checks first; a refused update leaves every file as it was ------------------------------


def test_refused_updates_leave_the_workdir_byte_identical(trained, run_copy, tmp_path, capsys):
    wd = run_copy
    before = checksums(wd)
    small = class_folders(tmp_path / "small", {"gnu": 3}, seed=5)  # 2 training images after 1 validation query
    assert update.update(wd, small) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "session 2 has 2 training images" in err[0] and "photos" in err[0], err
    assert "batch_size." not in err[0] and "lower" not in err[0]  # update cannot change the batch size
    assert checksums(wd) == before

    assert update.update(wd, str(tmp_path / "nowhere")) == 2  # a nonexistent --data
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not exist" in err[0] and "--config" not in err[0], err

    broken = write_folder(tmp_path / "broken", {"gnu": 12}, 2, seed=6)
    with open(os.path.join(broken, "train", "gnu", "bad.png"), "wb") as f:
        f.write(b"not a png")
    assert update.update(wd, broken) == 2
    err = capsys.readouterr().err
    assert "--config.data.on_corrupt=skip" in err
    assert checksums(wd) == before
    # the suggested flag is one update takes
    fv = flags.FlagValues()
    update.define_flags(fv)
    fv(["update", "--workdir", wd, "--data", broken, "--config.data.on_corrupt=skip"])
    assert fv["config.data.on_corrupt"].value == "skip"

    # after the refusals the run is not stuck: the small folder made bigger is accepted as session 2
    config_path = os.path.join(wd, "config.json")
    planned = update.plan_update(wd, trained[2])
    assert list(planned.data.updates) == [os.path.abspath(trained[2])]
    with open(config_path) as f:
        assert json.load(f)["data"]["updates"] == []


def test_update_duplicates_compare_content_not_names(trained, run_copy, tmp_path):
    wd, first = run_copy, trained[1]
    renamed = tmp_path / "renamed" / "ant"
    renamed.mkdir(parents=True)
    shutil.copyfile(_train_image(first), renamed / "a new name.png")  # the same bytes, a new name
    for i in range(3):
        Image.fromarray(np.full((20, 20, 3), 40 * i, np.uint8)).save(renamed / f"other {i}.png")
    with pytest.raises(DataError, match=r"1 image\(s\) of .* are already in the run \(same bytes\)"):
        update.plan_update(wd, str(renamed.parent))

    same_name = tmp_path / "same_name" / "ant"  # only a file name in common: accepted
    same_name.mkdir(parents=True)
    for i in range(4):
        name = os.path.basename(_train_image(first)) if i == 0 else f"x{i}.png"
        Image.fromarray(np.full((20, 20, 3), 7 + 50 * i, np.uint8)).save(same_name / name)
    planned = update.plan_update(wd, str(same_name.parent))
    assert list(planned.data.updates) == [str(same_name.parent)]


def test_a_class_folder_named_as_a_known_class_in_another_case_is_refused(run_copy, tmp_path, capsys):
    """``Ant/`` beside the run's ``ant`` became a second class (a query of one counted the other's hits as
    wrong); ``search --add --label Ant`` and ``/add?label=Ant`` refuse that name, and so does ``update``."""
    before = checksums(run_copy)
    folder = class_folders(tmp_path / "cased", {"Ant": 12, "gnu": 12}, seed=8)
    assert update.update(run_copy, folder) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "class folder 'Ant' of" in err[0] and "rename the folder to 'ant'" in err[0], err
    assert checksums(run_copy) == before


@pytest.mark.parametrize("run_form", ["NFC", "NFD"])
def test_a_class_folder_in_another_unicode_form_is_refused_naming_the_runs_form(tmp_path, run_form):
    """A folder ``crème`` whose accent is encoded the other way (NFC / NFD) reads as the run's class but is
    another name: refused, with the ``convmv`` form that renames it to the run's."""
    wd = tmp_path / "run"
    known = unicodedata.normalize(run_form, "crème")
    os.makedirs(os.path.dirname(paths.protocol_file(str(wd))), exist_ok=True)
    with open(paths.protocol_file(str(wd)), "w") as f:
        json.dump({"class_names": ["ant", known]}, f)
    other = unicodedata.normalize("NFD" if run_form == "NFC" else "NFC", "crème")
    with pytest.raises(DataError, match=f"--{run_form.lower()} -r") as refused:
        update._check_class_names(str(wd), "/photos/day2", ["ant", other])
    assert repr(known) in str(refused.value) and "\n" not in str(refused.value)
    update._check_class_names(str(wd), "/photos/day2", ["ant", known, "gnu"])  # the run's own form: accepted


def test_stored_updates_must_be_a_prefix(trained, tmp_path):
    c = folder_config(tmp_path, trained[1])
    wd = str(tmp_path / "wd")
    c.data.updates = ["/photos/a"]
    recorded.prepare(c, wd)  # config.json first, as a run writes it before any checkpoint
    os.makedirs(os.path.join(wd, "checkpoints", "sessions", "1"))  # a run that trained
    c.data.updates = ["/photos/a", "/photos/b"]  # update adds a folder: fine
    recorded.prepare(c, wd)
    c.data.updates = ["/photos/c", "/photos/b", "/photos/d"]  # an earlier folder replaced: refused
    with pytest.raises(ConfigError, match="extended by python -m cvs_jax.update"):
        recorded.prepare(c, wd)


def test_size_rule_counts_replay_and_says_how_many_photos():
    labels = np.repeat(np.arange(4), [20, 20, 20, 2])
    sessions = np.repeat([0, 1], [60, 2])
    plan = user_sessions.plan_from_sessions(labels, sessions, val_fraction=0.1)
    plabels = plan.to_protocol_labels(labels)
    replayed = user_sessions.replay_sizes(plan, plabels, "class_quota", budget=30)
    assert replayed == [0, 30]  # herding: 10 per class of the 3 seen
    user_sessions.check_plan_feasible(plan, batch_size=16, replayed=replayed)  # 1 own + 30 replayed
    assert user_sessions.replay_sizes(plan, plabels, "reservoir", budget=100)[1] == len(plan.sessions[0].train)
    with pytest.raises(ConfigError, match=r"session 2 has 1 training images .*16 training images of its own"):
        user_sessions.check_plan_feasible(
            plan, batch_size=16, batch_size_fixed=True, val_fraction=0.1, test_fraction=0.2
        )
    with pytest.raises(ConfigError, match="memory.budget=3 is smaller than the 4 classes.*cannot change"):
        user_sessions.check_plan_feasible(plan, batch_size=1, memory_budget=3, batch_size_fixed=True)
    # 16 train images need 18 before validation, 22 with the test share
    assert user_sessions.photos_needed(16, val_fraction=0.1, test_fraction=0.2) == 22


def test_budget_of_user_sessions_checked_before_any_data(trained, tmp_path):
    c = folder_config(tmp_path, trained[1])
    c.method, c.memory.budget = "cvs", 2  # the folder holds 3 classes
    with pytest.raises(ConfigError, match="memory.budget=2 is smaller than the 3 classes"):
        runner.run(c, str(tmp_path / "wd"))
    assert not os.path.exists(tmp_path / "data") and not os.path.exists(tmp_path / "wd")


# --- item 2/3: a run needs its workdir and record stores, not its folders -------------------------------


def test_moved_folder_search_export_update(trained, run_copy, tmp_path, capsys):
    wd, first, second = run_copy, trained[1], trained[2]
    shutil.copyfile(_train_image(first), tmp_path / "q.png")
    moved = first + "-moved"
    os.rename(first, moved)
    try:
        run = run_reader.Run(wd)
        hits = run.search(run_reader.load_images([str(tmp_path / "q.png")], run.image_shape), 3)
        assert all(h["source"].startswith(first + os.sep) for h in hits[0]), hits  # the paths the run was given
        info = export.export(wd, str(tmp_path / "export"))
        assert info["rows"] == len(run.rows)
        assert update.update(wd, second) == 0
        with open(os.path.join(wd, "results.json")) as f:
            assert len(json.load(f)["per_session"]) == 2
        assert search.search_or_add(wd, [str(tmp_path / "q.png")], k=1) == 0
    finally:
        os.rename(moved, first)


def test_missing_folder_is_refused_before_the_workdir(tmp_path):
    c = folder_config(tmp_path, tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="data.manual_dir: .* does not exist"):
        runner.run(c, str(tmp_path / "wd"))
    assert not os.path.exists(tmp_path / "wd")  # no config.json left behind


def test_paths_shown_are_the_folder_the_run_was_given(trained, tmp_path):
    copy = shutil.copytree(trained[1], tmp_path / "copy")  # the same files: the same record store
    c = folder_config(trained[3], str(copy))
    ds = sources.load_dataset(
        "image_folder", data_dir=c.data.data_dir, manual_dir=str(copy), options=stores.builder_options(c.data)
    )
    assert ds.stores == tuple(stores.store_dirs(folder_config(trained[3], trained[1]).data))  # shared
    names = stores.source_names(c.data, "train")
    assert names and all(n.startswith(str(copy) + os.sep) for n in names)


# --- item 4/5: one error line, exit 2 ------------------------------------------------------------------


def _parse(define, argv, capsys) -> str:
    fv = flags.FlagValues()
    define(fv)
    with pytest.raises(SystemExit) as exit_:
        cli._parse_flags(argv, fv)  # pylint: disable=protected-access
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_flag_mistakes_are_one_error_line(capsys):
    def main_flags(fv):
        config_flags.DEFINE_config_file("config", None, "config", flag_values=fv)
        flags.DEFINE_string("workdir", None, "workdir", flag_values=fv)

    assert "workdirr" in _parse(update.define_flags, ["update", "--workdirr=/w", "--data=/d"], capsys)
    assert "--data" in _parse(update.define_flags, ["update", "--workdir=/w"], capsys)
    assert "--k=abc" in _parse(search.define_flags, ["search", "--workdir=/w", "--k=abc"], capsys)
    batch = _parse(update.define_flags, ["update", "--workdir=/w", "--config.train.batch_size=8"], capsys)
    assert "takes only --config.data.on_corrupt, --config.train.epochs, --config.train.lr" in batch, batch
    assert "did you mean" not in batch.lower()  # absl offered train.epochs for train.batch_size
    typo = _parse(update.define_flags, ["update", "--workdir=/w", "--config.train.epochz=3"], capsys)
    assert "--config.train.epochz: did you mean --config.train.epochs? this command takes only" in typo, typo
    cfg = [
        "main",
        "--config",
        os.path.join(REPO, "configs", "image_folder_general.py"),
        "--workdir=/w",
        "--config.data.manual_dirr=x",
    ]
    assert "manual_dirr" in _parse(main_flags, cfg, capsys)


def test_update_cli_unknown_flag_subprocess():
    proc = subprocess.run(
        [sys.executable, "-m", "cvs_jax.update", "--workdirr=/w", "--data=/d"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: Unknown command line flag 'workdirr'")


def test_bad_queries_are_reported_and_the_rest_answered(trained, tmp_path, capsys, monkeypatch):
    wd = trained[0]
    good = str(tmp_path / "good.png")
    shutil.copyfile(_train_image(trained[1]), good)
    bomb = str(tmp_path / "bomb.png")
    Image.fromarray(np.zeros((200, 200, 3), np.uint8)).save(bomb)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 2000)  # 40000 pixels > 2 x 2000: a decompression bomb
    missing = str(tmp_path / "missing.png")
    assert search.search_or_add(wd, [bomb, good, missing], k=2) == 2
    out = capsys.readouterr()
    err = out.err.strip().splitlines()
    assert len(err) == 2 and err[1].startswith("error: cannot read image"), err
    assert err[0].startswith("error: image") and "too large to decode safely" in err[0], err  # not "pass PNG/JPEG"
    assert "bomb.png" in err[0] and "missing.png" in err[1] and "good.png" in out.out
    assert search.search_or_add(wd, [bomb, good], k=2, as_json=True) == 2
    answers = json.loads(capsys.readouterr().out)
    assert "error" in answers[0] and len(answers[1]["hits"]) == 2


# --- item 6: the same rules everywhere ----------------------------------------------------------------


def test_add_refuses_bytes_already_in_the_run(trained, run_copy, tmp_path, capsys):
    wd = run_copy
    known = str(tmp_path / "known.png")
    shutil.copyfile(_train_image(trained[1]), known)
    assert search.search_or_add(wd, [known], add=True, label="ant") == 2
    assert "already in the run (same bytes)" in capsys.readouterr().err
    new = str(tmp_path / "new.png")
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(new)
    assert search.search_or_add(wd, [new], add=True) == 0
    assert "unlabelled" in capsys.readouterr().err
    assert search.search_or_add(wd, [new], add=True, label="ant") == 2  # added once already
    assert search.search_or_add(wd, [new, known], add=True, label="ant", force=True) == 0
    assert len(run_reader.Run(wd).added) == 3


def test_degenerate_images_are_named_in_a_warning(tmp_path, capsys):
    folder = class_folders(tmp_path / "odd", {"ant": 6, "bee": 6}, seed=3)
    Image.fromarray(np.zeros((1, 1, 3), np.uint8)).save(os.path.join(folder, "ant", "dot.png"))
    shutil.copyfile(_train_image(folder), os.path.join(folder, "bee", "twin.png"))
    with open(os.path.join(folder, "bee", "broken.png"), "wb") as f:
        f.write(b"not a png")
    options = {"stored_size": 16, "test_fraction": 0.2, "test_seed": 0}
    for _ in range(2):  # loaded twice (as main does): every warning once
        sources.load_dataset(
            "image_folder", data_dir=str(tmp_path / "d"), manual_dir=folder, on_corrupt="skip", options=options
        )
    out = capsys.readouterr().out
    assert out.count("dot.png") == 1 and "smaller than 8 pixels" in out
    assert out.count("twin.png") == 1 and "same bytes under two classes" in out
    assert out.count("skipped 1 undecodable") == 1


# --- item 8: update continues a run whose first folder was cut into sessions by the generator -----------


def test_update_continues_a_generator_run(trained, tmp_path):
    c = folder_config(tmp_path, trained[1])
    c.method = "finetune"
    c.data.split, c.data.setup = "generator", "general"
    c.data.num_sessions, c.data.first_classes, c.data.classes_per_session = 2, 2, 1
    c.data.samples_per_new_class, c.data.old_class_percent = 16, 10.0
    wd = str(tmp_path / "run")
    runner.run(c, wd)
    with open(os.path.join(wd, "results.json")) as f:
        before = json.load(f)["per_session"]
    with open(os.path.join(wd, "protocol.json")) as f:
        planned = json.load(f)
    assert update.update(wd, trained[2]) == 0  # dog (new) and ant (known) as session 3
    with open(os.path.join(wd, "results.json")) as f:
        after = json.load(f)["per_session"]
    assert len(before) == 2 and len(after) == 3
    for a, b in zip(after[:2], before):  # the earlier sessions are as they were
        assert {k: v for k, v in a.items() if k != "seconds"} == {k: v for k, v in b.items() if k != "seconds"}
    with open(os.path.join(wd, "protocol.json")) as f:
        protocol = json.load(f)
    assert protocol["sessions"][:2] == planned["sessions"]  # the generated sessions are unchanged
    assert protocol["class_names"][:3] == planned["class_names"] and protocol["class_names"][3] == "dog"
    assert protocol["sessions"][2]["num_outputs"] == 4 and protocol["sessions"][2]["new_classes"] == [3]


# --- item 9: what a run holds, in one command ----------------------------------------------------------


def test_info_lists_classes_sessions_and_compatibility(trained, capsys):
    fv = flags.FlagValues()
    info.define_flags(fv)
    assert info.main(fv(["info", "--workdir", trained[0]]), fv) == 0
    out = capsys.readouterr().out
    assert "3 classes" in out and "session 1:" in out and "model S1" in out and "AR@1" in out
    fv = flags.FlagValues()
    info.define_flags(fv)
    assert info.main(fv(["info", "--workdir", trained[0], "--json"]), fv) == 0
    got = json.loads(capsys.readouterr().out)
    assert [c["class_name"] for c in got["classes"]] == ["ant", "bee", "cat"]
    assert all(c["first_session"] == 1 and c["gallery_rows"] > 0 for c in got["classes"])
    assert got["sessions"][0]["gallery_rows_by_its_model"] == got["gallery_rows"]
    assert len(got["compatibility_recall1"]) == 1
    assert len(got["record_stores"]) == 1 and os.path.isdir(got["record_stores"][0])
    assert info.main(fv(["info", "--workdir", "/nonexistent"]), fv) == 2
    assert capsys.readouterr().err.startswith("error: /nonexistent holds no cvs_jax run")


def test_compile_cache_on_by_default(monkeypatch, tmp_path):
    import jax

    before = jax.config.jax_compilation_cache_dir
    min_time = jax.config.jax_persistent_cache_min_compile_time_secs
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.delenv("CVS_JAX_COMPILE_CACHE", raising=False)
    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    try:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
        cli.enable_compile_cache()
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "cvs_jax" / "xla")
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0  # serve's small programs too
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
        monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1.0")  # the user's threshold is kept
        cli.enable_compile_cache()
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 1.0
        monkeypatch.setenv("CVS_JAX_COMPILE_CACHE", str(tmp_path / "mine"))
        cli.enable_compile_cache()
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "mine")
        jax.config.update("jax_compilation_cache_dir", before)
        monkeypatch.setenv("CVS_JAX_COMPILE_CACHE", "off")
        cli.enable_compile_cache()
        assert jax.config.jax_compilation_cache_dir == before
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_time)
