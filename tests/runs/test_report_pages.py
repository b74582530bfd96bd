"""The HTML pages: ``report.html`` of a run, ``search --html`` and a comparison's page.

Each page is parsed (``html.parser``): every picture it shows is an existing file or a decodable data
URI, and the numbers it shows are those of ``results.json`` / the search results.  A slow test renders
the pages in headless Chromium (where installed) and checks the console stays free of errors.
"""

import base64
import io
import json
import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser

import numpy as np
import pytest
from absl import flags
from PIL import Image

from cvs_jax import report, search
from cvs_jax.data import sources
from cvs_jax.engine import runner
from cvs_jax.reports import compare_page, run_page
from cvs_jax.reports.tables import summarize_pairs, summarize_runs
from cvs_jax.rundir import paths
from cvs_jax.testing.tiny_data import tiny_config


class Page(HTMLParser):
    """What the tests read of a page: image sources, ``data-*`` numbers, query rows and their text."""

    def __init__(self, text: str):
        super().__init__()
        self.images: list[str] = []
        self.data: dict[str, dict[str, str]] = {}  # attribute -> {key: the element's text}
        self.rows: dict[str, list[str]] = {}  # data-query -> the row's text pieces
        self.text: list[str] = []  # every piece of text, in order
        self._open: list[tuple[str, str]] = []
        self._row: str | None = None
        self._depth = 0
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.images.append(a.get("src", ""))
        for name in ("data-recall", "data-ar", "data-compat"):
            if name in a:
                self._open.append((name, a[name]))
        if "data-query" in a:
            self._row, self._depth = a["data-query"], 0
            self.rows[self._row] = []
        if self._row is not None and tag == "div":
            self._depth += 1

    def handle_endtag(self, tag):
        if tag == "span" and self._open:
            self._open.pop()
        if self._row is not None and tag == "div":
            self._depth -= 1
            if self._depth == 0:
                self._row = None

    def handle_data(self, data):
        if data.strip():
            self.text.append(data.strip())
        if self._open:
            name, key = self._open[-1]
            self.data.setdefault(name, {})[key] = data
        if self._row is not None and data.strip():
            self.rows[self._row].append(data.strip())


def check_images(page: Page, folder: str) -> None:
    assert page.images
    for src in page.images:
        if src.startswith("data:"):
            head, _, payload = src.partition(",")
            assert head in ("data:image/png;base64", "data:image/jpeg;base64"), head[:40]
            Image.open(io.BytesIO(base64.b64decode(payload, validate=True))).verify()
        else:
            assert os.path.exists(os.path.join(folder, src)), src


def pct(v) -> str:
    return "-" if v is None else f"{100 * v:.2f}"


WRITES: list[dict] = []  # the results each report.html of the module's run was written with


@pytest.fixture(scope="module")
def finished_run(fashion_idx, tmp_path_factory):
    root = tmp_path_factory.mktemp("pages")
    manual = fashion_idx(60, 10)
    c = tiny_config(manual, root, sessions=2)
    wd = str(root / "run")
    write = run_page.write

    def recorded(workdir, **kwargs):
        WRITES.append(kwargs["results"])
        return write(workdir, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(run_page, "write", recorded)
        runner.run(c, wd)
    return wd, c


def test_the_page_is_written_after_every_session(finished_run):
    """After session 1 (recall so far, no matrix yet), then at the end with results.json's contents."""
    assert len(WRITES) == 2
    assert [r["session"] for r in WRITES[0]["per_session"]] == [1] and "compatibility_recall1" not in WRITES[0]
    with open(paths.results_file(finished_run[0])) as f:
        assert WRITES[1] == json.load(f)


def test_the_run_writes_report_html_whose_numbers_are_results_json(finished_run):
    wd, _ = finished_run
    with open(paths.report_file(wd)) as f:
        page = Page(f.read())
    with open(paths.results_file(wd)) as f:
        results = json.load(f)
    check_images(page, wd)
    want = {f"{r['session']}:{k}": pct(v) for r in results["per_session"] for k, v in r["recall"].items()}
    assert page.data["data-recall"] == want
    assert page.data["data-ar"] == {k: pct(v) for k, v in results["average_recall"].items()}
    m = results["compatibility_recall1"]
    assert page.data["data-compat"] == {
        f"{i + 1}:{j + 1}": pct(v) for i, row in enumerate(m) for j, v in enumerate(row)
    }
    # one picture per plot (recall, heatmap, curves) plus the gallery samples of both sessions
    assert len(page.images) == 3 + 2 * run_page.SAMPLES


def test_report_command_rewrites_the_page(finished_run, tmp_path, capsys):
    wd = str(tmp_path / "run")
    shutil.copytree(finished_run[0], wd)
    os.remove(paths.report_file(wd))
    fv = flags.FlagValues()
    report.define_flags(fv)
    assert report.main(fv(["report", "--workdir", wd]), fv) == 0
    assert capsys.readouterr().out.strip() == paths.report_file(wd)
    with open(paths.report_file(wd)) as f:
        again = Page(f.read())
    with open(paths.report_file(finished_run[0])) as f:
        first = Page(f.read())
    assert again.data == first.data
    check_images(again, wd)


def test_report_command_refuses_what_is_not_a_run(tmp_path, capsys):
    fv = flags.FlagValues()
    report.define_flags(fv)
    assert report.main(fv(["report", "--workdir", str(tmp_path / "nope")]), fv) == 2
    assert report.main(fv(["report", "--workdir", str(tmp_path)]), fv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err), err


def test_a_failing_report_warns_and_the_run_goes_on(finished_run, monkeypatch, capsys):
    def broken(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(run_page, "render", broken)
    lines = []
    assert run_page.write_or_warn(finished_run[0], lines.append) is None
    assert len(lines) == 1 and "report.html not written" in lines[0] and "disk full" in lines[0]


def test_search_html_rows_equal_the_search_results(finished_run, tmp_path, capsys):
    wd, c = finished_run
    run = search.Run(wd)
    images = sources.load_dataset(c.data.name, data_dir=c.data.data_dir, manual_dir=c.data.manual_dir).train.images
    row = 3
    name = run.class_names[int(run.gallery.labels[row])]
    os.makedirs(tmp_path / name)
    good = str(tmp_path / name / "q.png")
    Image.fromarray(images[int(run.gallery.source_ids[row])][..., 0]).save(good)
    bad = str(tmp_path / "broken.png")
    with open(bad, "wb") as f:
        f.write(b"not an image")
    out = str(tmp_path / "hits.html")
    assert search.search_or_add(wd, [good, bad], k=4, html=out) == 2  # one query unreadable
    capsys.readouterr()
    assert search.search_or_add(wd, [good], k=4, as_json=True) == 0
    hits = json.loads(capsys.readouterr().out)[0]["hits"]
    with open(out) as f:
        page = Page(f.read())
    check_images(page, str(tmp_path))
    assert len(page.images) == 1 + 4  # the query and its hits; the unreadable query has none
    text = page.rows[good]
    assert text[:3] == ["query", "q.png", f"class: {name}"]
    shown = " ".join(text)
    for h in hits:
        assert h["class_name"] in shown and f"{h['score']:.4f}" in shown
    pieces = [t for t in text if t not in ("query",)]
    scores = [t for t in pieces if t.replace(".", "").isdigit() and "." in t]
    assert scores == [f"{h['score']:.4f}" for h in hits]
    assert shown.count("arrived in session") == 4
    # a hit of the query's class (its folder name) is marked: the query finds its own row first
    assert "\u2713" in shown
    reason = " ".join(page.rows[bad])
    assert "could not search with this image" in reason and "cannot read image" in reason


def test_search_html_refuses_a_missing_folder_and_add(finished_run, tmp_path, capsys):
    wd, _ = finished_run
    assert search.search_or_add(wd, ["x.png"], html=str(tmp_path / "no" / "hits.html")) == 2
    assert search.search_or_add(wd, ["x.png"], add=True, html=str(tmp_path / "hits.html")) == 2
    assert search.search_or_add(wd, ["x.png"], label="no such class", html=str(tmp_path / "hits.html")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("error: ") for line in err), err


def _comparison() -> dict:
    runs = [
        {"status": "ok", "method": m, "seed": s, "average_recall": {"1": v, "2": v + 5}, "BC": -b,
         "recall1_per_session": [v + 3, v - 3]}
        for m, base in (("finetune", 40.0), ("cvs", 45.0)) for s, (v, b) in enumerate(((base, 2.0), (base + 1, 3.0)))
    ]  # fmt: skip
    summary = summarize_runs(runs, ["finetune", "cvs"])
    return {"dataset": "d", "setup": "general", "seeds": [0, 1], "split_seed": None, "summary": summary,
            "pairs": summarize_pairs(runs, [("finetune", "cvs", "against cvs")]), "runs": runs}  # fmt: skip


def test_joint_rows_arrive_in_their_first_session_in_memory_and_on_disk(fashion_idx, tmp_path):
    """The engine's page counts the gallery from memory (arrival from the session plan), the command's
    from the checkpoints (arrival from the parts): ``joint`` re-embeds every row each session, and
    both pages still say what each session brought, identically."""
    manual = fashion_idx(60, 5)
    c = tiny_config(manual, tmp_path, method="joint", sessions=2)
    c.train.epochs = 1
    wd = str(tmp_path / "run")
    runner.run(c, wd)
    with open(paths.report_file(wd)) as f:
        engine = Page(f.read())
    command = Page(run_page.render(wd))
    assert engine.text == command.text
    assert "returning classes (images)" in engine.text


def test_compare_page_shows_the_table(tmp_path):
    c = _comparison()
    page = Page(compare_page.render(c, str(tmp_path)))
    check_images(page, str(tmp_path))
    assert page.data["data-ar"] == {"finetune:1": "40.50 ± 0.71", "finetune:2": "45.50 ± 0.71",
                                    "cvs:1": "45.50 ± 0.71", "cvs:2": "50.50 ± 0.71"}  # fmt: skip
    with open(tmp_path / paths.COMPARISON, "w") as f:
        json.dump(c, f)
    assert report.write_page(str(tmp_path)) == str(tmp_path / paths.COMPARISON_REPORT)


CHROMIUM = "/usr/bin/chromium"


def _console_errors(page: str) -> list[str]:
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
             "--disable-background-networking", "--disable-component-update", f"--user-data-dir={profile}",
             "--enable-logging=stderr", "--v=0", "--dump-dom", f"file://{page}"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "</html>" in out.stdout or "</body>" in out.stdout
    return [line for line in out.stderr.splitlines() if "Uncaught" in line or "CONSOLE" in line]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Chromium is not installed (apt-get install chromium)")
def test_pages_render_in_chromium_without_console_errors(finished_run, tmp_path):
    wd, _ = finished_run
    out = str(tmp_path / "hits.html")
    run = search.Run(wd)
    q = str(tmp_path / "q.png")
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(q)
    assert search.search_or_add(wd, [q], k=3, html=out) == 0
    cmp = tmp_path / "cmp"
    cmp.mkdir()
    with open(cmp / paths.COMPARISON, "w") as f:
        json.dump(_comparison(), f)
    for page in (paths.report_file(wd), out, report.write_page(str(cmp))):
        assert _console_errors(os.path.abspath(page)) == [], page
    assert run.session == 1


def test_search_page_marks_the_query_class_and_shows_missing_images():
    from cvs_jax.reports import search_page

    names = ["cat", "lemon"]
    assert search_page.query_class("/p/test/lemon/x.jpg", None, names) == "lemon"
    assert search_page.query_class("/p/test/other/x.jpg", None, names) is None
    assert search_page.query_class("/p/x.jpg", "1", names) == "lemon"
    hit = {"rank": 1, "score": 0.5, "class_name": "lemon", "arrival_session": 1, "model_session": 2, "source": "s"}
    q = {"query": "/p/lemon/x.jpg", "class_name": "lemon", "image": np.zeros((8, 8, 3), np.uint8), "error": None}
    page = Page(search_page.render([dict(q, hits=[dict(hit, image=None)])], workdir="w", model_session=2,
                                   gallery_rows=1, k=1))  # fmt: skip
    text = " ".join(page.rows["/p/lemon/x.jpg"])
    assert "image not available" in text and "same class: 1 of 1" in text and "\u2713" in text
    assert len(page.images) == 1  # the query's; the hit's picture is the grey square
