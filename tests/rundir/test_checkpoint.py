"""Checkpoint restore semantics: damaged files fall back to the previous checkpoint (moved aside,
never deleted); a structure mismatch, a permission or an I/O error stops with CheckpointError and
moves nothing; retention keeps the newest N (or all)."""

import errno
import glob
import json
import os
import shutil

import jax
import numpy as np
import pytest

from cvs_jax.errors import CheckpointError
from cvs_jax.rundir import checkpoint
from cvs_jax.rundir.checkpoint import Checkpoints, UnreadableCheckpointError, classify_restore_error

# orbax's tensorstore callbacks may hit its closed asyncio loop after a read error ("Event loop is closed")
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def tree(step):
    rng = np.random.default_rng(step)
    return {
        "params": {
            "net": {"kernel": rng.normal(size=(3, 4)).astype(np.float32), "bias": np.full((4,), step, np.float32)},
            "head": {"w": rng.normal(size=(4, 2)).astype(np.float32)},
        },
        "batch_stats": {"mean": np.arange(4, dtype=np.float32) + step},
        "count": np.int32(7 + step),
    }


def template():
    return tree(99)  # same structure, other values


def meta(step):
    return {"step": step, "results": [0.5, 1.5], "memory": {"labels": [1, 2, 3]}}


@pytest.fixture
def saved(tmp_path):
    """Two checkpoints (0 and 1) with a templated item, a raw item, an empty item and the JSON meta."""
    d = str(tmp_path / "ck")
    ck = Checkpoints(d, max_to_keep=None)
    for s in (0, 1):
        ck.save(s, {"variables": tree(s), "rows": {"ids": np.arange(5, dtype=np.int64) + 10 * s}, "none": {}}, meta(s))
    ck.close()
    return d


def open_ck(d, logs=None):
    return Checkpoints(d, max_to_keep=None, log=(logs.append if logs is not None else print))


TEMPLATES = {"variables": template(), "rows": None, "none": {}}


def listing(d):
    """Every file under d with its size and content digest (to show that nothing was moved or changed)."""
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = hash(fh.read())
    return out


def assert_tree_equal(got, want):
    assert set(got) == set(want)
    for k in want:
        if isinstance(want[k], dict):
            assert_tree_equal(got[k], want[k])
        else:
            np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]))
            assert np.asarray(got[k]).dtype == np.asarray(want[k]).dtype


def data_files(d, step, item="variables"):
    return [p for p in glob.glob(os.path.join(d, str(step), item, "**", "d", "*"), recursive=True) if os.path.isfile(p)]


# --------------------------------------------------------------------------- (e) exact round trip
def test_restore_gives_back_exactly_what_was_saved(saved):
    ck = open_ck(saved)
    step, items = ck.restore_latest(TEMPLATES)
    assert step == 1
    assert_tree_equal(items["variables"], tree(1))
    np.testing.assert_array_equal(items["rows"]["ids"], np.arange(5) + 10)
    assert items["none"] == {}
    assert items["meta"] == meta(1)
    older = ck.restore(0, TEMPLATES)
    assert_tree_equal(older["variables"], tree(0))
    assert older["meta"] == meta(0)
    assert ck.restore_latest(TEMPLATES, steps=range(0, 1))[0] == 0
    ck.close()


def test_tree_metadata_is_read_once_per_version_of_its_file(saved, monkeypatch):
    """A model's restore reads its stored tree's metadata once: ``stored_shape`` and the structure check share
    the read, and orbax, given host arrays to fill, looks for no sharding there. A step written again (same
    number, another head) is read again, never from what was read before."""
    reads = []
    real = checkpoint.ocp.StandardCheckpointHandler.metadata
    monkeypatch.setattr(
        checkpoint.ocp.StandardCheckpointHandler, "metadata", lambda self, d: reads.append(d.name) or real(self, d)
    )
    ck = open_ck(saved)
    assert ck.stored_shape(1, "variables", "params/head/w") == (4, 2)
    items = ck.restore(1, {"variables": template()})
    assert reads == ["variables"]
    assert_tree_equal(items["variables"], tree(1))
    assert all(isinstance(x, (np.ndarray, np.generic)) for x in jax.tree.leaves(items["variables"]))
    grown = tree(1)
    grown["params"]["head"]["w"] = np.ones((4, 3), np.float32)
    ck.remove([1])
    ck.save(1, {"variables": grown}, meta(1))
    assert ck.stored_shape(1, "variables", "params/head/w") == (4, 3)
    with pytest.raises(CheckpointError, match=r"params/head/w: shape \(4, 3\) in the checkpoint, \(4, 2\)"):
        ck.restore(1, {"variables": template()})
    assert_tree_equal(ck.restore(1, {"variables": grown})["variables"], grown)
    assert reads == ["variables"] * 2
    ck.close()


# --------------------------------------------------------------------------- (a) (b) damaged files
def truncate_data(d):
    victims = data_files(d, 1)
    assert victims
    for v in victims:
        with open(v, "r+b") as f:
            f.truncate(max(os.path.getsize(v) // 3, 1))


def remove(*parts):
    def damage(d):
        p = os.path.join(d, "1", *parts)
        shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)

    return damage


def clobber_meta(d):
    with open(os.path.join(d, "1", "meta", "metadata"), "r+b") as f:
        f.truncate(3)


def clobber_tree_metadata(d):
    with open(os.path.join(d, "1", "variables", "_METADATA"), "r+b") as f:
        f.truncate(20)


def remove_manifests(d):
    for p in glob.glob(os.path.join(d, "1", "variables", "**", "manifest.ocdbt"), recursive=True):
        os.remove(p)


def garble_data(d):
    for v in data_files(d, 1):
        n = os.path.getsize(v)
        with open(v, "r+b") as f:
            f.seek(n // 2)
            f.write(b"\xff" * (n - n // 2))


@pytest.mark.parametrize(
    "damage",
    [
        truncate_data,
        garble_data,
        remove("meta"),
        remove("variables"),
        remove("rows"),
        remove("variables", "_METADATA"),
        clobber_meta,
        clobber_tree_metadata,
        remove_manifests,
    ],
    ids=[
        "truncated-data",
        "garbled-data",
        "no-meta",
        "no-item",
        "no-raw-item",
        "no-tree-metadata",
        "bad-json",
        "bad-tree-metadata",
        "no-manifest",
    ],
)
def test_damaged_newest_falls_back_and_is_moved_aside(saved, damage):
    damage(saved)
    damaged = listing(os.path.join(saved, "1"))
    logs = []
    ck = open_ck(saved, logs)
    step, items = ck.restore_latest(TEMPLATES)
    assert step == 0
    assert_tree_equal(items["variables"], tree(0))
    assert items["meta"] == meta(0)
    assert ck.steps() == [0]
    ck.close()
    (aside,) = [e for e in os.listdir(saved) if e.startswith("unreadable-1-")]
    assert listing(os.path.join(saved, aside)) == damaged  # moved, never deleted
    assert len(logs) == 1 and "cannot be read" in logs[0] and aside in logs[0]


def test_restore_of_one_damaged_step_refuses_and_moves_nothing(saved):
    truncate_data(saved)
    before = listing(saved)
    ck = open_ck(saved)
    with pytest.raises(UnreadableCheckpointError, match="cannot be read.*Nothing was moved"):
        ck.restore(1, TEMPLATES)
    ck.close()
    assert listing(saved) == before


def test_all_damaged_gives_none(saved):
    truncate_data(saved)
    for v in data_files(saved, 0):
        os.truncate(v, 1)
    ck = open_ck(saved, [])
    assert ck.restore_latest(TEMPLATES) is None
    ck.close()
    assert sorted(e.split("-")[1] for e in os.listdir(saved) if e.startswith("unreadable-")) == ["0", "1"]


# --------------------------------------------------------------------------- (c) structure mismatch
def extra_in_code(t):
    t["params"]["lwf_head"] = {"w": np.zeros((4, 2), np.float32), "b": np.zeros((2,), np.float32)}
    return t, "variables/params/lwf_head: in the code, not in the checkpoint"


def missing_in_code(t):
    del t["params"]["head"]
    return t, "variables/params/head: in the checkpoint, not in the code"


def other_shape(t):
    t["params"]["net"]["kernel"] = np.zeros((3, 5), np.float32)
    return t, "variables/params/net/kernel: shape (3, 4) in the checkpoint, (3, 5) in the code"


def other_dtype(t):
    t["batch_stats"]["mean"] = np.zeros((4,), np.int32)
    return t, "variables/batch_stats/mean: dtype float32 in the checkpoint, int32 in the code"


@pytest.mark.parametrize("change", [extra_in_code, missing_in_code, other_shape, other_dtype])
@pytest.mark.parametrize("latest", [True, False], ids=["restore_latest", "restore"])
def test_structure_mismatch_stops_and_moves_nothing(saved, change, latest):
    t, expected = change(template())
    before = listing(saved)
    logs = []
    ck = open_ck(saved, logs)
    with pytest.raises(CheckpointError) as info:
        if latest:
            ck.restore_latest({**TEMPLATES, "variables": t})
        else:
            ck.restore(0, {**TEMPLATES, "variables": t})
    assert not isinstance(info.value, UnreadableCheckpointError)
    msg = str(info.value)
    assert expected in msg, msg
    assert os.path.join(saved, "1" if latest else "0") in msg
    assert "Nothing was moved" in msg and "--workdir" in msg and "different code version" in msg
    assert ck.steps() == [0, 1]
    ck.close()
    assert listing(saved) == before and not logs


def test_mismatch_names_each_subtree_once():
    stored = {"params": {"a": np.zeros((2,)), "lwf_head": {"w": np.zeros((2, 2)), "b": np.zeros((2,))}}}
    want = {"params": {"a": np.zeros((2,))}}
    assert checkpoint.structure_differences("variables", stored, want) == [
        "variables/params/lwf_head: in the checkpoint, not in the code"
    ]
    assert checkpoint.structure_differences("v", {"__empty__": np.zeros((1,), np.int8)}, {}) == []
    assert checkpoint.structure_differences("v", {"step": np.zeros((), np.int64)}, {"step": 0}) == []  # scalar


# --------------------------------------------------------------------------- (d) permissions, I/O
def permissions_enforced(tmp_path):
    """False for root (os.geteuid() == 0) unless it runs without CAP_DAC_OVERRIDE (e.g. under setpriv)."""
    probe = tmp_path / "probe"
    probe.write_bytes(b"x")
    probe.chmod(0)
    try:
        probe.read_bytes()
        return False
    except PermissionError:
        return True
    finally:
        probe.chmod(0o644)


def test_unreadable_permissions_stop_and_move_nothing(saved, tmp_path):
    if not permissions_enforced(tmp_path):
        pytest.skip("root ignores file permissions (covered by the simulated errors below)")
    victims = data_files(saved, 1)
    before = listing(saved)
    for v in victims:
        os.chmod(v, 0)
    try:
        ck = open_ck(saved)
        with pytest.raises(CheckpointError, match="cannot be read now") as info:
            ck.restore_latest(TEMPLATES)
        assert os.path.join(saved, "1") in str(info.value) and "Nothing was moved" in str(info.value)
        ck.close()
    finally:
        for v in victims:
            os.chmod(v, 0o644)
    assert listing(saved) == before


def _wrapped(inner):
    """An exception as orbax hands it over: the OS error is the cause of a ValueError."""
    try:
        try:
            raise inner
        except Exception as e:
            raise ValueError("Error restoring item") from e
    except ValueError as outer:
        return outer


STOPPING = [
    PermissionError(errno.EACCES, "Permission denied", "/x/_METADATA"),
    OSError(errno.EPERM, "Operation not permitted"),
    OSError(errno.EIO, "Input/output error"),
    OSError(errno.ENOSPC, "No space left on device"),
    OSError(errno.ETIMEDOUT, "Connection timed out"),
    OSError(errno.ESTALE, "Stale file handle"),
    ValueError('PERMISSION_DENIED: Error reading "a/0.0": Failed to open: "/x/d/ab" [os_error_code=\'13\']'),
    ValueError('Error reading "a/0.0" in OCDBT database: Failed to open: "/x/d/ab" [os_error_code=\'5\']'),
    ValueError('UNAVAILABLE: Error reading "a/0.0" in OCDBT database'),
    ValueError('DEADLINE_EXCEEDED: Error reading "a/0.0" in OCDBT database'),
    _wrapped(PermissionError(errno.EACCES, "Permission denied")),
    _wrapped(OSError(errno.EIO, "Input/output error")),
]


@pytest.mark.parametrize("error", STOPPING, ids=lambda e: f"{type(e).__name__}-{str(e)[:24]}")
def test_permission_and_io_errors_stop_and_move_nothing(saved, monkeypatch, error):
    assert classify_restore_error(error) == checkpoint.UNAVAILABLE
    before = listing(saved)
    logs = []
    ck = open_ck(saved, logs)

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(ck._mgr, "restore", fail)
    with pytest.raises(CheckpointError, match="cannot be read now") as info:
        ck.restore_latest(TEMPLATES)
    msg = str(info.value)
    assert os.path.join(saved, "1") in msg and "Nothing was moved" in msg and type(error).__name__ in msg
    assert ck.steps() == [0, 1]
    ck.close()
    assert listing(saved) == before and not logs


def test_permission_error_while_reading_tree_metadata_stops(saved, monkeypatch):
    def fail(self, directory):
        raise PermissionError(errno.EACCES, "Permission denied", str(directory / "_METADATA"))

    monkeypatch.setattr(checkpoint.ocp.StandardCheckpointHandler, "metadata", fail)
    before = listing(saved)
    ck = open_ck(saved, [])
    with pytest.raises(CheckpointError, match="Permission denied"):
        ck.restore_latest(TEMPLATES)
    ck.close()
    assert listing(saved) == before


def test_unrecognised_errors_stop_and_move_nothing(saved, monkeypatch):
    error = ValueError("User-provided restore item and on-disk value metadata tree structures do not match")
    assert classify_restore_error(error) == checkpoint.UNRECOGNISED
    before = listing(saved)
    ck = open_ck(saved, [])
    monkeypatch.setattr(ck._mgr, "restore", lambda *a, **k: (_ for _ in ()).throw(error))
    with pytest.raises(CheckpointError, match="not recognised as damaged files"):
        ck.restore_latest(TEMPLATES)
    ck.close()
    assert listing(saved) == before


@pytest.mark.parametrize(
    "error",
    [
        FileNotFoundError("Metadata file (named _METADATA) does not exist at /x/1/variables."),
        json.JSONDecodeError("Expecting value", "{", 1),
        ValueError('OUT_OF_RANGE: Error reading "a/0.0": Requested byte range [0, 15460) is not valid for value'),
        ValueError('DATA_LOSS: Error decoding local file "/x/manifest.ocdbt": Error decoding manifest'),
        ValueError('NOT_FOUND: Error opening "zarr" driver: Metadata at "a/.zarray" does not exist'),
        ValueError("Error decoding b-tree node: ZSTD_decompressStream() failed: Data corruption detected"),
        # bytes written over an array's chunk (was "not recognised as damaged files": a run stopped instead of
        # falling back, and search told the user to move the folder aside by hand)
        ValueError(
            'FAILED_PRECONDITION: Error reading "params.net.kernel/0.0.0.0" in OCDBT database at local file '
            '"/x/sessions/0/variables/": ZSTD_decompressStream() failed: Unknown frame descriptor; at byte 0'
        ),
        KeyError("Item \"meta\" was not found in the checkpoint. Available items: ['variables']"),
        _wrapped(FileNotFoundError(errno.ENOENT, "No such file or directory")),
    ],
    ids=lambda e: f"{type(e).__name__}-{str(e)[:24]}",
)
def test_damaged_file_errors_are_classified_unreadable(error):
    assert classify_restore_error(error) == checkpoint.UNREADABLE


# --------------------------------------------------------------------------- (f) retention
@pytest.mark.parametrize("keep, expected", [(2, [3, 4]), (None, [0, 1, 2, 3, 4]), (1, [4])])
def test_retention_keeps_the_newest_n_or_all(tmp_path, keep, expected):
    d = str(tmp_path / "ck")
    ck = Checkpoints(d, max_to_keep=keep)
    for s in range(5):
        ck.save(s, {"variables": tree(s)}, meta(s))
    assert ck.steps() == expected
    ck.close()
    assert sorted(int(e) for e in os.listdir(d) if e.isdigit()) == expected
    ck = Checkpoints(d, max_to_keep=keep)  # reopened: the same policy, the newest is restored
    step, items = ck.restore_latest({"variables": template()})
    assert step == 4 and items["meta"] == meta(4)
    ck.close()
