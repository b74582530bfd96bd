"""Bad input stops early with one message that names the problem and the fix."""

import json
import os
import subprocess
import sys

import pytest

from cvs_jax.data.sources import DatasetNotFoundError
from cvs_jax.engine import config_checks, runner
from cvs_jax.errors import ConfigError, DataError, NonFiniteError, UserError
from cvs_jax.retrieval import embedder
from cvs_jax.testing.tiny_data import tiny_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def manual_dir(fashion_idx):
    """tests/conftest.py's data with 6 test images per class instead of 10."""
    return fashion_idx(60, 6)


@pytest.fixture
def config(manual_dir, tmp_path):
    c = tiny_config(manual_dir, tmp_path, sessions=2)
    c.train.epochs = 1
    return c


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("method", "sgd", "method='sgd' is unknown"),
        ("data.setup", "mixed", "data.setup='mixed' is unknown"),
        ("data.num_sessions", 9, "S + (L-1)*C"),  # 4 + 8*2 = 20 classes > 10
        ("data.old_class_percent", 100.0, "must be in [0, 100)"),
        ("data.old_class_percent", -5.0, "must be in [0, 100)"),
        ("train.schedule", "step", "train.schedule='step' is unknown"),
        ("data.manual_dir", "/nonexistent/fashion", "data.manual_dir='/nonexistent/fashion' does not exist"),
        (
            "model.pretrained",
            "/nonexistent/resnet50.npz",
            "model.pretrained='/nonexistent/resnet50.npz' does not exist",
        ),
        (
            "data.official_split_dir",
            "/nonexistent/splits",
            "data.official_split_dir='/nonexistent/splits' does not exist",
        ),
        ("data.on_corrupt", "ignore", "data.on_corrupt='ignore' is unknown"),
        ("augment.policy", "autoaug", "augment.policy='autoaug' is unknown"),
        # the generator's own rules: refused before the data is read (they were refused by the splitter, after)
        ("data.setup", "blurry", "blurry needs data.first_classes (4) == data.classes_per_session (2)"),
        ("data.val_fraction", 1.0, "data.val_fraction=1.0 must lie in [0, 1)"),
        ("data.samples_per_new_class", 0, "data.samples_per_new_class=0 must be >= 1"),
    ],
)
def test_config_refused_before_any_work(config, tmp_path, field, value, message):
    group, _, key = field.rpartition(".")
    setattr(config[group] if group else config, key, value)
    with pytest.raises(
        config_checks.ConfigError,
        match=message.replace("(", r"\(")
        .replace("[", r"\[")
        .replace(")", r"\)")
        .replace("*", r"\*")
        .replace("+", r"\+"),
    ):
        runner.run(config, str(tmp_path / "wd"))
    assert not os.path.exists(str(tmp_path / "tfds"))  # refused before the dataset was even built
    assert not os.path.exists(str(tmp_path / "wd"))  # and before the workdir (config.json) was written


def test_budget_smaller_than_classes(config, tmp_path):
    config.method = "cvs"
    config.memory.budget = 5  # the run sees 6 classes
    with pytest.raises(config_checks.ConfigError, match="memory.budget=5 is smaller than the 6 classes"):
        runner.run(config, str(tmp_path / "wd"))


def test_a_session_smaller_than_the_batch_is_refused_before_session_one_trains(config, tmp_path):
    """Session 2 (90 images) cannot fill a batch of 120: the run stops before session 1 trains (it trained
    session 1 first and stopped when session 2 came)."""
    config.train.batch_size = 120
    wd = tmp_path / "wd"
    with pytest.raises(ConfigError, match=r"^session 2 has 90 training images, fewer than train.batch_size=120;"):
        runner.run(config, str(wd))
    assert not (wd / "checkpoints" / "sessions" / "0").exists()


@pytest.mark.parametrize(
    "method, batch_size, refused",
    [
        ("finetune", 120, "session 2 has 90 training images, fewer than train.batch_size=120"),
        ("cvs", 120, None),  # its memory (herded from session 1's 144 images) may fill the batch
        ("rainbow", 120, None),  # half-memory batches: 60 rows of its own, 90 images
        ("rainbow", 200, "session 1 has 144 training images, fewer than train.batch_size=200"),
        ("joint", 144, None),  # session 2 trains on every image so far: 234
        ("finetune", 144, "session 2 has 90 training images, fewer than train.batch_size=144"),
    ],
)
def test_the_batch_check_counts_what_each_method_trains_on(config, method, batch_size, refused):
    from cvs_jax.engine import data_checks
    from cvs_jax.engine.protocol_builder import build_protocol
    from cvs_jax.methods.registry import get_method

    config.method, config.train.batch_size = method, batch_size
    proto = build_protocol(config)
    if refused is None:
        data_checks.check_plan(config, get_method(config), proto)
    else:
        with pytest.raises(ConfigError, match=refused):
            data_checks.check_plan(config, get_method(config), proto)


def test_compare_checks_every_runs_plan_before_the_first_trains(config, tmp_path, monkeypatch):
    """``--methods cvs,finetune`` with a batch only cvs's memory fills in session 2: refused before cvs trains
    (cvs trained all its sessions, then finetune was refused).  Entries that can train are not refused, and
    each distinct session plan (one per seed, one with a fixed split) is built once for all the entries."""
    from cvs_jax.engine import data_checks

    ran, built = [], []

    def fake_run(c, workdir):
        ran.append(c.method)
        raise NonFiniteError("stop here")  # recorded as diverged: no training needed

    def counting_build(c):
        built.append(c.seed if c.split_seed is None else ("split", c.split_seed))
        return build_protocol(c)

    build_protocol = data_checks.build_protocol
    monkeypatch.setattr(runner, "run", fake_run)
    monkeypatch.setattr(data_checks, "build_protocol", counting_build)
    config.train.batch_size = 120
    with pytest.raises(ConfigError, match=r"^session 2 has 90 training images, fewer than train.batch_size=120;"):
        runner.run_comparison(config, str(tmp_path / "refused"), ["cvs", "finetune"], [0])
    assert ran == [] and not (tmp_path / "refused").exists()
    built.clear()
    runner.run_comparison(config, str(tmp_path / "cmp"), ["cvs", "joint", "rainbow"], [0, 1])
    assert ran == ["cvs", "joint", "rainbow"] * 2 and built == [0, 1]
    built.clear()
    runner.run_comparison(config, str(tmp_path / "fixed"), ["cvs", "joint"], [0, 1], split_seed=3)
    assert built == [("split", 3)]


def test_main_and_compare_refuse_each_others_workdir(config, tmp_path):
    """``main --workdir`` of a comparison trained a run among its seed folders (and ``compare`` on a run's
    workdir put its seeds inside the run); each is one error now, and the folder is left as it was."""
    cmp_dir, run_dir = tmp_path / "cmp", tmp_path / "run"
    for folder, name in ((cmp_dir, "comparison.json"), (run_dir, "config.json")):
        folder.mkdir()
        (folder / name).write_text("{}")
    (run_dir / ".lock").touch()  # a run's workdir has its lock file (compare refuses it under the lock)
    with pytest.raises(ConfigError, match=f"^{cmp_dir} is a compare --workdir"):
        runner.run(config, str(cmp_dir))
    with pytest.raises(ConfigError, match=f"^{run_dir} holds a run of python -m cvs_jax.main"):
        runner.run_comparison(config, str(run_dir), ["finetune"], [0])
    assert sorted(os.listdir(cmp_dir)) == ["comparison.json"] and sorted(os.listdir(run_dir)) == [
        ".lock",
        "config.json",
    ]


def test_batch_not_divisible_by_devices(config):
    config.train.batch_size = 15
    with pytest.raises(config_checks.ConfigError, match="train.batch_size=15 .* multiple of the 2 devices"):
        config_checks.check(config, num_devices=2)


def test_refusals_are_user_errors():
    """The one error boundary: what the entry points print as one line (and nothing else)."""
    assert config_checks.ConfigError is ConfigError and issubclass(DatasetNotFoundError, DataError)
    assert not issubclass(UserError, (ValueError, OSError, FloatingPointError))


def test_missing_dataset_files(config, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    config.data.manual_dir = str(empty)
    with pytest.raises(DatasetNotFoundError, match="apt-get install dataset-fashion-mnist"):
        runner.run(config, str(tmp_path / "wd"))
    assert os.path.exists(tmp_path / "wd" / "config.json")
    config.train.lr = 0.01  # the next command may differ in anything: that start wrote no checkpoint
    with pytest.raises(DatasetNotFoundError):  # (not "holds a run with a different config")
        runner.run(config, str(tmp_path / "wd"))


def test_unknown_dataset(config, tmp_path):
    config.data.name = "not_a_dataset"
    with pytest.raises(DatasetNotFoundError, match="not_a_dataset"):
        runner.run(config, str(tmp_path / "wd"))


def test_workdir_with_other_config_refused_then_moved_aside(config, tmp_path):
    wd = str(tmp_path / "wd")
    runner.run(config, wd)
    with open(os.path.join(wd, "results.json")) as f:
        first = json.load(f)
    config.train.lr = 0.01
    with pytest.raises(config_checks.ConfigError, match=r"different config \(train.lr: 0.03 -> 0.01\).*overwrite=True"):
        runner.run(config, wd)
    config.overwrite = True
    runner.run(config, wd)
    moved = [d for d in os.listdir(wd) if d.startswith("previous-")]
    assert len(moved) == 1  # the old run is kept, not deleted
    with open(os.path.join(wd, moved[0], "results.json")) as f:
        assert json.load(f) == first


def test_nan_loss_stops_with_step_and_session(config, tmp_path):
    wd = str(tmp_path / "wd")
    config.train.lr = 1e38
    with pytest.raises(NonFiniteError, match=r"NaN/inf at step \d+ of session 1"):
        runner.run(config, wd)
    assert not os.path.exists(os.path.join(wd, "results.json"))


def test_nan_embeddings_stop_the_run_with_a_clear_message(config, tmp_path, monkeypatch):
    """Finite losses but NaN eval-mode embeddings (seen with bf16 on jax 0.12's CPU compiler)."""
    import jax.numpy as jnp

    def one_nan_row(model, pipeline):
        fn = embedder.make_embed_fn(model, pipeline)
        return lambda params, batch_stats, images: fn(params, batch_stats, images).at[0].set(jnp.nan)

    monkeypatch.setattr(embedder, "shared_embed_fn", one_nan_row)
    wd = str(tmp_path / "wd")
    with pytest.raises(NonFiniteError, match=r"embeddings are NaN/inf \(model.dtype=float32\)"):
        runner.run(config, wd)
    assert not os.path.exists(os.path.join(wd, "results.json"))


def test_cli_prints_one_line_and_exits_2(manual_dir, tmp_path):
    def main(override):
        cmd = [
            sys.executable,
            "-m",
            "cvs_jax.main",
            "--config",
            "configs/fashion_mnist_general.py",
            "--workdir",
            str(tmp_path / "wd"),
            override,
        ]
        return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)

    proc = main("--config.method=nope")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: method='nope' is unknown")
    proc = main("--config.trian.lr=1")
    assert proc.returncode != 0 and "trian" in proc.stderr
