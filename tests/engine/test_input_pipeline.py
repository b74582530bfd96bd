"""The training input pipeline (engine.batches.batch_loader): the same batches, in the same order, for any
thread or worker-process count, streamed or in RAM, resumed at any step, split over processes; errors
in a worker process reach the train loop as themselves."""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import types

import jax
import numpy as np
import pytest

from cvs_jax import distributed
from cvs_jax.data import records, sources
from cvs_jax.engine import batches, phases, prefetch
from cvs_jax.engine.protocol_builder import build_protocol
from cvs_jax.methods import policies
from cvs_jax.testing.tiny_data import tiny_config, write_fashion_idx

BATCH = 16


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A tiny Fashion-MNIST-layout dataset prepared once; its protocol in RAM and streamed."""
    tmp = tmp_path_factory.mktemp("pipeline")
    manual_dir = write_fashion_idx(str(tmp / "idx"), train_per_class=30, test_per_class=5)
    c = tiny_config(manual_dir, tmp)
    c.data.samples_per_new_class = 20
    c.train.batch_size = BATCH
    c.data.in_memory_limit_mb = 4096.0
    in_ram = build_protocol(c)
    c.data.in_memory_limit_mb = 0.0
    streamed = build_protocol(c)
    assert isinstance(in_ram.dataset.train, sources.Split)
    assert isinstance(streamed.dataset.train, records.StoreSplit)
    return types.SimpleNamespace(config=c, in_ram=in_ram, streamed=streamed, tmp=tmp)


def _view(proto, config, epochs=2):
    idx = np.flatnonzero(proto.train_labels >= 0)
    batches = policies.ShuffledEpochs(idx, BATCH, config.seed, 0)
    return phases.SessionView(0, batches, idx, None, idx[:4], idx[:4], epochs)


def _loader(proto, config, *, threads=1, workers=0, start=0):
    c = config.copy_and_resolve_references()
    c.data.loader_threads, c.data.loader_workers = threads, workers
    ctx = types.SimpleNamespace(config=c, mesh=distributed.data_mesh(), proto=proto)
    return batches.batch_loader(ctx, _view(proto, c), start)


def _read(proto, config, **kw):
    return [(np.asarray(b["images"]), np.asarray(b["labels"])) for b in _loader(proto, config, **kw)]


def _expected(proto, config, start=0):
    """Each step's rows from the in-RAM images and protocol labels, by the batch policy's indices."""
    view = _view(proto, config)
    read = prefetch.BatchReader(None, None, view.batches, view.steps_per_epoch, 0, BATCH)
    return [read.indices(step) for step in range(start, view.total_steps)]


def _assert_same(got, want):
    assert len(got) == len(want)
    for (gi, gl), (wi, wl) in zip(got, want):
        np.testing.assert_array_equal(gi, wi)
        np.testing.assert_array_equal(gl, wl)


def test_batches_equal_for_threads_and_worker_processes(data):
    ref = _read(data.streamed, data.config, threads=1)
    images = data.in_ram.dataset.train.images
    for (gi, gl), idx in zip(ref, _expected(data.in_ram, data.config), strict=True):
        np.testing.assert_array_equal(gi, images[idx])
        np.testing.assert_array_equal(gl, data.in_ram.train_labels[idx])
        assert gl.dtype == np.int32 and gi.dtype == np.uint8
    assert len(ref) == 2 * (len(_view(data.streamed, data.config).batches.indices) // BATCH)
    _assert_same(_read(data.streamed, data.config, threads=3), ref)
    _assert_same(_read(data.streamed, data.config, threads=1, workers=2), ref)


def test_streamed_batches_equal_in_ram_batches(data):
    """in_memory_limit_mb=0 (decode each batch from its records) vs decoded once into RAM: the same
    dataset indices and the same pixels, step by step."""
    streamed, in_ram = _read(data.streamed, data.config), _read(data.in_ram, data.config)
    _assert_same(streamed, in_ram)
    idx_s, idx_r = _expected(data.streamed, data.config), _expected(data.in_ram, data.config)
    assert all(np.array_equal(a, b) for a, b in zip(idx_s, idx_r, strict=True))


def test_resumed_loader_yields_the_remaining_batches(data):
    full = _read(data.streamed, data.config, threads=2)
    spe = _view(data.streamed, data.config).steps_per_epoch
    for k in (3, spe + 1):  # within the first epoch, and after the epoch boundary
        _assert_same(_read(data.streamed, data.config, threads=2, start=k), full[k:])
    _assert_same(_read(data.streamed, data.config, workers=2, start=spe - 1), full[spe - 1 :])


def test_two_processes_read_disjoint_rows_of_the_global_batch(data, monkeypatch):
    """Each process loads only rows process_slice(B) of every global batch; the halves are disjoint
    and make the global batch (faked processes, as distributed.process_slice would give them)."""
    full = _read(data.streamed, data.config)
    halves = []
    for lo, hi, workers in ((0, BATCH // 2, 0), (BATCH // 2, BATCH, 2)):
        monkeypatch.setattr(distributed, "process_slice", lambda b, mesh=None, lo=lo, hi=hi: (lo, hi))
        halves.append(_read(data.streamed, data.config, workers=workers))
    idx = _expected(data.streamed, data.config)
    for (i0, l0), (i1, l1), (fi, fl), rows in zip(*halves, full, idx, strict=True):
        assert len(i0) == len(i1) == BATCH // 2
        assert not set(rows[: BATCH // 2].tolist()) & set(rows[BATCH // 2 :].tolist())
        np.testing.assert_array_equal(np.concatenate([i0, i1]), fi)
        np.testing.assert_array_equal(np.concatenate([l0, l1]), fl)


def test_batches_are_on_the_devices_and_global_batch_keeps_them(data):
    mesh = distributed.data_mesh()
    it = iter(_loader(data.streamed, data.config, workers=2))
    batch = next(it)
    assert isinstance(batch["images"], jax.Array)
    assert batch["images"].sharding == distributed.batch_sharding(mesh)
    placed = distributed.global_batch(batch, mesh)
    assert placed["images"] is batch["images"] and placed["labels"] is batch["labels"]
    it.close()  # stops the reading thread and the worker processes without reading the rest
    with pytest.raises(StopIteration):
        next(it)


def test_worker_count_uses_processes_only_for_streamed_splits(data):
    assert prefetch.worker_count(data.streamed.dataset.train, 3) == 3
    assert prefetch.worker_count(data.in_ram.dataset.train, 3) == 0  # gathering rows needs no decode
    assert prefetch.worker_count(data.streamed.dataset.train, 0) == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_corrupted_record_error_reaches_the_train_loop(data, tmp_path, workers):
    """A record file whose bytes changed on disk (same size): the loader raises StoreChangedError with
    its message in this process, from a worker process too, instead of hanging."""
    c = data.config.copy_and_resolve_references()
    c.data.data_dir = str(tmp_path / "records")
    shutil.copytree(data.config.data.data_dir, c.data.data_dir)
    proto = build_protocol(c)
    path = proto.dataset.train.path
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size // 4)
        f.write(b"\0" * (size // 2))

    def consume():
        return sum(1 for _ in _loader(proto, c, workers=workers))

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(consume)
        with pytest.raises(records.StoreChangedError, match=r"train\.array_record: records .* cannot be read"):
            future.result(timeout=120)
