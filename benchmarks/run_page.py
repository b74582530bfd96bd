"""What writing a run's ``report.html`` costs: the page is written after every session (``reporting.write_report``)
and shows 8 gallery thumbnails a session, so a growing run encodes more of them each time.

Renders the page of the run in ``--workdir`` (nothing written there) as the engine does, its gallery rows and
train images read once beforehand, two ways interleaved: small images' thumbnails encoded as PNG with zlib's
default level (now) and with ``optimize=True`` (before).  Prints seconds per page (best of rounds) and the
page's bytes each way.

    python benchmarks/run_page.py --workdir W
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

import _common  # noqa: F401  (the repository on sys.path)

from cvs_jax.reports import html, run_page
from cvs_jax.retrieval import run_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    stored = run_page.stored_rows(args.workdir)
    split = run_rows.train_split(run_page.stored_config(args.workdir))
    read = None if split is None else split.read
    ways = {"now (zlib default)": {}, "before (optimize=True)": {"optimize": True}}
    seconds: dict[str, list[float]] = {w: [] for w in ways}
    size = {}
    for _ in range(args.rounds):
        for way, options in ways.items():
            with mock.patch.object(html, "PNG_OPTIONS", options):
                t0 = time.perf_counter()
                page = run_page.render(args.workdir, stored=stored, read_train=read)
                seconds[way].append(time.perf_counter() - t0)
            size[way] = len(page.encode())
    sessions = 0 if stored is None else stored[0] + 1
    print(f"{args.workdir}: {sessions} sessions")
    print("| thumbnails | s per page (best of rounds) | page bytes |\n|---|---|---|")
    for way in ways:
        print(f"| {way} | {min(seconds[way]):.2f} | {size[way]:,} |")
    now, before = (min(seconds[w]) for w in ways)
    print(f"before / now: {before / now:.2f}x")


if __name__ == "__main__":
    main()
