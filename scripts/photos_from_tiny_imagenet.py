"""Cut a Tiny-ImageNet zip into "photos that arrive over days": the data of docs/your-images.md.

    python scripts/photos_from_tiny_imagenet.py --zip ../shared/data/tiny-imagenet-200-mini.zip --out photos

writes, from the first ``--classes`` classes (by wnid order) in ``--days`` equal groups:

    photos/day<d>/train/<class name>/<file>.JPEG   the group's train images (day 1 keeps the first
                                                  ``--keep`` of each class, a later day brings the
                                                  rest of two earlier classes: known classes return)
    photos/day<d>/test/<class name>/<file>.JPEG    the group's validation images (test queries)
    photos/manifest.csv                           the same files: path,label,split,session

Class names are the first word group of ``words.txt`` ("goldfish", "European fire salamander"):
folder names with spaces, as people name them.  The JPEG bytes are copied unchanged.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import zipfile

WHERE = (
    "the Tiny-ImageNet mini zip is part of the project's shared data (../shared/data beside the repository "
    "checkout), not of the repository; pass its path with --zip, or, with photos of your own, skip this "
    "command and pass your folder as --config.data.manual_dir"
)


def fail(message: str) -> None:
    """One line and exit 2, as every cvs-jax command refuses."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def class_names(z: zipfile.ZipFile, top: str, wnids: list[str]) -> dict[str, str]:
    """wnid -> the first word group of ``words.txt``, "/" made a space (a folder name), the wnid appended to a
    name already taken."""
    words = dict(line.split("\t", 1) for line in z.read(f"{top}/words.txt").decode().splitlines() if "\t" in line)
    names, used = {}, set()
    for w in wnids:
        name = words.get(w, w).split(",")[0].strip().replace("/", " ")
        names[w] = name if name not in used else f"{name} {w}"
        used.add(names[w])
    return names


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--zip", required=True, help="tiny-imagenet-200(-mini).zip")
    p.add_argument("--out", required=True, help="folder to write (must not exist)")
    p.add_argument("--classes", type=int, default=30)
    p.add_argument("--days", type=int, default=3)
    p.add_argument("--keep", type=int, default=70, help="train images of a class on its first day")
    a = p.parse_args()
    if not os.path.isfile(a.zip):
        fail(f"--zip {a.zip} does not exist; {WHERE}.")
    if os.path.exists(a.out):
        fail(f"{a.out} exists; choose a new --out folder.")
    try:
        z = zipfile.ZipFile(a.zip)
    except (zipfile.BadZipFile, OSError) as e:
        fail(f"--zip {a.zip} cannot be read as a zip ({e}); {WHERE}.")
    top = z.namelist()[0].split("/")[0]
    wnids = z.read(f"{top}/wnids.txt").decode().split()[: a.classes]
    names = class_names(z, top, wnids)
    val = {}
    for line in z.read(f"{top}/val/val_annotations.txt").decode().splitlines():
        f, w = line.split("\t")[:2]
        val.setdefault(w, []).append(f"{top}/val/images/{f}")
    per_day = -(-len(wnids) // a.days)
    rows = []

    def train_files(wnid: str) -> list[str]:
        return sorted(n for n in z.namelist() if n.startswith(f"{top}/train/{wnid}/images/") and n.endswith(".JPEG"))

    def put(day: int, split: str, wnid: str, member: str) -> None:
        path = os.path.join(a.out, f"day{day}", split, names[wnid], os.path.basename(member))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(z.read(member))
        rows.append([os.path.relpath(path, a.out), names[wnid], split, day])

    for d in range(a.days):
        group = wnids[d * per_day : (d + 1) * per_day]
        for w in group:
            for m in train_files(w)[: a.keep]:
                put(d + 1, "train", w, m)
            for m in sorted(val.get(w, [])):
                put(d + 1, "test", w, m)
        if d > 0:  # two classes of the previous day come back with their other images
            for w in wnids[(d - 1) * per_day : (d - 1) * per_day + 2]:
                for m in train_files(w)[a.keep :]:
                    put(d + 1, "train", w, m)
    with open(os.path.join(a.out, "manifest.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "split", "session"])
        w.writerows(rows)
    print(f"wrote {len(rows)} images of {len(wnids)} classes in {a.days} days to {a.out}")


if __name__ == "__main__":
    main()
