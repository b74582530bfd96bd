"""The export of a tiny ``joint`` run (rows re-embedded by the newest model, arrived earlier) plus two
``--add`` rows: files, round trip, and a faiss index that answers as ``cvs_jax.search`` does."""

import csv
import json
import os
import shutil
import subprocess
import sys

import flax.serialization
import flax.traverse_util
import numpy as np
import pytest
import safetensors.numpy
from absl import flags
from PIL import Image

from cvs_jax import export, search
from cvs_jax.data import sources
from cvs_jax.engine import runner
from cvs_jax.retrieval import added_session, run_reader, stablehlo_export
from cvs_jax.rundir import paths
from cvs_jax.rundir import workdir as workdir_lib
from cvs_jax.testing import reading_probe
from cvs_jax.testing.tiny_data import tiny_config

# The "Export to an ANN index" snippet of docs/your-images.md, run verbatim by test_faiss_answers_as_search
# (given ``export_dir`` and ``query_paths``).
FAISS_SNIPPET = """\
import faiss
import numpy as np
from cvs_jax import export

exported = export.load(export_dir)  # the folder written by python -m cvs_jax.export
rows = np.load(f"{export_dir}/embeddings.npy")  # float32 [N, D], raw as stored
faiss.normalize_L2(rows)  # cosine similarity = inner product of unit vectors
index = faiss.IndexFlatIP(rows.shape[1])
index.add(rows)
queries = exported.embed(query_paths)  # image files (or uint8 arrays), prepared as the gallery was
faiss.normalize_L2(queries)
scores, ids = index.search(queries, 5)  # ids are rows.csv's "row": path, class, sessions
"""


@pytest.fixture(scope="module")
def exported_run(fashion_idx, tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    manual = fashion_idx(60, 10)
    c = tiny_config(manual, root, method="joint", sessions=3)
    wd = str(root / "run")
    runner.run(c, wd)
    data = sources.load_dataset(c.data.name, data_dir=c.data.data_dir, manual_dir=c.data.manual_dir)
    added = []
    for i in range(2):
        added.append(str(root / f"added{i}.png"))
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (28, 36), dtype=np.uint8)).save(added[-1])
    assert search.search_or_add(wd, added, add=True, label="1") == 0
    out = str(root / "export")
    assert _cli(["--workdir", wd, "--out", out]) == 0
    return wd, out, data


def _cli(args: list[str]) -> int:
    """The command as ``python -m cvs_jax.export ARGS`` runs it (absl flags, then ``main``)."""
    fv = flags.FlagValues()
    export.define_flags(fv)
    return export.main(fv(["export", *args]), fv)


def _query_files(images: np.ndarray, directory) -> list[str]:
    os.makedirs(directory, exist_ok=True)
    paths = []
    for i, image in enumerate(images):
        paths.append(os.path.join(directory, f"q{i:03d}.png"))
        Image.fromarray(image[..., 0]).save(paths[-1])
    return paths


def test_export_round_trip(exported_run):
    wd, out, data = exported_run
    run = run_reader.Run(wd)
    assert sorted(os.listdir(out)) == sorted(export.FILES)
    rows = run.rows
    emb = np.load(os.path.join(out, "embeddings.npy"))
    assert emb.dtype == np.float32 and emb.shape == (len(run.gallery) + 2, run.config.model.embed_dim)
    np.testing.assert_array_equal(emb, np.asarray(rows.embeddings))  # raw, in gallery order, then --add rows
    with open(os.path.join(out, "rows.csv"), newline="") as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == list(export.ROW_COLUMNS) and len(table) == emb.shape[0]
    assert [int(r["row"]) for r in table] == list(range(len(table)))
    assert [int(r["id"]) for r in table] == run.ids.tolist()  # the ids search --json and the server show
    np.testing.assert_array_equal([int(r["label"]) for r in table], rows.labels)
    np.testing.assert_array_equal([int(r["arrival_session"]) for r in table], rows.arrival + 1)
    np.testing.assert_array_equal([int(r["model_session"]) for r in table], rows.model + 1)
    assert [r["class_name"] for r in table] == [run.class_name(int(label)) for label in rows.labels]
    assert [r["path"] for r in table] == [run.source(j) for j in range(len(table))]
    # joint re-embeds everything with the newest model; the images arrived over all three sessions
    assert set(rows.model[: len(run.gallery)]) == {2} and set(rows.arrival[: len(run.gallery)]) == {0, 1, 2}
    assert [r["path"] for r in table[-2:]] == run.added_sources and table[-1]["class_name"] == run.class_names[1]
    info = json.load(open(os.path.join(out, "export.json")))
    assert info["format_version"] == export.FORMAT_VERSION and info["session"] == run.session + 1 == 3
    assert info["image_shape"] == list(run.image_shape) and info["embed_dim"] == run.config.model.embed_dim
    with open(os.path.join(out, "model.msgpack"), "rb") as f:
        stored = flax.serialization.msgpack_restore(f.read())
    stored, want = (flax.traverse_util.flatten_dict(v) for v in (stored, run.variables))
    assert stored.keys() == want.keys()
    for key, value in want.items():
        np.testing.assert_array_equal(stored[key], value)
    # the loader embeds as search does: files, non-square pictures and stored-shape arrays alike
    loaded = export.load(out)
    images = data.test.images[:20]
    np.testing.assert_array_equal(loaded.embed(images), run.embed(images))
    wide = [np.pad(im[..., 0], ((0, 0), (3, 3))) for im in images[:3]]  # centre-cropped back to the image
    np.testing.assert_array_equal(loaded.embed(wide), run.embed(images[:3]))
    np.testing.assert_array_equal(loaded.embeddings(), emb)
    assert loaded.rows() == table


def test_faiss_snippet_is_the_docs_one():
    """The snippet run below is the one docs/your-images.md shows, character for character."""
    page = os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "your-images.md"
    )
    with open(page, encoding="utf-8") as f:
        assert FAISS_SNIPPET in f.read()


def test_faiss_answers_as_search(exported_run, tmp_path):
    faiss = pytest.importorskip("faiss")
    wd, out, data = exported_run
    query_paths = _query_files(data.test.images[:100], tmp_path / "queries")
    scope = {"export_dir": out, "query_paths": query_paths}
    exec(FAISS_SNIPPET, scope)  # noqa: S102 -- the docs page's snippet, verbatim
    scores, ids = scope["scores"], scope["ids"]
    assert isinstance(scope["index"], faiss.IndexFlatIP) and ids.shape == (100, 5)
    run = run_reader.Run(wd)
    hits = run.search(run_reader.load_images(query_paths, run.image_shape), k=1)
    for q, (h,) in enumerate(hits):
        assert abs(float(scores[q, 0]) - h["score"]) < 1e-5, (q, scores[q, 0], h)
        if int(ids[q, 0]) != h["row"]:  # an exact tie may be broken either way: the rows score the same
            emb = np.load(os.path.join(out, "embeddings.npy"))
            emb = emb / np.linalg.norm(emb, axis=1, keepdims=True)
            query = run.embed(run_reader.load_images([query_paths[q]], run.image_shape))[0]
            query = query / np.linalg.norm(query)
            assert abs(float(emb[int(ids[q, 0])] @ query) - float(emb[h["row"]] @ query)) < 1e-5, (q, h)


def test_out_must_be_new_or_empty(exported_run, tmp_path, capsys):
    wd, out, _ = exported_run
    assert _cli(["--workdir", wd, "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out") and "--overwrite" in err and err.count("\n") == 1
    again = str(tmp_path / "again")
    os.makedirs(again)
    with open(os.path.join(again, "old.txt"), "w") as f:
        f.write("x")
    assert _cli(["--workdir", wd, "--out", again]) == 2
    assert _cli(["--workdir", wd, "--out", os.path.join(again, "old.txt"), "--overwrite"]) == 2
    assert "is a file" in capsys.readouterr().err
    assert _cli(["--workdir", wd, "--out", again, "--overwrite"]) == 0
    np.testing.assert_array_equal(
        np.load(os.path.join(again, "embeddings.npy")), np.load(os.path.join(out, "embeddings.npy"))
    )
    assert _cli(["--workdir", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "holds no cvs_jax run" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "x")
    with pytest.raises(export.ExportError, match="not a readable export"):
        export.load(str(tmp_path))


# Run in a fresh interpreter from another folder, with cvs_jax and flax made unimportable: the artifact
# needs jax, numpy and safetensors only.
STABLEHLO_READER = """\
import importlib.abc, json, sys

class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("cvs_jax", "flax"):
            raise ImportError(f"{name} imported by the StableHLO reader")

sys.meta_path.insert(0, _Refuse())
import jax
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file

out, images, result = sys.argv[1:4]
embed = jax.export.deserialize(open(f"{out}/embed.stablehlo", "rb").read())
with safe_open(f"{out}/weights.safetensors", "np") as f:
    meta = f.metadata()
weights, images = load_file(f"{out}/weights.safetensors"), np.load(images)
np.save(result, np.asarray(embed.call(weights, images)))
np.save(result + ".one.npy", np.asarray(embed.call(weights, images[:1])))  # another batch size
mods = sorted(m for m in sys.modules if m.split(".")[0] in ("cvs_jax", "flax"))
image_aval = embed.in_avals[-1]
report = {"meta": meta, "in_shape": str(image_aval.shape), "in_dtype": str(image_aval.dtype), "mods": mods}
json.dump({**report, "platforms": list(embed.platforms)}, open(result + ".json", "w"))
"""


def test_stablehlo_runs_without_cvs_jax(exported_run, tmp_path):
    """``--format stablehlo``: a process with jax alone embeds as ``search`` does (within 1e-5), at two
    batch sizes (the batch is symbolic), from the weights file (zeroed weights embed differently)."""
    wd, _, data = exported_run
    out = str(tmp_path / "hlo")
    assert _cli(["--workdir", wd, "--out", out, "--format", "stablehlo"]) == 0
    assert sorted(os.listdir(out)) == sorted(export.FILES + stablehlo_export.FILES)
    modes = {name: os.stat(os.path.join(out, name)).st_mode & 0o777 for name in os.listdir(out)}
    assert len(set(modes.values())) == 1, modes  # the weights were 0600, the rest as the umask allows
    run = run_reader.Run(wd)
    images = data.test.images[:7]
    np.save(tmp_path / "images.npy", images)
    zeroed = str(tmp_path / "zeroed")  # the same function fed other weights must answer otherwise
    os.makedirs(zeroed)
    os.symlink(os.path.join(out, stablehlo_export.FUNCTION), os.path.join(zeroed, stablehlo_export.FUNCTION))
    weights = safetensors.numpy.load_file(os.path.join(out, stablehlo_export.WEIGHTS))
    safetensors.numpy.save_file(
        {k: np.zeros_like(v) if "kernel" in k else v for k, v in weights.items()},
        os.path.join(zeroed, stablehlo_export.WEIGHTS),
    )
    script = tmp_path / "reader.py"
    script.write_text(STABLEHLO_READER)
    for folder, result in ((out, "a.npy"), (zeroed, "z.npy")):
        subprocess.run(
            [sys.executable, str(script), folder, str(tmp_path / "images.npy"), str(tmp_path / result)],
            check=True,
            cwd=str(tmp_path),
            env={**os.environ, "PYTHONPATH": ""},
        )
    got, report = np.load(tmp_path / "a.npy"), json.load(open(tmp_path / "a.npy.json"))
    np.testing.assert_allclose(got, run.embed(images), atol=1e-5, rtol=0)
    assert np.abs(np.load(tmp_path / "z.npy") - got).max() > 1e-3
    assert report["mods"] == [] and report["in_dtype"] == "uint8" and set(report["platforms"]) == {"cpu", "cuda"}
    assert report["in_shape"] == "(B, {}, {}, {})".format(*run.image_shape)
    np.testing.assert_allclose(np.load(tmp_path / "a.npy.one.npy"), got[:1], atol=1e-5, rtol=0)
    meta = report["meta"]
    assert meta["architecture"] == run.config.model.name and meta["session"] == "3"
    assert meta["embed_dim"] == str(run.config.model.embed_dim) and json.loads(meta["input_shape"])[1:] == list(
        run.image_shape
    )
    prep = json.loads(meta["preprocessing"])
    assert prep["mean"] == list(run.config.data.mean) and prep["std"] == list(run.config.data.std)
    assert json.load(open(os.path.join(out, "export.json")))["stablehlo"]["files"] == list(stablehlo_export.FILES)
    # the search command's own query embeddings: files prepared at the stored shape, then the same vectors
    np.testing.assert_allclose(got[:3], export.load(out).embed(images[:3]), atol=1e-5, rtol=0)


def test_the_config_of_a_moved_run_names_its_folders_where_they_are(exported_run, tmp_path):
    """An export's config.json is the run's config as the run reads it: the same bytes for a run in place; for a
    run moved after ``update --from_added`` (hand-made here: a from-added folder recorded under the old
    workdir), that folder under the new one, as ``rows.csv`` names its rows, not the old place."""
    wd, out, _ = exported_run
    with open(paths.config_file(wd), "rb") as a, open(os.path.join(out, "config.json"), "rb") as b:
        assert a.read() == b.read()
    old, new = str(tmp_path / "W"), str(tmp_path / "disk" / "W")
    shutil.copytree(wd, old)
    with open(paths.config_file(old)) as f:
        config = json.load(f)
    config["data"]["updates"] = [added_session.folder_of(old, 4)]  # as update --from_added records it
    workdir_lib.write_config(paths.config_file(old), config)
    os.makedirs(added_session.folder_of(old, 4))
    with open(os.path.join(added_session.folder_of(old, 4), added_session.ROWS_FILE), "w") as f:
        json.dump({"first": 0, "end": 2, "rows": [[0, 2]]}, f)
    shutil.move(old, new)
    assert _cli(["--workdir", new, "--out", str(tmp_path / "export")]) == 0
    with open(tmp_path / "export" / "config.json") as f:
        exported = json.load(f)
    assert exported["data"]["updates"] == [added_session.folder_of(new, 4)]  # before: the old, gone, place
    assert {k: v for k, v in exported.items() if k != "data"} == {k: v for k, v in config.items() if k != "data"}


def test_reading_a_fashion_run_never_imports_tfds(exported_run, tmp_path):
    """The reading commands on a Fashion-MNIST run (``reading_probe``; tests/serve has the photo run's)."""
    wd = str(tmp_path / "run")
    shutil.copytree(exported_run[0], wd)
    images = []
    for i in range(3):
        images.append(str(tmp_path / f"q{i}.png"))
        Image.fromarray(np.random.default_rng(50 + i).integers(0, 256, (28, 28), dtype=np.uint8)).save(images[-1])
    loaded = reading_probe.heavy_modules_by_step(wd, images[0], (images[1], images[2]), str(tmp_path / "out"))
    assert loaded == {step: [] for step in reading_probe.STEPS}
