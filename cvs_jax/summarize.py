"""Print one table comparing finished runs: per-session recall@1 and AR@K, in percent.

    python -m cvs_jax.summarize WORKDIR [WORKDIR ...]

Example (two runs of python -m cvs_jax.main on one config):

    python -m cvs_jax.summarize workdirs/finetune workdirs/cvs

No flags: name the ``--workdir`` of each run; each must hold ``results.json`` (a finished run).
For tables over seeds with confidence intervals use ``python -m cvs_jax.compare``.
"""

from __future__ import annotations

import os

from absl import flags

from cvs_jax import cli
from cvs_jax.errors import UserError
from cvs_jax.rundir import paths, run_files


def summary_table(results: list[dict]) -> str:
    ks = list(results[0]["average_recall"])
    n_sessions = max(len(r["per_session"]) for r in results)
    head = (
        "| method | "
        + " | ".join(f"S{i + 1} R@1" for i in range(n_sessions))
        + " | "
        + " | ".join(f"AR@{k}" for k in ks)
        + " |"
    )
    rows = [head, "|" + "---|" * (1 + n_sessions + len(ks))]
    for r in results:
        per = [f"{100 * s['recall']['1']:.2f}" for s in r["per_session"]]
        per += [""] * (n_sessions - len(per))
        ar = [f"{100 * r['average_recall'][k]:.2f}" for k in ks]
        rows.append(f"| {r['method']} | " + " | ".join(per + ar) + " |")
    return "\n".join(rows)


def summarize(workdirs: list[str]) -> str:
    results = []
    for d in workdirs:
        path = paths.results_file(d)
        if not os.path.exists(path) and os.path.exists(os.path.join(d, paths.COMPARISON)):
            raise UserError(
                f"{d} is a compare --workdir: its tables are {os.path.join(d, 'comparison.md')}; summarize takes "
                f"the runs inside it, e.g. {os.path.join(d, 'seed0', '*')}."
            )
        if not os.path.exists(path):
            raise UserError(f"{path} does not exist; run the experiment first (python -m cvs_jax.main --workdir {d}).")
        results.append(run_files.read_json(path, fields=("dataset", "setup", "per_session")))
    return f"{results[0]['dataset']} / {results[0]['setup']} (recall in %)\n{summary_table(results)}"


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """None: the command reads its workdirs from the arguments."""
    del flag_values


@cli.command
def main(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> int:
    """``argv``: what absl left after the flags (program name, then the workdirs)."""
    if len(argv) < 2:
        raise UserError("name at least one WORKDIR, e.g. python -m cvs_jax.summarize workdirs/cvs")
    print(summarize(argv[1:]))
    return 0


if __name__ == "__main__":
    cli.run(main, define_flags)
