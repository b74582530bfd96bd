"""The paper's CVS ablations (Table 4 and the budget study) as named config variants.

Use as ``--config configs/cifar100_general.py:<variant>``; each variant only flips the
switches of ``config.cvs`` / ``config.memory`` on top of the dataset config.
"""

VARIANTS = {
    "cvs": {},
    "lc": {"method": "finetune"},                                   # L_c only
    "lc_lm": {"cvs.use_ld": False},                                 # L_c + L_m (with replay)
    "lc_ld": {"cvs.use_lm": False},                                 # L_c + L_d (with replay)
    "lc_ld_noreplay": {"cvs.use_lm": False, "cvs.replay": False},   # L_c + L_d without replay
    "cvs_noreplay": {"cvs.replay": False},                          # CVS without replay
    "half_budget": {"memory.budget": 0.5},                          # memory budget x0.5
}


def apply(config, variant: str):
    if variant not in VARIANTS:
        raise ValueError(f"config variant {variant!r} is unknown; choose one of {sorted(VARIANTS)}.")
    for key, value in VARIANTS[variant].items():
        if key == "method":
            config.method = value
        elif key == "memory.budget":
            config.memory.budget = int(config.memory.budget * value)
        else:
            group, field = key.split(".")
            setattr(config[group], field, value)
    return config
