r"""Run several methods on identical splits and seeds and tabulate them like the paper's Table 1.

    python -m cvs_jax.compare --config configs/<name>.py[:<variant>] --workdir DIR \
        --methods finetune,joint,cvs,ewc@cosine --seeds 0,1,2 [--fixed_split | --split_seed=N] \
        [--config.<key>=<value> ...]

Example (three methods, two seeds, on the offline Fashion-MNIST demo; rerun it to resume):

    python -m cvs_jax.compare --config configs/fashion_mnist_general.py --workdir workdirs/cmp \
        --methods finetune,cvs,ewc@cosine --seeds 0,1 --config.train.epochs=2

Fields you usually change: ``--methods``, ``--seeds``, ``--fixed_split``, and any config field with
``--config.<field>=<value>`` (it applies to every entry), e.g. ``train.epochs``, ``memory.budget``.

An entry of ``--methods`` is a method, trained with ``model.head`` as configured (default
"official": the method's reference head), or ``method@head`` (``cosine`` / ``linear_reset``) to
train it with that head: ``ewc,ewc@cosine`` compares the fork's EWC with its head and with CVS's.
``method@procrustes`` (or ``@affine``, ``@mean_shift``; also after a head, ``cvs@linear_reset@procrustes``)
sets ``retrieval.query_map`` for that entry: ``finetune,finetune@procrustes,cvs,cvs@procrustes`` adds the
training-free query maps, each paired with its entry without the map.  ``--config.retrieval.query_map=...``
sets it for every entry.
``+field=value`` after it sets config fields for that entry alone (an ablation):
``rainbow,rainbow+rainbow.memory=herding,cvs,cvs+cvs.use_lm=False``; each ablation is also paired
with its entry without the ``+`` part when that entry is compared.  ``--tabulate`` runs nothing and
builds the tables from the runs already finished in DIR (a long comparison can be read while it runs:
then they are printed, and its files are left to the running comparison).
Each (seed, entry) runs in ``DIR/seed<seed>/<entry>`` (rerunning resumes).  Session 1 is plain
L_c training for every method (as in the official launch scripts), so it is trained once per seed
and head and its checkpoint is copied into the workdirs of the other entries with that head,
which then resume from session 2; a method whose session 1 keeps statistics of its own
(``Method.shares_first_session`` False: fork EWC / RWalk) trains it.

Seeds and splits: by default each seed draws its own session plan (class order and image
split) and its own initialisation, augmentation and data order.  ``--fixed_split`` runs
every seed on one plan (that of ``config.split_seed``, else of the first seed), as the
official code does (fixed split files, only the run varies); ``--split_seed=N`` names it.

Writes, in DIR:

* ``comparison.md`` / ``comparison.csv``: AR@K, mAP (mean over sessions), the backward-compatibility drop (BC,
  ``compatibility.mean_drop``: recall@1 newer models lose on older gallery parts, in points), AC (a tie
  fails; "AC ties pass" beside it where a tie-passing count differs) and
  AM of the compatibility matrix and the negative-flip rate NFR (docs/comparisons.md, Compatibility metrics)
  mean ± std over seeds; per entry the paired difference to ``cvs`` (the entry minus cvs on the
  same seed): its mean and 95 % Student-t interval over the seeds both finished, "significant"
  when the interval excludes 0, "n/a" with fewer than two seeds; the same paired differences for
  each method's head effect (``m@linear_reset`` minus ``m@cosine``) and for each entry against
  cvs under the same head, when those entries were run; the per-seed AR@1 of every run;
* ``comparison.json``: all of it, per-seed values included (format in ``comparison_json``);
* ``comparison.png``: recall@1 per session per method, mean over seeds.
* ``comparison.html``: the same on one page (the table, paired intervals, per-seed points;
  ``reports/compare_page.py``), rewritten by ``python -m cvs_jax.report --workdir DIR``.

A run that stops with ``NonFiniteError`` (the NaN guard: a diverged baseline) does not stop
the comparison: it is recorded as diverged, with its message, its cells read "diverged",
and the other runs go on (exit status 0).  The comparison holds DIR's lock throughout, and
each run also locks its own workdir.  Any other problem to fix ends with one
``error: ...`` line and exit status 2.
"""

from __future__ import annotations

from absl import flags
from ml_collections import config_flags

from cvs_jax import cli
from cvs_jax.engine import determinism
from cvs_jax.engine.runner import run_comparison
from cvs_jax.errors import UserError
from cvs_jax.methods.registry import METHODS
from cvs_jax.models.heads import HEADS


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    fv = flag_values
    config_flags.DEFINE_config_file("config", None, cli.config_help(), lock_config=True, flag_values=fv)
    flags.DEFINE_string("workdir", None, "Directory for all runs and the comparison table.", flag_values=fv)
    flags.DEFINE_list(
        "methods",
        ["finetune", "joint", "cvs"],
        f"Methods to compare, from: {', '.join(METHODS)}; method@head (head: {', '.join(HEADS)}) trains the "
        "method with that head instead of model.head; method@procrustes (affine, mean_shift) sets retrieval.query_map; "
        "entry+field=value (repeatable) overrides config fields "
        "for that entry alone, e.g. rainbow+rainbow.memory=herding.",
        flag_values=fv,
    )
    flags.DEFINE_list(
        "seeds",
        ["0"],
        "Seeds: each drives initialisation, augmentation and data order, and also the split unless "
        "--fixed_split / --split_seed is given.",
        flag_values=fv,
    )
    flags.DEFINE_bool(
        "fixed_split",
        False,
        "Run every seed on one session plan (class order + image split): that of --split_seed, else of "
        "config.split_seed, else of the first seed (the official code fixes the split and varies the run).",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "split_seed", None, "Seed of the one session plan every run uses (implies --fixed_split).", flag_values=fv
    )
    flags.DEFINE_bool(
        "population",
        False,
        "Train each method's seeds as one population (cvs_jax/engine/population.py: one vmapped step for all of "
        "them; the seeds must be consecutive, k..k+N-1); implies --fixed_split.  Same DIR/seed<k>/<method> "
        "layout; DIR/population/<method>/ holds the population's config and population.json.",
        flag_values=fv,
    )
    flags.DEFINE_bool(
        "tabulate",
        False,
        "Run nothing: build the tables from the runs already in DIR (results.json: finished; diverged.json: "
        "stopped by the NaN guard; neither: not finished, left out), e.g. while a long comparison runs (then "
        "printed only: the running comparison writes DIR's tables).",
        flag_values=fv,
    )
    flags.mark_flags_as_required(["config", "workdir"], flag_values=fv)


@cli.command
def main(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> int:
    fv = flag_values
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {argv[1:]}; pass --config, --workdir, --methods and --seeds.")
    if not all(s.strip().lstrip("-").isdigit() for s in fv.seeds):
        raise UserError(f"--seeds={','.join(fv.seeds)}: give integers, e.g. --seeds 0,1,2")
    seeds = [int(s) for s in fv.seeds]
    split_seed = fv.split_seed
    if split_seed is None and fv.fixed_split:
        split_seed = fv.config.split_seed if fv.config.split_seed is not None else seeds[0]
    cli.quiet_logging()
    determinism.apply(fv.config.deterministic)  # before the first JAX computation
    run_comparison(fv.config, fv.workdir, fv.methods, seeds, split_seed, fv.population, fv.tabulate)
    return 0


if __name__ == "__main__":
    cli.run(main, define_flags)
