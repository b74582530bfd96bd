"""Fashion-MNIST as "photos that arrive over days": a domain an ImageNet backbone never saw, for the photo path.

    python scripts/photos_from_fashion_mnist.py --out fashion_photos   # Debian's dataset-fashion-mnist files

writes, in the layout of scripts/photos_from_tiny_imagenet.py (``day<d>/{train,test}/<class>/<i>.png`` and
``manifest.csv``: path,label,split,session), the 10 classes in ``--days`` groups (4, 3, 3 for 3 days), the
first ``--train`` train images and the first ``--test`` test images of each class (28 x 28 grey PNGs; the photo
path stores them as RGB at its own size).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import os
import sys

import numpy as np
from PIL import Image

NAMES = ["T-shirt", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def idx(path: str) -> np.ndarray:
    with gzip.open(path) as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--idx", default="/usr/share/datasets/fashion-mnist", help="folder of the four IDX .gz files")
    p.add_argument("--out", required=True, help="folder to write (must not exist)")
    p.add_argument("--days", type=int, default=3)
    p.add_argument("--train", type=int, default=100, help="train images per class")
    p.add_argument("--test", type=int, default=50, help="test images per class")
    a = p.parse_args()
    if not os.path.isfile(os.path.join(a.idx, "train-images-idx3-ubyte.gz")):
        print(f"error: no Fashion-MNIST IDX files in {a.idx}; apt-get install dataset-fashion-mnist", file=sys.stderr)
        sys.exit(2)
    if os.path.exists(a.out):
        print(f"error: {a.out} exists; choose a new --out folder.", file=sys.stderr)
        sys.exit(2)
    rows = []
    groups = np.array_split(np.arange(10), a.days)
    for split, prefix, n in (("train", "train", a.train), ("test", "t10k", a.test)):
        images = idx(os.path.join(a.idx, f"{prefix}-images-idx3-ubyte.gz"))
        labels = idx(os.path.join(a.idx, f"{prefix}-labels-idx1-ubyte.gz"))
        for day, group in enumerate(groups, 1):
            for c in group:
                folder = os.path.join(a.out, f"day{day}", split, NAMES[c])
                os.makedirs(folder)
                for i in np.flatnonzero(labels == c)[:n]:
                    path = os.path.join(folder, f"{prefix}_{i}.png")
                    Image.fromarray(images[i]).save(path)
                    rows.append([os.path.relpath(path, a.out), NAMES[c], split, day])
    with open(os.path.join(a.out, "manifest.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "split", "session"])
        w.writerows(rows)
    print(f"wrote {len(rows)} images of 10 classes in {a.days} days to {a.out}")


if __name__ == "__main__":
    main()
