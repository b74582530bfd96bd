r"""Run several methods on identical splits and seeds and tabulate them like the paper's Table 1.

    python -m cvs_jax.compare --config configs/<name>.py[:<variant>] --workdir DIR \
        --methods finetune,joint,cvs --seeds 0,1,2 [--config.<key>=<value> ...]

Each (seed, method) runs in ``DIR/seed<seed>/<method>`` (rerunning resumes).  Session 1
is plain normalized-softmax training for every method (as in the official launch
scripts), so it is trained once per seed and its checkpoint is copied into the other
methods' workdirs, which then resume from session 2.  Writes ``DIR/comparison.md``,
``DIR/comparison.csv`` (AR@K mean ± std over seeds) and ``DIR/comparison.png``
(recall@1 per session per method, mean over seeds).  The comparison holds DIR's lock
throughout, and each run also locks its own workdir.  A problem to fix ends with one
``error: ...`` line and exit status 2.
"""

from __future__ import annotations

import copy
import csv
import json
import os
import shutil
import sys
import time

import numpy as np
from absl import app, flags
from ml_collections import config_flags

from cvs_jax import cli, determinism, distributed, plots, trainer
from cvs_jax import workdir as workdir_lib
from cvs_jax.errors import ConfigError, UserError
from cvs_jax.methods import METHODS

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command's flags (defined when it runs, so that tests can import every entry point together)."""
    config_flags.DEFINE_config_file("config", None, cli.config_help(), lock_config=True)
    flags.DEFINE_string("workdir", None, "Directory for all runs and the comparison table.")
    flags.DEFINE_list("methods", ["finetune", "joint", "cvs"], f"Methods to compare, from: {', '.join(METHODS)}.")
    flags.DEFINE_list("seeds", ["0"], "Seeds (each seed: its own class order, splits and initialisation).")
    flags.mark_flags_as_required(["config", "workdir"])


def share_first_session(source: str, target: str) -> None:
    """Copies the session-1 checkpoint and its metrics so ``target`` resumes at session 2."""
    src = os.path.join(source, "checkpoints", "sessions", "0")
    dst = os.path.join(target, "checkpoints", "sessions", "0")
    if os.path.exists(dst) or not os.path.exists(src):
        return
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copytree(src, dst + ".copying")
    os.rename(dst + ".copying", dst)  # atomic: a half copy is never taken for a checkpoint
    with open(os.path.join(source, "metrics.jsonl")) as f:
        first = [line for line in f if json.loads(line)["session"] == 1]
    with open(os.path.join(target, "metrics.jsonl"), "w") as f:
        f.writelines(first)


def aggregate(results: dict[str, list[dict]]) -> list[dict]:
    """Per method: AR@K mean/std over seeds and the mean recall@1 of every session."""
    rows = []
    for method, runs in results.items():
        ks = list(runs[0]["average_recall"])
        row = {"method": method, "seeds": len(runs)}
        for k in ks:
            vals = np.array([100 * r["average_recall"][k] for r in runs])
            row[f"AR@{k}"] = float(vals.mean())
            row[f"AR@{k} std"] = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
        per = np.array([[100 * s["recall"]["1"] for s in r["per_session"]] for r in runs])
        row["recall1_per_session"] = per.mean(axis=0).tolist()
        rows.append(row)
    return rows


def markdown(rows: list[dict], title: str) -> str:
    ks = [k for k in rows[0] if k.startswith("AR@") and not k.endswith("std")]
    lines = [f"### {title}", "", "| method | " + " | ".join(ks) + " |", "|---|" + "---|" * len(ks)]
    for r in rows:
        lines.append(f"| {r['method']} | " + " | ".join(f"{r[k]:.2f} ± {r[k + ' std']:.2f}" for k in ks) + " |")
    lines.append("")
    lines.append(f"AR@K in %, mean ± std over {rows[0]['seeds']} seed(s); each seed has its own class order and split.")
    return "\n".join(lines)


def run_comparison(config, workdir: str, methods: list[str], seeds: list[int]) -> list[dict]:
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ConfigError(f"--methods names unknown methods {unknown}; choose from {sorted(METHODS)}.")
    distributed.maybe_initialize(config.distributed.multihost)  # before the lock asks JAX for the process index
    with workdir_lib.hold(workdir):  # one comparison per DIR; each run also locks its own workdir
        return _compare(config, workdir, methods, seeds)


def _compare(config, workdir: str, methods: list[str], seeds: list[int]) -> list[dict]:
    results: dict[str, list[dict]] = {m: [] for m in methods}
    t0 = time.time()
    for seed in seeds:
        first_dir = None
        for method in methods:
            c = copy.deepcopy(config)
            c.unlock()
            c.method, c.seed = method, seed
            run_dir = os.path.join(workdir, f"seed{seed}", method)
            if first_dir is None:
                first_dir = run_dir
            else:
                share_first_session(first_dir, run_dir)
            print(f"\n##### seed {seed}, method {method} ({time.time() - t0:.0f}s elapsed)", flush=True)
            results[method].append(trainer.run(c, run_dir))
    rows = aggregate(results)
    title = f"{config.data.name} / {config.data.setup}"
    with open(os.path.join(workdir, "comparison.md"), "w") as f:
        f.write(markdown(rows, title) + "\n")
    with open(os.path.join(workdir, "comparison.csv"), "w", newline="") as f:
        fields = [k for k in rows[0] if k != "recall1_per_session"]
        w = csv.DictWriter(f, fieldnames=fields + [f"S{i + 1} R@1" for i in range(len(rows[0]["recall1_per_session"]))])
        w.writeheader()
        for r in rows:
            out = {k: r[k] for k in fields}
            out.update({f"S{i + 1} R@1": v for i, v in enumerate(r["recall1_per_session"])})
            w.writerow(out)
    mean_runs = [
        {
            "method": r["method"],
            "dataset": config.data.name,
            "setup": config.data.setup,
            "average_recall": {"1": r["AR@1"] / 100},
            "per_session": [{"session": i, "recall": {"1": v / 100}} for i, v in enumerate(r["recall1_per_session"])],
        }
        for r in rows
    ]
    plots.recall_per_session(mean_runs, os.path.join(workdir, "comparison.png"))
    print(
        "\n" + markdown(rows, title) + f"\n\ntotal time {time.time() - t0:.0f}s; tables in {workdir}/comparison.md/.csv"
    )
    return rows


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not all(s.strip().lstrip("-").isdigit() for s in FLAGS.seeds):
        raise app.UsageError(f"--seeds={','.join(FLAGS.seeds)}: give integers, e.g. --seeds 0,1,2")
    cli.quiet_logging()
    determinism.apply(FLAGS.config.deterministic)  # before the first JAX computation
    try:
        run_comparison(FLAGS.config, FLAGS.workdir, FLAGS.methods, [int(s) for s in FLAGS.seeds])
    except UserError as e:  # a problem the user must fix: one line, no traceback; anything else is a bug
        sys.exit(cli.report(e))


if __name__ == "__main__":
    define_flags()
    cli.run(main)
