"""One writer per workdir: the lock, its holder in the refusal, and the config rule (no training)."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import ml_collections
import pytest

from cvs_jax.config import recorded
from cvs_jax.errors import ConfigError, UserError, WorkdirBusyError
from cvs_jax.rundir import workdir as workdir_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(lr=0.1, overwrite=False, eval_batch_size=64):
    return ml_collections.ConfigDict({"overwrite": overwrite, "train": {"lr": lr, "eval_batch_size": eval_batch_size}})


@pytest.fixture
def holder(tmp_path):
    """A live process that holds ``tmp_path/wd`` through ``open_run`` (its pid)."""
    wd = str(tmp_path / "wd")
    code = textwrap.dedent(
        f"""
        import sys, time
        import ml_collections
        from cvs_jax.config import recorded
        config = ml_collections.ConfigDict({{"overwrite": False, "train": {{"lr": 0.1, "eval_batch_size": 64}}}})
        with recorded.open_run(config, {wd!r}):
            print("held", flush=True)
            time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield wd, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)


def test_second_writer_refused_naming_the_holder_until_it_is_killed(holder):
    wd, proc = holder
    with pytest.raises(WorkdirBusyError, match=rf"in use by pid {proc.pid} on \S+ .*wait for it.*stop it") as e:
        with recorded.open_run(_config(), wd):
            pass
    assert isinstance(e.value, UserError) and "cvs_jax.search" in str(e.value)
    with pytest.raises(WorkdirBusyError, match=str(proc.pid)):  # the lock alone (compare, search --add)
        with workdir_lib.hold(wd):
            pass
    os.kill(proc.pid, signal.SIGKILL)  # no clean-up in the holder: the kernel drops its lock
    proc.wait(timeout=60)
    with recorded.open_run(_config(), wd):
        with open(os.path.join(wd, workdir_lib.LOCK_NAME)) as f:
            assert json.load(f)["pid"] == os.getpid()  # the file names the new holder


def test_compare_on_a_directory_another_process_holds_is_refused_naming_it(holder, monkeypatch):
    """A run in another process holds DIR (``open_run``): ``compare`` takes DIR's lock before anything
    else, so it starts no run and names that process."""
    from configs import fashion_mnist_general
    from cvs_jax.engine import runner

    def no_run(*args, **kwargs):
        raise AssertionError("a run started although DIR is held")

    monkeypatch.setattr(runner, "run", no_run)
    monkeypatch.setattr(runner, "run_population", no_run)
    wd, proc = holder
    config = fashion_mnist_general.get_config()
    config.data.manual_dir = os.path.dirname(wd)  # a folder that exists: the entries' config checks pass
    with pytest.raises(WorkdirBusyError, match=rf"in use by pid {proc.pid} on \S+ "):
        runner.run_comparison(config, wd, ["finetune", "cvs"], [0, 1])
    assert not os.path.exists(os.path.join(wd, "seed0")), "compare wrote a run while DIR was held"


def test_sequential_runs_in_one_process_and_release_after_an_exception(tmp_path):
    wd = str(tmp_path / "wd")
    with recorded.open_run(_config(), wd):
        pass
    with pytest.raises(RuntimeError, match="inside"):
        with recorded.open_run(_config(), wd):
            raise RuntimeError("inside")
    with recorded.open_run(_config(), wd):
        with pytest.raises(WorkdirBusyError, match=str(os.getpid())):  # a second holder in the same process
            with workdir_lib.hold(wd):
                pass
    with workdir_lib.hold(wd):
        pass
    with open(os.path.join(wd, workdir_lib.LOCK_NAME)) as f:
        assert f.read() == ""  # released: no holder named


def test_failed_start_takes_a_different_config(tmp_path, capsys):
    wd = str(tmp_path / "wd")
    with recorded.open_run(_config(lr=0.1), wd):
        pass  # e.g. refused on a data check: config.json written, no checkpoint
    os.makedirs(os.path.join(wd, "checkpoints", "sessions", "0.orbax-checkpoint-tmp-1"))  # unfinished: not one
    with recorded.open_run(_config(lr=0.01), wd):
        pass
    assert "no checkpoint" in capsys.readouterr().out
    with open(os.path.join(wd, "config.json")) as f:
        assert json.load(f)["train"]["lr"] == 0.01
    assert not [n for n in os.listdir(wd) if n.startswith("previous-")]


def test_workdir_with_a_checkpoint_refuses_a_different_config_and_moves_nothing(tmp_path):
    wd = str(tmp_path / "wd")
    with recorded.open_run(_config(lr=0.1), wd):
        os.makedirs(os.path.join(wd, "checkpoints", "sessions", "0"))
    before = sorted(os.listdir(wd))
    with pytest.raises(ConfigError, match=r"different config \(train.lr: 0.1 -> 0.01\).*overwrite=True"):
        with recorded.open_run(_config(lr=0.01), wd):
            pass
    assert sorted(os.listdir(wd)) == before
    with open(os.path.join(wd, "config.json")) as f:
        assert json.load(f)["train"]["lr"] == 0.1
    with recorded.open_run(_config(lr=0.1, overwrite=True, eval_batch_size=32), wd):  # operational fields only
        pass
    assert sorted(os.listdir(wd)) == before


def test_progress_checkpoint_counts_and_overwrite_moves_the_run_but_not_the_lock(tmp_path):
    wd = str(tmp_path / "wd")
    with recorded.open_run(_config(lr=0.1), wd):
        os.makedirs(os.path.join(wd, "checkpoints", "progress", "1007"))
    with pytest.raises(ConfigError, match="different config"):
        with recorded.open_run(_config(lr=0.01), wd):
            pass
    with recorded.open_run(_config(lr=0.01, overwrite=True), wd):
        pass
    (aside,) = [n for n in os.listdir(wd) if n.startswith("previous-")]
    assert sorted(os.listdir(os.path.join(wd, aside))) == ["checkpoints", "config.json"]  # not the .lock
    assert os.path.isdir(os.path.join(wd, aside, "checkpoints", "progress", "1007"))
    assert sorted(os.listdir(wd)) == sorted([".lock", aside, "config.json"])
    with open(os.path.join(wd, "config.json")) as f:
        assert json.load(f)["train"]["lr"] == 0.01


MULTIHOST_WORKER = textwrap.dedent(
    """
    import json, sys
    import ml_collections
    from cvs_jax import distributed
    from cvs_jax.config import recorded
    from cvs_jax.errors import UserError

    distributed.maybe_initialize(True)  # CVS_JAX_MULTIHOST=1 and JAX_* variables come from the test
    config = ml_collections.ConfigDict({"overwrite": False, "train": {"lr": 0.1, "eval_batch_size": 64}})
    out = []
    for wd in sys.argv[1:]:
        try:
            with recorded.open_run(config, wd):
                out.append("held")
        except UserError as e:
            out.append(f"{type(e).__name__}: {e}")
    print("RESULT " + json.dumps(out), flush=True)
    """
)


def test_multihost_only_process_0_locks_and_every_process_stops_when_it_is_refused(holder, tmp_path):
    busy, proc = holder
    free = str(tmp_path / "free")
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    workers = []
    for pid in range(2):
        env = dict(
            os.environ,
            JAX_PLATFORMS="cpu",
            CVS_JAX_MULTIHOST="1",
            JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
            JAX_NUM_PROCESSES="2",
            JAX_PROCESS_ID=str(pid),
        )
        args = [sys.executable, "-c", MULTIHOST_WORKER, free, busy]
        workers.append(
            subprocess.Popen(args, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        )
    results = []
    try:
        for w in workers:
            stdout, stderr = w.communicate(timeout=300)
            lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
            assert w.returncode == 0 and lines, stderr[-3000:]
            results.append(json.loads(lines[-1][len("RESULT ") :]))
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    (p0_free, p0_busy), (p1_free, p1_busy) = results
    assert p0_free == p1_free == "held"
    assert p0_busy.startswith("WorkdirBusyError: ") and f"in use by pid {proc.pid}" in p0_busy
    assert p1_busy == f"WorkdirBusyError: process 0 could not open {busy} (see its output)"
    assert os.path.exists(os.path.join(free, "config.json"))


def test_a_run_recorded_before_a_field_existed_resumes_under_its_default(tmp_path):
    """A config.json from an earlier version lacks the fields added since: they take their one default
    (cvs_jax/config/base.py), so the run resumes; a changed value of such a field is still refused."""
    from configs import base

    wd = str(tmp_path / "wd")
    config = base.get_config()
    with recorded.open_run(config, wd):
        os.makedirs(os.path.join(wd, "checkpoints", "sessions", "0"))
    path = os.path.join(wd, "config.json")
    with open(path) as f:
        stored = json.load(f)
    del stored["rainbow"]["memory"], stored["cvs"]["batches"]  # as if recorded before they existed
    with open(path, "w") as f:
        json.dump(stored, f)
    with recorded.open_run(config, wd):
        pass
    with open(path, "w") as f:
        json.dump(stored, f)
    config.cvs.batches = "half"
    with pytest.raises(ConfigError, match=r"cvs\.batches: 'mixed' -> 'half'"):
        with recorded.open_run(config, wd):
            pass
