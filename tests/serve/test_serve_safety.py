"""The service safe to run: no compile under the searches' lock when the index grows, query maps
served, a 500 that keeps the connection, strict integers, Pillow's pixel limit as 413, stable row ids,
relative upload paths, cross-origin and Host refusals, the compatibility gate and the model pin."""

import errno
import glob
import json
import os
import shutil
import socket
import threading
import time

import jax
import numpy as np
import pytest
from absl import flags
from fastapi.testclient import TestClient
from PIL import Image

from cvs_jax import errors, export, search
from cvs_jax.index import exact
from cvs_jax.retrieval import gate, query_maps
from cvs_jax.retrieval.run_reader import ADDED_BASE
from cvs_jax.rundir import paths
from cvs_jax.serve import __main__ as command
from cvs_jax.serve import guard
from cvs_jax.serve.app import Limits, create_app
from cvs_jax.serve.state import Served
from cvs_jax.testing.image_folders import new_photo

LOWERING = "/jax/core/compile/jaxpr_to_mlir_module_duration"  # one per jit cache miss (persistent cache or not)
OFF = gate.Thresholds(off=True)
SMALL = 4  # batches of up to 4 images: a model is warmed for 4 batch sizes, not ~20 (cheaper tests)


def _photos(wd, split="train"):
    return sorted(glob.glob(os.path.join(os.path.dirname(wd), "s1", split, "*", "*")))


def _files(paths_):
    return [("file", (os.path.basename(p), open(p, "rb").read())) for p in paths_]


def _cli(wd, paths_, k, capsys):
    capsys.readouterr()
    assert search.search_or_add(wd, paths_, k=k, as_json=True) == 0
    return json.loads(capsys.readouterr().out)


def _next_session_completes(two, wd):
    for name in (paths.CONFIG, paths.PROTOCOL, paths.RESULTS):
        shutil.copy(os.path.join(two, name), os.path.join(wd, name))
    shutil.copytree(paths.session_dir(two, 1), paths.session_dir(wd, 1))


@pytest.fixture(scope="module")
def shared(photo_runs):
    served = Served(photo_runs[0], poll_s=0, max_batch=SMALL, max_wait_s=0.01)
    yield served, TestClient(create_app(served))
    served.close()


def test_a_500_is_answered_without_raising_into_the_server(photo_runs, shared, monkeypatch):
    """Starlette's ``ServerErrorMiddleware`` re-raised into uvicorn, which closed the client's connection;
    TestClient(raise_server_exceptions=True) shows that re-raise as an exception."""
    served, _ = shared
    client = TestClient(create_app(served))

    def broken(run):
        raise RuntimeError("a bug")

    monkeypatch.setattr("cvs_jax.retrieval.run_info.describe_run", broken)
    r = client.get("/info")
    assert r.status_code == 500 and r.json()["error"].startswith("internal error (RuntimeError)")
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    "params,route",
    [
        ({"k": "²"}, "/search"),
        ({"k": "--5"}, "/search"),
        ({"k": "٣"}, "/search"),
        ({"k": "03"}, "/search"),
        ({"label": "²"}, "/search"),
        ({"label": "--1"}, "/search"),
        ({"label": "007"}, "/search"),
        ({"label": "01"}, "/search"),  # the tiny run has 3 classes: 007 is refused as a number anyway
        ({"label": "²"}, "/add"),
    ],
)
def test_odd_integers_are_400(photo_runs, shared, params, route):
    _, client = shared
    r = client.post(route, params=params, files=_files(_photos(photo_runs[0])[:1]))
    assert r.status_code == 400, r.text
    assert list(r.json()) == ["error"]


def test_pillows_pixel_limit_is_413(photo_runs, shared, tmp_path, monkeypatch):
    """The command sets ``Image.MAX_IMAGE_PIXELS`` to --max_pixels: Pillow's own warning came first (400)."""
    _, client = shared
    big = tmp_path / "big.png"
    Image.new("RGB", (80, 80)).save(big)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 3000)
    r = client.post("/search", files=_files([str(big)]))
    assert r.status_code == 413, r.text
    assert "(--max_pixels)" in r.json()["error"]  # the command sets both to one limit: Pillow's refusal came first


def test_write_routes_refuse_cross_origin_and_the_host_list(photo_runs, run_copy, tmp_path):
    served = Served(run_copy, poll_s=0, max_batch=SMALL)
    try:
        app = create_app(served, allowed_hosts=guard.LOOPBACK_HOSTS)
        client = TestClient(app, base_url="http://127.0.0.1:8000")
        photo = new_photo(tmp_path / "x.png", "ant", seed=3)
        for headers in ({"origin": "http://evil.example"}, {"sec-fetch-site": "cross-site"}, {"origin": "null"}):
            r = client.post("/add", files=_files([photo]), headers=headers)
            assert r.status_code == 403, r.text
        assert not os.path.exists(paths.uploads_dir(run_copy))
        r = client.get("/healthz", headers={"host": "evil.example:8000"})  # DNS rebinding: another name
        assert r.status_code == 400 and "--allowed_hosts" in r.json()["error"]
        same = client.post("/add", files=_files([photo]), headers={"origin": "http://127.0.0.1:8000"})
        assert same.status_code == 200, same.text  # the server's own page
        info = client.get("/info").json()
        assert not os.path.isabs(info["workdir"]) and os.path.abspath(run_copy) not in client.get("/").text
    finally:
        served.close()


def _tree(folder):
    return {
        os.path.relpath(os.path.join(d, f), folder): os.stat(os.path.join(d, f)).st_mtime_ns
        for d, _, files in os.walk(folder)
        for f in files
    }


def test_a_workdir_that_cannot_be_written_is_one_line_or_a_503(
    photo_runs, shared, run_copy, tmp_path, monkeypatch, capsys
):
    """A read-only workdir (a read-only mount; root passes a chmod, so the file system's refusal is made
    here): the lock every add takes first was a traceback from ``search --add`` and a 500 from ``/add``;
    ``export --out`` under a file (a real refusal, the command's boundary) was a traceback too."""
    out = tmp_path / "a-file"
    out.write_text("")
    capsys.readouterr()
    assert export.main(["export"], _export_flags(photo_runs[0], str(out / "export"))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: cannot use {out}") and "pass another path" in err[0]
    denied = errors.not_writable(PermissionError(errno.EACCES, "Permission denied", "/photos"))  # a read, too
    assert str(denied) == "cannot use /photos (permission denied); give this user access to it, or pass another path."
    assert errors.not_writable(OSError(errno.EIO, "I/O error", "/x")) is None  # not the user's: a traceback

    real_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and str(path).endswith(".lock"):
            raise OSError(errno.EROFS, "Read-only file system", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    photo = new_photo(tmp_path / "new.png", "ant", seed=7)
    before = _tree(run_copy)
    assert search.search_or_add(run_copy, [photo], add=True, label="ant") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "additions.lock (a read-only file system); pass a folder" in err[0], err
    assert _tree(run_copy) == before

    served, client = shared
    rows = len(served.run.rows)
    r = client.post("/add", params={"label": "ant"}, files=_files([photo]))
    assert r.status_code == 503 and list(r.json()) == ["error"], r.text
    assert "read-only file system" in r.json()["error"] and os.path.dirname(photo_runs[0]) not in r.text
    assert len(served.run.rows) == rows and client.get("/healthz").status_code == 200


def _export_flags(workdir, out):
    fv = flags.FlagValues()
    export.define_flags(fv)
    fv(["export", "--workdir", workdir, "--out", out])
    return fv


def test_command_token_file_hosts_and_port(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(command.TOKEN_ENV, raising=False)
    f = tmp_path / "token"
    f.write_text("t0k\n")
    assert command.check_token("0.0.0.0", None, str(f)) == "t0k"
    assert command.allowed_hosts("127.0.0.1", None) == guard.LOOPBACK_HOSTS
    assert command.allowed_hosts("0.0.0.0", ["*"]) is None
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        fv = flags.FlagValues()
        command.define_flags(fv)
        argv = fv(["serve", "--workdir", str(tmp_path / "none"), "--port", str(port)])
        assert command.main(argv, fv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: cannot listen on 127.0.0.1:{port}")
    a, b = command.default_collection(str(tmp_path / "a" / "run")), command.default_collection(str(tmp_path / "run"))
    assert a != b and a.startswith("cvs_run_")


def test_a_half_sent_request_line_is_closed_after_the_deadline():
    import uvicorn

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(app, port=port, log_level="error", http=command_protocol(0.3), lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(100):
            if server.started:
                break
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            c.sendall(b"GET / HT")
            start = time.monotonic()
            assert c.recv(100) == b""  # closed by the server, not by the 5 s client timeout
            assert time.monotonic() - start < 4
    finally:
        server.should_exit = True
        thread.join(5)


def command_protocol(seconds):
    from cvs_jax.serve import protocol

    return protocol.with_head_deadline(seconds)


def test_query_maps_are_applied_as_search_does(photo_runs, tmp_path, capsys):
    wd = str(tmp_path / "mapped")
    shutil.copytree(photo_runs[1], wd)
    config = json.load(open(paths.config_file(wd)))
    config.setdefault("retrieval", {})["query_map"] = "procrustes"
    json.dump(config, open(paths.config_file(wd), "w"))
    dim = int(config["model"]["embed_dim"])
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(dim, dim)))
    query_maps.QueryMap(q, np.zeros(dim), "procrustes").save(paths.query_map_file(wd, 1))
    served = Served(wd, poll_s=0, max_batch=SMALL)
    try:
        run = served.run
        newer = set(run.gallery.parts[1].labels.tolist())
        only_old = next(c for c in run.gallery.parts[0].labels.tolist() if c not in newer)  # its rows: model 1's
        name, queries = run.class_names[only_old], _photos(photo_runs[0])[::6]
        client = TestClient(create_app(served))
        body = client.post("/search", params={"k": 3, "label": name}, files=_files(queries)).json()
        for got, want in zip(body["queries"], _cli(wd, queries, len(run.rows), capsys)):
            want = [h for h in want["hits"] if h["class_name"] == name][:3]  # the mapped query scores them
            assert [h["row"] for h in got["hits"]] == [h["row"] for h in want]
            np.testing.assert_allclose([h["score"] for h in got["hits"]], [h["score"] for h in want], atol=1e-5)
    finally:
        served.close()


def test_growth_and_switch_compile_nothing_under_the_lock(photo_runs, run_copy, tmp_path, monkeypatch):
    """An add and a switch each take the index past a power of two (64 rows, then 128: ``SMALL_BLOCK`` made
    small); every compile they need happens beside serving, none while the batcher's lock is held."""
    monkeypatch.setattr(exact, "SMALL_BLOCK", 8)
    served = Served(run_copy, poll_s=0, thresholds=OFF)
    client = TestClient(create_app(served, limits=Limits(max_images=64)))
    under_lock = []

    def listener(event, duration, **kwargs):
        if event == LOWERING and served.batcher.holds_lock():
            under_lock.append(threading.current_thread().name)

    def add(n, seed):
        photos = [new_photo(tmp_path / f"p{seed + j}.png", "ant", seed=seed + j) for j in range(n)]
        assert client.post("/add", files=_files(photos), params={"label": "ant"}).status_code == 200

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        query = _files(_photos(photo_runs[0])[:1])
        for k in (3, 9):
            assert client.post("/search", params={"k": k}, files=query).status_code == 200
        assert len(served.index) + 16 < 64
        add(64 - len(served.index) - 4, 100)
        under_lock.clear()
        _next_session_completes(photo_runs[1], run_copy)
        served.poll()  # the new part takes the index past 64 rows
        assert served.model_session == 2 and len(served.index) > 64
        add(129 - len(served.index), 200)  # past 128
        assert len(served.index) > 128
        assert client.post("/search", params={"k": 9}, files=query).status_code == 200
        assert under_lock == []
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
        served.close()


def test_an_added_rows_id_names_the_same_photo_after_a_switch_and_a_moved_workdir(
    photo_runs, run_copy, tmp_path, capsys
):
    served = Served(run_copy, poll_s=0, max_batch=SMALL, thresholds=OFF)
    client = TestClient(create_app(served))
    photo = new_photo(tmp_path / "mine.png", "bee", seed=41)
    added = client.post("/add", files=_files([photo]), params={"label": "bee"}).json()
    (row_id,), (row_before,) = added["ids"], added["rows"]
    assert row_id == ADDED_BASE
    thumb = client.get(f"/thumb/{row_id}.png").content
    (added_source,) = [
        h["source"]
        for h in client.post("/search", params={"k": 3}, files=_files([photo])).json()["queries"][0]["hits"]
        if h["id"] == row_id
    ]
    _next_session_completes(photo_runs[1], run_copy)
    served.poll()
    assert served.model_session == 2
    every = len(served.run.rows)
    hits = client.post("/search", params={"k": every}, files=_files([photo])).json()["queries"][0]["hits"]
    (hit,) = [h for h in hits if h["id"] == row_id]
    assert hit["row"] != row_before and hit["source"] == added_source  # the row number is a position
    assert client.get(f"/thumb/{row_id}.png").content == thumb
    assert client.get(f"/thumb/{row_before}.png").content != thumb  # that number is a session row now
    (cli,) = [h for h in _cli(run_copy, [photo], every, capsys)[0]["hits"] if h["id"] == row_id]
    assert cli["row"] == hit["row"] and cli["source"] == added_source
    served.close()
    moved = str(tmp_path / "moved")
    shutil.move(run_copy, moved)  # the rows store paths relative to the workdir: a moved run shows them
    served = Served(moved, poll_s=0, max_batch=SMALL)
    try:
        r = TestClient(create_app(served)).get(f"/thumb/{row_id}.png")
        assert r.status_code == 200 and r.content == thumb
    finally:
        served.close()


def test_the_gate_keeps_a_model_that_loses_old_rows_and_a_pin_overrides_it(photo_runs, run_copy):
    """The tiny run's second session loses 33 recall@1 points on the first session's rows (its
    results.json): kept by the default gate; a looser gate switches; ``POST /model`` pins either way."""
    served = Served(run_copy, poll_s=0, max_batch=SMALL)
    client = TestClient(create_app(served, token="t"))
    auth = {"authorization": "Bearer t"}
    try:
        _next_session_completes(photo_runs[1], run_copy)
        served.poll()
        verdict = client.get("/info").json()["gate"]
        assert verdict["decision"] == "kept" and verdict["candidate_session"] == 2 and verdict["bc"] < -gate.DEFAULT_BC
        assert set(verdict) >= {"candidate_session", "decision", "bc", "nfr", "thresholds", "reason"}
        assert served.model_session == 1 and len(served.run.rows) == len(served.index) > len(
            served.run.gallery.parts[0]
        )
        assert 'cvs_gate_decisions_total{decision="kept"} 1' in client.get("/metrics").text
        assert client.post("/model", params={"session": "2"}).status_code == 401
        assert client.post("/model", params={"session": "3"}, headers=auth).status_code == 400
        pinned = client.post("/model", params={"session": "2"}, headers=auth).json()
        assert pinned["model_session"] == served.model_session == 2 and pinned["pinned_session"] == 2
        back = client.post("/model", params={"session": "1"}, headers=auth).json()
        assert back["model_session"] == 1 and back["rows_by_newer_models"] > 0
        body = client.post("/search", params={"k": 3}, files=_files(_photos(photo_runs[0])[:1])).json()
        assert body["model_session"] == 1
        served.thresholds = gate.Thresholds(bc=50, nfr=50)
        assert client.post("/model", params={"session": "newest"}, headers=auth).json()["model_session"] == 2
        assert client.get("/info").json()["gate"]["decision"] == "switched"
    finally:
        served.close()


def test_a_pin_holds_across_restarts_until_it_is_lifted(photo_runs, run_copy, caplog):
    """A pin is recorded in served.json: a server restarted after session 2 completed serves the pinned
    model 1 with the newest gallery, where the gate (here off) would switch; ``session=newest`` lifts it,
    also in the record when the gate then keeps the model; a record without a pin (older servers wrote
    none) is taken through the gate at restart, and a pin of a session the run lacks is dropped (the run then
    goes through the gate as one never served)."""
    auth = {"authorization": "Bearer t"}

    def start(thresholds=OFF):
        served = Served(run_copy, poll_s=0, max_batch=SMALL, thresholds=thresholds)
        return served, TestClient(create_app(served, token="t"))

    def record():
        with open(paths.served_file(run_copy)) as f:
            return json.load(f)

    served, client = start()
    try:
        assert client.post("/model", params={"session": "1"}, headers=auth).json()["pinned_session"] == 1
    finally:
        served.close()
    assert record() == {"model_session": 0, "gallery_session": 0, "pinned_session": 0}
    _next_session_completes(photo_runs[1], run_copy)  # while no server runs
    caplog.clear()
    served, client = start()
    try:
        info = client.get("/info").json()
        assert (info["model_session"], info["pinned_session"], info["gate"]) == (1, 1, None)
        assert served.run.gallery_session == 1 and len(served.run.rows) > len(served.run.gallery.parts[0])
        assert "lift it with POST /model?session=newest" in caplog.text
        served.thresholds = gate.Thresholds()  # the default gate keeps session 2: lifting the pin switches nothing
        lifted = client.post("/model", params={"session": "newest"}, headers=auth).json()
        assert (lifted["model_session"], lifted["pinned_session"]) == (1, None)
        assert client.get("/info").json()["gate"]["decision"] == "kept"
    finally:
        served.close()
    assert record() == {"model_session": 0, "gallery_session": 1, "pinned_session": None}
    with open(paths.served_file(run_copy), "w") as f:  # a record from before pins were kept, before session 2
        json.dump({"model_session": 0, "gallery_session": 0}, f)
    served, client = start()
    try:
        info = client.get("/info").json()
        assert (info["model_session"], info["pinned_session"], info["gate"]["decision"]) == (2, None, "switched")
    finally:
        served.close()
    with open(paths.served_file(run_copy), "w") as f:  # a pin of another run (the workdir replaced)
        json.dump({"model_session": 0, "gallery_session": 0, "pinned_session": 2}, f)
    caplog.clear()
    served, _ = start(gate.Thresholds())  # taken through the gate as a run never served: session 2 kept out
    try:
        assert (served.model_session, served.status()["pinned_session"]) == (1, None)
        assert (served.gate["candidate_session"], served.gate["decision"]) == (2, "kept")
        assert "served.json pins session 3, which this run lacks: not pinned" in caplog.text
    finally:
        served.close()


def test_update_prints_the_gate_verdict(photo_runs):
    from cvs_jax import update

    results = gate.read_results(photo_runs[1])
    line = update.gate_line(photo_runs[1], results)
    # the reference: session 2's model on session 1's rows against session 1's own model (recall@1, points); the
    # value itself moves with the host's floats (-33.33 on one machine, -25.00 on another), so it is recomputed here
    matrix = np.asarray(results["compatibility_recall1"], float)
    bc = 100 * (matrix[1, 0] - matrix[0, 0])
    decision = "kept" if bc < -gate.DEFAULT_BC else "switched"
    assert line.startswith(f"gate: {decision} session 2 (BC {bc:+.2f} points"), line
    assert decision == "kept"  # the other tests here lean on the default gate keeping this run's session 2
    assert line.endswith("; search, export and a new server use the model of session 1 (--session 2: this one)")


def test_the_benchmark_sends_the_runs_photos_not_its_plots(photo_runs, tmp_path, benchmark_module):
    module = benchmark_module("serve")
    wd = str(tmp_path / "elsewhere" / "run")  # no photo folder beside it, as for --workdir W
    shutil.copytree(photo_runs[0], wd)
    Image.new("RGB", (8, 8)).save(os.path.join(wd, "plot.png"))
    photos, payloads = module.photo_payloads(wd)
    assert photos and len(payloads) == len(photos)
    assert not any(os.path.abspath(p).startswith(os.path.abspath(wd)) for p in photos)


def test_every_batch_bucket_is_compiled_at_start_without_running_the_model(photo_runs):
    """The start compiles the model for each batch size a request can bring (1..``max_batch`` images) without
    running it (a pretrained photo run's start spent 15 of 27 s embedding zeros): no request of any size then
    lowers a program, and the network ran no row before the first request."""
    said = []
    served = Served(photo_runs[0], poll_s=0, max_batch=6, announce=said.append)
    client = TestClient(create_app(served))
    compiled = []
    assert len(said) == 1 and "(model of session 1): compiling it for batches of 1 to 6 images" in said[0], said

    def listener(event, duration, **kwargs):
        if event == LOWERING:
            compiled.append(event)

    assert served.run.network.rows_run == 0
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        photos = _photos(photo_runs[0])
        for n in range(1, 7):
            assert client.post("/search", params={"k": 5}, files=_files(photos[:n])).status_code == 200
        assert compiled == [] and served.run.network.rows_run > 0
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
        served.close()


def test_new_k_buckets_and_labels_are_compiled_before_any_request(photo_runs):
    served = Served(photo_runs[0], poll_s=0, max_batch=1, max_k=8, warm_all=True)
    client = TestClient(create_app(served, limits=Limits(max_k=8)))
    compiled = []

    def listener(event, duration, **kwargs):
        if event == LOWERING:
            compiled.append(event)

    assert served.warmed.wait(120)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        query = _files(_photos(photo_runs[0])[:1])
        for params in ({"k": 7}, {"k": 8, "label": served.run.class_names[0]}, {"k": 2, "label": "1"}):
            assert client.post("/search", params=params, files=query).status_code == 200
        assert compiled == []
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
        served.close()
