"""The suite's compile log (``cvs_jax.testing.compile_log``, docs/testing.md): a process that imports cvs_jax with
``CVS_JAX_COMPILE_LOG`` set records each XLA compile under the test named in its environment, one record per
compile JAX itself logs, and tells a compile from a persistent-cache hit."""

import os
import subprocess
import sys

from cvs_jax.testing import compile_log

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = """
import cvs_jax, jax, jax.numpy as jnp
def doubled_sine(x):
    return jnp.sin(x) * 2
jax.jit(doubled_sine)(jnp.ones(3)).block_until_ready()
"""


def _run(tmp_path, test: str) -> str:
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        PYTHONPATH=REPO,
        JAX_LOG_COMPILES="1",  # JAX's own line per backend compile: the count to match
        JAX_COMPILATION_CACHE_DIR=str(tmp_path / "cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        CVS_JAX_COMPILE_LOG=str(tmp_path / "log"),
        CVS_JAX_COMPILE_TEST=test,
    )
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_each_compile_is_recorded_under_its_test_and_a_cache_hit_is_told_apart(tmp_path):
    logged = {test: _run(tmp_path, test).count("Finished XLA compilation") for test in ("a.py::first", "a.py::second")}
    everything = compile_log.read(str(tmp_path / "log"))
    lines = [line for line in everything if not line.get("exit")]
    exits = [line for line in everything if line.get("exit")]
    for test, n in logged.items():
        assert n > 0 and sum(line["test"] == test for line in lines) == n
    ours = {line["test"]: line for line in lines if line["fun"] == "jit(doubled_sine)"}
    assert not ours["a.py::first"]["hit"] and ours["a.py::second"]["hit"]  # the second process read the cache
    assert all(line["sub"] for line in lines)  # started under a test's name: a test's subprocess

    summary = compile_log.summarize(str(tmp_path / "log"))
    tests = {row["name"]: row for row in summary["tests"]}
    for test in logged:
        mine = [line for line in lines if line["test"] == test]
        assert tests[test]["compiles"] == tests[test]["in_subprocesses"] == sum(not x["hit"] for x in mine)
        assert tests[test]["hits"] == sum(x["hit"] for x in mine)
    (file_row,) = summary["files"]
    assert file_row["name"] == "a.py" and file_row["compiles"] + file_row["hits"] == len(lines)
    assert "jit(doubled_sine)" in compile_log.table(summary)

    # each process's exit: its whole CPU, at least the compiles it logged, summed per test and per file
    assert sorted(line["test"] for line in exits) == sorted(logged)
    for line in exits:
        assert (
            line["cpu"] >= sum(x["cpu"] for x in lines if x["pid"] == line["pid"] and not x["hit"]) and line["cpu"] > 0
        )
    processes = {row["name"]: row for row in summary["subprocesses"]}
    assert processes["a.py"]["processes"] == 2
    assert processes["a.py"]["cpu_s"] == round(sum(line["cpu"] for line in exits), 2)
    assert processes["a.py::first"]["processes"] == 1


def test_a_torn_last_line_of_a_killed_process_is_skipped(tmp_path):
    folder = tmp_path / "log"
    folder.mkdir()
    whole = '{"test": "t", "fun": "jit(f)", "hit": false, "wall": 1.0, "cpu": 0.5, "sub": true, "pid": 1, "argv": ""}'
    (folder / "1.jsonl").write_text(whole + "\n" + whole[:30])
    assert compile_log.summarize(str(folder))["total"]["compiles"] == 1
