"""The server in-process (FastAPI's TestClient): its hits are ``search --json``'s, its adds are
``search --add``'s, every bad request gets one 4xx line, and a newer session is switched to between
batches with every stored row kept."""

import asyncio
import concurrent.futures
import glob
import json
import os
import shutil
import threading

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from cvs_jax import search
from cvs_jax.retrieval import run_reader
from cvs_jax.retrieval.run_reader import ADDED_BASE
from cvs_jax.rundir import paths
from cvs_jax.serve.app import Limits, create_app
from cvs_jax.serve.batcher import LONE
from cvs_jax.serve.state import Query, Served
from cvs_jax.testing import image_folders, reading_probe
from cvs_jax.testing.image_folders import new_photo


def _client(wd, **kwargs):
    served = Served(wd, poll_s=0, max_wait_s=0.02)
    return served, TestClient(create_app(served, **kwargs))


_files = image_folders.uploads


def _post(client, paths, route="/search", headers=None, **params):
    return client.post(route, params=params, files=_files(paths), headers=headers)


def _cli(wd, paths, k, capsys):
    capsys.readouterr()
    assert search.search_or_add(wd, paths, k=k, as_json=True) == 0
    return json.loads(capsys.readouterr().out)


def _same_hits(api: list[dict], cli: list[dict], workdir: str) -> None:
    """The server's hits are the CLI's, with each source relative to the workdir (no server folder)."""
    assert [h["row"] for h in api] == [h["row"] for h in cli]
    np.testing.assert_allclose([h["score"] for h in api], [h["score"] for h in cli], atol=1e-5)
    for a, c in zip(api, cli):
        shown = os.path.relpath(c["source"], workdir) if os.path.isabs(c["source"]) else c["source"]
        assert not os.path.isabs(a["source"]) and a["source"] == shown
        assert {k: v for k, v in a.items() if k not in ("score", "source")} == {
            k: v for k, v in c.items() if k not in ("score", "source")
        }


def _photos(wd, split="train"):
    return sorted(glob.glob(os.path.join(os.path.dirname(wd), "s1", split, "*", "*")))


@pytest.fixture(scope="module")
def served_one(photo_runs):
    served, client = _client(photo_runs[0])
    yield served, client
    served.close()


def test_hits_equal_search_json(photo_runs, served_one, capsys):
    wd = photo_runs[0]
    queries = _photos(wd)[::9] + _photos(wd, "test")[:3]
    served, client = served_one
    r = _post(client, queries, k=5)
    assert r.status_code == 200, r.text
    body = r.json()
    cli = _cli(wd, queries, 5, capsys)
    assert body["model_session"] == 1 and body["gallery_rows"] == len(run_reader.Run(wd).rows)
    for got, want in zip(body["queries"], cli):
        assert got["model_session"] == want["model_session"] == 1
        _same_hits(got["hits"], want["hits"], wd)


def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(photo_runs, served_one, capsys):
    wd = photo_runs[0]
    served, client = served_one
    queries = _photos(wd)[1::5][:8]
    ks = [1 + i % 4 for i in range(len(queries))]
    with concurrent.futures.ThreadPoolExecutor(len(queries)) as pool:
        answers = list(pool.map(lambda qk: _post(client, [qk[0]], k=qk[1]), zip(queries, ks)))
    cli = _cli(wd, queries, 4, capsys)
    for r, k, want in zip(answers, ks, cli):
        assert r.status_code == 200, r.text
        _same_hits(r.json()["queries"][0]["hits"], want["hits"][:k], wd)


def test_a_stored_image_gets_its_own_row_first_with_its_stored_score(photo_runs, served_one):
    """The stored image (``/thumb/<row>.png`` serves it losslessly; a photo folder's store keeps a JPEG
    re-encoding of each file, so the file itself differs slightly) finds its own row with score 1."""
    served, client = served_one
    run = served.run
    for row in range(0, len(run.gallery), 7):
        thumb = client.get(f"/thumb/{row}.png")
        assert thumb.status_code == 200
        r = client.post("/search", params={"k": 3}, files=[("file", ("stored.png", thumb.content))])
        hits = r.json()["queries"][0]["hits"]
        top = [h["row"] for h in hits if h["score"] >= hits[0]["score"] - 1e-6]  # up to exact ties
        assert row in top
        stored = np.asarray(run.rows.embeddings[row : row + 1], np.float64)[0]
        query = np.asarray(run.embed(run.row_images([row])[0][None])[0], np.float64)
        stored_score = float(stored @ query / np.linalg.norm(stored) / np.linalg.norm(query))
        assert abs(hits[0]["score"] - stored_score) <= 1e-5 and abs(stored_score - 1.0) <= 1e-5


def test_added_rows_are_found_by_the_api_and_the_cli(run_copy, tmp_path, capsys):
    served, client = _client(run_copy)
    n = len(served.run.gallery)
    photo = new_photo(tmp_path / "new.png", "bee", seed=5)
    r = _post(client, [photo], "/add", label="bee")
    assert r.status_code == 200, r.text
    assert r.json()["rows"] == [n] and r.json()["label"] == served.run.class_names.index("bee")
    assert r.json()["ids"] == [ADDED_BASE]
    hits = _post(client, [photo], k=3).json()["queries"][0]["hits"]
    assert hits[0]["row"] == n and hits[0]["class_name"] == "bee" and abs(hits[0]["score"] - 1.0) <= 1e-5
    assert hits[0]["id"] == ADDED_BASE and hits[0]["source"].startswith(paths.UPLOADS + os.sep)
    _same_hits(hits, _cli(run_copy, [photo], 3, capsys)[0]["hits"], run_copy)
    # the duplicate-bytes rule of search --add, both ways
    assert _post(client, [photo], "/add").status_code == 409
    assert search.search_or_add(run_copy, [photo], add=True) == 2
    # a row the CLI adds is taken in at the next poll, after the server's own
    other = new_photo(tmp_path / "other.png", "cat", seed=6)
    assert search.search_or_add(run_copy, [other], add=True, label="cat") == 0
    served.poll()
    hits = _post(client, [other], k=2).json()["queries"][0]["hits"]
    assert hits[0]["row"] == n + 1 and hits[0]["source"] == os.path.relpath(other, run_copy)
    assert client.get("/info").json()["added_rows"] == 2
    assert client.get(f"/thumb/{ADDED_BASE}.png").headers["content-type"] == "image/png"
    served.close()


def test_a_label_keeps_only_hits_of_that_class(photo_runs, served_one, capsys):
    wd = photo_runs[0]
    served, client = served_one
    query = _photos(wd)[0]
    hits = _post(client, [query], k=4, label="cat").json()["queries"][0]["hits"]
    everything = _cli(wd, [query], len(served.run.rows), capsys)[0]["hits"]
    cats = [h for h in everything if h["class_name"] == "cat"][:4]
    _same_hits(hits, [dict(h, rank=rank) for rank, h in enumerate(cats, 1)], wd)  # ranked among the class's rows


def test_each_bad_request_gets_one_4xx_line_and_the_next_query_is_answered(photo_runs, run_copy, tmp_path):
    served, client = _client(
        run_copy, token="s3cret", limits=Limits(max_upload_bytes=100_000, max_images=3, max_pixels=45 * 45)
    )
    good = _photos(photo_runs[0])[0]
    with open(good, "rb") as f:
        good_bytes = f.read()
    big = tmp_path / "big.png"
    new_photo(big)
    from PIL import Image

    Image.open(big).resize((60, 60)).save(big)  # 3600 pixels: over the limit, refused from its header
    auth = {"authorization": "Bearer s3cret"}
    cases = [
        (lambda: client.post("/search", content=b""), 400),
        (lambda: client.post("/search", content=b"not an image"), 400),
        (lambda: client.post("/search", files=[("file", ("cut.png", good_bytes[: len(good_bytes) // 2]))]), 400),
        (lambda: _post(client, [str(big)]), 413),
        (lambda: _post(client, [good] * 4), 413),
        (lambda: client.post("/search", content=b"x" * 200_000), 413),
        (lambda: client.post("/search", content=iter([good_bytes])), 411),
        (lambda: _post(client, [good], k=0), 400),
        (lambda: _post(client, [good], k=101), 400),
        (lambda: _post(client, [good], k="three"), 400),
        (lambda: _post(client, [good], label="zebra"), 400),
        (lambda: _post(client, [good], "/add"), 401),
        (lambda: _post(client, [good], "/add", headers={"authorization": "Bearer wrong"}), 401),
        (lambda: _post(client, [good], "/add", headers={"authorization": "Bearer s3cre"}), 401),
        (lambda: _post(client, [good], "/add", headers={"authorization": "Basic s3cret"}), 401),
        (lambda: _post(client, [good], "/add", headers={"authorization": "Bearer s3cret s3cret"}), 401),
        (lambda: _post(client, [good], "/add", headers=auth), 409),  # its bytes are a row of the run
        (lambda: _post(client, [new_photo(tmp_path / "n.png")], "/add", headers=auth, label="Ant"), 400),  # ant's case
        (lambda: _post(client, [new_photo(tmp_path / "n.png")], "/add", headers=auth, label="7"), 400),  # a number
        (lambda: _post(client, [new_photo(tmp_path / "n.png")], "/add", headers=auth, label="train"), 400),
        (lambda: _post(client, [new_photo(tmp_path / "n.png")], "/add", headers=auth, label=""), 400),  # was unlabelled
        (lambda: client.get("/thumb/99999.png"), 404),
        (lambda: client.get("/thumb/-1.png"), 404),
        (lambda: client.get("/etc/passwd"), 404),
    ]
    before = sorted(os.listdir(os.path.join(run_copy, "checkpoints")))
    for send, status in cases:
        r = send()
        assert r.status_code == status, (status, r.text)
        body = r.json()
        assert list(body) == ["error"] and body["error"] and "\n" not in body["error"]
        assert "Traceback" not in body["error"]
        ok = _post(client, [good], k=2)
        assert ok.status_code == 200 and len(ok.json()["queries"][0]["hits"]) == 2
    unknown = _post(client, [good], label="zebra").json()["error"]  # named as the request names it, not as a flag
    assert unknown.startswith("label 'zebra' is neither") and "known classes: " in unknown
    assert sorted(os.listdir(os.path.join(run_copy, "checkpoints"))) == before  # refused adds wrote nothing
    assert not os.path.exists(paths.uploads_dir(run_copy))
    fresh = new_photo(tmp_path / "fresh.png", seed=77)
    assert _post(client, [fresh], "/add", headers=auth, label="ant").status_code == 200  # the token admits
    lower = {"authorization": "bearer s3cret"}  # the scheme in any case (RFC 7235): it was refused
    assert _post(client, [fresh], "/add").headers.get("www-authenticate") == "Bearer"  # a 401 names its scheme
    assert (
        _post(client, [new_photo(tmp_path / "f2.png", seed=78)], "/add", headers=lower, label="ant").status_code == 200
    )
    metrics = client.get("/metrics").text
    assert 'cvs_requests_total{route="/search",status="413"} 3' in metrics
    assert "cvs_gallery_rows " in metrics and "cvs_model_session 1" in metrics
    served.close()


def _next_session_completes(photo_runs, wd):
    """What ``update`` leaves in a workdir when its session completes (the files of the updated copy)."""
    two = photo_runs[1]
    for name in (paths.CONFIG, paths.PROTOCOL, paths.RESULTS):
        shutil.copy(os.path.join(two, name), os.path.join(wd, name))
    shutil.copytree(paths.session_dir(two, 1), paths.session_dir(wd, 1))


def test_a_newer_session_is_served_with_every_stored_row_kept(photo_runs, run_copy, tmp_path, capsys):
    served, client = _client(run_copy)
    photo = new_photo(tmp_path / "added.png", "ant", seed=9)
    assert _post(client, [photo], "/add", label="ant").status_code == 200
    queries = _photos(photo_runs[0])[::13] + [photo]
    image = run_reader.load_images([queries[0]], served.run.image_shape)
    gate = threading.Event()
    served.batcher.call(gate.wait)  # the batcher is busy: what follows is queued in order
    in_flight = served.batcher.submit(Query(image, 3, None), 1)
    _next_session_completes(photo_runs, run_copy)
    new = run_reader.Run(run_copy)
    switched = served.batcher.call(lambda: served._switch(new))
    after = served.batcher.submit(Query(image, 3, None), 1)
    gate.set()
    switched.result()
    assert in_flight.result().model_session == 1  # queued before the switch: the old model
    assert after.result().model_session == 2
    served.poll()  # nothing newer: no second switch
    assert served.switches == 1 and served.model_session == 2
    body = _post(client, queries, k=6).json()
    assert body["model_session"] == 2 and body["gallery_rows"] == len(new.rows)
    for got, want in zip(body["queries"], _cli(run_copy, queries, 6, capsys)):
        _same_hits(got["hits"], want["hits"], run_copy)  # the CLI scores the stored rows: none re-embedded
    added = served.run.describe(len(new.gallery))  # the added row: after the new part, still model 1's
    assert added["model_session"] == 1 and added["source"].startswith(paths.UPLOADS + os.sep)
    assert len(served.index) == len(new.rows)
    served.close()


def test_a_bug_answers_one_500_line_is_counted_and_the_server_goes_on(photo_runs, monkeypatch, caplog):
    served = Served(photo_runs[0], poll_s=0)
    client = TestClient(create_app(served), raise_server_exceptions=False)

    def broken(run):
        raise RuntimeError("a bug in describe_run")

    monkeypatch.setattr("cvs_jax.retrieval.run_info.describe_run", broken)
    r = client.get("/info")
    assert r.status_code == 500
    assert r.json() == {"error": "internal error (RuntimeError); the server's log has the details"}
    assert "a bug in describe_run" in caplog.text  # the traceback went to the server's log, not the client
    ok = _post(client, _photos(photo_runs[0])[:1], k=2)
    assert ok.status_code == 200 and len(ok.json()["queries"][0]["hits"]) == 2
    metrics = client.get("/metrics").text
    assert 'cvs_requests_total{route="/info",status="500"} 1' in metrics
    assert 'cvs_requests_total{route="/search",status="200"} 1' in metrics
    served.close()


def test_requests_already_received_are_batched_even_after_a_run_of_lone_queries(photo_runs, served_one):
    """Many requests read in one turn of the event loop (bodies already buffered, as under load, after the
    loop ran a lone query itself) are counted before any of them decides to run alone: they are batched.
    Without the yield in ``/search`` each ran alone in turn and the server served one query at a time."""
    wd = photo_runs[0]
    served, _ = served_one
    app = create_app(served)
    files = _files(_photos(wd)[:1])

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            for _ in range(LONE + 1):  # a run of lone queries: the next search may run on the event loop
                assert (await c.post("/search", params={"k": 3}, files=files)).status_code == 200
            assert served.batcher.batch_sizes[-LONE:] == [1] * LONE
            rs = await asyncio.gather(*(c.post("/search", params={"k": 3}, files=files) for _ in range(12)))
            assert all(r.status_code == 200 for r in rs)

    asyncio.run(go())
    assert max(served.batcher.batch_sizes[-12:]) > 1, served.batcher.batch_sizes[-12:]


def test_reading_a_photo_run_never_imports_tfds(photo_runs, tmp_path):
    """search (and --html, --add), info, export and the server's start-up, /search, thumbnails and /add on a
    photo run, in a fresh process: none imports tensorflow_datasets or TensorFlow (they found the run's
    stores through the TFDS builders before the builders' file half: 0.1-0.35 s of CPU, ~10 MB per process)."""
    wd = str(tmp_path / "run")
    shutil.copytree(photo_runs[0], wd)
    query = sorted(glob.glob(os.path.join(os.path.dirname(photo_runs[0]), "s1", "test", "*", "*")))[0]
    new = (new_photo(tmp_path / "new1.png", "ant", seed=41), new_photo(tmp_path / "new2.png", "bee", seed=42))
    loaded = reading_probe.heavy_modules_by_step(wd, query, new, str(tmp_path / "out"))
    assert loaded == {step: [] for step in reading_probe.STEPS}
