"""A session's recipe as the run recorded it: ``python -m cvs_jax.update --config.train.lr/epochs`` sets
them for the session it adds (``train.session_lr`` / ``train.session_epochs``); the other sessions use
``train.lr`` / ``train.epochs``.  Read by training (``engine.schedules``) and by ``info``/``serve``."""

from __future__ import annotations


def _entry(values, s: int):
    values = list(values or [])
    return values[s] if s < len(values) else None


def session_lr(config, s: int) -> float:
    """Session ``s``'s (0-based) base learning rate: ``train.session_lr[s]`` (an ``update``'s
    ``--config.train.lr``) or ``train.lr``."""
    lr = _entry(config.train.session_lr, s)
    return float(config.train.lr if lr is None else lr)


def session_epochs(config, s: int) -> int:
    """Session ``s``'s epochs: ``train.session_epochs[s]`` (an ``update``'s ``--config.train.epochs``) or
    ``train.epochs``."""
    epochs = _entry(config.train.session_epochs, s)
    return int(config.train.epochs if epochs is None else epochs)
