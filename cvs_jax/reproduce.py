r"""The paper's tables beside our runs, and the plan that produces every cell.

    python -m cvs_jax.reproduce DIR [DIR ...] [--output_json PATH]
    python -m cvs_jax.reproduce --plan [--plan_seeds 0,1,2] [--plan_workdir workdirs/paper]

Example: ``python -m cvs_jax.reproduce --plan`` prints the commands (and GPU hours) of every cell;
after running some of them, ``python -m cvs_jax.reproduce workdirs/paper/*`` tabulates them.
Flags you change: ``--plan_seeds``, ``--plan_workdir`` and ``--output_json`` (all below).

With result directories (from ``compare``: each holds ``comparison.json`` and the runs under
``seed<k>/<method>/``; a single run's workdir with ``results.json`` works too), prints the
paper's Table 1 (AR@1/2/4 of Joint / Finetune / BCT / CVS on CIFAR-100 and Tiny-ImageNet,
disjoint / blurry / general), LwF and MMD (CIFAR-100, AR@1), the ablations, the 3-run means
and the half-budget runs (``cvs_jax/reports/paper_results.py``, copied from the paper) beside ours: the
mean over our finished runs of that cell, their number, and ours minus the paper's.  A run
counts for a cell when its dataset, setup, method (``results.json``) and config variant (read
from its ``config.json``: the CVS switches and the memory budget of ``cvs_jax/config/variants.py``)
are the cell's.  A cell without runs reads "not run"; one whose runs all stopped with
``NonFiniteError`` reads "diverged".  When a run's config differs from the cell's config file
in any other result-changing field (e.g. fewer epochs), the cell is marked † and the fields are
listed under the table; so it is when a run's sessions brought other image counts than its split gives
on the paper's dataset (another copy of the data, such as the Tiny-ImageNet mini zip).

``--plan`` prints, for every cell, the ``compare`` command that produces it and its estimated
GPU hours on one H100 (the formula and the rates are printed with it).  Nothing is read from
disk but the configs: the image counts come from each config's split on synthetic labels.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os

import numpy as np
from absl import flags

from cvs_jax import cli
from cvs_jax.config import stored
from cvs_jax.data import splits
from cvs_jax.errors import UserError
from cvs_jax.reports import paper_results, statistics
from cvs_jax.rundir import paths

# ---------------------------------------------------------------- the plan's cost model

# Measured step rates (BENCHMARKS.md, "GPU: one NVIDIA H100 80GB HBM3", table (a)).
RATES = {
    "cifar100": {
        "img_per_s": 4676.0,
        "measured": True,
        "note": "measured: BENCHMARKS.md (a), H100, the CVS step (current + frozen previous model, "
        "L_c + 10 L_m + L_d), ResNet-18 CIFAR stem, batch 16, JAX f32: 4,676 img/s",
    },
    "tinyimagenet": {
        "img_per_s": 4676.0,
        "measured": False,
        "note": "NOT measured for Tiny-ImageNet's step (ResNet-18 ImageNet stem on 64x64, batch 64); the "
        "CIFAR batch-16 rate of BENCHMARKS.md (a) is used as a lower bound (the ImageNet stem reaches "
        "16x16 before layer 1, ~1/4 of the CIFAR stem's convolution work per image, and batch 64 "
        "fills the GPU better: 25,821 img/s at CIFAR batch 256), so these hours are an upper bound",
    },
}
OVERHEAD_FRACTION = 0.25  # of the step time: per-epoch validation, per-epoch checkpoints, gallery/test extraction
PER_SESSION_S = 120.0  # per session: compiling the session's train/eval shapes (8-18 s each measured), setup
FORMULA = (
    "GPU h of one run = [(1 + {over:g}) x sum over sessions s of (epochs x images_per_epoch_s) / rate"
    " + {per:g} s x sessions] / 3600\n"
    "  images_per_epoch_s = floor((n_s + m_s) / batch) x batch (the last partial batch is dropped), n_s = the\n"
    "  images session s trains on (joint: all sessions <= s) in the config's split, built with\n"
    "  cvs_jax.data.splits.make_session_plan on synthetic labels (C classes x 500 train images: CIFAR-100 and\n"
    "  Tiny-ImageNet), m_s = the replayed memory (herding: sum over the pool's classes of\n"
    "  min(images, floor(budget / classes))).  The official CIFAR-100 session files (which CIFAR-100 runs may\n"
    "  read instead of the generator) hold the same counts for general and disjoint, and 9,000 instead of\n"
    "  8,640 training images per blurry10 session (+4 %).\n"
    "  Allowance (an assumption, not measured): +{over_pct:.0f} % of the step time for the per-epoch validation\n"
    "  pass (forward only, 5-11 % as many images as trained), per-epoch checkpoints and gallery/test extraction,\n"
    "  plus {per:g} s per session for compiling its shapes.  The rate is that of the CVS step (with the frozen\n"
    "  previous model) for every method and session: an upper bound for steps without the old model.\n"
    "  A command trains session 1 once per seed and shares it with its other methods: its total counts it once."
)


def _load_config(name: str, variant: str = ""):
    try:
        module = importlib.import_module(f"cvs_jax.config.{name}")
    except ModuleNotFoundError as e:
        raise UserError(f"cannot import the config {name} ({e}): cvs_jax/config/{name}.py is missing.") from None
    return module.get_config(variant)


@functools.lru_cache(maxsize=None)
def expected_config(dataset: str, setup: str, variant: str) -> dict:
    """The config dict a paper cell's runs use (before ``method`` and ``seed``)."""
    name = paper_results.DATASETS[dataset]["config"].format(setup=setup)
    return _load_config(name, variant).to_dict()


def config_name(dataset: str, setup: str) -> str:
    return paper_results.DATASETS[dataset]["config"].format(setup=setup)


def session_plan(config, dataset: str) -> splits.SessionPlan:
    """The config's split on synthetic labels of the dataset's size (no data files)."""
    info = paper_results.DATASETS[dataset]
    labels = np.repeat(np.arange(info["num_classes"]), info["train_per_class"])
    return splits.plan_from_config(labels, config, num_classes=info["num_classes"])


def images_per_epoch(config, dataset: str) -> list[int]:
    """Images one epoch of each session trains on (session images + replayed memory, whole batches)."""
    from cvs_jax.methods import policies
    from cvs_jax.methods.registry import get_method  # pylint: disable=g-import-not-at-top

    plan = session_plan(config, dataset)
    method = get_method(config)
    info = paper_results.DATASETS[dataset]
    labels = plan.to_protocol_labels(np.repeat(np.arange(info["num_classes"]), info["train_per_class"]))
    bs, budget = config.train.batch_size, int(config.memory.budget)
    mem = np.zeros(int(labels.max()) + 1, np.int64)  # replayed images per class
    seen, out = 0, []
    for s in range(plan.num_sessions):
        n = len(method.scope.indices(plan, s))
        if s > 0 and method.memory.keeps_memory:
            prev = plan.sessions[s - 1].train
            seen += len(prev)
            if isinstance(method.memory, policies.HerdingMemory):
                pool = np.bincount(labels[prev], minlength=len(mem)) + mem
                mem = np.minimum(pool, budget // max(int((pool > 0).sum()), 1))
            else:  # reservoir / uncertainty memories: filled up to the budget
                mem = np.array([min(budget, seen)])
        m = int(mem.sum()) if s > 0 and method.memory.keeps_memory else 0
        if isinstance(method.batches, policies.HalfMemoryBatches) and m > 0:
            out.append(n // (bs // 2) * bs)
        else:
            out.append((n + m) // bs * bs)
    return out


def run_estimate(dataset: str, setup: str, method: str, variant: str) -> dict:
    """Trained images and estimated GPU hours of one run of a cell (see ``FORMULA``)."""
    c = _load_config(config_name(dataset, setup), variant)
    c.method = method
    per_epoch = images_per_epoch(c, dataset)
    rate = RATES[dataset]["img_per_s"]
    step_s = [c.train.epochs * n / rate for n in per_epoch]
    hours = ((1 + OVERHEAD_FRACTION) * sum(step_s) + PER_SESSION_S * len(step_s)) / 3600
    first = ((1 + OVERHEAD_FRACTION) * step_s[0] + PER_SESSION_S) / 3600
    return {
        "sessions": len(per_epoch),
        "epochs": int(c.train.epochs),
        "batch": int(c.train.batch_size),
        "images_per_epoch": per_epoch,
        "trained_images": int(c.train.epochs * sum(per_epoch)),
        "rate": rate,
        "hours": hours,
        "session1_hours": first,
    }


def plan_command(entry: dict, seeds: str, root: str) -> tuple[str, list[str]]:
    """The ``compare`` command that produces a cell, and its methods.  Cells without a variant share one
    command per dataset x setup (Table 1's methods, plus LwF and MMD on CIFAR-100); a variant runs alone."""
    name = config_name(entry["dataset"], entry["setup"])
    if entry["variant"]:
        methods, config, wd = (
            [entry["method"]],
            f"configs/{name}.py:{entry['variant']}",
            f"{root}/{name}_{entry['variant']}",
        )
    else:
        methods = list(paper_results.TABLE1_METHODS) + (["lwf", "mmd"] if entry["dataset"] == "cifar100" else [])
        config, wd = f"configs/{name}.py", f"{root}/{name}"
    cmd = (
        f"python -m cvs_jax.compare --config {config} --workdir {wd} --methods {','.join(methods)} "
        f"--seeds {seeds} --fixed_split"
    )
    return cmd, methods


def plan(seeds: list[int], root: str) -> tuple[str, dict]:
    """The plan's text and its JSON form."""
    seeds_arg = ",".join(str(s) for s in seeds)
    lines = [
        "Plan: the command that produces every cell of the paper's tables and its estimated GPU hours on",
        f"one H100, for {len(seeds)} seed(s) ({seeds_arg}) on one fixed split per command.",
        "",
        FORMULA.format(over=OVERHEAD_FRACTION, per=PER_SESSION_S, over_pct=100 * OVERHEAD_FRACTION),
        "  Rates:",
    ]
    lines += [
        f"    {paper_results.DATASETS[d]['label']}: {r['img_per_s']:,.0f} img/s, {r['note']}." for d, r in RATES.items()
    ]
    commands: dict[str, dict] = {}
    cells = []
    for group in paper_results.GROUPS:
        lines += ["", f"## {group}"]
        for e in (e for e in paper_results.ENTRIES if e["group"] == group):
            cmd, methods = plan_command(e, seeds_arg, root)
            est = run_estimate(e["dataset"], e["setup"], e["method"], e["variant"])
            first = commands.setdefault(cmd, {"command": cmd, "methods": methods, "runs": {}})["runs"]
            again = e["method"] in first
            first.setdefault(e["method"], est)
            paper = " / ".join(f"{v:.2f}" for v in e["ar"].values())
            if "std" in e:
                paper += f" ± {e['std']['1']:.2f} over {e['paper_runs']} runs"
            ks = "/".join(e["ar"])
            cell = f"{paper_results.DATASETS[e['dataset']]['label']} | {e['setup']} | {e['label']}"
            lines.append(f"{group} | {cell} (paper AR@{ks} {paper}; {e['source']})")
            lines.append(f"  {cmd}")
            cost = (
                f"{len(seeds)} run(s) x {est['sessions']} sessions x {est['epochs']} epochs, "
                f"{est['trained_images'] / 1e6:.2f} M trained images per run at {est['rate']:,.0f} img/s -> "
                f"{est['hours']:.2f} GPU h per run, {len(seeds) * est['hours']:.2f} GPU h"
            )
            lines.append(f"  {cost}" + (" (the same runs as an earlier cell: no extra time)" if again else ""))
            cells.append(
                {**e, "command": cmd, "estimate": est, "extra_gpu_hours": 0 if again else len(seeds) * est["hours"]}
            )
    lines += ["", "## Commands (run each once; rerunning resumes)"]
    total = 0.0
    for i, c in enumerate(commands.values()):
        runs = [c["runs"][m] for m in c["methods"] if m in c["runs"]]
        missing = [m for m in c["methods"] if m not in c["runs"]]
        if missing:  # methods a shared command runs that no cell asks for (none today)
            runs += [run_estimate(*_cell_of(c["command"]), m, "") for m in missing]
        hours = len(seeds) * (sum(r["hours"] for r in runs) - sum(r["session1_hours"] for r in runs[1:]))
        c["gpu_hours"] = hours
        total += hours
        lines.append(f"[{i + 1}] {c['command']}")
        lines.append(f"    {len(seeds)} seed(s) x {len(c['methods'])} method(s): {hours:.1f} GPU h")
    lines.append(f"\nTotal: {len(commands)} commands, {total:.1f} GPU h on one H100 (estimate, see the formula above).")
    return "\n".join(lines), {"seeds": seeds, "cells": cells, "commands": list(commands.values()), "gpu_hours": total}


def _cell_of(command: str) -> tuple[str, str]:
    name = command.split("--config configs/", 1)[1].split(".py", 1)[0]
    for d, info in paper_results.DATASETS.items():
        for s in paper_results.SETUPS:
            if info["config"].format(setup=s) == name:
                return d, s
    raise ValueError(command)


# ---------------------------------------------------------------- our runs


@dataclasses.dataclass
class Run:
    path: str
    dataset: str | None  # a key of paper_results.DATASETS, None: not a paper dataset
    data_name: str
    setup: str
    method: str
    seed: int | None
    status: str  # "ok" or "diverged"
    message: str | None
    average_recall: dict  # K -> AR@K in %
    variant: str = ""
    differences: tuple = ()  # result-changing config fields that differ from the cell's config file
    data_differences: tuple = ()  # the run's sessions differ from those the paper's dataset gives (data_difference)
    config_known: bool = True


IGNORED_FIELDS = ("seed", "split_seed", "method")  # what a cell's runs may vary
VARIANT_FIELDS = ("memory.budget",)
CVS_FIELDS = ("cvs.use_lm", "cvs.use_ld", "cvs.replay")  # read by method cvs only


def _get(d: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def paper_dataset(data_name: str) -> str | None:
    base = data_name.split("/", 1)[0].split(":", 1)[0]
    return next((k for k, v in paper_results.DATASETS.items() if base in v["data_names"]), None)


def infer_variant(config: dict, dataset: str, setup: str) -> str:
    """The ``cvs_jax/config/variants.py`` ablation a run's config is (""): the first whose CVS switches (method
    cvs only) and memory budget equal the run's; otherwise a description of those fields."""
    from cvs_jax.config.variants import ABLATIONS  # pylint: disable=g-import-not-at-top

    fields = VARIANT_FIELDS + (CVS_FIELDS if config["method"] == "cvs" else ())
    for variant in [""] + [v for v in ABLATIONS if v not in ("cvs", "lc")]:
        expected = expected_config(dataset, setup, variant)
        if all(_get(config, f) == _get(expected, f) for f in fields):
            return variant
    return "custom(" + ",".join(f"{f}={_get(config, f)}" for f in fields) + ")"


def recipe_differences(config: dict, expected: dict) -> tuple[str, ...]:
    a, b = stored.comparable(expected), stored.comparable(config)
    keys = sorted(k for k in set(a) | set(b) if k not in IGNORED_FIELDS and a.get(k) != b.get(k))
    return tuple(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in keys)


def _read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path} ({e}); rerun the command that wrote it.") from None


def data_difference(config: dict, results: dict | None, dataset: str) -> tuple[str, ...]:
    """The images each session of the run brought (``results.json``) against those its own split gives on
    the paper's dataset (``session_plan``): a run of a paper config on another copy of the data (the
    200-class Tiny-ImageNet mini zip, 100 train images per class where Tiny-ImageNet has 500) has the
    cell's config and other sessions.  () when they agree, or when the run does not say (runs written
    before ``new_images`` was recorded, the official CIFAR-100 session files)."""
    got = [s.get("new_images") for s in (results or {}).get("per_session", [])]
    if not got or None in got:
        return ()
    try:
        c = stored.over_defaults(config, "config.json")
        if c.data.split != "generator":
            return ()
        want = [len(s.train) for s in session_plan(c, dataset).sessions][: len(got)]
    except UserError:  # a split the paper's class sizes cannot give (a custom config): nothing to compare
        return ()
    if got == want:
        return ()
    info = paper_results.DATASETS[dataset]
    return (
        f"its sessions brought {'/'.join(map(str, got))} training images, where {info['label']} "
        f"({info['train_per_class']} per class) gives {'/'.join(map(str, want))}: another copy of the data "
        "(e.g. the Tiny-ImageNet mini zip)",
    )


def _identify(run: Run, config: dict | None, results: dict | None = None) -> Run:
    run.dataset = paper_dataset(run.data_name)
    if run.dataset is None or run.setup not in paper_results.SETUPS:
        return run
    if config is None:
        run.config_known = False
        return run
    config = {**config, "method": run.method}
    run.variant = infer_variant(config, run.dataset, run.setup)
    if not run.variant.startswith("custom("):
        run.differences = recipe_differences(config, expected_config(run.dataset, run.setup, run.variant))
        run.data_differences = data_difference(config, results, run.dataset)
    return run


def find_runs(dirs: list[str]) -> list[Run]:
    """Every finished or diverged run under ``dirs``: the runs a ``comparison.json`` lists, and every
    directory holding a ``results.json`` (earlier runs moved into ``previous-*`` are skipped)."""
    runs: dict[str, Run] = {}
    for top in dirs:
        if not os.path.isdir(top):
            raise UserError(f"{top} is not a directory; name the --workdir of a compare or main run.")
        for root, subdirs, files in os.walk(top):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith("previous-") and d != paths.CHECKPOINTS)
            if "comparison.json" in files:
                cmp = _read_json(os.path.join(root, "comparison.json"))
                for r in cmp.get("runs", []):
                    path = os.path.realpath(os.path.join(root, r["workdir"]))
                    cfg_path = paths.config_file(path)
                    config = _read_json(cfg_path) if os.path.exists(cfg_path) else None
                    run = Run(
                        path,
                        None,
                        (config or {}).get("data", {}).get("name") or cmp["dataset"],
                        cmp["setup"],
                        r["method"],
                        r["seed"],
                        r["status"],
                        r.get("message"),
                        dict(r.get("average_recall") or {}),
                    )
                    res_path = paths.results_file(path)
                    runs[path] = _identify(run, config, _read_json(res_path) if os.path.exists(res_path) else None)
            if paths.RESULTS in files:
                path = os.path.realpath(root)
                if path in runs:
                    continue
                res = _read_json(paths.results_file(root))
                cfg_path = paths.config_file(root)
                config = _read_json(cfg_path) if os.path.exists(cfg_path) else None
                run = Run(
                    path,
                    None,
                    res["dataset"] if config is None else config["data"]["name"],
                    res["setup"],
                    res["method"],
                    res.get("seed"),
                    "ok",
                    None,
                    {k: 100 * v for k, v in res["average_recall"].items()},
                )
                runs[path] = _identify(run, config, res)
    return list(runs.values())


def match(runs: list[Run]) -> list[dict]:
    """One record per paper cell: the paper's numbers, our runs of it, their mean/std, ours - paper."""
    cells = []
    for e in paper_results.ENTRIES:
        key = (e["dataset"], e["setup"], e["method"], e["variant"])
        mine = [r for r in runs if (r.dataset, r.setup, r.method, r.variant) == key]
        ok = [r for r in mine if r.status == "ok"]
        ours, delta = {}, {}
        for k, paper in e["ar"].items():
            values = [r.average_recall[k] for r in ok if k in r.average_recall]
            if values:
                mean, std = statistics.mean_std(values)
                ours[k] = {"mean": mean, "std": std, "per_run": values}
                delta[k] = mean - paper
        cells.append(
            {
                **e,
                "runs": [r.path for r in ok],
                "seeds": [r.seed for r in ok],
                "diverged": [{"path": r.path, "seed": r.seed, "message": r.message} for r in mine if r not in ok],
                "ours": ours,
                "delta": delta,
                "recipe_differences": sorted({d for r in ok for d in r.differences}),
                "data_differences": sorted({d for r in ok for d in r.data_differences}),
                "config_unknown": [r.path for r in ok if not r.config_known],
            }
        )
    return cells


def _ours_text(c: dict) -> str:
    if not c["ours"]:
        return f"diverged ({len(c['diverged'])} run(s))" if c["diverged"] else "not run"
    n = len(c["runs"])
    parts = [f"{v['mean']:.2f}" + (f" ± {v['std']:.2f}" if n > 1 else "") for k, v in c["ours"].items() if k in c["ar"]]
    text = " / ".join(parts)
    if c["diverged"]:
        text += f" ({len(c['diverged'])} diverged)"
    if c["recipe_differences"] or c["data_differences"]:
        text += " †"
    return text


def report(cells: list[dict], runs: list[Run], dirs: list[str]) -> str:
    matched = {p for c in cells for p in c["runs"] + [d["path"] for d in c["diverged"]]}
    lines = [
        "The paper's numbers (cvs_jax/reports/paper_results.py) beside ours: AR@K in %; "
        "ours = mean (± std) over our finished runs of the cell, n = their number; delta = ours - paper.",
        f"Read {len(runs)} run(s) from {', '.join(dirs)}; {len(matched)} count for a cell.",
    ]
    notes = []
    for group in paper_results.GROUPS:
        for dataset, info in paper_results.DATASETS.items():
            rows = [c for c in cells if c["group"] == group and c["dataset"] == dataset]
            if not rows:
                continue
            ks = list(rows[0]["ar"])
            head = "/".join(f"AR@{k}" for k in ks)
            title = f"{group}: {info['label']}" + (f" ({info['recipe']})" if group == paper_results.TABLE1 else "")
            lines += ["", f"### {title}", "", f"| setup | method | paper {head} | ours {head} | n | delta {head} |"]
            lines.append("|---|---|---|---|---|---|")
            for c in rows:
                paper = " / ".join(f"{v:.2f}" for v in c["ar"].values())
                if "std" in c:
                    paper += f" ± {c['std']['1']:.2f} ({c['paper_runs']} runs)"
                delta = " / ".join(f"{c['delta'][k]:+.2f}" if k in c["delta"] else "" for k in ks) if c["delta"] else ""
                setup = paper_results.SETUP_LABELS[(dataset, c["setup"])]
                lines.append(f"| {setup} | {c['label']} | {paper} | {_ours_text(c)} | {len(c['runs'])} | {delta} |")
                cell = f"{info['label']} {c['setup']} {c['label']} ({group})"
                if c["recipe_differences"]:
                    shown = "; ".join(c["recipe_differences"][:8]) + (
                        "; ..." if len(c["recipe_differences"]) > 8 else ""
                    )
                    name = f"configs/{config_name(dataset, c['setup'])}.py" + (
                        f":{c['variant']}" if c["variant"] else ""
                    )
                    notes.append(f"† {cell}: config differs from {name}: {shown}")
                for d in c["data_differences"]:
                    notes.append(f"† {cell}: the data differs from {info['label']}'s: {d}")
                if c["config_unknown"]:
                    notes.append(f"{cell}: {len(c['config_unknown'])} run(s) without config.json (variant not checked)")
                for d in c["diverged"]:
                    notes.append(f"{cell}: seed {d['seed']} diverged ({d['path']}): {d['message']}")
    if notes:
        lines += ["", *notes]
    others = sorted(
        {f"{r.data_name}/{r.setup}/{r.method}" + (f":{r.variant}" if r.variant else "") for r in runs}
        - {
            f"{r.data_name}/{r.setup}/{r.method}" + (f":{r.variant}" if r.variant else "")
            for r in runs
            if r.path in matched
        }
    )
    if others:
        lines += ["", f"Runs in no cell of the paper's tables: {', '.join(others)}."]
    return "\n".join(lines)


# ---------------------------------------------------------------- entry point


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    fv = flag_values
    flags.DEFINE_bool(
        "plan", False, "Print the command and the estimated GPU hours of every cell instead.", flag_values=fv
    )
    flags.DEFINE_list(
        "plan_seeds", ["0", "1", "2"], "Seeds in the --plan commands (the paper's 3-run means).", flag_values=fv
    )
    flags.DEFINE_string(
        "plan_workdir", "workdirs/paper", "Parent directory of the --plan commands' workdirs.", flag_values=fv
    )
    flags.DEFINE_string("output_json", None, "Also write the table (or the plan) as JSON to this file.", flag_values=fv)


@cli.command
def main(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> int:
    """``argv``: what absl left after the flags (program name, then the result directories)."""
    fv, dirs = flag_values, argv[1:]
    if fv.plan and dirs:
        raise UserError("--plan reads no result directories; drop them or drop --plan")
    if not fv.plan and not dirs:
        raise UserError("name at least one result directory (a compare --workdir), or pass --plan")
    if not all(s.strip().lstrip("-").isdigit() for s in fv.plan_seeds):
        raise UserError(f"--plan_seeds={','.join(fv.plan_seeds)}: give integers, e.g. --plan_seeds 0,1,2")
    if fv.plan:
        text, data = plan([int(s) for s in fv.plan_seeds], fv.plan_workdir.rstrip("/"))
    else:
        runs = find_runs(dirs)
        cells = match(runs)
        text, data = report(cells, runs, dirs), {"cells": cells}
    print(text)
    if fv.output_json:
        with open(fv.output_json, "w") as f:
            json.dump(data, f, indent=1)
    return 0


if __name__ == "__main__":
    cli.run(main, define_flags)
