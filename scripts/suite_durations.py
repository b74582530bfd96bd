"""Where the test suite's time goes, from one run's log, and how two workers would share it.

    python -m pytest -v -p no:cacheprovider -n 2 --dist loadfile --durations=0 tests > suite.log 2>&1
    python scripts/suite_durations.py suite.log            # per-file seconds, each worker's load, a schedule

Prints each file's seconds (setup + call + teardown, from ``--durations=0``), the slowest setups (module
fixtures that train), each worker's load as the ``[gwN]`` lines say it ran, and the wall that
``--dist loadfile`` gives on two workers with the files queued as in this run (the order they started in) and
heaviest first (tests/conftest.py's ``HEAVIEST_FIRST``). The simulation follows xdist 3.8: a
worker takes the next file while it has at most two tests pending. Needs only the standard library.
"""

from __future__ import annotations

import argparse
import collections
import re

DURATION = re.compile(r"\s*([\d.]+)s (setup|call|teardown)\s+(\S+)")
RAN = re.compile(r"\[(gw\d+)\] \[\s*\d+%\] \w+ (\S+::\S+)")


def read(log: str):
    """(seconds per test id, (seconds, phase, test id) each, test ids per worker, test ids as they started)."""
    per_test: collections.Counter = collections.Counter()
    phases: list[tuple[float, str, str]] = []
    workers: dict[str, list[str]] = collections.defaultdict(list)
    started: list[str] = []
    with open(log, encoding="utf-8") as f:
        for line in f:
            if m := DURATION.match(line):
                per_test[m.group(3)] += float(m.group(1))
                phases.append((float(m.group(1)), m.group(2), m.group(3)))
            elif m := RAN.match(line):
                workers[m.group(1)].append(m.group(2))
                started.append(m.group(2))
    return per_test, phases, workers, started


def file_of(test_id: str) -> str:
    return test_id.split("::")[0]


def simulate(order: list[str], tests: dict[str, list[str]], seconds, workers: int = 2) -> list[float]:
    """Each worker's busy seconds when ``order`` is the queue of files (xdist's LoadScopeScheduling)."""
    queue, pending, clock = list(order), [[] for _ in range(workers)], [0.0] * workers

    def take(w: int) -> None:
        if queue:
            pending[w].extend(tests[queue.pop(0)])

    for w in range(workers):
        take(w)
    for w in range(workers):
        if len(pending[w]) <= 2:
            take(w)
    while any(pending):
        w = min((i for i in range(workers) if pending[i]), key=lambda i: clock[i])
        clock[w] += seconds[pending[w].pop(0)]
        if len(pending[w]) <= 2:
            take(w)
    return clock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("log", help="output of pytest -v -n 2 --dist loadfile --durations=0")
    parser.add_argument("--top", type=int, default=25, help="how many files and setups to list")
    args = parser.parse_args()
    per_test, phases, workers, started = read(args.log)
    per_file: collections.Counter = collections.Counter()
    for test_id, s in per_test.items():
        per_file[file_of(test_id)] += s
    total = sum(per_file.values())
    print(f"{total:.0f} s in {len(per_file)} files, {len(per_test)} tests (setup + call + teardown)\n")
    running = 0.0
    for name, s in per_file.most_common(args.top):
        running += s
        print(f"{s:7.1f} s {100 * running / total:4.0f} % cumulative  {name}")
    print("\nslowest setups:")
    for s, _, test_id in sorted((p for p in phases if p[1] == "setup"), reverse=True)[: args.top // 2]:
        print(f"{s:7.1f} s  {test_id}")
    if workers:
        print("\nworkers as they ran (seconds, last files):")
        for w, ids in sorted(workers.items()):
            files = list(dict.fromkeys(file_of(t) for t in ids))
            print(f"  {w}: {sum(per_test[t] for t in ids):7.1f} s, last: {', '.join(files[-3:])}")
        tests: dict[str, list[str]] = collections.defaultdict(list)
        for t in started:
            tests[file_of(t)].append(t)
        as_run = list(tests)  # the queue: files in the order they started
        heaviest = sorted(tests, key=lambda f: -per_file[f])
        for label, order in (("queued as in this run", as_run), ("heaviest first", heaviest)):
            loads = simulate(order, tests, per_test)
            print(f"simulated, {label}: wall {max(loads):.0f} s (workers {', '.join(f'{x:.0f}' for x in loads)})")


if __name__ == "__main__":
    main()
