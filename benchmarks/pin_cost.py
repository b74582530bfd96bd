"""What pinning an older model costs: the compatibility matrix read the other way.

A server pinned to session i's model (``POST /model?session=i``) searches rows that a newer model j > i
embedded. No run measures that (its matrix has entries i >= j only). Here, for every pair i < j:
recall@1 of labelled query photos embedded by model i against part j's rows alone, beside model j's own
recall@1 there (the diagonal), in points.

    python benchmarks/pin_cost.py --workdir W --queries DIR [DIR ...]

``DIR``: folders of ``<class name>/<image>`` query photos the run did not train on (e.g. the photo
folders' ``test`` splits).
"""

from __future__ import annotations

import argparse
import json
import os

import _common  # noqa: F401  (puts the repo root on sys.path)
import numpy as np

from cvs_jax.retrieval import run_reader, topk


def labelled(folders: list[str], class_names: list[str]) -> tuple[list[str], np.ndarray]:
    files, labels = [], []
    for folder in folders:
        for name in sorted(os.listdir(folder)):
            if name not in class_names:
                continue
            for f in sorted(os.listdir(os.path.join(folder, name))):
                files.append(os.path.join(folder, name, f))
                labels.append(class_names.index(name))
    return files, np.asarray(labels, np.int32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", required=True)
    p.add_argument("--queries", nargs="+", required=True)
    a = p.parse_args()
    newest = run_reader.Run(a.workdir)
    files, labels = labelled(a.queries, newest.class_names)
    images = run_reader.load_images(files, newest.image_shape)
    sessions = range(newest.gallery_session + 1)
    embedded = {i: run_reader.Run(a.workdir, model_session=i).embed(images) for i in sessions}
    out = []
    for j in sessions:
        parts = [p for p in newest.gallery.parts if p.session == j]
        if not parts:
            continue
        rows = np.concatenate([np.asarray(p.embeddings) for p in parts])
        row_labels = np.concatenate([p.labels for p in parts])
        keep = np.isin(labels, np.unique(row_labels))
        if not keep.any():
            continue

        def recall(q):
            return 100 * topk.recall_at_k(q[keep], labels[keep], rows, row_labels, ks=(1,))[1]

        own = recall(embedded[j])
        for i in sessions:
            if i < j:
                r = recall(embedded[i])
                out.append({"model": i + 1, "part": j + 1, "recall1": r, "own": own, "points": r - own})
                print(f"model {i + 1} on part {j + 1}'s rows: R@1 {r:.2f} against its own model's {own:.2f}: "
                      f"{r - own:+.2f} points ({int(keep.sum())} queries)")  # fmt: skip
    print(json.dumps(out))


if __name__ == "__main__":
    main()
