"""The added-rows store (``retrieval/additions.py``): segments, merges, the chain, old layouts, kills, gaps.

Rows are synthetic (``cvs_jax.testing.added_rows``: row ``r`` recognisable from its values), written to a bare
folder (the store needs no run), so each test is seconds; the kill tests start one small process each.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from cvs_jax.errors import UnreadableCheckpointError
from cvs_jax.retrieval import additions
from cvs_jax.rundir import paths, run_files
from cvs_jax.testing import added_rows, file_tree
from cvs_jax.testing.methods_runs import REPO

DIM = 4
SIZES = [3, 1, 2, 5, 1, 1, 1, 4, 2, 8, 1, 1, 16, 3, 2, 2, 7]
SESSIONS = [0, 0, 0, 1, 1, 0, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]


@pytest.fixture
def wd(tmp_path) -> str:
    os.makedirs(tmp_path / "run" / "checkpoints")
    return str(tmp_path / "run")


def _assert_rows(added: additions.Added, sizes: list[int], sessions: list[int]) -> None:
    got, want = added_rows.columns(added), added_rows.expected(sizes, sessions, DIM)
    assert len(added) == sum(sizes)
    for key, value in want.items():
        np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(value), err_msg=key)


def _steps(wd: str) -> list[int]:
    return sorted(int(n) for n in os.listdir(paths.additions_dir(wd)) if n.isdigit())


_files = file_tree.checksums  # every file by content: what a refused add must leave


def _chain(wd: str) -> list[list[int]]:
    with open(paths.additions_chain(wd)) as f:
        return json.load(f)["segments"]


def test_segments_hold_the_rows_the_layout_before_them_held(wd, tmp_path):
    """The same adds give the same rows, in the same order (so the same ids), as the store where each step held
    every row; but an add writes only its own rows, and the folder holds only the chain's segments."""
    written: list[tuple[int, int]] = []  # (rows after the add, rows in its newest segment)

    def say(rows):
        chain = _chain(wd)
        written.append((rows, chain[-1][2]))

    added = added_rows.append_batches(wd, DIM, SIZES, SESSIONS, say=say)
    _assert_rows(added, SIZES, SESSIONS)  # what the writer holds
    _assert_rows(additions.read(wd, DIM), SIZES, SESSIONS)  # what a reader reads back
    old = str(tmp_path / "old")
    os.makedirs(os.path.join(old, "checkpoints"))
    added_rows.legacy_append(old, DIM, SIZES, SESSIONS)
    np.testing.assert_array_equal(np.asarray(added_rows.legacy_read(old, DIM).embeddings), added.gallery.embeddings)
    # an add that merged nothing wrote a segment of its own rows only (the old layout wrote every row again)
    n_before = [0] + [rows for rows, _ in written[:-1]]
    own = [newest == rows - before for (rows, newest), before in zip(written, n_before)]
    merged = [newest > rows - before for (rows, newest), before in zip(written, n_before)]
    assert all(a or b for a, b in zip(own, merged)) and sum(own) >= len(SIZES) // 2
    chain = _chain(wd)
    assert [s for s, _, _ in chain] == _steps(wd)  # no leftover step
    assert len(chain) <= math.log2(sum(SIZES)) + additions.FANOUT


def test_merges_keep_a_chain_short_and_rewrite_each_row_few_times():
    """``merge_from`` on 5,000 adds of 1 to 64 rows (the chain alone, no files): at most ``log2(rows) + FANOUT``
    segments to read, and no row written more than ``log2(rows) + FANOUT`` times."""
    rng = np.random.default_rng(0)
    chain: tuple[additions.Segment, ...] = ()
    writes = np.zeros(0, np.int64)  # per row, how many times a segment holding it was written
    longest = 0
    for step in range(5000):
        n = int(rng.integers(1, 65))
        first = chain[-1].end if chain else 0
        chain += (additions.Segment(2 * step, first, n),)
        writes = np.concatenate([writes, np.ones(n, np.int64)])
        j = additions.merge_from(chain)
        if j is not None:
            a = chain[j].first
            writes[a:] += 1
            chain = chain[:j] + (additions.Segment(2 * step + 1, a, len(writes) - a),)
        longest = max(longest, len(chain))
        assert [s.first for s in chain] == [0] + [s.end for s in chain[:-1]]
    bound = math.log2(len(writes)) + additions.FANOUT
    assert longest <= bound and writes.max() <= bound, (longest, writes.max(), bound)


@pytest.mark.parametrize("one_part", [False, True], ids=["per-session parts", "one part"])
def test_a_store_of_the_layout_before_segments_is_read_and_appended(wd, one_part):
    """A run written before segments (each step every row; the oldest layout one part) reads as it did, and
    the first append makes its newest step the chain's base: its rows keep their numbers, the steps before
    it go.  The code before segments, reading that store now, refuses it (no ``rows`` item in its newest
    step) rather than read one segment as every row."""
    sizes, sessions = [4, 3], [0, 0] if one_part else [0, 1]
    added_rows.legacy_append(wd, DIM, sizes, sessions, one_part=one_part)
    assert _steps(wd) == [0, 1] and not os.path.exists(paths.additions_chain(wd))
    _assert_rows(additions.read(wd, DIM), sizes, sessions)
    assert additions.newest_step(wd) == 1
    added_rows.append_batches(wd, DIM, [2], [1])
    assert _chain(wd) == [[1, 0, 7], [2, 7, 2]] and _steps(wd) == [1, 2]  # step 0, a copy of fewer rows, gone
    _assert_rows(additions.read(wd, DIM), sizes + [2], sessions + [1])
    more, more_sessions = [5, 1], [2, 2]
    added = added_rows.append_batches(wd, DIM, more, more_sessions)  # the base merged with the newer ones
    _assert_rows(added, sizes + [2] + more, sessions + [1] + more_sessions)
    _assert_rows(additions.read(wd, DIM), sizes + [2] + more, sessions + [1] + more_sessions)
    assert [s for s, _, _ in _chain(wd)] == _steps(wd)
    with pytest.raises(UnreadableCheckpointError, match="rows/_METADATA"):
        added_rows.legacy_read(wd, DIM)


def _kill(wd: str, fault: str, sizes: list[int]) -> int:
    """Runs the appender with ``fault`` armed; the rows it acknowledged before it was killed."""
    env = dict(os.environ, CVS_JAX_FAULT=fault, PYTHONPATH=REPO)
    cmd = [sys.executable, "-m", "cvs_jax.testing.added_rows", wd, str(DIM), ",".join(map(str, sizes))]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == -9, done.stderr[-2000:]
    acked = [int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("acked ")]
    return acked[-1] if acked else 0


@pytest.mark.parametrize(
    "fault",
    ["additions_segment:3", "additions_merge:1", "additions_merged:1", "additions_merged:2"],
    ids=[
        "segment written, not in the chain",
        "while a merge writes",
        "merge named, covered not removed",
        "second merge",
    ],
)
def test_a_kill_in_an_add_or_a_merge_loses_no_acknowledged_row_and_shows_none_twice(wd, fault):
    sizes = [16] * 12
    acked = _kill(wd, fault, sizes)
    assert acked >= 16 * 2
    after = additions.read(wd, DIM)  # a reader beside the dead writer's leftovers
    assert len(after) in (acked, acked + 16)  # the add in flight is there whole or not at all
    _assert_rows(after, sizes[: len(after) // 16], [0] * (len(after) // 16))
    rest = sizes[len(after) // 16 :]
    added = added_rows.append_batches(wd, DIM, rest, [0] * len(rest))  # the next writer removes the leftovers
    _assert_rows(added, sizes, [0] * len(sizes))
    _assert_rows(additions.read(wd, DIM), sizes, [0] * len(sizes))
    assert [s for s, _, _ in _chain(wd)] == _steps(wd)


def test_a_segment_gone_from_the_chain_is_refused_naming_it(wd):
    """A segment folder deleted (the newest too: the chain counts the rows) is refused with the folder and the
    fix, never read as fewer rows; nothing is written."""
    added_rows.append_batches(wd, DIM, [8, 2, 2, 1], [0] * 4)
    chain = _chain(wd)
    assert len(chain) >= 3
    for step, first, count in (chain[1], chain[-1]):
        folder = os.path.join(paths.additions_dir(wd), str(step))
        os.rename(folder, folder + ".away")
        before = _files(wd)
        with pytest.raises(UnreadableCheckpointError) as e:
            additions.read(wd, DIM)
        rows = f"row {first}" if count == 1 else f"rows {first} to {first + count - 1}"
        assert f"the added {rows} cannot be read: {folder} is gone" in str(e.value)
        assert "restore that folder from a backup" in str(e.value)
        store = additions.writer(wd)
        try:
            with pytest.raises(UnreadableCheckpointError, match="Nothing was added"):
                additions.read_for_append(store, DIM)
        finally:
            store.close()
        assert _files(wd) == before
        os.rename(folder + ".away", folder)
    _assert_rows(additions.read(wd, DIM), [8, 2, 2, 1], [0] * 4)


def test_a_damaged_newest_segment_stops_the_add_and_says_how_to_go_on(wd):
    added_rows.append_batches(wd, DIM, [8, 2, 2], [0] * 3)
    step, first, count = _chain(wd)[-1]
    folder = os.path.join(paths.additions_dir(wd), str(step))
    files = [os.path.join(r, n) for r, _, names in os.walk(folder) for n in names]
    biggest = max(files, key=os.path.getsize)
    os.truncate(biggest, os.path.getsize(biggest) // 2)
    before = _files(wd)
    store = additions.writer(wd)
    try:
        with pytest.raises(UnreadableCheckpointError) as e:
            additions.read_for_append(store, DIM)
    finally:
        store.close()
    assert f"checkpoint {folder} cannot be read" in str(e.value) and "Nothing was added" in str(e.value)
    assert f"the added rows {first} to {first + count - 1} (added last), move that folder out of " in str(e.value)
    assert _files(wd) == before
    os.rename(folder, folder + ".damaged")  # the way on it names: the rows before the damaged segment
    os.remove(paths.additions_chain(wd))
    _assert_rows(additions.read(wd, DIM), [8, 2], [0] * 2)
    added_rows.append_batches(wd, DIM, [2, 3], [0, 0])  # appended after them, the damaged one removed
    got = additions.read(wd, DIM)
    assert len(got) == 15 and got.sources[:10] == [f"/photos/{i}.png" for i in range(10)]


def test_without_its_chain_file_a_store_is_rebuilt_from_its_segments_and_a_damaged_one_is_refused(wd):
    added_rows.append_batches(wd, DIM, SIZES[:9], SESSIONS[:9])
    chain_file = paths.additions_chain(wd)
    with open(chain_file) as f:
        text = f.read()
    with open(chain_file, "w") as f:
        f.write(text[: len(text) // 2])
    with pytest.raises(run_files.DamagedFileError, match="additions.json is cut short .*delete it"):
        additions.read(wd, DIM)
    os.remove(chain_file)
    _assert_rows(additions.read(wd, DIM), SIZES[:9], SESSIONS[:9])
    added_rows.append_batches(wd, DIM, SIZES[9:], SESSIONS[9:])
    _assert_rows(additions.read(wd, DIM), SIZES, SESSIONS)


def test_a_reader_that_loses_a_race_with_a_merge_reads_the_new_chain(wd, monkeypatch):
    """A merge removes the segments it covers once the chain names the merged one: a reader that read the
    chain before then finds its segment gone, and reads the chain again (not a gap)."""
    added_rows.append_batches(wd, DIM, [8, 2, 2], [0] * 3)
    real, raced = additions._restore, []

    def restore(checkpoints, step):
        if not raced:  # another writer's add (and its merge) lands between the chain read and this read
            raced.append(step)
            added_rows.append_batches(wd, DIM, [2, 2], [0, 0])
        return real(checkpoints, step)

    monkeypatch.setattr(additions, "_restore", restore)
    got = additions.read(wd, DIM)
    assert raced and raced[0] not in _steps(wd)  # the segment it was about to read was merged away
    _assert_rows(got, [8, 2, 2, 2, 2], [0] * 5)


def test_a_read_given_the_rows_it_holds_reads_only_the_newer_segments(wd, monkeypatch):
    held = added_rows.append_batches(wd, DIM, [32, 2], [0, 0])
    added_rows.append_batches(wd, DIM, [2], [1])
    real, read = additions._restore, []

    def restore(checkpoints, step):
        read.append(step)
        return real(checkpoints, step)

    monkeypatch.setattr(additions, "_restore", restore)
    got = additions.read(wd, DIM, held=held)
    _assert_rows(got, [32, 2, 2], [0, 0, 1])
    assert read == [_chain(wd)[-1][0]]  # the newest segment alone, not the 32 rows held
