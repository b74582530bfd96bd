"""Export a run's gallery and served model for use outside cvs_jax (an ANN index, another service).

    python -m cvs_jax.export --workdir W --out DIR [--overwrite] [--format stablehlo] [--session N]

Example: ``python -m cvs_jax.export --workdir workdirs/demo --out exports/demo`` (then, in Python,
``cvs_jax.export.load("exports/demo").embed(["query.png"])``).

Writes the gallery of the run's newest completed session and the model ``search`` uses: the one a server of
the run serves (``retrieval.gate.served_model``: the newest session's, unless the compatibility gate kept it
out or a server pinned another, which a line on stderr then says), or ``--session N`` (1-based) / ``newest``:

* ``embeddings.npy``: float32 [N, D], every gallery row in gallery order, then the ``--add`` rows,
  raw as stored (cosine search = inner product of the L2-normalised rows);
* ``rows.csv``: ``row, id, path, label, class_name, arrival_session, model_session`` per row
  (sessions 1-based, as ``search`` prints them; ``id`` the row's stable id, as ``search --json`` and the
  server show it; ``path`` is the image's source);
* ``model.msgpack``: that model's Flax variables (``flax.serialization.to_bytes``);
* ``query_maps.npz`` (a run with ``retrieval.query_map`` set): per model session j (1-based) ``matrix_<j>``
  and ``bias_<j>``, the composed map q -> q @ matrix + bias that takes an L2-normalised query of the exported
  model into the space of the rows model j made (``model_session`` in rows.csv; the identity for a model j
  newer than it); score those rows with it;
* with ``--format stablehlo``, ``embed.stablehlo`` and ``weights.safetensors``: the embedding function
  (preprocessing included) and its weights, run with jax alone (``retrieval.stablehlo_export`` says how);
* ``config.json``: the run's config as the run is read now (``config.stored.recorded``): the folders of a
  run moved or copied since it trained (``mv``, ``cp -r``) named where they are now, its own
  ``from_added/session-<S>`` folders under its new place, as ``rows.csv``'s paths are, not where the run's
  ``config.json`` recorded them before the move (folders that may be gone, or another copy's); otherwise
  the same bytes as the run's; ``export.json``: format version, image shape, embedding width, model
  session, row count and class names.

``load(DIR).embed(images)`` (Python) embeds image files or uint8 arrays as ``search`` embeds its
queries (``run_reader.prepare`` + ``run_reader.Network``: the preprocessing and eval network of the
gallery), so rows and queries of an export are comparable without the workdir.  A problem to fix ends with one
``error: ...`` line and exit status 2; an existing non-empty ``--out`` is refused unless
``--overwrite``.  ``export.json`` is written last, so an export cut short is refused by ``load``.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import sys
from typing import Any, Iterable, cast

import flax.serialization
import jax
import ml_collections
import numpy as np
from absl import flags

from cvs_jax import cli
from cvs_jax.config import stored
from cvs_jax.errors import UserError
from cvs_jax.retrieval import gate, query_maps, run_reader, stablehlo_export
from cvs_jax.rundir import workdir as workdir_lib

FORMAT_VERSION = 1
FILES = ("embeddings.npy", "rows.csv", "model.msgpack", "config.json", "export.json")
ROW_COLUMNS = ("row", "id", "path", "label", "class_name", "arrival_session", "model_session")
FORMATS = ("flax", "stablehlo")  # --format: stablehlo adds stablehlo_export.FILES
QUERY_MAPS = "query_maps.npz"  # a run with query maps: matrix_<j>, bias_<j> per model session j (1-based)
_BLOCK = 1 << 16  # rows copied at a time: a large gallery is never held twice


class ExportError(UserError):
    """An export that cannot be written or read as asked."""


def export(workdir: str, out: str, *, overwrite: bool = False, fmt: str = "flax", session: str | None = None) -> dict:
    """Writes the export of ``workdir`` into ``out``; returns what ``export.json`` holds.  ``fmt="stablehlo"``
    adds the model as StableHLO + safetensors (``retrieval.stablehlo_export``), runnable without cvs_jax."""
    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt!r} is unknown; pass one of {', '.join(FORMATS)}.")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ExportError(f"--out {out} is a file; pass a new or empty folder.")
    if os.path.isdir(out) and os.listdir(out) and not overwrite:
        raise ExportError(
            f"--out {out} exists and is not an empty folder; pass another --out, or --overwrite to replace it."
        )
    run_reader.check_is_run(workdir)
    model, note = gate.model_for(workdir, session, subject="the export holds")  # said once it is written
    run = run_reader.Run(workdir, model_session=model)
    variables = run.variables  # read before anything is written: unreadable weights leave --out as it was
    rows = run.rows
    os.makedirs(out, exist_ok=True)
    info_path = os.path.join(out, "export.json")
    if os.path.exists(info_path):  # written last: an export cut short is never loaded
        os.remove(info_path)
    emb = np.lib.format.open_memmap(
        os.path.join(out, "embeddings.npy"), mode="w+", dtype=np.float32, shape=rows.embeddings.shape
    )
    for start in range(0, len(rows), _BLOCK):
        emb[start : start + _BLOCK] = rows.embeddings[start : start + _BLOCK]
    emb.flush()
    del emb
    with open(os.path.join(out, "rows.csv"), "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(ROW_COLUMNS)
        for j in range(len(rows)):
            d = run.describe(j)
            writer.writerow(
                [j, d["id"], d["source"], d["label"], d["class_name"], d["arrival_session"], d["model_session"]]
            )
    with open(os.path.join(out, "model.msgpack"), "wb") as f:
        f.write(flax.serialization.to_bytes(jax.device_get(variables)))
    # the run as it is read now (a moved run's folders where they are), in the run's own format
    workdir_lib.write_config(os.path.join(out, "config.json"), stored.recorded(workdir))
    if run.query_maps:  # per model session j: the chain from the newest model's space to j's
        chains = query_maps.map_chains(run.query_maps, run.session, sorted(set(rows.model.tolist())))
        with open(os.path.join(out, QUERY_MAPS), "wb") as f:
            np.savez(f, **chains)
    info = {
        "format_version": FORMAT_VERSION,
        "image_shape": list(run.image_shape),
        "embed_dim": int(run.config.model.embed_dim),
        "session": run.session + 1,
        "rows": len(rows),
        "class_names": run.class_names,
        "workdir": os.path.abspath(workdir),
        "query_map": run.config.retrieval.query_map,
    }
    if fmt == "stablehlo":
        info["stablehlo"] = stablehlo_export.write(run.config, run.variables, run.image_shape, run.session + 1, out)
    for name in stablehlo_export.FILES if fmt != "stablehlo" else ():  # an --overwrite leaves no stale model
        if os.path.exists(os.path.join(out, name)):
            os.remove(os.path.join(out, name))
    with open(info_path, "w") as f:
        json.dump(info, f, indent=1)
    if note is not None:
        print(note, file=sys.stderr)
    return info


@dataclasses.dataclass(frozen=True)
class Exported:
    """An export folder, read back: its rows and the model that embeds queries for them."""

    directory: str
    info: dict  # export.json
    config: ml_collections.ConfigDict
    network: run_reader.Network

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.info["image_shape"])

    def embed(self, images: Iterable[Any]) -> np.ndarray:
        """Image files, PIL images or uint8 arrays (any size; ``[N, H, W, C]`` works too) -> float32
        [N, D], prepared and embedded exactly as ``search`` embeds its queries."""
        return self.network.embed_images(images)

    def embeddings(self) -> np.ndarray:
        """The rows, float32 [N, D], memory-mapped (raw as stored)."""
        return np.load(os.path.join(self.directory, "embeddings.npy"), mmap_mode="r")

    def rows(self) -> list[dict[str, str]]:
        """rows.csv as one dict per row (values as strings)."""
        with open(os.path.join(self.directory, "rows.csv"), newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))


def load(directory: str) -> Exported:
    """Reads an export folder (no workdir, no dataset needed)."""
    try:
        with open(os.path.join(directory, "export.json")) as f:
            info = json.load(f)
        with open(os.path.join(directory, "config.json")) as f:
            config = ml_collections.ConfigDict(json.load(f))
        with open(os.path.join(directory, "model.msgpack"), "rb") as f:
            variables = cast(dict, flax.serialization.msgpack_restore(f.read()))  # export wrote a dict
    except (OSError, ValueError) as e:
        raise ExportError(f"{directory} is not a readable export of python -m cvs_jax.export ({e}).") from e
    if info.get("format_version") != FORMAT_VERSION:
        raise ExportError(
            f"{directory} has export format {info.get('format_version')}; this code reads {FORMAT_VERSION}."
        )
    return Exported(directory, info, config, run_reader.Network(config, variables, info["image_shape"]))


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """The command's flags (defined when it runs, so that tests can import every entry point together)."""
    flags.DEFINE_string("workdir", None, "The --workdir of a run of python -m cvs_jax.main.", flag_values=flag_values)
    flags.DEFINE_string("out", None, "Folder to write the export into (new or empty).", flag_values=flag_values)
    flags.DEFINE_boolean(
        "overwrite", False, "Write into --out even if it holds files (they are replaced).", flag_values=flag_values
    )
    flags.DEFINE_enum(
        "format",
        "flax",
        FORMATS,
        "stablehlo: also the model as StableHLO + safetensors, runnable without cvs_jax.",
        flag_values=flag_values,
    )
    flags.DEFINE_string("session", None, gate.SESSION_HELP.format(what="is exported"), flag_values=flag_values)
    flags.mark_flags_as_required(["workdir", "out"], flag_values=flag_values)


@cli.command
def main(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> int:
    """``argv``: what absl left after the flags (the program name only); returns the exit status."""
    fv = flag_values
    cli.quiet_logging()  # orbax logs every file it reads at INFO
    if len(argv) > 1:
        raise ExportError(f"unexpected arguments {' '.join(argv[1:])}; pass --workdir and --out.")
    info = export(fv.workdir, fv.out, overwrite=fv.overwrite, fmt=fv.format, session=fv.session)
    print(
        f"exported {info['rows']} gallery rows (embed_dim {info['embed_dim']}, model of session "
        f"{info['session']}) to {fv.out}: {', '.join(FILES)}"
        + (f", {', '.join(stablehlo_export.FILES)}" if "stablehlo" in info else "")
        + (
            f", {QUERY_MAPS} ({info['query_map']} maps: score a model's rows through its chain)"
            if info["query_map"] != "none"
            else ""
        )
    )
    return 0


if __name__ == "__main__":
    cli.run(main, define_flags)
