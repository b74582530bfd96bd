"""The entry points' one error boundary, their --help and --verbosity (subprocesses, no training but in one
slow test)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from configs import variants
from configs.variants import VARIANTS
from cvs_jax import cli
from cvs_jax.errors import UserError
from cvs_jax.methods.registry import METHODS
from cvs_jax.rundir import workdir as workdir_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# `python -m cvs_jax.main` with runner.run replaced: it reports the log verbosity, then fails as asked.
FAKE_MAIN = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from absl import logging
    from cvs_jax import cli, errors, main
    from cvs_jax.engine import runner

    failure = sys.argv.pop(1)
    # Ctrl-C as a terminal delivers it: a job a non-interactive shell starts with & (a CI script run in the
    # background) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def run(config, workdir):
        print("verbosity", logging.get_verbosity(), flush=True)
        if failure == "user":
            import logging as std_logging
            std_logging.getLogger("cvs_jax.retrieval.additions").warning("a warning of the package")
            raise errors.DataError("the dataset files are missing; put them in data.manual_dir")
        if failure == "interrupt":  # Ctrl-C: a real SIGINT to this process, a background thread still busy
            threading.Thread(target=time.sleep, args=(600,)).start()  # (as orbax's mid-save threads were)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(60)
        if failure == "reader_gone":  # stdout's reader left (| head -1) before the first line: the run goes on
            for s in range(3):
                print(f"session {s + 1} trained", flush=True)
            with open(os.environ["FAKE_RESULTS"], "w") as f:  # what a run writes after its last printed lines
                f.write("results")
            return {}
        raise RuntimeError("a bug in the trainer")

    runner.run = run
    cli.run(main.main, main.define_flags)
    """
)


def _run(args, **kw):
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300, **kw)


def _main(failure, *flags, timeout=300, **kw):
    args = ["--config", "configs/fashion_mnist_general.py", "--workdir", "/nonexistent/wd", *flags]
    output = {"capture_output": True} if "stdout" not in kw else {"stderr": subprocess.PIPE}
    return subprocess.run(
        [sys.executable, "-c", FAKE_MAIN, failure, *args], cwd=REPO, text=True, timeout=timeout, **output, **kw
    )


def _closed_pipe() -> int:
    """The writing end of a pipe whose reader has already gone (``| head -1`` done before the first line)."""
    read, write = os.pipe()
    os.close(read)
    return write


def test_summarize_help_prints_usage_and_exits_0():
    proc = _run([sys.executable, "-m", "cvs_jax.summarize", "--help"])
    assert proc.returncode == 0, proc.stderr
    assert "python -m cvs_jax.summarize WORKDIR" in proc.stdout
    assert "error" not in proc.stdout + proc.stderr


def test_summarize_missing_results_is_one_error_line():
    proc = _run([sys.executable, "-m", "cvs_jax.summarize", "/nonexistent/run"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: /nonexistent/run/results.json does not exist; run the experiment first "
        "(python -m cvs_jax.main --workdir /nonexistent/run)."
    ]


def test_summarize_on_a_compare_folder_names_its_tables_and_runs(tmp_path):
    """A compare --workdir is not a run: the message points at its tables and its runs (it said "run the
    experiment first (python -m cvs_jax.main --workdir DIR)", which would start a run inside the comparison)."""
    from cvs_jax import summarize

    (tmp_path / "comparison.json").write_text("{}")
    with pytest.raises(UserError) as e:
        summarize.summarize([str(tmp_path)])
    assert str(e.value) == (
        f"{tmp_path} is a compare --workdir: its tables are {tmp_path}/comparison.md; summarize takes the runs "
        f"inside it, e.g. {tmp_path}/seed0/*."
    )


def test_main_help_lists_methods_and_config_variants():
    proc = _run([sys.executable, "-m", "cvs_jax.main", "--help"])
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # absl wraps the help text
    for name in list(METHODS) + list(VARIANTS):
        assert name in text
    assert "cpu, cpu_pretrained (image_folder_general.py)" in text  # the variants the README gives CPU users
    assert "--workdir" in text and ":<variant>" in text


def test_user_error_is_one_line_exit_2_and_logging_is_quiet():
    proc = _main("user")
    assert proc.returncode == 2
    assert "verbosity -1" in proc.stdout  # WARNING: orbax's per-file INFO lines stay out
    # once: absl's handler, not also the basicConfig one absl's logging before app.run left (cli.run)
    assert proc.stderr.count("a warning of the package") == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == ("error: the dataset files are missing; put them in data.manual_dir")
    assert "Traceback" not in proc.stderr


def test_other_exceptions_keep_their_traceback_and_verbosity_is_respected():
    proc = _main("bug", "--verbosity=1")
    assert proc.returncode == 1
    assert "verbosity 1" in proc.stdout  # --verbosity is not overridden
    assert "Traceback" in proc.stderr and "RuntimeError: a bug in the trainer" in proc.stderr
    assert "error: a bug" not in proc.stderr


def test_ctrl_c_is_one_line_and_status_130():
    """SIGINT mid-run (Ctrl-C) ends with one line saying how to resume and the shell's status 130; it was a
    KeyboardInterrupt traceback through absl and the training loop.  The process ends at once although a
    background thread is still busy (Ctrl-C in an orbax save once left the process waiting 5 min)."""
    proc = _main("interrupt", timeout=60)
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [cli.INTERRUPTED]
    assert "rerun the same command to resume" in cli.INTERRUPTED


def test_a_closed_stdout_stops_the_printing_not_the_run(tmp_path):
    """``main ... | head -1``: the run trains on and writes its results, prints nothing more and ends quietly
    with status 141 (SIGPIPE's); a BrokenPipeError traceback from the next print stopped the run there."""
    results, stdout = tmp_path / "results.json", _closed_pipe()
    try:
        proc = _main("reader_gone", stdout=stdout, env={**os.environ, "FAKE_RESULTS": str(results)}, timeout=120)
    finally:
        os.close(stdout)
    assert (proc.returncode, proc.stderr) == (cli.READER_GONE_STATUS, "")
    assert results.read_text() == "results"


def test_a_printing_command_piped_to_head_ends_quietly_and_finishes(tmp_path):
    """``reproduce --plan --output_json F | head -1``: no traceback, status 141, and F is still written (the
    print came first and raised BrokenPipeError before it)."""
    out, stdout = tmp_path / "plan.json", _closed_pipe()
    try:
        args = [sys.executable, "-m", "cvs_jax.reproduce", "--plan", "--output_json", str(out)]
        proc = subprocess.run(args, cwd=REPO, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(stdout)
    assert (proc.returncode, proc.stderr) == (cli.READER_GONE_STATUS, "")
    assert json.loads(out.read_text())["gpu_hours"] > 0


@pytest.mark.slow
def test_a_real_run_piped_to_a_reader_that_left_trains_to_its_end(fashion_idx, tmp_path):
    """``main ... | head`` with the real trainer: every session trains and results.json is written although
    stdout's reader left before the first line; a rerun trains nothing and leaves results.json as it was."""
    wd = tmp_path / "wd"
    tiny = {"data.num_sessions": 2, "data.first_classes": 4, "data.classes_per_session": 2}
    tiny |= {"data.samples_per_new_class": 40, "model.width": 4, "model.embed_dim": 8, "train.epochs": 1}
    tiny |= {"train.batch_size": 16, "memory.budget": 30, "method": "cvs"}
    args = [sys.executable, "-m", "cvs_jax.main", "--config", "configs/fashion_mnist_general.py", "--workdir", str(wd)]
    args += [f"--config.data.manual_dir={fashion_idx(60, 10)}", f"--config.data.data_dir={tmp_path / 'tfds'}"]
    args += [f"--config.{k}={v}" for k, v in tiny.items()]
    stdout = _closed_pipe()
    try:
        proc = subprocess.run(args, cwd=REPO, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=600)
    finally:
        os.close(stdout)
    assert (proc.returncode, proc.stderr) == (cli.READER_GONE_STATUS, "")
    first = (wd / "results.json").read_text()
    assert len(json.loads(first)["per_session"]) == 2
    again = _run(args)
    assert again.returncode == 0 and "session 1/2" not in again.stdout, again.stdout[-2000:]
    assert (wd / "results.json").read_text() == first


def test_unknown_config_variant_is_one_error_line():
    proc = _run(
        [
            sys.executable,
            "-m",
            "cvs_jax.main",
            "--config",
            "configs/fashion_mnist_general.py:nope",
            "--workdir",
            "/nonexistent/wd",
        ]
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: config variant 'nope' is unknown; choose from {variants.listed()}."
    ]
    assert "cpu, cpu_pretrained" in proc.stderr


@pytest.mark.parametrize("command", ["cvs_jax.main", "cvs_jax.compare"])
def test_a_config_path_that_is_not_there_is_one_error_line(tmp_path, command):
    """A relative ``--config`` given from another folder: ml_collections keeps the failed load for the
    config's first use, which was an OSError traceback (exit 1) once the command ran; nothing is made."""
    wd = tmp_path / "wd"
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-m", command, "--config", "configs/fashion_mnist_general.py:smoke", "--workdir", str(wd)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"error: --config configs/fashion_mnist_general.py:smoke: no such file (looked from {tmp_path}); give the "
        "path of a configs/<name>.py file from this folder, or an absolute one."
    ]
    assert not wd.exists()


def test_workdir_that_is_a_file_is_one_error_line_and_the_file_is_kept(tmp_path):
    """A mistyped --workdir naming a file: one line and exit 2 (it was a FileExistsError traceback in
    ``compare``), and the file is left as it was."""
    not_a_folder = tmp_path / "notes.txt"
    not_a_folder.write_text("mine")
    message = f"--workdir {not_a_folder} is a file (or lies under one), not a folder; pass a new or existing folder."
    args = ["--config", "configs/fashion_mnist_general.py", "--workdir", str(not_a_folder), "--methods", "finetune"]
    args.append(f"--config.data.manual_dir={tmp_path}")  # a folder that exists: the entries' config checks pass
    proc = _run([sys.executable, "-m", "cvs_jax.compare", *args])
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: {message}"]
    for workdir in (not_a_folder, not_a_folder / "run"):  # main's runs take the same lock (open_run)
        with pytest.raises(UserError, match="is a file"):
            with workdir_lib.hold(str(workdir)):
                pass
    assert not_a_folder.read_text() == "mine"
