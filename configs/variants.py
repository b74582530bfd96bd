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
VARIANTS = tuple(ABLATIONS) + ("smoke",)


def smoke(config):
    """Two one-epoch sessions on a few classes with a width-8 network: checks the whole pipeline of a
    config (its data source, setup, augmentation, model family, method) in seconds, not its results."""
    d, m, t = config.data, config.model, config.train
    d.split, d.num_sessions = "generator", 2  # the official CIFAR-100 sessions need 5 x 20 classes of the full data
    if d.setup == "blurry":
        d.first_classes = d.classes_per_session = 3  # blurry needs S == C
    else:
        d.first_classes, d.classes_per_session = min(d.first_classes, 4), min(d.classes_per_session, 2)
    d.samples_per_new_class = None  # whatever the (small, mocked) data allows
    m.width, m.embed_dim, m.pretrained = 8, 32, None
    t.epochs, t.batch_size, t.eval_batch_size = 1, 8, 64
    config.memory.budget = 12
    if config.augment.crop == "resized":
        config.augment.size = 24  # smoke data is stored small (see tests/tiny_data.py)
    return config


def apply(config, spec: str | None):
    for name in (spec or "").split(","):
        name = name.strip()
        if not name:
            continue
        if name == "smoke":
            smoke(config)
            continue
        if name not in ABLATIONS:
            raise ConfigError(f"config variant {name!r} is unknown; choose from {sorted(VARIANTS)}.")
        for key, value in ABLATIONS[name].items():
            if key == "method":
                config.method = value
            elif key == "memory.budget":
                config.memory.budget = int(config.memory.budget * value)
            else:
                group, field = key.split(".")
                setattr(config[group], field, value)
    return config
