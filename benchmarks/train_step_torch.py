"""The same CVS training step written the way the official PyTorch code runs it, for a speed ratio.

Run beside ``benchmarks/train_step.py`` on the same machine.  The step mirrors the
official session >= 2 step (as ivclab/CVS trains it): the GDumb-style ResNet-18 (CIFAR stem,
conv-BN-ReLU everywhere, no ReLU after the addition, BN eps 1e-6) in train mode, the
frozen previous model in eval mode under ``no_grad`` on the same batch, the cosine
classifier at temperature 0.05, the triplet L_m (hardest other-label old embedding via
``torch.cdist``, ``TripletMarginLoss(0.1)``), L_d against stored class centres, and
SGD (Nesterov 0.9, weight decay 1e-4).  The images are already on the GPU and are not
augmented (the official code augments on the CPU in DataLoader workers, which this
benchmark leaves out, so the PyTorch figure is an upper bound for the original).

Variants: ``eager`` (the official code: float32, NCHW, eager), ``amp`` (bf16 autocast +
channels_last, the usual PyTorch speed-ups), ``compile`` (``torch.compile`` of the model,
optional: ``--compile``).

Usage (GPU machine with PyTorch):
  python benchmarks/train_step_torch.py                  # batch 16 and 256, eager and amp, 50 timed steps
  python benchmarks/train_step_torch.py --compile        # adds torch.compile
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

NUM_CLASSES, OLD_CLASSES, VALID_CLASSES, EMBED = 100, 20, 40, 128


class ConvBlock(nn.Sequential):
    def __init__(self, cin, cout, k, s):
        super().__init__(
            nn.Conv2d(cin, cout, k, s, (k - 1) // 2, bias=False), nn.BatchNorm2d(cout, eps=1e-6), nn.ReLU(inplace=True)
        )


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1, self.conv2 = ConvBlock(cin, cout, 3, stride), ConvBlock(cout, cout, 3, 1)
        self.short = ConvBlock(cin, cout, 1, stride) if (stride != 1 or cin != cout) else nn.Identity()

    def forward(self, x):
        return self.conv2(self.conv1(x)) + self.short(x)  # GDumb block: no ReLU after the addition


class ResNet18(nn.Module):
    def __init__(self, width=64):
        super().__init__()
        layers, cin = [ConvBlock(3, width, 3, 1)], width
        for i in range(4):
            for b in range(2):
                cout = width * 2**i
                layers.append(BasicBlock(cin, cout, 2 if (i > 0 and b == 0) else 1))
                cin = cout
        self.body = nn.Sequential(*layers)
        self.embedding = nn.Linear(cin, EMBED)

    def forward(self, x):
        return self.embedding(F.adaptive_avg_pool2d(self.body(x), 1).flatten(1))


def cvs_loss(new, old, head, labels, centers, temperature=0.05, margin=0.1):
    e = F.normalize(new, dim=1)
    logits = e @ F.normalize(head[:VALID_CLASSES], dim=1).t() / temperature
    l_c = F.cross_entropy(logits, labels)
    o = F.normalize(old, dim=1)
    with torch.no_grad():
        d = torch.cdist(e, o)
        d = d.masked_fill(labels[:, None] == labels[None, :], float("inf"))
        neg = d.argmin(1)
    l_m = F.triplet_margin_loss(e, o, o[neg], margin=margin)
    sel = labels < OLD_CLASSES
    l_d = ((centers[labels[sel]] - e[sel]) ** 2).sum(1).mean() if sel.any() else e.sum() * 0
    return l_c + 10 * l_m + l_d


def resnet50_embedding():
    """torchvision ResNet-50 with a 128-d embedding in place of fc, every BN frozen (eval mode), as the
    official fine-grained code does."""
    import torchvision

    m = torchvision.models.resnet50()
    m.fc = nn.Linear(2048, EMBED)
    return m.eval()


def bench(variant: str, batch: int, steps: int, width: int, recipe: str = "cifar") -> dict:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    if recipe == "cifar":
        model, old, side = ResNet18(width).to(dev), ResNet18(width).to(dev), 32
    else:  # images already cropped to 224 (the official loader crops on the CPU)
        model, old, side = resnet50_embedding().to(dev), resnet50_embedding().to(dev), 224
    old.eval().requires_grad_(False)
    head = nn.Parameter(torch.randn(NUM_CLASSES, EMBED, device=dev) * 0.01)
    centers = F.normalize(torch.randn(NUM_CLASSES, EMBED, device=dev), dim=1)
    amp = variant in ("amp", "compile")
    if amp:
        model, old = model.to(memory_format=torch.channels_last), old.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(list(model.parameters()) + [head], lr=0.03, momentum=0.9, nesterov=True, weight_decay=1e-4)
    fwd, old_fwd = (torch.compile(model), torch.compile(old)) if variant == "compile" else (model, old)
    x = torch.rand(batch, 3, side, side, device=dev)
    if amp:
        x = x.to(memory_format=torch.channels_last)
    y = torch.randint(0, VALID_CLASSES, (batch,), device=dev)

    def step():
        with torch.autocast("cuda", torch.bfloat16, enabled=amp):
            new = fwd(x)
            with torch.no_grad():
                o = old_fwd(x)
        loss = cvs_loss(new.float(), o.float(), head, y, centers)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    assert torch.isfinite(loss).item()
    return {
        "variant": variant,
        "batch": batch,
        "steps_per_s": steps / dt,
        "images_per_s": steps * batch / dt,
        "ms_per_step": 1000 * dt / steps,
        "first_step_s": first_s,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="16,256")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--compile", action="store_true", help="also time torch.compile (slow to compile)")
    p.add_argument(
        "--recipe",
        default="cifar",
        choices=["cifar", "finegrained"],
        help="finegrained: torchvision ResNet-50 (frozen BN) on 224x224 crops",
    )
    a = p.parse_args()
    variants = ["eager", "amp"] + (["compile"] if a.compile else [])
    torch.backends.cudnn.benchmark = True
    net = f"ResNet-18 width {a.width}, 32x32x3" if a.recipe == "cifar" else "ResNet-50 (frozen BN), 224x224x3"
    print(
        f"# PyTorch CVS train step: {net}, {a.steps} timed steps\n"
        f"# torch {torch.__version__}, {torch.cuda.get_device_name()}, python {platform.python_version()}\n"
    )
    rows = [bench(v, int(b), a.steps, a.width, a.recipe) for b in a.batches.split(",") for v in variants]
    print("| batch | variant | steps/s | images/s | ms/step | first step s |\n|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['batch']} | {r['variant']} | {r['steps_per_s']:.1f} | {r['images_per_s']:,.0f} | "
            f"{r['ms_per_step']:.2f} | {r['first_step_s']:.1f} |"
        )


if __name__ == "__main__":
    main()
