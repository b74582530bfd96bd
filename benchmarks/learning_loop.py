"""The loop, measured: photos arrive as ``POST /add?label=NAME`` over days, a session is triggered each
day (``POST /sessions``), searches run all the time; three arms side by side in one run.

* ``learning``: the run's method (cvs); each day's labelled adds become the next session (``update
  --from_added`` in the server's child), the gate decides the switch; no stored row is re-embedded.
* ``frozen``: no learning: the day-0 model embeds every add and serves every query.
* ``joint``: the same adds and triggers, method ``joint``: each session retrains on everything seen and
  re-embeds the whole session gallery (its rows re-embedded are counted, as for every arm).

Each arm is a real server (``python -m cvs_jax.serve``) on loopback, reached over HTTP; a client thread
searches one photo at a time for the whole arm. Per day: R@1 of that day's held-out queries (Tiny-ImageNet
validation images of the day's classes, never added) against everything stored, read from the server's own
``/search`` answers (top hit's class); AR@1, the mean of R@1 over the days so far (``topk.average_recall``);
BC and NFR of the day's session as the project computes them (``results.json`` read by ``gate.evaluate``);
failed requests (searches, adds, triggers); seconds from ``POST /sessions`` to the server answering with the
new model; rows re-embedded (stored rows, by id, whose embedding bytes changed during the day).

Photos (``--zip``, the Tiny-ImageNet mini zip): day 0 trains the first run on ``--base`` classes; each later
day adds ``--new`` classes the run has not seen (``/add?label=NEW``) and ``--returning`` known classes with
``--more`` images each. ``--known_only``: every class is in day 0 and the days bring known classes only.

    nice -n 10 python benchmarks/learning_loop.py --zip ../shared/data/tiny-imagenet-200-mini.zip \\
        --out /tmp/loop                     # tiny widths: about 10-20 minutes on a 2-core CPU

writes ``/tmp/loop/learning_loop.{md,json,csv,html}`` and ``ar1_per_day.png``. Bigger: ``--days``,
``--base``, ``--new``, ``--train``, ``--width``, ``--embed_dim``, ``--size``, ``--epochs``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
import zipfile

import _common  # noqa: F401  (puts the repo root on sys.path)
import httpx
import numpy as np

from cvs_jax.retrieval import gate, topk
from cvs_jax.retrieval.run_reader import Run, load_images
from cvs_jax.testing import serve_process
from scripts.photos_from_tiny_imagenet import class_names  # one naming rule for the photos

REPO = _common.REPO
TOKEN = "learning-loop"
AUTH = {"authorization": f"Bearer {TOKEN}"}
ARMS = ("learning", "frozen", "joint")
METHOD = {"learning": "cvs", "frozen": "cvs", "joint": "joint"}


# ------------------------------------------------------------------ photos arriving over days


def day_plan(n_classes: int, days: int, base: int, new: int, returning: int) -> list[dict]:
    """Which classes each day brings: ``{"new": [class index], "returning": [class index]}``; day 0 is the
    first run's. Returning classes take turns through the classes seen before the day, oldest first."""
    plan = [{"new": list(range(base)), "returning": []}]
    seen = base
    for d in range(1, days + 1):
        fresh = list(range(seen, min(seen + new, n_classes)))
        back = [((d - 1) * returning + i) % seen for i in range(min(returning, seen))]
        plan.append({"new": fresh, "returning": sorted(set(back))})
        seen += len(fresh)
    return plan


def write_days(zip_path: str, out: str, a) -> list[dict]:
    """Writes ``out/day<d>/{train,queries}/<class>/<file>.JPEG`` (JPEG bytes unchanged) and returns, per day,
    ``{"day", "new", "returning", "train": {class: [path]}, "queries": {class: [path]}}``."""
    z = zipfile.ZipFile(zip_path)
    top = z.namelist()[0].split("/")[0]
    n_classes = a.base + a.days * a.new
    wnids = z.read(f"{top}/wnids.txt").decode().split()[:n_classes]
    names = class_names(z, top, wnids)
    members = z.namelist()
    train = {
        w: sorted(n for n in members if n.startswith(f"{top}/train/{w}/images/") and n.endswith(".JPEG")) for w in wnids
    }
    val: dict[str, list[str]] = {}
    for line in z.read(f"{top}/val/val_annotations.txt").decode().splitlines():
        f, w = line.split("\t")[:2]
        if w in train:
            val.setdefault(w, []).append(f"{top}/val/images/{f}")
    used_train = {w: 0 for w in wnids}
    used_val = {w: 0 for w in wnids}
    days = []
    for d, classes in enumerate(day_plan(len(wnids), a.days, a.base, a.new, a.returning)):
        day = {"day": d, "new": [], "returning": [], "train": {}, "queries": {}}
        for kind, count in (("new", a.train), ("returning", a.more)):
            for c in classes[kind]:
                w, name = wnids[c], names[wnids[c]]
                day[kind].append(name)
                take = train[w][used_train[w] : used_train[w] + count]
                used_train[w] += len(take)
                day["train"][name] = [_put(z, m, os.path.join(out, f"day{d}", "train", name)) for m in take]
                q = sorted(val[w])[used_val[w] : used_val[w] + a.queries]
                used_val[w] += len(q)
                day["queries"][name] = [_put(z, m, os.path.join(out, f"day{d}", "queries", name)) for m in q]
        days.append(day)
    return days


def _put(z: zipfile.ZipFile, member: str, folder: str) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, os.path.basename(member))
    with open(path, "wb") as f:
        f.write(z.read(member))
    return path


# ------------------------------------------------------------------ the first run of each arm


def train_day0(arm: str, root: str, day0_train: str, a) -> str:
    """``python -m cvs_jax.main`` on day 0's class folders (``:cpu`` at tiny widths; ``--recipe
    pretrained``: ``:cpu_pretrained``); returns the workdir."""
    wd = os.path.join(root, arm, "run")
    variant = "cpu" if a.recipe == "tiny" else "cpu_pretrained"
    sets = {
        "data.manual_dir": day0_train,
        "data.data_dir": os.path.join(root, arm, "data"),
        "method": METHOD[arm],
        "seed": a.seed,
    }
    given = {"train.epochs": a.epochs, "train.batch_size": a.batch_size, "memory.budget": a.memory}
    sets.update({k: v for k, v in given.items() if v is not None})  # else the recipe's own
    if a.recipe == "tiny":
        sets.update({"data.stored_size": a.size, "augment.size": a.size - a.size // 8})
        sets.update({"model.width": a.width, "model.embed_dim": a.embed_dim})
    cmd = [sys.executable, "-m", "cvs_jax.main", "--config", f"{REPO}/configs/image_folder_general.py:{variant}"]
    cmd += ["--workdir", wd] + [f"--config.{k}={v}" for k, v in sets.items()]
    with open(os.path.join(root, arm, "day0.log"), "w") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True, cwd=REPO)
    return wd


# ------------------------------------------------------------------ what one day does and measures (any client:
# an ``httpx.Client`` on a server's address, or a FastAPI ``TestClient``)


def _files(paths: list[str]) -> list[tuple]:
    out = []
    for p in paths:
        with open(p, "rb") as f:
            out.append(("file", (os.path.basename(p), f.read(), "image/jpeg")))
    return out


def add_day(client, train: dict[str, list[str]], per_request: int = 8) -> dict:
    """Each class's photos as ``POST /add?label=NAME`` requests of up to ``per_request`` images."""
    requests = failed = rows = 0
    for name, paths in train.items():
        for i in range(0, len(paths), per_request):
            r = client.post("/add", params={"label": name}, files=_files(paths[i : i + per_request]), headers=AUTH)
            requests, failed = requests + 1, failed + (r.status_code != 200)
            rows += len(r.json().get("ids", [])) if r.status_code == 200 else 0
    return {"add_requests": requests, "add_failed": failed, "rows_added": rows}


def top1_via_search(client, queries: dict[str, list[str]], per_request: int = 16) -> dict:
    """Each query's top hit from ``POST /search?k=1`` (the server's answer: its model, everything it stores):
    ``{"correct": [bool], "ids": [top-1 row id], "model_session", "failed"}``, in ``queries``' order."""
    correct, ids, sessions, failed = [], [], set(), 0
    for name, paths in queries.items():
        for i in range(0, len(paths), per_request):
            r = client.post("/search", params={"k": 1}, files=_files(paths[i : i + per_request]))
            if r.status_code != 200:
                failed += 1
                continue
            for q in r.json()["queries"]:
                hit = q["hits"][0]
                correct.append(hit["class_name"] == name)
                ids.append(hit["id"])
                sessions.add(q["model_session"])
    return {"correct": correct, "ids": ids, "model_sessions": sorted(sessions), "failed": failed}


def stored_embeddings(workdir: str) -> dict[int, bytes]:
    """Every stored row's embedding bytes by row id (session rows and added rows), as stored now."""
    run = Run(workdir)
    rows = np.asarray(run.rows.embeddings[: len(run.rows)], np.float32)
    return {int(i): rows[n].tobytes() for n, i in enumerate(run.ids)}


def session_rows_r1(workdir: str, model_session: int, queries: dict[str, list[str]]) -> float:
    """R@1 of the queries against the session rows alone (no added row), embedded by the served model
    (``model_session``, 1-based), with ``topk.recall_at_k``: what a ``joint`` arm's re-embedded gallery finds,
    without the added rows it does not re-embed."""
    run = Run(workdir, model_session=model_session - 1)
    names = run.class_names
    paths = [p for ps in queries.values() for p in ps]
    labels = np.asarray([names.index(n) if n in names else -1 for n, ps in queries.items() for _ in ps], np.int32)
    q = run.embed(load_images(paths, run.image_shape))
    g = run.gallery
    return topk.recall_at_k(q, labels, np.asarray(g.embeddings, np.float32), g.labels, ks=(1,))[1]


def rows_reembedded(before: dict[int, bytes], after: dict[int, bytes]) -> int:
    """Rows stored before whose stored embedding is different (or gone) after."""
    return sum(after.get(i) != b for i, b in before.items())


def session_scores(workdir: str, session: int) -> dict:
    """BC (points) and NFR (%) of completed session ``session`` (1-based) against its predecessor, as the
    run scored them (``results.json``, read by the gate's ``evaluate``), and what the default gate decides on
    them; None where not defined."""
    v = gate.evaluate(gate.read_results(workdir), session - 1, session - 2, gate.Thresholds())
    return {"bc": v["bc"], "nfr": v["nfr"], "default_gate": v["decision"]}


def trigger_and_wait(client, session: int, timeout_s: float) -> dict:
    """``POST /sessions``, then waits until the server answers with session ``session``'s model (switched)
    or its gate keeps the served one; seconds from the trigger to either."""
    t0 = time.monotonic()
    r = client.post("/sessions", headers=AUTH)
    if r.status_code != 200:
        return {"trigger_failed": 1, "error": r.text, "switch_s": None, "decision": "not started"}
    while time.monotonic() - t0 < timeout_s:
        current = client.get("/sessions/current").json()
        if current["state"] == "failed":
            return {"trigger_failed": 0, "error": current.get("error"), "switch_s": None, "decision": "failed"}
        if client.get("/healthz").json()["model_session"] == session:
            return {"trigger_failed": 0, "switch_s": time.monotonic() - t0, "decision": "switched"}
        verdict = client.get("/info").json().get("gate") or {}
        if verdict.get("candidate_session") == session and verdict.get("decision") == "kept":
            return {"trigger_failed": 0, "switch_s": None, "kept_s": time.monotonic() - t0, "decision": "kept"}
        time.sleep(0.25)
    return {"trigger_failed": 0, "switch_s": None, "decision": f"timeout {timeout_s:.0f} s"}


class Searcher(threading.Thread):
    """A client searching one photo at a time (k=5) on its own connection until stopped, ``pause_s`` between
    answers (without a pause it takes a whole core of a small host from the sessions); counts per day."""

    def __init__(self, base_url: str, payloads: list[bytes], pause_s: float = 0.02):
        super().__init__(daemon=True)
        self.base_url, self.payloads, self.pause_s = base_url, payloads, pause_s
        self.day, self.counts = 0, {}
        self._stop_event = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=60) as c:
            i = 0
            while not self._stop_event.is_set():
                counts = self.counts.setdefault(self.day, {"searches": 0, "search_failed": 0})
                try:
                    files = [("file", ("q.jpg", self.payloads[i % len(self.payloads)], "image/jpeg"))]
                    ok = c.post("/search", params={"k": 5}, files=files).status_code == 200
                except httpx.HTTPError:
                    ok = False
                counts["searches"] += 1
                counts["search_failed"] += not ok
                i += 1
                self._stop_event.wait(self.pause_s)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=120)


def measure_day(client, workdir: str, day: dict, before: dict[int, bytes], extra: dict, so_far: dict) -> dict:
    """The day's row of the table, once its adds (and session) are in: R@1 of its queries and of every day's
    queries so far (``so_far``: are the old classes still found?), rows re-embedded."""
    top = top1_via_search(client, day["queries"])
    every = top1_via_search(client, so_far)
    health = client.get("/healthz").json()
    return {
        "day": day["day"],
        "new_classes": len(day["new"]),
        "returning_classes": len(day["returning"]),
        "queries": len(top["correct"]),
        "r1": float(np.mean(top["correct"])) if top["correct"] else None,
        "r1_all_so_far": float(np.mean(every["correct"])),
        "r1_session_rows": session_rows_r1(workdir, health["model_session"], day["queries"]),
        "model_session": health["model_session"],
        "gallery_rows": health["gallery_rows"],
        "rows_reembedded": rows_reembedded(before, stored_embeddings(workdir)),
        "rows_before": len(before),
        "query_failed": top["failed"] + every["failed"],
        **extra,
    }


def run_days(client, workdir: str, days: list[dict], learn: bool, searcher=None, timeout_s: float = 1800) -> list:
    """Day 0 measured as served, then each day: its adds, its session (``learn``), its measurement."""
    so_far = {n: list(p) for n, p in days[0]["queries"].items()}
    out = [measure_day(client, workdir, days[0], stored_embeddings(workdir), {}, so_far)]
    for day in days[1:]:
        for name, paths in day["queries"].items():
            so_far[name] = so_far.get(name, []) + paths
        if searcher is not None:
            searcher.day = day["day"]
        before = stored_embeddings(workdir)
        extra = add_day(client, day["train"])
        if learn:
            session = client.get("/healthz").json()["model_session"] + 1
            extra.update(trigger_and_wait(client, session, timeout_s))
            if extra["decision"] in ("switched", "kept"):
                extra.update(session_scores(workdir, session))
        out.append(measure_day(client, workdir, day, before, extra, so_far))
        print(f"  day {day['day']}: {json.dumps(out[-1])}", flush=True)
    for row, r in zip(out, topk_running_average([row["r1"] for row in out])):
        row["ar1"] = r
    return out


def topk_running_average(r1: list[float | None]) -> list[float | None]:
    """AR@1 after each day: ``topk.average_recall`` over the days so far (the official AR@K: mean of recall@K)."""
    out, seen = [], []
    for r in r1:
        seen += [{1: r}] if r is not None else []
        out.append(topk.average_recall(seen)[1] if seen else None)
    return out


def run_arm(arm: str, workdir: str, days: list[dict], a) -> dict:
    """One arm's server on loopback, its searching client, its days."""
    port = serve_process.free_port()
    log_path = os.path.join(os.path.dirname(workdir), "serve.log")
    flags = ["--token", TOKEN, "--poll_s", "0.5"] + (["--gate", "off"] if a.gate == "off" else [])
    with open(log_path, "w") as log:
        t0 = time.monotonic()
        proc = serve_process.start(workdir, port, log, *flags, timeout_s=600)
        start_s = time.monotonic() - t0
        base = f"http://127.0.0.1:{port}"
        payloads = [open(p, "rb").read() for paths in days[0]["queries"].values() for p in paths[:2]]
        searcher = Searcher(base, payloads, a.search_pause_s)
        searcher.start()
        try:
            with httpx.Client(base_url=base, timeout=600) as client:
                rows = run_days(client, workdir, days, learn=arm != "frozen", searcher=searcher)
        finally:
            searcher.stop()
            serve_process.stop(proc)
    for row in rows:
        row.update(searcher.counts.get(row["day"], {"searches": 0, "search_failed": 0}))
        row["failed_requests"] = sum(
            row.get(k, 0) for k in ("search_failed", "add_failed", "trigger_failed", "query_failed")
        )
    return {"arm": arm, "method": METHOD[arm], "server_start_s": start_s, "days": rows}


# ------------------------------------------------------------------ the table, the plot, the page

COLUMNS = [
    ("arm", "arm"),
    ("day", "day"),
    ("new_classes", "new classes"),
    ("queries", "queries"),
    ("r1", "R@1 %"),
    ("ar1", "AR@1 %"),
    ("r1_all_so_far", "R@1 all days' queries %"),
    ("r1_session_rows", "R@1 session rows only %"),
    ("bc", "BC points"),
    ("nfr", "NFR %"),
    ("decision", "switch"),
    ("default_gate", "default gate"),
    ("switch_s", "trigger to switch s"),
    ("rows_added", "rows added"),
    ("rows_reembedded", "rows re-embedded"),
    ("gallery_rows", "rows stored"),
    ("model_session", "model"),
    ("searches", "searches"),
    ("failed_requests", "failed requests"),
]


def _cell(key: str, v) -> str:
    if v is None or v == "":
        return "-"
    if key in ("r1", "ar1", "r1_all_so_far", "r1_session_rows"):
        return f"{100 * v:.2f}"
    if key in ("bc", "nfr"):
        return f"{v:+.2f}" if key == "bc" else f"{v:.2f}"
    if key == "switch_s":
        return f"{v:.1f}"
    return str(v)


def table_rows(arms: list[dict]) -> list[dict]:
    return [{"arm": r["arm"], **day} for r in arms for day in r["days"]]


def markdown(arms: list[dict]) -> str:
    lines = ["| " + " | ".join(h for _, h in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in table_rows(arms):
        lines.append("| " + " | ".join(_cell(k, row.get(k)) for k, _ in COLUMNS) + " |")
    return "\n".join(lines)


def write_csv(path: str, arms: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[k for k, _ in COLUMNS], extrasaction="ignore")
        w.writeheader()
        w.writerows(table_rows(arms))


def write_page(out: str, arms: list[dict], header: dict) -> str:
    """The R@1-per-day and AR@1-per-day plots (``reports.plots.recall_per_session``) and the table, on one
    page (``reports.html``)."""
    from cvs_jax.reports import html, plots

    results = [
        {
            "method": r["arm"],
            "dataset": "Tiny-ImageNet mini photos via /add",
            "setup": "day's held-out queries",
            "per_session": [
                {"session": d["day"], "recall": {"1": d["r1"]}, "ar": {"1": d["ar1"]}, "all": {"1": d["r1_all_so_far"]}}
                for d in r["days"]
            ],
            "average_recall": {"1": r["days"][-1]["ar1"]},
        }
        for r in arms
    ]
    plots.recall_per_session(results, os.path.join(out, "r1_per_day.png"), xlabel="day")
    plots.recall_per_session(
        results, os.path.join(out, "ar1_per_day.png"), xlabel="day", ylabel="AR@1 (%), days 0..d", key="ar"
    )
    plots.recall_per_session(
        results,
        os.path.join(out, "r1_all_queries_per_day.png"),
        xlabel="day",
        ylabel="R@1 (%), days 0..d's queries",
        key="all",
    )
    head = [h for _, h in COLUMNS]
    rows = [[html.esc(_cell(k, row.get(k))) for k, _ in COLUMNS] for row in table_rows(arms)]
    body = (
        f"<p>{html.esc(header['command'])}</p>"
        '<p><img src="ar1_per_day.png" alt="AR@1 per day"> <img src="r1_per_day.png" alt="R@1 per day"> '
        '<img src="r1_all_queries_per_day.png" alt="R@1 of every day\'s queries so far, per day"></p>'
        + html.table(head, rows)
    )
    return html.write(os.path.join(out, "learning_loop.html"), html.page("the learning loop", header["when"], body))


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zip", default=os.path.join(REPO, "..", "shared", "data", "tiny-imagenet-200-mini.zip"))
    p.add_argument("--out", required=True, help="folder to write (must not exist)")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--days", type=int, default=5, help="days after day 0")
    p.add_argument("--base", type=int, default=6, help="classes of day 0")
    p.add_argument("--new", type=int, default=2, help="new classes each day")
    p.add_argument("--returning", type=int, default=2, help="known classes coming back each day")
    p.add_argument("--known_only", action="store_true", help="every class in day 0; the days bring known ones")
    p.add_argument("--train", type=int, default=20, help="images of a class on its first day")
    p.add_argument("--more", type=int, default=10, help="images of a returning class")
    p.add_argument("--queries", type=int, default=16, help="held-out queries per class and day")
    p.add_argument("--recipe", choices=("tiny", "pretrained"), default="tiny")
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--embed_dim", type=int, default=32)
    p.add_argument("--epochs", type=int, help="per session (tiny: 4; pretrained: the recipe's 8)")
    p.add_argument("--batch_size", type=int, help="tiny: 16; pretrained: the recipe's 32")
    p.add_argument("--memory", type=int, help="replay exemplars (tiny: 100; pretrained: the recipe's 2,000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--search_pause_s", type=float, default=0.02, help="the searching client's pause")
    p.add_argument(
        "--gate",
        choices=("default", "off"),
        default="off",
        help="the servers' gate; off (default): every session is switched to, and the table says what the "
        "default gate would have decided",
    )
    a = p.parse_args(argv)
    if a.recipe == "tiny":
        a.epochs, a.batch_size, a.memory = a.epochs or 4, a.batch_size or 16, a.memory or 100
    if a.known_only:
        a.base, a.new = a.base + a.days * a.new, 0
    return a


def main(argv=None) -> int:
    a = parse(argv)
    if os.path.exists(a.out):
        print(f"error: {a.out} exists; choose a new --out folder.", file=sys.stderr)
        return 2
    if not os.path.isfile(a.zip):
        print(f"error: --zip {a.zip} does not exist; pass the Tiny-ImageNet mini zip.", file=sys.stderr)
        return 2
    t0 = time.time()
    days = write_days(a.zip, os.path.join(a.out, "photos"), a)
    day0 = os.path.join(a.out, "photos", "day0", "train")
    names = [x for x in a.arms.split(",") if x]
    workdirs = {}
    for arm in names:  # every first run before any arm serves: the frozen one copies the learning one's day 0
        print(f"{arm}: day 0", flush=True)
        os.makedirs(os.path.join(a.out, arm))
        if arm == "frozen" and "learning" in workdirs:
            workdirs[arm] = os.path.join(a.out, arm, "run")
            shutil.copytree(workdirs["learning"], workdirs[arm])
        else:
            workdirs[arm] = train_day0(arm, a.out, day0, a)
    arms = [run_arm(arm, workdirs[arm], days, a) for arm in names]
    header = {
        "command": "python " + " ".join([os.path.relpath(__file__, REPO)] + (argv or sys.argv[1:])),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0)),
        "host": f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()}",
        "wall_s": time.time() - t0,
        "args": vars(a),
        "days": [{k: d[k] for k in ("day", "new", "returning")} for d in days],
    }
    with open(os.path.join(a.out, "learning_loop.json"), "w") as f:
        json.dump({**header, "arms": arms}, f, indent=1)
    write_csv(os.path.join(a.out, "learning_loop.csv"), arms)
    table = markdown(arms)
    with open(os.path.join(a.out, "learning_loop.md"), "w") as f:
        f.write(f"{header['command']}\n\n{header['when']}, {header['host']}\n\n{table}\n")
    write_page(a.out, arms, header)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
