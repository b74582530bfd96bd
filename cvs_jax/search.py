"""Search a trained run's gallery with image files, or add images to it.

    python -m cvs_jax.search --workdir DIR --images a.png b.jpg [--k 5]
    python -m cvs_jax.search --workdir DIR --images new/*.png --add [--label CLASS]

(``--images`` takes the files after it, or repeat it: ``--images a.png --images b.jpg``.)

Queries are embedded by the newest session's selected model (the run's last
completed session checkpoint) and searched by cosine similarity against the whole
gallery: the rows of every session (each embedded by its own session's model,
never re-extracted) plus the rows added with ``--add``.  ``--add`` embeds the
images with the newest model and appends them, persisted with orbax under
``checkpoints/additions``; it never changes the session checkpoints.  Searching reads a
run at any time, also while it trains; ``--add`` holds the workdir's lock, so it waits
for no one and is refused while a run (or another ``--add``) writes there.  A problem to
fix ends with one ``error: ...`` line and exit status 2.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import flags
from PIL import Image

from cvs_jax import augment, cli, evaluate, models
from cvs_jax import workdir as workdir_lib
from cvs_jax.checkpoint import Checkpoints
from cvs_jax.errors import SearchError, UserError
from cvs_jax.gallery import Gallery, GalleryPart, RowConcat
from cvs_jax.train_step import make_embed_fn


def load_images(paths: list[str], shape: tuple[int, int, int]) -> np.ndarray:
    """Reads image files as uint8 [N, H, W, C] in the dataset's size and channel count."""
    h, w, c = shape
    out = []
    for p in paths:
        try:
            with Image.open(p) as im:
                im = im.convert("L" if c == 1 else "RGB").resize((w, h), Image.BILINEAR)
                arr = np.asarray(im, np.uint8)
        except (OSError, ValueError) as e:
            raise SearchError(f"cannot read image {p!r} ({e}); pass PNG/JPEG files.") from e
        out.append(arr.reshape(h, w, c))
    return np.stack(out)


def check_is_run(workdir: str) -> None:
    for name in ("config.json", "protocol.json"):
        if not os.path.exists(os.path.join(workdir, name)):
            raise SearchError(
                f"{workdir} holds no cvs_jax run ({name} is missing); pass the --workdir of "
                f"a run of python -m cvs_jax.main."
            )


def _without_pretrained(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict(config.to_dict())
    c.model.pretrained = None
    return c


class Run:
    """The newest model and the full gallery of a finished (or partly finished) run."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        check_is_run(workdir)
        with open(os.path.join(workdir, "config.json")) as f:
            self.config = ml_collections.ConfigDict(json.load(f))
        with open(os.path.join(workdir, "protocol.json")) as f:
            self.protocol = json.load(f)
        c = self.config
        self.model = models.from_config(c)
        template = models.init_variables(
            self.model,
            _without_pretrained(c),  # the checkpoint holds the trained weights: only their structure is needed
            self.image_shape,
            len(self.protocol["class_names"]),
            jax.random.key(0),
            jax.random.key(0),
        )
        self._sessions = Checkpoints(os.path.join(workdir, "checkpoints", "sessions"), max_to_keep=None)
        if not self._sessions.steps():
            raise SearchError(f"{workdir} has no completed session yet; wait for the first session to finish.")
        # the newest session's model; a reader never moves a checkpoint (a damaged one is refused)
        self.session = self._sessions.steps()[-1]
        self.variables = self._sessions.restore(self.session, {"variables": template})["variables"]
        self.gallery = Gallery.restore(self._sessions, self.session, c.model.embed_dim)
        self._additions = Checkpoints(os.path.join(workdir, "checkpoints", "additions"), max_to_keep=2)
        added = self._additions.restore_latest({"rows": None})
        self.added_sources: list[str] = []
        self.added = Gallery.empty(c.model.embed_dim)
        if added is not None:
            self.added = Gallery([GalleryPart.from_dict(added[1]["rows"])], c.model.embed_dim)
            self.added_sources = added[1]["meta"]["sources"]
        self._embed = make_embed_fn(self.model, augment.Pipeline.from_config(c))

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.protocol["image_shape"])

    def embed(self, images: np.ndarray) -> np.ndarray:
        return np.asarray(self._embed(self.variables["params"], self.variables["batch_stats"], jnp.asarray(images)))

    def search(self, images: np.ndarray, k: int) -> list[list[dict]]:
        q = self.embed(images)
        parts = self.gallery.parts + self.added.parts
        emb = RowConcat([p.embeddings for p in parts], width=self.gallery.embed_dim)  # rows read in slices
        labels = np.concatenate([self.gallery.labels, self.added.labels])
        sessions = np.concatenate([self.gallery.sessions, self.added.sessions])
        sources = [f"train[{i}]" for i in self.gallery.source_ids] + list(self.added_sources)
        scores, idx = evaluate.topk_indices(q, emb, k)  # exact cosine top-k, ties to the lower row
        names = self.protocol["class_names"]
        return [
            [
                {
                    "rank": r + 1,
                    "score": float(sc),
                    "label": int(labels[j]),
                    "class": names[labels[j]] if labels[j] >= 0 else "?",
                    "session": int(sessions[j]) + 1,
                    "source": sources[j],
                }
                for r, (sc, j) in enumerate(zip(srow, irow))
            ]
            for srow, irow in zip(scores, idx)
        ]

    def add(self, images: np.ndarray, paths: list[str], label: int) -> None:
        # additions are few: kept as one part (session = the newest model's), rewritten on each --add
        merged = GalleryPart(
            np.concatenate([np.asarray(self.added.embeddings), self.embed(images)]),
            np.concatenate([self.added.labels, np.full(len(paths), label, np.int32)]),
            np.full(len(self.added) + len(paths), -1, np.int64),
            self.session,
        )
        step = (max(self._additions.steps()) + 1) if self._additions.steps() else 0
        self._additions.save(
            step, {"rows": merged.as_dict()}, {"sources": self.added_sources + [os.path.abspath(p) for p in paths]}
        )
        self.added = Gallery([merged], self.gallery.embed_dim)
        self.added_sources = self.added_sources + [os.path.abspath(p) for p in paths]

    def label_of(self, name: str | None) -> int:
        if name is None:
            return -1
        names = self.protocol["class_names"]
        if name in names:
            return names.index(name)
        if name.lstrip("-").isdigit() and -1 <= int(name) < len(names):
            return int(name)
        raise SearchError(
            f"--label {name!r} is neither a class name nor a label; known classes: "
            f"{', '.join(names[:10])}{', ...' if len(names) > 10 else ''}."
        )


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """The command's flags (defined when it runs, so that tests can import every entry point together)."""
    flags.DEFINE_string("workdir", None, "The --workdir of a run of python -m cvs_jax.main.", flag_values=flag_values)
    flags.DEFINE_multi_string(
        "images", [], "Image files (PNG/JPEG): --images a.png b.jpg, or repeat the flag.", flag_values=flag_values
    )
    flags.DEFINE_integer("k", 5, "Gallery rows to print per query.", flag_values=flag_values)
    flags.DEFINE_boolean("add", False, "Add the images to the gallery instead of searching.", flag_values=flag_values)
    flags.DEFINE_string("label", None, "Class name or label of the images added with --add.", flag_values=flag_values)
    flags.mark_flags_as_required(["workdir"], flag_values=flag_values)


def main(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> int:
    """``argv``: what absl left after the flags (program name, then further image files)."""
    fv = flag_values
    return search_or_add(fv.workdir, list(fv.images) + list(argv[1:]), k=fv.k, add=fv.add, label=fv.label)


def search_or_add(workdir: str, paths: list[str], *, k: int = 5, add: bool = False, label: str | None = None) -> int:
    """The command: prints the hits (or adds the images); returns the exit status."""
    try:
        if not paths:
            raise SearchError("no images given; pass image files with --images a.png b.jpg.")
        if k < 1:
            raise SearchError(f"--k={k}: ask for at least one gallery row per query.")
        if add:
            check_is_run(workdir)  # before the lock, which would create the folder
            with workdir_lib.hold(workdir):  # additions are written: one writer at a time
                run = Run(workdir)
                run.add(load_images(paths, run.image_shape), paths, run.label_of(label))
            print(
                f"added {len(paths)} images to the gallery of {workdir} (model of session "
                f"{run.session + 1}); gallery now {len(run.gallery) + len(run.added)} rows"
            )
            return 0
        run = Run(workdir)
        for path, hits in zip(paths, run.search(load_images(paths, run.image_shape), k)):
            print(f"{path}  (model of session {run.session + 1}, gallery {len(run.gallery) + len(run.added)} rows)")
            for h in hits:
                print(
                    f"  {h['rank']:>2}. score {h['score']:.4f}  label {h['label']:>4} {h['class']:<20} "
                    f"session {h['session']}  {h['source']}"
                )
        return 0
    except UserError as e:  # a problem the user must fix: one line, no traceback; anything else is a bug
        return cli.report(e)


if __name__ == "__main__":
    define_flags()
    cli.run(main)
