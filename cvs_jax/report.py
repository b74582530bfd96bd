"""A run's or a comparison's results as one HTML page, on demand.

    python -m cvs_jax.report --workdir W

For a run's workdir it writes ``W/report.html`` (``reports/run_page.py``: recall@K and AR@K per
session, the compatibility matrix as a heatmap, what each session brought, the training curves and
gallery samples), the page a run and every ``update`` rewrite after each session; use it to
rebuild the page of a run made before pages existed, or while a run trains (it reads only finished
checkpoints and writes nothing else).  For a ``compare`` folder (it holds ``comparison.json``) it
writes ``W/comparison.html``.  Prints the page's path.  A problem to fix ends with one ``error: ...``
line and exit status 2.

Example: ``python -m cvs_jax.report --workdir workdirs/mine`` after a run or an ``update``.
"""

from __future__ import annotations

import json
import os

from absl import flags

from cvs_jax import cli
from cvs_jax.errors import UserError
from cvs_jax.reports import compare_page, run_page
from cvs_jax.reports import html as html_lib
from cvs_jax.retrieval import run_reader
from cvs_jax.rundir import paths


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    flags.DEFINE_string(
        "workdir", None, "A run's --workdir, or a compare --workdir (comparison.json).", flag_values=flag_values
    )
    flags.mark_flags_as_required(["workdir"], flag_values=flag_values)


def write_page(workdir: str) -> str:
    """Writes the workdir's page; returns its path."""
    comparison = os.path.join(workdir, paths.COMPARISON)
    if os.path.exists(comparison):
        with open(comparison) as f:
            page = compare_page.render(json.load(f), workdir)
        return html_lib.write(os.path.join(workdir, paths.COMPARISON_REPORT), page)
    run_reader.check_is_run(workdir)
    if not os.path.isdir(paths.sessions_dir(workdir)):
        raise UserError(f"{workdir} has no completed session yet; the page is written after the first one.")
    return run_page.write(workdir)


@cli.command
def main(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> int:
    cli.quiet_logging()
    if len(argv) > 1:
        raise UserError(f"unexpected arguments {' '.join(argv[1:])}; pass --workdir only.")
    if not os.path.isdir(flag_values.workdir):
        raise UserError(f"--workdir {flag_values.workdir} is not a folder; pass a run's or a comparison's.")
    print(write_page(flag_values.workdir))
    return 0


if __name__ == "__main__":
    cli.run(main, define_flags)
