"""Named config variants: the paper's CVS ablations (Table 4, budget study) and ``smoke``.

Use as ``--config configs/<name>.py:<variant>`` (several: ``:lc_lm,smoke``).  Every dataset
config ends with ``variants.apply(c, variant)``, so each variant is applied after the dataset's
own settings.  Ablations only flip switches of ``config.cvs`` / ``config.memory``.
"""

from cvs_jax.errors import ConfigError

ABLATIONS = {
    "cvs": {},
    "lc": {"method": "finetune"},  # L_c only
    "lc_lm": {"cvs.use_ld": False},  # L_c + L_m (with replay)
    "lc_ld": {"cvs.use_lm": False},  # L_c + L_d (with replay)
    "lc_ld_noreplay": {"cvs.use_lm": False, "cvs.replay": False},  # L_c + L_d without replay
    "cvs_noreplay": {"cvs.replay": False},  # CVS without replay
    "half_budget": {"memory.budget": 0.5},  # memory budget x0.5
}
VARIANTS = tuple(ABLATIONS) + ("gpu", "smoke")
# Variants one config file defines for itself (applied by its get_config before ``apply``).
OWN_VARIANTS = {"image_folder_general.py": ("cpu", "cpu_pretrained")}


def listed(own: tuple = ()) -> str:
    """The variants to name in help and refusals: the config's own first, then every config's."""
    text = ", ".join(own + VARIANTS)
    others = [f"{', '.join(v)} ({name})" for name, v in OWN_VARIANTS.items() if tuple(v) != tuple(own)]
    return text + (f"; and for one config: {'; '.join(others)}" if others else "")


# Epochs per session of ``:gpu``: finetune + cvs + joint + rainbow on Tiny-ImageNet mini sum to about
# 160k image-steps per epoch (session 1 shared, memory and old-model passes, joint's growing data,
# per-epoch validation); at the ~10k img/s we expect of the ResNet-18 step at batch 64 on one H100
# (BENCHMARKS.md measured 4.7k at batch 16 and 25.8k at batch 256 on CIFAR) 32 epochs take ~9 min
# of training, leaving room for compiles, tests and gallery extraction within ~25 minutes.  An
# estimate, not a measurement: the first GPU run should time one chunk and adjust.
GPU_EPOCHS = 32


def gpu(config):
    """The paper's network and recipe (ResNet-18 at full width, the official SGDR schedule, the
    dataset's augmentation policy) at ``GPU_EPOCHS`` epochs per session: a protocol for about half an
    hour of one GPU, run in resumable chunks (``launch/gpu_chunk.sh``).  Meant for
    ``tinyimagenet_mini_general``, which otherwise shrinks the network to fit a CPU."""
    m, t = config.model, config.train
    m.name, m.width = "resnet18", 64
    t.schedule, t.epochs = "official", GPU_EPOCHS
    if config.data.name == "tiny_imagenet_zip":
        config.augment.policy = "randaugment"  # as the official Tiny-ImageNet code


# ``:smoke``'s cap on each class's train images and test queries: a few hundred training images per session
# and a few hundred queries, whatever the data's size (docs/configs-and-data.md gives the measured time).
SMOKE_PER_CLASS = 60


def smoke(config):
    """Two one-epoch sessions on a few classes, at most ``SMOKE_PER_CLASS`` images of each, with a
    width-8 network: checks the whole pipeline of a config (its data source, setup, augmentation, model
    family, method) on real data in about a minute, not its results."""
    d, m, t = config.data, config.model, config.train
    d.split, d.num_sessions = "generator", 2  # the official CIFAR-100 sessions need 5 x 20 classes of the full data
    if d.setup == "blurry":
        d.first_classes = d.classes_per_session = 3  # blurry needs S == C
    else:
        d.first_classes, d.classes_per_session = min(d.first_classes, 4), min(d.classes_per_session, 2)
    d.samples_per_new_class = None  # whatever the (capped, or small mocked) data allows
    d.max_per_class = SMOKE_PER_CLASS
    m.width, m.embed_dim, m.pretrained = 8, 32, None
    t.epochs, t.batch_size, t.eval_batch_size = 1, 8, 64
    config.memory.budget = 12
    if config.augment.crop == "resized":
        config.augment.size = 24  # smoke data is stored small (see cvs_jax/testing/tiny_data.py)
    return config


def apply(config, spec: str | None, own: tuple = ()):
    """Applies the variants of ``spec``; ``own``: the config's own variant names (already applied)."""
    for name in (spec or "").split(","):
        name = name.strip()
        if not name:
            continue
        if name in ("gpu", "smoke"):
            {"gpu": gpu, "smoke": smoke}[name](config)
            continue
        if name not in ABLATIONS:
            raise ConfigError(f"config variant {name!r} is unknown; choose from {listed(own)}.")
        for key, value in ABLATIONS[name].items():
            if key == "method":
                config.method = value
            elif key == "memory.budget":
                config.memory.budget = int(config.memory.budget * value)
            else:
                group, field = key.split(".")
                setattr(config[group], field, value)
    return config
