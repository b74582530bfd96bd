"""The per-session gallery: appending copies nothing, each checkpoint holds its session's part,
and restoring gives back exactly the rows that were stored."""

import errno
import os
import shutil
import tracemalloc

import numpy as np
import pytest

from cvs_jax.errors import CheckpointError
from cvs_jax.methods import losses
from cvs_jax.rundir.checkpoint import Checkpoints
from cvs_jax.rundir.gallery import Gallery, GalleryPart, RowConcat


def part(session, n, d=8, start=0, seed=0, replaces=False):
    rng = np.random.default_rng(seed + session)
    return GalleryPart(
        rng.normal(size=(n, d)).astype(np.float32),
        rng.integers(0, 5, n).astype(np.int32),
        np.arange(start, start + n, dtype=np.int64),
        session,
        replaces,
    )


def test_row_view_equals_concatenation_for_any_slice():
    parts = [np.random.default_rng(i).normal(size=(n, 3)).astype(np.float32) for i, n in enumerate((5, 0, 7, 1))]
    full = np.concatenate(parts)
    view = RowConcat(parts)
    assert view.shape == full.shape and len(view) == 13
    for a in range(0, 14):
        for b in range(a, 14):
            np.testing.assert_array_equal(view[a:b], full[a:b])
    np.testing.assert_array_equal(np.asarray(view), full)


def test_with_part_keeps_stored_arrays_and_columns_line_up():
    g = Gallery.empty(8).with_part(part(0, 6)).with_part(part(1, 4, start=6))
    p0 = g.parts[0]
    g2 = g.with_part(part(2, 3, start=10))
    assert g2.parts[0] is p0 and len(g2) == 13  # the stored part is shared, not copied
    np.testing.assert_array_equal(g2.sessions, [0] * 6 + [1] * 4 + [2] * 3)
    np.testing.assert_array_equal(g2.source_ids, np.arange(13))
    np.testing.assert_array_equal(np.asarray(g2.embeddings)[6:10], g.parts[1].embeddings)
    with pytest.raises(ValueError, match="never added twice"):
        g2.with_part(part(3, 2, start=12))
    joint = g2.with_part(part(3, 13, replaces=True))  # joint re-embeds everything
    assert len(joint.parts) == 1 and joint.parts[0].session == 3


def test_appending_a_session_does_not_copy_the_stored_rows():
    stored = Gallery.empty(128).with_part(part(0, 40000, d=128))  # 20 MB of embeddings
    new = part(1, 1000, d=128, start=40000)
    tracemalloc.start()
    g = stored.with_part(new)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(g) == 41000
    assert peak < 2 * 1024 * 1024, peak  # only the small id/label columns, never the 20 MB


def test_checkpoints_store_one_part_each_and_restore_exactly(tmp_path):
    ck = Checkpoints(str(tmp_path / "sessions"), max_to_keep=None)
    g = Gallery.empty(8)
    for s, n in enumerate((6, 4, 5)):
        p = part(s, n, start=100 * s)
        g = g.with_part(p)
        ck.save(s, {"gallery": p.as_dict()}, {})
    back = Gallery.restore(ck, 2, 8)
    for name in ("labels", "sessions", "source_ids"):
        np.testing.assert_array_equal(getattr(back, name), getattr(g, name))
    np.testing.assert_array_equal(np.asarray(back.embeddings), np.asarray(g.embeddings))
    assert len(Gallery.restore(ck, 0, 8)) == 6
    ck.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # orbax's closed loop after a read error
def test_an_unreadable_older_part_is_refused_and_left_in_place(tmp_path):
    ck = Checkpoints(str(tmp_path / "sessions"), max_to_keep=None)
    for s in range(2):
        ck.save(s, {"gallery": part(s, 3, start=10 * s).as_dict()}, {})
    ck.close()
    victims = [
        os.path.join(root, f)
        for root, _, files in os.walk(tmp_path / "sessions" / "0" / "gallery")
        for f in files
        if os.sep + "d" in root
    ]  # the array data files
    assert victims
    for v in victims:
        with open(v, "r+b") as f:
            f.truncate(5)
    ck = Checkpoints(str(tmp_path / "sessions"), max_to_keep=None)
    with pytest.raises(CheckpointError, match="session 1 cannot be read.*never re-extracted"):
        Gallery.restore(ck, 1, 8)
    ck.close()
    assert all(os.path.exists(v) for v in victims) and sorted(os.listdir(tmp_path / "sessions")) == ["0", "1"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # orbax's closed loop after a read error
def test_a_missing_part_is_refused_and_nothing_moved(tmp_path):
    ck = Checkpoints(str(tmp_path / "sessions"), max_to_keep=None)
    for s in range(2):
        ck.save(s, {"gallery": part(s, 3, start=10 * s).as_dict()}, {})
    ck.close()
    shutil.rmtree(tmp_path / "sessions" / "1" / "gallery")
    ck = Checkpoints(str(tmp_path / "sessions"), max_to_keep=None)
    with pytest.raises(CheckpointError, match="session 2 cannot be read.*restore that folder from a backup"):
        Gallery.restore(ck, 1, 8)
    ck.close()
    assert sorted(os.listdir(tmp_path / "sessions")) == ["0", "1"]


def test_a_permission_error_of_the_checkpoint_layer_passes_through(tmp_path, monkeypatch):
    ck = Checkpoints(str(tmp_path / "sessions"), max_to_keep=None)
    ck.save(0, {"gallery": part(0, 3).as_dict()}, {})

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(ck._mgr, "restore", denied)
    with pytest.raises(CheckpointError, match="cannot be read now.*Permission denied") as info:
        Gallery.restore(ck, 0, 8)
    assert "gallery rows" not in str(info.value)  # the checkpoint layer's own message, unchanged
    ck.close()
    assert sorted(os.listdir(tmp_path / "sessions")) == ["0"]


def test_another_store_failing_is_refused_as_unreadable():
    class Store:
        directory = "/somewhere"

        def restore(self, step, templates):
            raise OSError("bad sector")

    with pytest.raises(CheckpointError, match="session 1 cannot be read from /somewhere/0 .OSError: bad sector"):
        Gallery.restore(Store(), 0, 8)


@pytest.mark.parametrize("per_session", [False, True])
def test_class_centers_stream_the_parts(per_session, monkeypatch):
    monkeypatch.setattr(losses, "_CENTER_BLOCK", 4)  # several blocks per part
    g = Gallery.empty(8).with_part(part(0, 9)).with_part(part(1, 7, start=9)).with_part(part(2, 5, start=16))
    got = losses.class_centers(g.embeddings, g.labels, 6, gallery_sessions=g.sessions, per_session_mean=per_session)
    monkeypatch.setattr(losses, "_CENTER_BLOCK", 1 << 18)
    want = losses.class_centers(
        np.asarray(g.embeddings), g.labels, 6, gallery_sessions=g.sessions, per_session_mean=per_session
    )
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(got[1], want[1])
