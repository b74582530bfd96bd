"""A session plan the user defines: each train image names its session (setup ``"user"``).

:func:`plan_from_sessions` turns per-image sessions (e.g. the ``session`` column of a manifest,
:meth:`cvs_jax.data.folder_inventory.Inventory.sessions`) into the :class:`~cvs_jax.data.splits.SessionPlan`
the engine runs, with the same fields and methods as a generated plan:

* session s pools the train images whose session is s; sessions must be 0..S-1, none empty;
* protocol labels follow the order of first appearance: the classes new in session 0 (sorted by
  original label), then those new in session 1, ...; ``class_order[p]`` is the original label of
  protocol label p and ``sessions[s].new_classes`` the protocol labels first seen in s;
* ``num_outputs`` of session s = the number of classes seen in sessions 0..s (old classes may return
  in later sessions, as in the general setup);
* validation queries are held out of every session's pool exactly as
  :func:`cvs_jax.data.splits.make_session_plan` does it (same code, same seed stream): a stratified
  ``val_fraction`` of the pool (``data.val_fraction``; n_val = ceil(fraction * pool size), spread over
  the classes by largest remainder), or with ``val_per_class`` (``data.val_per_class``, needs
  ``val_fraction=0``) that many random images of each class of the pool, never its last one.
  The generator's val stream is the third child of ``np.random.SeedSequence(seed).spawn(4)``,
  consumed session by session; the same child is used here.

A class whose every image in its first session becomes a validation query would enter the classifier
with nothing to train on and val queries with nothing to find: it is refused (naming the class and
the session). :func:`check_plan_feasible` adds the checks that depend on the run (batch size,
memory budget).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from cvs_jax.data import splits
from cvs_jax.data.splits import Session, SessionPlan
from cvs_jax.errors import ConfigError, SplitError

__all__ = ["USER_SETUP", "budget_message", "check_plan_feasible", "photos_needed", "plan_from_sessions", "replay_sizes"]

USER_SETUP = "user"


def _name(c: int, class_names: Sequence[str] | None) -> str:
    return f"class {class_names[c]!r} (label {c})" if class_names is not None else f"class {c}"


def _int_array(a, what: str) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != 1 or not (np.issubdtype(a.dtype, np.integer) or a.size == 0):
        raise ValueError(f"{what} must be a 1-D integer array, got shape {a.shape} dtype {a.dtype}")
    return a.astype(np.int64, copy=False)


def plan_from_sessions(
    train_labels: np.ndarray,
    train_sessions: np.ndarray,
    *,
    val_fraction: float = 0.1,
    val_per_class: int | None = None,
    seed: int = 0,
    class_names: Sequence[str] | None = None,
) -> SessionPlan:
    """The ``"user"`` plan of the module docstring.

    Args:
      train_labels: original labels of the train split (>= 0), one per train image.
      train_sessions: 0-based session of each train image (same length).
      val_fraction / val_per_class / seed: the validation rule of ``splits.make_session_plan``
        (``data.val_fraction``, ``data.val_per_class``, the split seed).
      class_names: ``class_names[label]``, only to name classes in error messages.

    Raises ``SplitError`` for a gap or a negative value in the sessions, and for a class left with
    no train image in the session that introduces it.
    """
    labels = _int_array(train_labels, "train_labels")
    sess = _int_array(train_sessions, "train_sessions")
    num_sessions = _checked_sessions(labels, sess, val_fraction, val_per_class)
    class_order, plabels, intro = _first_appearance(labels, sess, num_sessions)
    frac = splits.exact_fraction(val_fraction)
    val_rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(4)[2])  # make_session_plan's val stream
    sessions = []
    for s in range(num_sessions):
        pool = np.flatnonzero(sess == s).astype(np.int64)
        if val_per_class is None:
            train, val = splits.stratified_split(pool, plabels, frac, val_rng)
        else:
            train, val = splits.per_class_split(pool, plabels, val_per_class, val_rng)
        new = np.flatnonzero(intro == s)
        trained = np.bincount(plabels[train], minlength=class_order.size)
        starved = new[trained[new] == 0]
        if starved.size:
            p = int(starved[0])
            n = int(np.sum(plabels[pool] == p))
            rule = f"val_fraction={val_fraction}" if val_per_class is None else f"val_per_class={val_per_class}"
            raise SplitError(
                f"{_name(int(class_order[p]), class_names)} first appears in session {s + 1} with {n} image(s), "
                f"all drawn as validation queries ({rule}), so nothing trains it; add images of it to session "
                f"{s + 1}, lower val_fraction, or use val_per_class (which never takes a class's last image)."
            )
        sessions.append(
            Session(
                index=s,
                train=splits.read_only(train),
                val=splits.read_only(val),
                new_classes=splits.read_only(new),
                num_outputs=int(np.sum(intro <= s)),
            )
        )
    return SessionPlan(setup=USER_SETUP, class_order=splits.read_only(class_order), sessions=tuple(sessions))


def _checked_sessions(labels: np.ndarray, sess: np.ndarray, val_fraction: float, val_per_class: int | None) -> int:
    """Refuse what no plan can be made of; returns the number of sessions."""
    if labels.shape != sess.shape:
        raise ValueError(f"train_labels ({labels.size}) and train_sessions ({sess.size}) differ in length")
    if not 0 <= val_fraction < 1:
        raise SplitError(f"val_fraction={val_fraction} must lie in [0, 1)")
    if val_per_class is not None and (val_per_class < 1 or val_fraction != 0):
        raise SplitError(f"val_per_class={val_per_class} needs val_fraction=0 (got {val_fraction}) and must be >= 1")
    if labels.size == 0:
        raise SplitError("the train split is empty; a user session plan needs train images with sessions")
    if labels.min() < 0:
        raise SplitError("train_labels must be non-negative original dataset labels")
    if sess.min() < 0:
        raise SplitError(
            f"session {int(sess.min()) + 1} is not a positive session number; sessions are numbered 1, 2, 3, ..."
        )
    counts = np.bincount(sess)
    gaps = np.flatnonzero(counts == 0)
    if gaps.size:
        present = ", ".join(str(int(s) + 1) for s in np.flatnonzero(counts))
        raise SplitError(
            f"session {int(gaps[0]) + 1} has no train image but session {counts.size} does (sessions present: "
            f"{present}; {gaps.size} empty); number the sessions 1..S without gaps (renumber, or move images "
            f"into session {int(gaps[0]) + 1})."
        )
    return counts.size


def _first_appearance(labels: np.ndarray, sess: np.ndarray, num_sessions: int):
    """``(class_order, protocol labels, intro)``: protocol labels in order of first appearance (session,
    then original label); ``intro[p]`` is the session introducing protocol label p (non-decreasing)."""
    first = np.full(int(labels.max()) + 1, num_sessions, np.int64)
    np.minimum.at(first, labels, sess)
    present = np.flatnonzero(first < num_sessions)
    class_order = present[np.lexsort((present, first[present]))]
    lut = np.full(first.size, -1, np.int64)
    lut[class_order] = np.arange(class_order.size)
    return class_order, lut[labels], first[class_order]


def replay_sizes(plan: SessionPlan, protocol_labels: np.ndarray, memory: str, budget: int) -> list[int]:
    """A lower bound of the replayed images of each session (0 for session 1): ``memory`` is "none",
    "reservoir" (min(budget, images seen)) or "class_quota" (herding, Rainbow: per class at most
    ``budget // classes`` of the pool = the previous session's images + the memory; exact for
    herding, Rainbow's refill only adds)."""
    labels = np.asarray(protocol_labels, np.int64)
    classes = len(plan.class_order)
    out, seen, mem = [], 0, np.zeros(classes, np.int64)
    for s, sess in enumerate(plan.sessions):
        if memory == "none" or s == 0:
            out.append(0)
        elif memory == "reservoir":
            out.append(min(int(budget), seen))
        else:
            out.append(int(mem.sum()))
        seen += len(sess.train)
        pool = mem + np.bincount(labels[sess.train], minlength=classes)
        quota = int(budget) // max(int(np.count_nonzero(pool)), 1)
        mem = np.minimum(pool, quota)
    return out


def photos_needed(train_images: int, *, val_fraction: float, test_fraction: float, test_drawn: bool = True) -> int:
    """About how many photos a folder needs for ``train_images`` training images once the validation
    share (and, without a test/ folder, the test share) of each class is held out."""
    pool = train_images
    while pool - math.ceil(pool * val_fraction) < train_images:
        pool += 1
    photos = pool
    while test_drawn and photos - math.floor(photos * test_fraction) < pool:
        photos += 1
    return photos


def budget_message(budget: int, classes: int, *, fixed: bool = False) -> str:
    """The refusal of a replay memory smaller than the classes seen (``fixed``: a run extended by
    ``update``, whose budget cannot change)."""
    text = f"memory.budget={budget} is smaller than the {classes} classes the run will have seen; "
    if fixed:
        return text + f"the budget of a run cannot change between sessions, so it holds at most {budget} classes."
    return text + f"raise memory.budget to at least {classes}."


def check_plan_feasible(
    plan: SessionPlan,
    *,
    batch_size: int,
    memory_budget: int | None = None,
    trained: Sequence[int] | None = None,
    replayed: Sequence[int] | None = None,
    stream_rows: int | None = None,
    batch_size_fixed: bool = False,
    val_fraction: float | None = None,
    test_fraction: float | None = None,
) -> None:
    """Refuse a plan the run cannot train, before any step: what ``phases.session_view`` and
    ``config_checks`` would find later, stated for a user plan.

    * a session whose training images are fewer than ``batch_size``: ``trained[s]`` of its own
      (default: its train images; ``joint``: every image seen) plus ``replayed[s]`` from the memory
      (``replay_sizes``); with Rainbow's half-memory batches (``stream_rows``: the batch rows its own
      images fill) a session with a memory needs ``stream_rows`` images of its own.  The message says
      how many photos the session's folder needs (``photos_needed``), and suggests a smaller batch
      unless ``batch_size_fixed`` (a run extended by ``update``, whose config is fixed);
    * ``memory_budget`` (replay methods) below the number of classes the run sees.
    """
    if batch_size < 1:
        raise ConfigError(f"train.batch_size={batch_size} must be >= 1.")
    classes = plan.num_classes
    if memory_budget is not None and memory_budget < classes:
        raise ConfigError(budget_message(memory_budget, classes, fixed=batch_size_fixed))
    for sess in plan.sessions:
        s = sess.index
        own = len(sess.train) if trained is None else int(trained[s])
        replay = 0 if replayed is None else int(replayed[s])
        need = batch_size - replay if stream_rows is None or replay == 0 else stream_rows
        if own >= need:
            continue
        what = f"{own} training images (after {len(sess.val)} validation queries)"
        what += f" + {replay} replayed from the memory" if replay else ""
        text = f"session {s + 1} has {what}, fewer than train.batch_size={batch_size}: it needs at least "
        text += f"{need} training images of its own ({need - own} more)"
        if val_fraction is not None and test_fraction is not None:
            photos = photos_needed(need, val_fraction=val_fraction, test_fraction=test_fraction)
            text += (
                f"; a folder of about {photos} photos gives them (data.test_fraction={test_fraction} of each class "
                f"are test queries unless the folder has a test/ folder, data.val_fraction={val_fraction} of the "
                f"rest validation queries)"
            )
        text += f"; add images to session {s + 1}'s folder"
        text += "." if batch_size_fixed else ", or lower train.batch_size."
        raise ConfigError(text)
