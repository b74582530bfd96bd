"""Query maps in runs (``retrieval.query_map``) and mAP beside recall@K, on one pair of tiny three-session
finetune runs that differ only in the switch (``none`` and ``procrustes``).

Every number a run reports is recomputed here by hand in numpy from what the run stored: the session
checkpoints' models and gallery parts, and the maps in ``checkpoints/query_maps``.  A query of model i
reaches the rows model j made through q -> (q A_i + b_i) A_{i-1} + b_{i-1} ... down to j, written out
step by step below, so a map left out, applied to the newest part, or composed in the wrong order gives
other numbers."""

import json
import os
import shutil

import numpy as np
import pytest
from PIL import Image

from cvs_jax import export, info, search
from cvs_jax.engine import runner
from cvs_jax.engine.context_builder import build_context
from cvs_jax.errors import CheckpointError
from cvs_jax.retrieval import query_maps
from cvs_jax.rundir import paths
from cvs_jax.rundir.checkpoint import Checkpoints
from cvs_jax.rundir.gallery import Gallery
from cvs_jax.rundir.run_log import RunLog
from cvs_jax.testing.tiny_data import tiny_config

SESSIONS = 3
KS = (1, 2, 4)


@pytest.fixture(scope="module")
def runs(manual_dir, tmp_path_factory):
    """``{kind: (config, workdir, results)}`` and a context on the same config (the protocol's queries
    and the run's embedder), in a scratch workdir."""
    root = tmp_path_factory.mktemp("qmap")
    out = {}
    for kind in ("none", "procrustes"):
        c = tiny_config(manual_dir, root, sessions=SESSIONS)
        c.retrieval.query_map = kind
        wd = str(root / kind)
        out[kind] = (c, wd, runner.run(c, wd))
    scratch = str(root / "ctx")
    os.makedirs(scratch)
    ctx = build_context(out["procrustes"][0], scratch, RunLog(scratch))
    yield out, ctx, root
    ctx.close()


def _models(wd):
    ck = Checkpoints(paths.sessions_dir(wd), max_to_keep=None)
    models = [ck.restore(i, {"variables": None})["variables"] for i in range(SESSIONS)]
    gallery = Gallery.restore(ck, SESSIONS - 1, 8)
    ck.close()
    return models, gallery


def _stored_maps(wd):
    """{s: (A, b)} read from the npz files themselves."""
    out = {}
    for s in range(1, SESSIONS):
        with np.load(paths.query_map_file(wd, s)) as d:
            out[s] = (d["matrix"], d["bias"])
    return out


def _unit(x):
    x = np.asarray(x, np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _mapped(q, maps, i, j):
    """Model i's queries in model j's space: map i first, then i - 1, ..., down to j + 1."""
    out = _unit(q)
    for s in range(i, j, -1):
        a, b = maps[s]
        out = out @ a + b
    return out


def _scores(q, parts, maps, i):
    """Cosine scores [Q, N] of model i's queries against the parts' rows (gallery order), each part j
    scored with the queries mapped down to j (``maps`` empty: the plain search)."""
    cols = []
    for j, rows in parts:
        qj = _mapped(q, maps, i, j) if maps else _unit(q)
        cols.append(_unit(qj) @ _unit(rows).T)
    return np.concatenate(cols, axis=1)


def _ranking(scores):
    """Rows best first, ties to the lower row."""
    rows = np.broadcast_to(np.arange(scores.shape[1]), scores.shape)
    return np.lexsort((rows, -scores), axis=1)


def _recall(scores, q_labels, g_labels):
    top = np.asarray(g_labels)[_ranking(scores)[:, : max(KS)]]
    hits = top == np.asarray(q_labels)[:, None]
    return {str(k): float(np.mean(hits[:, :k].any(axis=1))) for k in KS}


def _recall_within_ties(got, scores, q_labels, g_labels, eps=5e-7):
    """``got`` (a run's recall@K) lies between the recall@K with the relevant rows moved behind and ahead of
    every score within ``eps``: the tiny net's near-duplicate rows tie at float32's resolution, so their
    order is the search's rounding (the embedder's batch bucket, the device top-K against numpy)."""
    low, high = (_recall(scores + sign * eps * _relevant(q_labels, g_labels), q_labels, g_labels) for sign in (-1, 1))
    for k in got:
        assert low[k] - 1e-12 <= got[k] <= high[k] + 1e-12, (k, got[k], low[k], high[k])


def _relevant(q_labels, g_labels):
    return np.asarray(g_labels)[None, :] == np.asarray(q_labels)[:, None]


def _map_bounds(scores, q_labels, g_labels, eps=5e-7):
    """mAP over the whole ranking, bracketed: the tiny net's rows are near-duplicates whose cosine
    scores differ by about float32's resolution (~1e-7; 1e-5 apart they span mAP 0.24..0.40), so their
    order is the float32 search's rounding.  Relevant rows moved ahead of (behind) every score within
    ``eps`` give the highest (lowest) mAP any such order gives."""
    rel = np.asarray(g_labels)[None, :] == np.asarray(q_labels)[:, None]
    out = []
    for sign in (-1, 1):
        order = _ranking(scores + sign * eps * rel)
        r = np.take_along_axis(rel, order, axis=1).astype(np.float64)
        n = r.sum(axis=1)
        ap = (r * np.cumsum(r, axis=1) / np.arange(1, r.shape[1] + 1)).sum(axis=1)
        out.append(float(np.mean(ap[n > 0] / n[n > 0])))
    return tuple(out)


def _session_scores(ctx, wd, maps, s):
    """Session s's test queries (embedded by model s) against the gallery parts of sessions <= s."""
    models, gallery = _models(wd)
    idx = ctx.proto.test_queries(s)
    q = ctx.embed(models[s], ctx.proto.test_images(idx))
    parts = [p for p in gallery.parts if p.session <= s]
    scores = _scores(q, [(p.session, p.embeddings) for p in parts], maps, s)
    return scores, ctx.proto.test_labels[idx], np.concatenate([p.labels for p in parts])


def _matrix_by_hand(ctx, wd, maps, shift=0.0):
    """The compatibility matrix scored in numpy; ``shift`` moves each query's relevant rows by that much
    (``_within_ties``: +-eps brackets the near-ties whose order is float32 rounding)."""
    models, gallery = _models(wd)
    last = ctx.proto.test_queries(SESSIONS - 1)
    labels = ctx.proto.test_labels[last]
    m = np.full((SESSIONS, SESSIONS), np.nan)
    for i in range(SESSIONS):
        q = ctx.embed(models[i], ctx.proto.test_images(last))
        for j in range(i + 1):
            part = next(p for p in gallery.parts if p.session == j)
            keep = np.isin(labels, part.labels)
            scores = _scores(q[keep], [(j, part.embeddings)], maps, i)
            scores = scores + shift * _relevant(labels[keep], part.labels)
            m[i, j] = _recall(scores, labels[keep], part.labels)["1"]
    return m


def _matrix_within_ties(m, ctx, wd, maps, eps=5e-7):
    """Every cell of ``m`` lies between the numpy scoring with the relevant rows moved behind and ahead of
    every score within ``eps`` (as ``_recall_within_ties``: the run embeds its queries in other batch
    buckets than ``ctx.embed`` here, so a near-tie can fall either way: seen on one 2-core host, 1 of 40
    queries of model 1 on its own rows)."""
    low, high = (_matrix_by_hand(ctx, wd, maps, sign * eps) for sign in (-1, 1))
    assert np.array_equal(np.isnan(m), np.isnan(low))
    ok = np.isnan(m) | ((low - 1e-12 <= m) & (m <= high + 1e-12))
    assert ok.all(), (m, low, high)


def _flips_by_hand(ctx, wd, maps, shifts=(0.0, 0.0)):
    """NFR of each update i-1 -> i: the last session's queries of classes in parts < i, top-1 right with
    model i-1 and wrong with model i, both searching those parts (each through its chain); ``shifts``
    moves the relevant rows of the model before and after the update (``_flips_within_ties``)."""
    models, gallery = _models(wd)
    last = ctx.proto.test_queries(SESSIONS - 1)
    labels = ctx.proto.test_labels[last]
    out = []
    for i in range(1, SESSIONS):
        parts = [p for p in gallery.parts if p.session < i]
        g_labels = np.concatenate([p.labels for p in parts])
        keep = np.isin(labels, g_labels)
        right = []
        for m, shift in zip((i - 1, i), shifts):
            q = ctx.embed(models[m], ctx.proto.test_images(last))[keep]
            scores = _scores(q, [(p.session, p.embeddings) for p in parts], maps, m)
            top = g_labels[_ranking(scores + shift * _relevant(labels[keep], g_labels))[:, 0]]
            right.append(top == labels[keep])
        out.append(float(np.mean(right[0] & ~right[1])))
    return out


def _flips_within_ties(got, ctx, wd, maps, eps=5e-7):
    """Each update's NFR lies between the fewest flips (the model before ahead on near-ties, the model
    after behind) and the most, as ``_matrix_within_ties`` brackets recall."""
    low = _flips_by_hand(ctx, wd, maps, (-eps, eps))
    high = _flips_by_hand(ctx, wd, maps, (eps, -eps))
    assert all(lo - 1e-12 <= g <= hi + 1e-12 for g, lo, hi in zip(got, low, high)), (got, low, high)
    assert len(got) == len(low) == SESSIONS - 1


def _matrix(results):
    return np.array([[np.nan if v is None else v for v in row] for row in results["compatibility_recall1"]])


def test_maps_change_recall_only_where_they_apply(runs):
    """Session 1 (no older part) and the part the newest model made score as without maps; the older
    parts are scored through the maps, and every number equals the scoring by hand."""
    out, ctx, _ = runs
    (_, wd_none, plain), (_, wd_map, mapped) = out["none"], out["procrustes"]
    assert plain["per_session"][0]["recall"] == mapped["per_session"][0]["recall"]
    assert plain["per_session"][0]["map"] == mapped["per_session"][0]["map"]
    m_plain, m_map = _matrix(plain), _matrix(mapped)
    np.testing.assert_array_equal(np.diag(m_plain), np.diag(m_map))  # each model on its own rows: no map
    below = np.tril_indices(SESSIONS, -1)
    assert not np.array_equal(m_plain[below], m_map[below])  # the maps reach the older parts
    maps = _stored_maps(wd_map)
    _matrix_within_ties(m_map, ctx, wd_map, maps)
    _matrix_within_ties(m_plain, ctx, wd_none, {})
    _flips_within_ties(mapped["negative_flip_rate"], ctx, wd_map, maps)
    _flips_within_ties(plain["negative_flip_rate"], ctx, wd_none, {})
    for s in range(1, SESSIONS):
        _recall_within_ties(mapped["per_session"][s]["recall"], *_session_scores(ctx, wd_map, maps, s))
        _recall_within_ties(plain["per_session"][s]["recall"], *_session_scores(ctx, wd_none, {}, s))
    assert mapped["query_map"] == "procrustes" and plain["query_map"] == "none"


def test_map_per_session_is_brute_force_map(runs):
    """results.json's mAP per session equals numpy's AP over the whole ranking (mapped parts for the run
    with maps), and average_map is their mean."""
    out, ctx, _ = runs
    for kind in ("none", "procrustes"):
        _, wd, results = out[kind]
        maps = _stored_maps(wd) if kind != "none" else {}
        for s in range(SESSIONS):
            low, high = _map_bounds(*_session_scores(ctx, wd, maps, s))
            assert low - 1e-12 <= results["per_session"][s]["map"] <= high + 1e-12, (kind, s)
            assert high - low < 0.02  # narrow: a map left out or misapplied moves mAP by more (test above)
        mean = np.mean([r["map"] for r in results["per_session"]])
        assert results["average_map"] == pytest.approx(mean, abs=1e-12)


def test_maps_are_fitted_on_the_session_images_of_a_method_without_memory(runs):
    """finetune keeps no replay memory: map s is Procrustes from model s to model s - 1 on session s's new
    training images; a run with query_map=none stores no map."""
    out, ctx, _ = runs
    _, wd, _ = out["procrustes"]
    models, _ = _models(wd)
    maps = _stored_maps(wd)
    for s in range(1, SESSIONS):
        images = ctx.proto.train_images(np.asarray(ctx.proto.plan.sessions[s].train, np.int64))
        want = query_maps.fit_query_map("procrustes", ctx.embed(models[s], images), ctx.embed(models[s - 1], images))
        np.testing.assert_allclose(maps[s][0], want.matrix, atol=1e-12)
        np.testing.assert_array_equal(maps[s][1], np.zeros(8))
    assert not os.path.exists(os.path.join(out["none"][1], paths.QUERY_MAPS))


def test_rerun_after_losing_the_last_session_loads_the_stored_maps(runs, tmp_path):
    """A crash during the last session: the rerun reads the earlier sessions' maps back (without them
    the last session's queries could not reach part 1) and gives the uninterrupted results."""
    out, _, _ = runs
    c, wd, full = out["procrustes"]
    copy = str(tmp_path / "rerun")
    shutil.copytree(wd, copy)
    shutil.rmtree(paths.session_dir(copy, SESSIONS - 1))
    shutil.rmtree(paths.progress_dir(copy))
    os.remove(paths.results_file(copy))
    os.remove(paths.query_map_file(copy, SESSIONS - 1))
    resumed = runner.run(c, copy)
    full = json.loads(json.dumps(full))
    for r in resumed["per_session"] + full["per_session"]:
        r.pop("seconds")
    assert resumed == full
    for s in range(1, SESSIONS):
        with np.load(paths.query_map_file(copy, s)) as a, np.load(paths.query_map_file(wd, s)) as b:
            np.testing.assert_array_equal(a["matrix"], b["matrix"])


def test_search_json_scores_each_part_through_its_chain(runs, tmp_path, capsys):
    """``search --json`` on the run with maps: the hits and scores of the scoring by hand (the newest
    model's query, mapped down to each part's model); ``info`` names the maps and both AC tie rules."""
    out, ctx, _ = runs
    _, wd, results = out["procrustes"]
    idx = ctx.proto.test_queries(SESSIONS - 1)[:4]
    images = np.asarray(ctx.proto.test_images(idx)[: len(idx)])
    files = []
    for n, im in enumerate(images):
        files.append(str(tmp_path / f"q{n}.png"))
        Image.fromarray(im[..., 0]).save(files[-1])
    k = 7
    assert search.search_or_add(wd, files, k=k, as_json=True) == 0
    answers = json.loads(capsys.readouterr().out)
    models, gallery = _models(wd)
    q = ctx.embed(models[-1], images)
    scores = _scores(q, [(p.session, p.embeddings) for p in gallery.parts], _stored_maps(wd), SESSIONS - 1)
    best = -np.sort(-scores, axis=1)[:, :k]
    for n, answer in enumerate(answers):
        rows, got = [h["row"] for h in answer["hits"]], [h["score"] for h in answer["hits"]]
        np.testing.assert_allclose(got, scores[n, rows], atol=1e-5)  # each hit's score: its part's mapped query
        np.testing.assert_allclose(got, best[n], atol=1e-5)  # and they are the k best (near-ties in any order)
    with open(paths.report_file(wd), encoding="utf-8") as f:  # the run's page shows mAP beside recall
        page = f.read()
    assert f'data-map="AR">{100 * results["average_map"]:.2f}<' in page
    assert f'data-map="{SESSIONS}">{100 * results["per_session"][-1]["map"]:.2f}<' in page
    assert "through the run's procrustes query maps" in page
    described = info.describe(wd)
    assert described["query_map"] == "procrustes" and described["query_map_sessions"] == [2, 3]
    assert described["average_map"] == results["average_map"]
    assert described["compatibility_ac"] == results["compatibility_ac"]
    assert described["compatibility_ac_ties_pass"] == results["compatibility_ac_ties_pass"]


def test_compare_tabulates_map_and_both_ac_rules(runs, tmp_path):
    """compare's JSON and table carry each run's mAP (results.json's average_map, in %) and AC under both
    tie rules; ``finetune@procrustes`` is the run with the map, paired with plain finetune."""
    out, _, _ = runs
    cmp_dir = tmp_path / "cmp"
    entries = {"finetune": out["none"], "finetune@procrustes": out["procrustes"]}
    for entry, (_, wd, _) in entries.items():
        shutil.copytree(wd, cmp_dir / "seed0" / entry)
    runner.run_comparison(out["none"][0], str(cmp_dir), list(entries), [0], tabulate=True)
    with open(cmp_dir / "comparison.json") as f:
        written = json.load(f)
    for run in written["runs"]:
        results = entries[run["method"]][2]
        assert run["mAP"] == pytest.approx(100 * results["average_map"], abs=1e-9)
        assert run["AC"] == pytest.approx(100 * results["compatibility_ac"], abs=1e-9)
        assert run["AC ties pass"] == pytest.approx(100 * results["compatibility_ac_ties_pass"], abs=1e-9)
    summary = {e["method"]: e for e in written["summary"]}
    assert summary["finetune@procrustes"]["mAP"]["mean"] == pytest.approx(100 * out["procrustes"][2]["average_map"])
    assert [(p["a"], p["b"]) for p in written["pairs"]] == [("finetune@procrustes", "finetune")]
    table = (cmp_dir / "comparison.md").read_text()
    header = next(line for line in table.splitlines() if line.startswith("| method | memory | AR@1"))
    assert "| mAP |" in header
    differ = any(r["compatibility_ac"] != r["compatibility_ac_ties_pass"] for _, _, r in entries.values())
    assert ("AC ties pass" in header) == differ


def test_export_writes_the_chain_of_each_model_session(runs, tmp_path):
    """export's query_maps.npz: per model session j (1-based) the composed map from the newest model's
    space to j's, the step-by-step chain applied to the identity; a run without maps writes none."""
    out, _, _ = runs
    _, wd, _ = out["procrustes"]
    written = export.export(wd, str(tmp_path / "exp"))
    assert written["query_map"] == "procrustes"
    maps = _stored_maps(wd)
    with np.load(tmp_path / "exp" / export.QUERY_MAPS) as d:
        for j in range(SESSIONS):
            a = np.eye(8)
            b = np.zeros(8)
            for s in range(SESSIONS - 1, j, -1):  # map SESSIONS - 1 first, down to j + 1
                a, b = a @ maps[s][0], b @ maps[s][0] + maps[s][1]
            np.testing.assert_allclose(d[f"matrix_{j + 1}"], a, atol=1e-12)
            np.testing.assert_allclose(d[f"bias_{j + 1}"], b, atol=1e-12)
    export.export(out["none"][1], str(tmp_path / "plain"))
    assert not os.path.exists(tmp_path / "plain" / export.QUERY_MAPS)


def test_a_run_missing_a_map_is_refused_not_scored_without_it(runs, tmp_path, capsys):
    """A run with maps whose file of one session is gone: search and a rerun stop with one error line
    (scoring that part without its map would change every number silently); nothing is written."""
    out, ctx, _ = runs
    c, wd, _ = out["procrustes"]
    copy = str(tmp_path / "gap")
    shutil.copytree(wd, copy)
    os.remove(paths.query_map_file(copy, 1))
    image = str(tmp_path / "q.png")
    Image.fromarray(np.asarray(ctx.proto.test_images(ctx.proto.test_queries(0))[:1])[0, ..., 0]).save(image)
    assert search.search_or_add(copy, [image], as_json=True) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "retrieval.query_map=procrustes but holds no query map for session(s) [2]" in err[0]
    os.remove(paths.results_file(copy))
    with pytest.raises(CheckpointError, match=r"no query map for session\(s\) \[2\]"):
        runner.run(c, copy)
    assert not os.path.exists(paths.results_file(copy))
