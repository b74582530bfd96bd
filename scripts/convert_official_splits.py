"""Convert the official CVS CIFAR-100 session files (35 JSON files) into the packaged .npz.

    python scripts/convert_official_splits.py [--split_dir DIR] [--out FILE] [--check]

``--split_dir``: the ivclab/CVS ``collections/cifar100`` JSON files (default
``../shared/data/cvs-official-splits/cifar100``). ``--out``: where to write (default: the packaged
``cvs_jax/data/official/cifar100_splits.npz``). ``--check``: write nothing; compare the arrays of
the JSON files with those of ``--out`` and exit 1 if they differ.

The arrays (format in ``cvs_jax/data/official_splits.py``) come from
``official_splits.encode_json_dir``. The file is written byte-reproducibly (entries in sorted order,
fixed zip timestamps, deflate level 9), and the script prints its size, its SHA-256 and the digest of
its arrays (``official_splits.content_sha256``, independent of zip/zlib details), which
``official_splits.PACKAGED_SHA256`` must equal for the package to accept the file.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import sys
import zipfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from cvs_jax.data import official_splits  # noqa: E402

DEFAULT_SPLIT_DIR = os.path.join(ROOT, "..", "shared", "data", "cvs-official-splits", "cifar100")
DEFAULT_OUT = os.path.join(ROOT, *official_splits.PACKAGED_PACKAGE.split("."), *official_splits.PACKAGED_PATH)


def write_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    """An ``np.load``-able .npz whose bytes depend only on the arrays (and zlib)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w") as zf:
        for key in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arrays[key]), allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue(), compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    os.replace(tmp, path)


def read_npz(path: str) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split_dir", default=DEFAULT_SPLIT_DIR)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = ap.parse_args(argv)

    arrays = official_splits.encode_json_dir(args.split_dir)
    digest = official_splits.content_sha256(arrays)
    for tag in official_splits.FILE_SETUPS.values():
        table = arrays[tag]
        sizes = [(int((table == 2 * t).sum()), int((table == 2 * t + 1).sum())) for t in range(5)]
        print(f"{tag:10s} train/val per session: {sizes}")
    print(f"class order: {', '.join(arrays['class_names'][:5])}, ... {arrays['class_names'][-1]}")
    if args.check:
        stored = read_npz(args.out)
        same = stored.keys() == arrays.keys() and all(np.array_equal(stored[k], arrays[k]) for k in arrays)
        print(f"{args.out}: {'same arrays as' if same else 'DIFFERS from'} {args.split_dir}")
        print(f"content sha256 {digest}")
        return 0 if same else 1
    write_npz(args.out, arrays)
    with open(args.out, "rb") as f:
        data = f.read()
    print(f"wrote {args.out}: {len(data)} bytes")
    print(f"file sha256    {hashlib.sha256(data).hexdigest()}")
    print(f"content sha256 {digest}")
    if digest != official_splits.PACKAGED_SHA256:
        print(f"NOTE: official_splits.PACKAGED_SHA256 is {official_splits.PACKAGED_SHA256}; set it to {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
