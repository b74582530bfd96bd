"""A damaged file of a run (cut short, emptied, bytes written over it, another kind of JSON, a field edited
by hand, a record deleted) stops every command that reads it with one ``error:`` line naming the file and
what to do (``cvs_jax/rundir/run_files.py``), changes nothing, and is never a traceback or a silent wrong
answer.  Hand-made run folders: nothing here trains."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from absl import flags
from orbax.checkpoint._src import asyncio_utils

from cvs_jax import info, summarize
from cvs_jax.config import image_folder_general, recorded
from cvs_jax.config.stored import stored_config
from cvs_jax.engine import comparison
from cvs_jax.errors import ConfigError, UnreadableCheckpointError, UserError
from cvs_jax.retrieval import added_session, additions, run_info, run_reader
from cvs_jax.rundir import checkpoint, paths, run_files
from cvs_jax.rundir import workdir as workdir_lib
from cvs_jax.rundir.checkpoint import Checkpoints
from cvs_jax.rundir.run_log import RunLog
from cvs_jax.testing import added_rows

PROTOCOL = {"dataset": "image_folder", "setup": "user", "image_shape": [16, 16, 3], "class_names": ["ant", "bee"]}
PROTOCOL["sessions"] = [{"train": 40, "val": 4, "num_outputs": 2, "new_classes": [0, 1]}]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = {"method": "cvs", "dataset": "image_folder", "setup": "user", "per_session": [], "average_recall": {}}


def _run(tmp_path) -> str:
    """The JSON files of a photo run (no checkpoints: every damage below is found before them)."""
    wd = tmp_path / "run"
    wd.mkdir()
    (wd / paths.CONFIG).write_text(json.dumps(image_folder_general.get_config("cpu").to_dict()))
    (wd / paths.PROTOCOL).write_text(json.dumps(PROTOCOL))
    (wd / paths.RESULTS).write_text(json.dumps(RESULTS))
    return str(wd)


def _files(wd) -> dict[str, bytes]:
    out = {}
    for root, _, names in os.walk(wd):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                out[os.path.relpath(os.path.join(root, name), wd)] = f.read()
    return out


DAMAGES = {
    "cut short": (lambda b: b[: len(b) // 2], "is cut short"),
    "emptied": (lambda b: b"", "is empty"),
    "bytes written over it": (lambda b: b"\xcd\x00\xff" * 50, "is not text"),
    "another JSON": (lambda b: b"[1, 2]", "holds a JSON list where a JSON object is expected"),
    "edited into bad JSON": (lambda b: b'{"method": "cvs",, }', "is not valid JSON (line 1, column 18"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
@pytest.mark.parametrize("name", [paths.CONFIG, paths.PROTOCOL])  # results.json: read after the checkpoints
def test_info_stops_with_one_line_naming_the_file_and_its_fix(tmp_path, capsys, name, damage):
    """Was a JSONDecodeError / UnicodeDecodeError traceback (exit 1) from every reading command."""
    wd = _run(tmp_path)
    path = os.path.join(wd, name)
    cut, problem = DAMAGES[damage]
    with open(path, "rb") as f:
        data = cut(f.read())
    with open(path, "wb") as f:
        f.write(data)
    before = _files(wd)
    fv = flags.FlagValues()
    info.define_flags(fv)
    assert info.main(fv(["info", "--workdir", wd]), fv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {path} {problem}"), err
    assert run_files.fix_for(path) in err[0]
    assert _files(wd) == before  # refused: nothing changed


def test_each_file_kind_names_its_own_fix(tmp_path):
    wd = _run(tmp_path)
    for name, fix in [
        (paths.CONFIG, "python -m cvs_jax.export"),  # an export keeps the run's config.json
        (paths.RESULTS, "written anew from the session checkpoints"),  # the last command rewrites it
        (paths.PROTOCOL, "restore it from a copy of the run"),
    ]:
        path = os.path.join(wd, name)
        with open(path, "w") as f:
            f.write("")
        with pytest.raises(run_files.DamagedFileError) as e:
            run_files.read_json(path)
        assert str(e.value).startswith(f"{path} is empty; ") and fix in str(e.value)


def test_a_reader_of_the_results_stops_on_a_damaged_file_and_counts_a_missing_one_as_none(tmp_path):
    """``update`` and the server count the completed sessions from results.json: a damaged one was a
    traceback; a missing one is 0 (rerunning the last command writes it again from the checkpoints)."""
    wd = _run(tmp_path)
    path = paths.results_file(wd)
    with open(path, "w") as f:
        json.dump({**RESULTS, "per_session": [{"session": 1}]}, f)
    assert added_session.completed_sessions(wd) == 1
    with open(path, "w") as f:
        f.write('{"per_session": [{"sess')
    with pytest.raises(UserError, match=r"results\.json is cut short .* rerun the run's last"):
        added_session.completed_sessions(wd)
    with open(path, "w") as f:
        json.dump({"method": "cvs"}, f)  # no per_session: was counted as 0 sessions, silently
    with pytest.raises(UserError, match=r"results\.json lacks the field\(s\) per_session"):
        added_session.completed_sessions(wd)
    os.remove(path)
    assert added_session.completed_sessions(wd) == 0


def test_summarize_names_a_damaged_results_file(tmp_path):
    wd = _run(tmp_path)
    with open(paths.results_file(wd), "wb") as f:
        f.write(b"\xff" * 10)
    with pytest.raises(UserError, match=r"results\.json is not text"):
        summarize.summarize([wd])


@pytest.mark.parametrize(
    "edit, named",
    [
        (lambda c: c["model"].update(embed_dim="8"), 'model.embed_dim = "8" (it takes an integer)'),
        (lambda c: c.update(augment=5), "augment = 5 (it takes a section of fields)"),
        (lambda c: c["train"].update(eval_batch_size=64.5), "train.eval_batch_size = 64.5 (it takes an integer)"),
        (lambda c: c.update(method=7), "method = 7 (it takes a string)"),
        (lambda c: c["data"].update(mean="x"), 'data.mean = "x" (it takes a list)'),
        (lambda c: c["train"].update(nesterov=1), "train.nesterov = 1 (it takes true or false)"),
    ],
)
def test_a_config_value_of_the_wrong_kind_is_refused_by_name(tmp_path, edit, named):
    """Was a ValueError ("width 8, not 8"), AttributeError or TypeError traceback in search, or a run read
    with ``method = 7``."""
    wd = _run(tmp_path)
    with open(paths.config_file(wd)) as f:
        config = json.load(f)
    edit(config)
    with open(paths.config_file(wd), "w") as f:
        json.dump(config, f)
    with pytest.raises(ConfigError, match="edited by hand") as e:
        stored_config(wd)
    assert named in str(e.value)


def test_values_of_the_kind_a_field_takes_are_read_as_recorded(tmp_path):
    wd = _run(tmp_path)
    with open(paths.config_file(wd)) as f:
        config = json.load(f)
    config["train"]["lr"] = 1  # an integer where a float is kept: JSON writes 1.0 as 1 elsewhere
    config["data"]["max_per_class"] = 7  # a field that may be null
    with open(paths.config_file(wd), "w") as f:
        json.dump(config, f)
    c = stored_config(wd)
    assert (c.train.lr, c.data.max_per_class) == (1, 7)


def test_a_learnt_from_added_session_without_its_rows_record_is_refused(tmp_path):
    """rows.json says which added rows a --from_added session learnt.  A deleted one made every row count as
    not learnt (the next session learnt them again); a damaged one was a traceback."""
    wd = _run(tmp_path)
    folder = added_session.folder_of(wd, 2)
    os.makedirs(folder)
    record = os.path.join(folder, added_session.ROWS_FILE)
    with open(record, "w") as f:
        json.dump({"first": 0, "end": 4, "rows": [[0, 2], [3, 4]]}, f)
    assert added_session.used_rows(wd, [folder]) == {0, 1, 3}
    os.remove(record)
    with pytest.raises(UserError, match=rf"{record} is missing; .*learnt"):
        added_session.used_rows(wd, [folder])
    with open(record, "w") as f:
        json.dump({"first": 0, "end": 4, "rows": [["a", 2]]}, f)
    with pytest.raises(UserError, match="holds rows that are not ranges"):
        added_session.used_rows(wd, [folder])


def _metrics(wd, lines: list[bytes]) -> str:
    path = paths.metrics_file(wd)
    with open(path, "wb") as f:
        f.writelines(lines)
    return path


def test_a_metrics_line_cut_short_by_a_crash_is_skipped_by_its_readers(tmp_path):
    """metrics.jsonl is a log: info's term summary skips a line it cannot decode (was a traceback)."""
    wd = _run(tmp_path)
    good = [json.dumps({"session": 1, "epoch": e, "step": e, "L_c": float(e)}).encode() + b"\n" for e in (1, 2)]
    path = _metrics(wd, [good[0], b"\xcd\xff garbage\n", good[1], b'{"session": 1, "epoch": 3, "st'])
    assert [r["epoch"] for r in run_files.read_metrics(path)] == [1, 2]
    assert run_info.term_summary(path)[1]["L_c"] == {"mean": 1.5, "epochs": 2, "zero_epochs": 0}


def test_a_resumed_log_drops_the_line_a_crash_cut_short(tmp_path):
    """``RunLog.truncate`` (every resume) read each line with json.loads: a last line cut short by a kill
    while appending stopped the resume with a traceback."""
    wd = _run(tmp_path)
    records = [{"session": 0, "epoch": 1, "step": s, "loss": 1.0} for s in (1, 2, 3)]
    path = _metrics(wd, [json.dumps(r).encode() + b"\n" for r in records] + [b'{"session": 0, "ep'])
    log = RunLog(wd)
    try:
        log.truncate(session=0, step=2)
    finally:
        log.close()
    with open(path) as f:
        assert [json.loads(line) for line in f] == records[:2]


def _damage_biggest_file(folder: str) -> None:
    files = [os.path.join(r, n) for r, _, names in os.walk(folder) for n in names]
    biggest = max(files, key=os.path.getsize)
    os.truncate(biggest, os.path.getsize(biggest) // 2)


def test_an_add_to_damaged_added_rows_stops_and_keeps_them(tmp_path):
    """In the layout before segments each additions step held every added row.  ``search --add`` (and the
    server's /add) fell back to the previous step when the newest was damaged, moved the newest aside and
    appended to the previous one: the rows added last were gone from the run, and the add said it succeeded.
    Now it stops, moving nothing (a damaged segment: ``tests/retrieval/test_additions_store.py``)."""
    wd = _run(tmp_path)
    added_rows.legacy_append(wd, 4, [2, 2], [0, 0])
    directory = paths.additions_dir(wd)
    _damage_biggest_file(os.path.join(directory, "1"))
    before = _files(wd)
    writer = additions.writer(wd)
    try:
        with pytest.raises(UnreadableCheckpointError, match=r"additions/1 cannot be read .*Nothing was added") as e:
            additions.read_for_append(writer, 4)
    finally:
        writer.close()
    assert f"{os.path.join(directory, '0')} holds the rows added before them" in str(e.value)
    assert _files(wd) == before  # nothing moved aside, nothing written


def test_a_run_whose_newest_session_folder_was_deleted_is_refused_not_read_as_an_older_run(tmp_path):
    """With ``checkpoints/sessions/<newest>`` deleted, search, info, export and search --add read the run as it
    was a session earlier (its model, its smaller gallery) while results.json and info reported the newest:
    answers of a run the user no longer has, without a word."""
    wd = _run(tmp_path)
    with open(paths.results_file(wd), "w") as f:
        json.dump({**RESULTS, "per_session": [{"session": 1}, {"session": 2}]}, f)
    with pytest.raises(UserError, match="holds no session checkpoint, while .* records 2 completed"):
        run_reader.Run(wd)  # was "no completed session yet; wait for the first session to finish"
    sessions = Checkpoints(paths.sessions_dir(wd), max_to_keep=None)
    try:
        sessions.save(0, {"variables": {"w": np.zeros(2, np.float32)}}, {"per_session": []})
    finally:
        sessions.close()
    with pytest.raises(UserError, match=rf"{paths.session_dir(wd, 1)} is missing: .* records 2 completed session"):
        run_reader.Run(wd)
    run_reader.check_sessions_kept(wd, [0, 1])  # the folders results.json counts are there
    with workdir_lib.hold(wd):  # a training run retrains a session it set aside: read the older one meanwhile
        run_reader.check_sessions_kept(wd, [0])


@pytest.mark.parametrize("deleted", [(paths.CONFIG,), (paths.CONFIG, paths.PROTOCOL)])
def test_main_on_a_run_whose_config_was_deleted_is_refused_not_resumed_with_its_own(tmp_path, capsys, deleted):
    """``main`` recorded its own config and resumed the checkpoints with it, whatever config trained them; with
    protocol.json deleted too it still did, as that was how a compare entry's copied session 1 looked (no
    config.json, no protocol.json).  ``compare`` now marks the copy (``paths.SHARED_SESSION``), which takes the
    entry's config."""
    wd = _run(tmp_path)
    os.makedirs(paths.session_dir(wd, 0))  # a checkpoint's folder
    for name in deleted:
        os.remove(os.path.join(wd, name))
    config = image_folder_general.get_config("cpu")
    before = _files(wd)
    with pytest.raises(ConfigError, match="no config.json .*Restore config.json from a copy of the run"):
        recorded.prepare(config, wd)
    assert _files(wd) == before
    config.overwrite = True
    recorded.prepare(config, wd)  # moved into previous-<time>/, as a run of another config is
    assert [n for n in os.listdir(wd) if n.startswith("previous-")] and os.path.exists(paths.config_file(wd))
    assert "(no config.json)" in capsys.readouterr().out


def test_compare_s_copy_of_session_one_takes_the_entry_s_config(tmp_path, capsys):
    """The one state of a workdir with checkpoints and no config.json that is not a deletion: ``compare`` copied
    session 1 from an earlier entry; the entry's run records its config there and resumes at session 2."""
    source = _run(tmp_path)
    os.makedirs(paths.session_dir(source, 0))
    with open(paths.metrics_file(source), "w") as f:
        f.write(json.dumps({"session": 1, "epoch": 1}) + "\n" + json.dumps({"session": 2, "epoch": 1}) + "\n")
    entry = str(tmp_path / "entry")
    comparison.share_first_session(source, entry)
    assert workdir_lib.has_checkpoint(entry) and not os.path.exists(paths.config_file(entry))
    config = image_folder_general.get_config("cpu")
    recorded.prepare(config, entry)
    with open(paths.config_file(entry)) as f:
        assert json.load(f) == json.loads(json.dumps(config.to_dict()))
    assert capsys.readouterr().out == "" and not os.path.exists(paths.shared_session_file(entry))
    os.remove(paths.config_file(entry))  # its config.json deleted later: refused like any other run's
    with pytest.raises(ConfigError, match="no config.json"):
        recorded.prepare(config, entry)


_LATE_READS = """
import asyncio, gc, sys, threading, time
import tensorstore as ts
from orbax.checkpoint._src import asyncio_utils
from cvs_jax.rundir import checkpoint  # what every command that reads a checkpoint imports

slow, damaged_too = ts.Promise.new(), ts.Promise.new()

async def damaged():
    await asyncio.sleep(0.05)
    raise ValueError("DATA_LOSS: the first damaged array")

async def read(future):
    return await future

async def restore():  # as orbax reads a checkpoint's arrays: all at once, tensorstore reads in flight
    await asyncio.gather(damaged(), read(slow[1]), read(damaged_too[1]))

threading.Timer(0.3, lambda: slow[0].set_result(1)).start()
threading.Timer(0.4, lambda: damaged_too[0].set_exception(ValueError("DATA_LOSS: a second damaged array"))).start()
try:
    asyncio_utils.run_sync(restore())
except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
time.sleep(0.8)  # the reads still in flight complete meanwhile
gc.collect()
"""


def test_a_failed_restore_prints_its_error_and_nothing_after_it():
    """orbax reads a checkpoint's arrays all at once on an event loop of its own and closed that loop at the
    first failed read: the reads still in flight then completed into the closed loop and Python printed a
    "RuntimeError: Event loop is closed" traceback for each after the command's ``error:`` line (intermittent on
    a real damaged checkpoint; here the reads in flight are tensorstore futures completed on time)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", _LATE_READS], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "", done
    assert done.stderr.splitlines() == ["error: DATA_LOSS: the first damaged array"], done.stderr
    # the runner orbax calls is ours (an orbax that renamed it would bring the tracebacks back)
    assert asyncio_utils._run_sync_via_new_loop is checkpoint._run_on_a_new_loop_draining_a_failure
