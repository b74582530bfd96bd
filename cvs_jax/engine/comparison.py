"""Several methods on identical splits and seeds (``python -m cvs_jax.compare``): the entries, the records
of their runs and the tables.  ``runner.run_comparison`` runs every (seed, method) in
``DIR/seed<k>/<method>/``, session 1 shared where methods train it alike, holding DIR's lock throughout;
each run also locks its own workdir.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import time

from cvs_jax.errors import ConfigError
from cvs_jax.methods import memory_rules
from cvs_jax.methods.registry import METHODS, get_method, head_name, registered
from cvs_jax.models.heads import HEADS
from cvs_jax.reports import compare_page, plots
from cvs_jax.reports import html as html_lib
from cvs_jax.reports.tables import (
    AC_PASS,
    BC,
    COMPAT,
    REFERENCE,
    comparison_json,
    markdown,
    rows_from_summary,
    summarize_pairs,
    summarize_runs,
    write_csv,
)
from cvs_jax.retrieval import compatibility, query_maps
from cvs_jax.rundir import paths, run_files


def share_first_session(source: str, target: str) -> None:
    """Copies the session-1 checkpoint and its metrics so ``target`` resumes at session 2.  ``target`` then
    holds a checkpoint without config.json or protocol.json (the entry's run writes them): ``paths.SHARED_SESSION``
    marks it, written before the checkpoint appears, so that ``config.recorded.prepare`` tells it from a run
    whose config.json was deleted (refused)."""
    src = paths.session_dir(source, 0)
    dst = paths.session_dir(target, 0)
    if os.path.exists(dst) or not os.path.exists(src):
        return
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    run_files.write_json(paths.shared_session_file(target), {"session": 1, "copied_from": os.path.abspath(source)})
    shutil.copytree(src, dst + ".copying")
    os.rename(dst + ".copying", dst)  # atomic: a half copy is never taken for a checkpoint
    with open(paths.metrics_file(source)) as f:
        first = [line for line in f if json.loads(line)["session"] == 1]
    with open(paths.metrics_file(target), "w") as f:
        f.writelines(first)


def parse_entry(entry: str) -> tuple[str, str | None, dict[str, str]]:
    """``"ewc@cosine+importance.mode=online"`` -> ("ewc", "cosine", {"importance.mode": "online"});
    ``"ewc"`` -> ("ewc", None, {}): the configured model.head, no override.  A query-map kind after ``@``
    sets ``retrieval.query_map``: ``"cvs@procrustes"`` -> ("cvs", None, {"retrieval.query_map":
    "procrustes"}), ``"cvs@linear_reset@affine"`` sets both."""
    base, *fields = entry.split("+")
    method, *tags = base.split("@")
    overrides = {}
    maps = [t for t in tags if t in query_maps.KINDS and t != "none"]
    if maps:
        overrides["retrieval.query_map"] = maps[-1]
    heads = [t for t in tags if t not in maps]
    head = "@".join(heads)  # anything else is a head (refused by run_comparison when it names none)
    for f in fields:
        key, sep, value = f.partition("=")
        if not sep or not key:
            raise ConfigError(f"--methods entry {entry!r}: write each override as +field=value, e.g. +cvs.use_lm=False")
        overrides[key] = value
    return method, (head or None), overrides


def _without_map(entry: str) -> str:
    """``"cvs@linear_reset@procrustes"`` -> ``"cvs@linear_reset"``: the entry without its query-map tag."""
    method, *tags = entry.split("@")
    return "@".join([method] + [t for t in tags if t not in query_maps.KINDS])


def _typed(old, value: str, key: str):
    """``value`` parsed as the type of the field's current value (bools from True/False)."""
    if isinstance(old, bool):
        if value not in ("True", "False", "true", "false"):
            raise ConfigError(f"+{key}={value}: {key} is a bool; write True or False.")
        return value in ("True", "true")
    try:
        return type(old)(value) if old is not None else value
    except ValueError:
        raise ConfigError(f"+{key}={value}: {key} holds a {type(old).__name__}, e.g. {old!r}.") from None


def entry_config(config, entry: str, seed: int, split_seed):
    """The config of one (seed, entry) run."""
    c = copy.deepcopy(config)
    c.unlock()
    method, head, overrides = parse_entry(entry)
    c.method, c.seed, c.split_seed = method, seed, split_seed
    if head is not None:
        c.model.head = head
    for key, value in overrides.items():
        *path, field = key.split(".")
        node = c
        for part in path:
            node = node[part] if part in node else None
            if node is None:
                break
        if node is None or field not in node:
            raise ConfigError(f"--methods entry {entry!r}: the config has no field {key!r}.")
        node[field] = _typed(node[field], value, key)
    return c


DIVERGED = "diverged.json"  # written into a run dir stopped by the NaN guard: {"message": ...}


def _write_json(path: str, value) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=1)
    os.replace(path + ".tmp", path)


def record_divergence(run_dir: str, error: Exception) -> None:
    """Marks a run stopped by the NaN guard (``DIVERGED``), which ``recorded_run`` reads back."""
    _write_json(os.path.join(run_dir, DIVERGED), {"message": str(error)})


def recorded_run(config, workdir: str, entry: str, seed: int, split_seed) -> dict | None:
    """The record of a run already in ``workdir`` (``--tabulate``): finished (results.json), diverged
    (diverged.json), or None when it has not finished."""
    run_dir = os.path.join(workdir, f"seed{seed}", entry)
    c = entry_config(config, entry, seed, split_seed)
    for path in (paths.results_file(run_dir), os.path.join(run_dir, DIVERGED)):
        if os.path.exists(path):
            with open(path) as f:
                value = json.load(f)
            if path.endswith(DIVERGED):
                return run_record(seed, entry, c, run_dir, workdir, None, value["message"])
            return run_record(seed, entry, c, run_dir, workdir, value)
    print(f"seed {seed}, {entry}: not finished in {run_dir}; left out")
    return None


def run_record(seed: int, method: str, c, run_dir: str, workdir: str, results: dict | None, error=None) -> dict:
    """One run of the comparison (``method``: the ``--methods`` entry, ``c``: its config): what
    ``comparison.json`` lists (recalls and the compatibility summaries BC, AC, AM, NFR, in % / points)."""
    record = {
        "seed": seed,
        "method": method,
        "head": head_name(c),
        "workdir": os.path.relpath(run_dir, workdir),
        "status": "ok" if error is None else "diverged",
        "message": None if error is None else str(error),
        "average_recall": None,
        "recall1_per_session": None,
        "memory_rule": memory_rules.describe(get_method(c).memory),
        "memory_rows": None,  # replay rows stored before each session (absent before it was recorded)
        **{key: None for key in COMPAT},
    }
    if results is not None:
        record["average_recall"] = {k: 100 * v for k, v in results["average_recall"].items()}
        record["recall1_per_session"] = [100 * s["recall"]["1"] for s in results["per_session"]]
        rows = [s.get("memory_rows") for s in results["per_session"]]
        record["memory_rows"] = None if None in rows else rows
        matrix = results["compatibility_recall1"]
        summaries = {
            BC: compatibility.mean_drop(matrix),
            "AC": compatibility.average_compatibility(matrix),
            AC_PASS: compatibility.average_compatibility(matrix, ties="pass"),
            "mAP": results.get("average_map"),  # absent before mAP was recorded
            "AM": compatibility.average_multimodel_accuracy(matrix),
            "NFR": compatibility.mean_flips(results.get("negative_flip_rate")),  # absent before it existed
        }
        record.update({k: None if v is None else 100 * v for k, v in summaries.items()})
    return record


def entry_pairs(config, methods: list[str]) -> list[tuple[str, str, str]]:
    """The paired comparisons beyond "each entry minus cvs": ``(a, b, why)`` for each method run under
    both heads (``a`` linear_reset, ``b`` cosine: the head effect) and for each entry against the cvs
    entry trained with the same head (when that cvs entry is not plain ``cvs``, already the reference);
    and each ablation (``entry+field=value``) against its entry without overrides; each query-map entry
    (``method@procrustes``) against the entry without the map (``method``), its query-map effect; and
    each entry against the cvs entry with the same settings (``_same_settings_pairs``)."""
    mapped = {e: _without_map(e) for e in methods if "+" not in e and "retrieval.query_map" in parse_entry(e)[2]}
    plain = [e for e in methods if "+" not in e and e not in mapped]
    ablations = [(e, _ablation_base(e, methods)) for e in methods if "+" in e]
    pairs = [(e, base, f"ablation of {base}") for e, base in ablations if base in methods]
    pairs += [(e, base, f"query map of {base}") for e, base in mapped.items() if base in plain]
    pairs += _equal_memory_pairs(config, methods)
    heads = {}
    for entry in plain:
        c = entry_config(config, entry, 0, None)
        heads[entry] = (c.method, head_name(c))
    for method in dict.fromkeys(m for m, _ in heads.values()):
        by_head = {h: e for e, (m, h) in heads.items() if m == method}
        if "linear_reset" in by_head and "cosine" in by_head:
            pairs.append((by_head["linear_reset"], by_head["cosine"], f"head effect of {method}"))
    for entry, (method, head) in heads.items():
        ref = next((e for e, (m, h) in heads.items() if m == REFERENCE and h == head), None)
        if method != REFERENCE and ref is not None and ref != REFERENCE:
            pairs.append((entry, ref, f"against {REFERENCE} with the {head} head"))
    taken = {(a, b) for a, b, _ in pairs}
    pairs += [p for p in _same_settings_pairs(config, methods) if p[:2] not in taken]
    return pairs


def _size_rule(entry_cfg) -> str:
    """The size rule of the memory an entry's config keeps ("budget", "per_class", "all" or "none")."""
    return memory_rules.rule_of(get_method(entry_cfg).memory)


def _same_settings_pairs(config, methods: list[str]) -> list[tuple[str, str, str]]:
    """Each entry against the cvs entry with its head, query map and overrides less ``memory.rule``
    (``cl2r+model.embed_dim=200+memory.rule=budget`` against ``cvs+model.embed_dim=200``): a study at
    another width than the config's otherwise pairs every entry with plain ``cvs``, which differs in
    more than the method (Tiny-ImageNet mini's 200-d study needed a script for these pairs)."""
    cvs_entries = {}
    for entry in methods:
        method, head, overrides = parse_entry(entry)
        if method == REFERENCE and entry != REFERENCE and "memory.rule" not in overrides:
            cvs_entries[(head, tuple(sorted(overrides.items())))] = entry
    pairs = []
    for entry in methods:
        method, head, overrides = parse_entry(entry)
        rest = tuple(sorted((k, v) for k, v in overrides.items() if k != "memory.rule"))
        ref = cvs_entries.get((head, rest))
        if method == REFERENCE or ref is None:
            continue
        size = {e: _size_rule(entry_config(config, e, 0, None)) for e in (entry, ref)}
        if "memory.rule" in overrides and size[entry] == size[ref]:
            pairs.append((entry, ref, f"at equal memory ({size[ref]}): against {ref}, the same settings"))
        else:
            pairs.append((entry, ref, f"against {ref}, the same settings"))
    return pairs


def _ablation_base(entry: str, methods: list[str]) -> str:
    """The entry an ablation is paired with: ``entry`` less its last ``+`` overrides, the longest such prefix
    that is compared (``cl2r+model.head_block=16+memory.rule=budget`` -> ``cl2r+model.head_block=16``),
    else the bare method entry."""
    parts = entry.split("+")
    for n in range(len(parts) - 1, 0, -1):
        if "+".join(parts[:n]) in methods:
            return "+".join(parts[:n])
    return parts[0]


def _equal_memory_pairs(config, methods: list[str]) -> list[tuple[str, str, str]]:
    """Each entry with its method's own memory against the cvs entry given that memory's size rule
    (``cvs+memory.rule=per_class`` for cl2r and hoc, ``cvs+memory.rule=all`` for cores)."""
    rules = {}
    for entry in methods:
        c = entry_config(config, entry, 0, None)
        rules[entry] = (c.method, c.memory.rule, _size_rule(c))
    pairs = []
    for ref, (method, rule, size) in rules.items():
        if method != REFERENCE or rule == "official" or "retrieval.query_map" in parse_entry(ref)[2]:
            continue
        for entry, (m, r, own) in rules.items():
            if m != REFERENCE and r == "official" and own == size:
                pairs.append((entry, ref, f"at equal memory ({size}): against {REFERENCE} given {m}'s memory"))
    return pairs


def check_entries(config, methods: list[str], seeds: list[int], split_seed: int | None, population: bool) -> None:
    """Refuses a comparison's entries before anything runs: seeds a population cannot take, unknown
    methods or heads, an entry or a seed named twice, an override of a field that does not exist, no entry
    or no seed."""
    if not methods:
        raise ConfigError("--methods names no entry; name at least one, e.g. --methods finetune,cvs.")
    if not seeds:
        raise ConfigError("--seeds names no seed; name at least one, e.g. --seeds 0,1,2.")
    if len(set(seeds)) < len(seeds):  # it ran once, and the tables' "n seeds" counted it once
        raise ConfigError(f"--seeds {','.join(map(str, seeds))} names a seed twice; name each once.")
    if population and sorted(seeds) != list(range(min(seeds), min(seeds) + len(seeds))):
        raise ConfigError(
            f"--population trains seeds k..k+N-1 as one population; --seeds {','.join(map(str, seeds))} are "
            f"not consecutive (e.g. --seeds {','.join(str(min(seeds) + i) for i in range(len(seeds)))})."
        )
    unknown = [m for m in methods if parse_entry(m)[0] not in METHODS]  # parse_entry refuses a bad override
    if unknown:
        raise ConfigError(f"--methods names unknown methods {unknown}; choose from {sorted(METHODS)}.")
    bad_heads = [m for m in methods if parse_entry(m)[1] not in (None,) + HEADS]
    if bad_heads:
        raise ConfigError(
            f"--methods {bad_heads}: after '@' name a head, one of {list(HEADS)} (e.g. ewc@cosine), or a query map, "
            f"one of {list(query_maps.KINDS[1:])} (e.g. cvs@procrustes)."
        )
    if len(set(methods)) < len(methods):
        raise ConfigError(f"--methods {','.join(methods)} names an entry twice; name each once.")
    for entry in methods:  # an override of a field that does not exist, or of the wrong type, stops here
        get_method(entry_config(config, entry, seeds[0], split_seed))


# Config groups every run reads only from session 2 on: the weights of the terms added from session 2, the
# query maps fitted from session 2 (``retrieval.query_map``).
ENGINE_SESSION_TWO_GROUPS = ("loss_weights", "retrieval")


def session_two_groups(config) -> tuple[str, ...]:
    """Config groups read only from session 2 on, derived from the registered methods: the engine's, each
    method's own sections (``Method.own_sections``) and ``memory`` when a method keeps one (built after
    session 1).  An entry whose overrides stay inside them shares session 1."""
    groups = list(ENGINE_SESSION_TWO_GROUPS)
    for method in registered(config).values():
        groups += [g for g in method.own_sections + (("memory",) if method.uses_memory else ()) if g not in groups]
    return tuple(groups)


def write_outputs(
    config, workdir: str, methods: list[str], seeds: list[int], split_seed, runs: list[dict], t0: float, write=True
):
    """The comparison's tables, JSON, page and plot from its runs' records; returns one row per method
    (``rows_from_summary``).  ``write=False`` (``--tabulate`` while the comparison runs): printed only."""
    summary = summarize_runs(runs, methods, config.eval.ks)
    pairs = summarize_pairs(runs, entry_pairs(config, methods), config.eval.ks)
    rows = rows_from_summary(summary)
    title = f"{config.data.name} / {config.data.setup}"
    if split_seed is None:
        split_note = "each seed has its own class order and split"
    else:
        split_note = f"every seed runs on the split of split_seed={split_seed} (seeds vary initialisation and order)"
    table = markdown(summary, runs, title, split_note, pairs)
    if not write:
        print(f"\n{table}", flush=True)
        return rows
    with open(os.path.join(workdir, "comparison.md"), "w") as f:
        f.write(table + "\n")
    write_csv(os.path.join(workdir, "comparison.csv"), rows)
    tmp = os.path.join(workdir, "comparison.json.tmp")
    with open(tmp, "w") as f:
        json.dump(comparison_json(config, methods, seeds, split_seed, runs, summary, pairs), f, indent=1)
    os.replace(tmp, os.path.join(workdir, "comparison.json"))
    try:  # the page is a view of comparison.json: it never fails the comparison
        with open(os.path.join(workdir, paths.COMPARISON)) as f:
            html_lib.write(os.path.join(workdir, paths.COMPARISON_REPORT), compare_page.render(json.load(f), workdir))
    except Exception as e:  # noqa: BLE001
        print(f"warning: {paths.COMPARISON_REPORT} not written ({type(e).__name__}: {e})", flush=True)
    mean_runs = [
        {
            "method": e["method"],
            "dataset": config.data.name,
            "setup": config.data.setup,
            "average_recall": {"1": e["average_recall"]["1"]["mean"] / 100},
            "per_session": [
                {"session": i + 1, "recall": {"1": v / 100}} for i, v in enumerate(e["recall1_per_session"])
            ],
        }
        for e in summary
        if e["seeds"]
    ]
    if mean_runs:
        plots.recall_per_session(mean_runs, os.path.join(workdir, "comparison.png"))
    print(f"\n{table}\n\ntotal time {time.time() - t0:.0f}s; tables in {workdir}/comparison.md/.csv/.json")
    return rows
