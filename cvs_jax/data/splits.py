"""Deterministic, seeded session splits for continual visual search (pure numpy).

Classes are relabelled to *protocol labels* (position in ``class_order``), so session 0 owns
labels ``0..S-1`` and session t >= 1 owns the next C labels, as in the official CVS files.

* **disjoint**: each session holds only its own new classes (all images, or a seeded sample of
  ``samples_per_new_class`` per class); an old class never returns.
* **blurry**: every session holds every class. Each class puts ``k`` "minor" images into each
  of the L-1 sessions that do not own it and the rest of its share into its "major" session, so
  the minor share per session is ``blurry_minor_percent`` (Rainbow-Memory / CVS blurry-M).
* **general (S, C, M, L)**: session 0 is S classes x ``samples_per_new_class``; session t >= 1 is
  C new classes x ``samples_per_new_class`` plus M% old-class data spread evenly over all classes
  seen before, drawn from images no earlier session used.  ``general_shares="proportional"``
  (long-tailed data, Product-M) scales both with each class's size instead: class c brings
  ``floor(a * n_c)`` images when new, and each session's M% old-class images are spread over the old
  classes in proportion to n_c; ``a`` is the largest value for which every class has enough images,
  so nearly all images are used instead of what the smallest class allows every class.

Every session pool is then split into train / val, stratified by label (scikit-learn's
``train_test_split`` arithmetic). No image belongs to two sessions; val images are never trained on.
The official counts are in docs/configs-and-data.md and ``tests/engine/test_configs.py``.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np

from cvs_jax.errors import SplitError

SETUPS = ("disjoint", "blurry", "general")
GENERAL_SHARES = ("uniform", "proportional")


def read_only(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.int64)
    a.setflags(write=False)
    return a


def exact_fraction(x: float) -> Fraction:
    """Decimal value the user typed (0.05 -> 1/20), so floors/ceils do not trip on binary noise."""
    return Fraction(repr(float(x)))


@dataclasses.dataclass(frozen=True, eq=False)
class Session:
    index: int  # 0-based session number
    train: np.ndarray  # int64 indices into the TRAIN split: training/gallery images
    val: np.ndarray  # int64 indices into the TRAIN split: this session's val queries
    new_classes: np.ndarray  # protocol labels introduced (as major/new classes) in this session
    num_outputs: int  # classifier rows needed in this session


@dataclasses.dataclass(frozen=True, eq=False)
class SessionPlan:
    setup: str
    class_order: np.ndarray  # class_order[p] = ORIGINAL dataset label of protocol label p
    sessions: tuple[Session, ...]

    @property
    def num_sessions(self) -> int:
        return len(self.sessions)

    @property
    def num_classes(self) -> int:
        """Every class of the plan: the most outputs a session needs."""
        return max(s.num_outputs for s in self.sessions)

    def old_classes(self, s: int) -> int:
        """Classes seen before session ``s`` (0 at the first): the outputs of the previous session's model."""
        return self.sessions[s - 1].num_outputs if s > 0 else 0

    def _check(self, s: int) -> None:
        if not 0 <= s < len(self.sessions):
            raise ValueError(f"session index s={s} out of range; valid: 0..{len(self.sessions) - 1}")

    def to_protocol_labels(self, original_labels: np.ndarray) -> np.ndarray:
        """Map original dataset labels to protocol labels; classes not in the order map to -1."""
        labels = np.asarray(original_labels).astype(np.int64, copy=False)
        top = int(self.class_order.max()) + 1 if self.class_order.size else 0
        lut = np.full(top, -1, dtype=np.int64)
        lut[self.class_order] = np.arange(self.class_order.size, dtype=np.int64)
        out = np.full(labels.shape, -1, dtype=np.int64)
        ok = (labels >= 0) & (labels < top)
        out[ok] = lut[labels[ok]]
        return out

    def seen_classes(self, s: int) -> np.ndarray:
        """Protocol labels seen up to and including session s (blurry: every session has all)."""
        self._check(s)
        if self.setup == "blurry":
            return np.arange(self.class_order.size, dtype=np.int64)
        return np.arange(self.sessions[s].num_outputs, dtype=np.int64)

    def val_queries(self, s: int) -> np.ndarray:
        """Accumulated val queries; blurry uses all sessions' val in every session (official loader)."""
        self._check(s)
        last = len(self.sessions) - 1 if self.setup == "blurry" else s
        return np.sort(np.concatenate([self.sessions[u].val for u in range(last + 1)]))

    def test_queries(self, s: int, test_protocol_labels: np.ndarray) -> np.ndarray:
        """Indices of test images whose protocol label has been seen by session s."""
        seen = self.seen_classes(s)
        labels = np.asarray(test_protocol_labels).astype(np.int64, copy=False)
        return np.flatnonzero(np.isin(labels, seen)).astype(np.int64)

    def joint_train(self, s: int) -> np.ndarray:
        """Union of train of sessions 0..s, for the joint-training upper bound (``--jt``)."""
        self._check(s)
        return np.sort(np.concatenate([self.sessions[u].train for u in range(s + 1)]))


def _largest_remainder(total: int, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Split ``total`` over classes proportionally to ``counts`` (random tie-breaks, like sklearn)."""
    n = int(counts.sum())
    if n == 0 or total == 0:
        return np.zeros_like(counts)
    scaled = counts.astype(np.int64) * total
    alloc, rem = scaled // n, scaled % n
    short = total - int(alloc.sum())
    if short:
        tie = rng.permutation(counts.size)
        order = np.lexsort((tie, -rem))  # largest remainder first, ties random
        alloc[order[:short]] += 1
    return alloc


def stratified_split(
    pool: np.ndarray, plabels: np.ndarray, frac: Fraction, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Stratified train/val split of one session pool; n_val = ceil(frac * len) as in scikit-learn."""
    n_val = math.ceil(frac * pool.size)
    if n_val == 0:
        return np.sort(pool), np.empty(0, np.int64)
    lab = plabels[pool]
    classes, inv, counts = np.unique(lab, return_inverse=True, return_counts=True)
    per_class = _largest_remainder(n_val, counts, rng)
    perm = rng.permutation(pool.size)
    perm = perm[np.argsort(inv[perm], kind="stable")]  # grouped by class, random within
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.arange(pool.size) - np.repeat(starts, counts)
    is_val = rank < np.repeat(per_class, counts)
    return np.sort(pool[perm[~is_val]]), np.sort(pool[perm[is_val]])


def per_class_split(
    pool: np.ndarray, plabels: np.ndarray, per_class: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``min(per_class, n_c - 1)`` random images of each class c of the pool become validation queries."""
    perm = rng.permutation(pool.size)
    lab = plabels[pool][perm]
    order = np.argsort(lab, kind="stable")  # grouped by class, random within
    perm, lab = perm[order], lab[order]
    classes, starts, counts = np.unique(lab, return_index=True, return_counts=True)
    rank = np.arange(pool.size) - np.repeat(starts, counts)
    is_val = rank < np.repeat(np.minimum(per_class, counts - 1), counts)
    return np.sort(pool[perm[~is_val]]), np.sort(pool[perm[is_val]])


def _proportional_general(
    counts: np.ndarray, intro: np.ndarray, L: int, m: Fraction, ties: np.random.SeedSequence
) -> tuple[np.ndarray, np.ndarray]:
    """``(spc [K], share [L, K])`` of the proportional general rule (module docstring).

    For a trial ``a``: spc_c = max(1, floor(a n_c)); session u's old images
    O_u = floor(sum of its new classes' spc * M / (1 - M)) are split over the classes introduced
    before u in proportion to n_c (largest remainder, ties random).  The largest ``a`` (on a grid of
    1/1000) for which every class has spc_c + its later shares <= n_c is used.
    """
    n = counts.astype(np.int64)
    ratio = m / (1 - m)

    def trial(a: Fraction):
        spc = np.maximum(1, (n * a.numerator) // a.denominator)
        share = np.zeros((L, n.size), np.int64)
        for u in range(1, L):
            old = np.flatnonzero(intro < u)
            total = math.floor(int(spc[intro == u].sum()) * ratio)
            tie_rng = np.random.default_rng(np.random.SeedSequence(ties.entropy, spawn_key=ties.spawn_key + (u,)))
            share[u, old] = _largest_remainder(total, n[old], tie_rng)  # same tie-breaks in every trial
        need = spc + share.sum(0)
        return spc, share, bool(np.all(need <= n))

    for k in range(1000, 0, -1):
        spc, share, ok = trial(Fraction(k, 1000))
        if ok:
            return spc, share
    raise SplitError(
        f"old_class_percent={float(m * 100)} leaves no room for new-class images with these "
        "class sizes; lower old_class_percent"
    )


def _general_shares(first: int, per: int, L: int, spc: int, m: Fraction) -> list[int]:
    """Per-old-class image count for each session (index 0 unused): floor(N_new*M/(1-M)/n_old)."""
    shares = [0]
    for t in range(1, L):
        n_old = first + (t - 1) * per
        shares.append(math.floor(per * spc * m / (1 - m) / n_old))
    return shares


@dataclasses.dataclass(frozen=True)
class _Request:
    """The arguments of ``make_session_plan``, handed whole to the per-setup pool builders."""

    setup: str
    num_sessions: int
    first_classes: int
    classes_per_session: int
    old_class_percent: float
    samples_per_new_class: int | None
    blurry_minor_percent: float
    val_fraction: float
    num_classes: int | None
    shuffle_classes: bool
    seed: int
    val_per_class: int | None
    general_shares: str
    max_per_class: int | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class _Classes:
    """The used classes in protocol order: each one's train images in a seeded random order."""

    class_order: np.ndarray  # original label of each protocol label
    plabels: np.ndarray  # protocol label of each train image (-1: class not used)
    groups: list[np.ndarray]  # groups[p]: the train images of protocol label p, shuffled
    counts: np.ndarray  # counts[p] = len(groups[p])
    intro: np.ndarray  # intro[p]: the session that introduces protocol label p
    L: int  # sessions
    S: int  # classes of session 0
    C: int  # new classes per later session (0 with one session)


def _check_request(r: _Request, prefix: str = "") -> None:
    """Refuse arguments that no train split could satisfy (fields named ``<prefix><field>``: ``data.`` when
    they come from a config, ``check_config``)."""
    f = {k: f"{prefix}{k}" for k in dataclasses.asdict(r)}
    if r.setup not in SETUPS:
        raise SplitError(f"{f['setup']}={r.setup!r} is unknown; use one of {SETUPS}")
    if r.num_sessions < 1:
        raise SplitError(f"{f['num_sessions']}={r.num_sessions} must be >= 1")
    if r.first_classes < 1:
        raise SplitError(f"{f['first_classes']}={r.first_classes} must be >= 1")
    if r.num_sessions > 1 and r.classes_per_session < 1:
        raise SplitError(
            f"{f['classes_per_session']}={r.classes_per_session} must be >= 1 when {f['num_sessions']} > 1"
        )
    if not 0 <= r.old_class_percent < 100:
        raise SplitError(f"{f['old_class_percent']}={r.old_class_percent} must lie in [0, 100)")
    if not 0 <= r.val_fraction < 1:
        raise SplitError(f"{f['val_fraction']}={r.val_fraction} must lie in [0, 1)")
    if r.general_shares not in GENERAL_SHARES:
        raise SplitError(f"{f['general_shares']}={r.general_shares!r} is unknown; use one of {GENERAL_SHARES}")
    if r.general_shares == "proportional" and r.samples_per_new_class is not None:
        raise SplitError(
            f"{f['general_shares']}='proportional' sizes every class itself; pass {f['samples_per_new_class']}=None"
        )
    if r.val_per_class is not None and (r.val_per_class < 1 or r.val_fraction != 0):
        raise SplitError(
            f"{f['val_per_class']}={r.val_per_class} needs {f['val_fraction']}=0 (got {r.val_fraction}) "
            "and must be >= 1"
        )
    if r.max_per_class is not None and r.max_per_class < 1:
        raise SplitError(f"{f['max_per_class']}={r.max_per_class} must be >= 1 or None")
    if r.samples_per_new_class is not None and r.samples_per_new_class < 1:
        raise SplitError(f"{f['samples_per_new_class']}={r.samples_per_new_class} must be >= 1 or None")
    if r.setup == "blurry":
        if r.num_sessions > 1 and r.first_classes != r.classes_per_session:
            raise SplitError(
                f"blurry needs {f['first_classes']} ({r.first_classes}) == {f['classes_per_session']} "
                f"({r.classes_per_session}); set them equal"
            )
        if not 0 < r.blurry_minor_percent < 100:
            raise SplitError(
                f"{f['blurry_minor_percent']}={r.blurry_minor_percent} must lie in (0, 100) for setup='blurry'"
            )


def _checked_labels(train_labels: np.ndarray, num_classes: int | None) -> np.ndarray:
    labels = np.asarray(train_labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"train_labels must be a 1-D integer array, got shape {labels.shape} dtype {labels.dtype}")
    labels = labels.astype(np.int64, copy=False)
    if labels.size and labels.min() < 0:
        raise SplitError("train_labels must be non-negative original dataset labels")
    if num_classes is not None and labels.size and labels.max() >= num_classes:
        raise SplitError(
            f"num_classes={num_classes} but train_labels contain label {int(labels.max())}; "
            f"pass num_classes > max label or None"
        )
    return labels


def _classes(labels: np.ndarray, r: _Request, ss_order, ss_sample) -> _Classes:
    """Draw the class order and group the used classes' images (seeded streams ``ss_order``, ``ss_sample``)."""
    present = np.unique(labels)
    L, S, C = r.num_sessions, r.first_classes, r.classes_per_session if r.num_sessions > 1 else 0
    needed = S + (L - 1) * C
    if needed > present.size:
        raise SplitError(
            f"first_classes + (num_sessions-1)*classes_per_session = {S} + {L - 1}*{C} = {needed} "
            f"exceeds the {present.size} classes present; lower num_sessions, first_classes "
            f"or classes_per_session"
        )
    order = np.random.default_rng(ss_order).permutation(present) if r.shuffle_classes else present
    class_order = read_only(order[:needed])

    # Protocol labels of the train images and, per used class, its images in a seeded random order.
    lut = np.full(int(present.max()) + 1, -1, dtype=np.int64)
    lut[class_order] = np.arange(needed)
    plabels = lut[labels]
    perm = np.random.default_rng(ss_sample).permutation(labels.size)
    perm = perm[plabels[perm] >= 0]
    perm = perm[np.argsort(plabels[perm], kind="stable")]
    counts = np.bincount(plabels[perm], minlength=needed)
    groups = np.split(perm, np.cumsum(counts)[:-1])
    if r.max_per_class is not None:  # as if each class had only its first max_per_class images (seeded order)
        groups = [g[: r.max_per_class] for g in groups]
        counts = np.minimum(counts, r.max_per_class)
    intro = np.concatenate([np.zeros(S, np.int64), np.repeat(np.arange(1, L), C)])  # session of each class
    spc = r.samples_per_new_class
    if spc is not None and spc > counts.min():
        p = int(np.argmin(counts))
        raise SplitError(
            f"samples_per_new_class={spc} exceeds the {counts[p]} images of "
            f"class {int(class_order[p])}; lower samples_per_new_class or pass None"
        )
    return _Classes(class_order, plabels, groups, counts, intro, L, S, C)


Pools = list[list[np.ndarray]]  # pools[t]: the image groups that make up session t's pool


def _disjoint_pools(k: _Classes, r: _Request, ss_ties) -> Pools:
    """Each class only in its own session: all its images, or ``samples_per_new_class`` of them."""
    pools: Pools = [[] for _ in range(k.L)]
    for p in range(k.counts.size):
        take = k.counts[p] if r.samples_per_new_class is None else r.samples_per_new_class
        pools[k.intro[p]].append(k.groups[p][:take])
    return pools


def _blurry_pools(k: _Classes, r: _Request, ss_ties) -> Pools:
    """Each class: ``k`` minor images in every session that does not own it, the rest in its own."""
    pools: Pools = [[] for _ in range(k.L)]
    L = k.L
    b = exact_fraction(r.blurry_minor_percent) / 100
    for p in range(k.counts.size):
        n = int(k.counts[p]) if r.samples_per_new_class is None else r.samples_per_new_class
        if L == 1:
            minor, major = 0, n
        else:
            minor = math.floor(n * b / (L - 1))
            major = math.floor(minor * (L - 1) * (1 - b) / b + Fraction(1, 2))
            if minor == 0:
                raise SplitError(
                    f"class {int(k.class_order[p])} has {n} images: too few for "
                    f"blurry_minor_percent={r.blurry_minor_percent} over num_sessions={L} "
                    f"(need >= {math.ceil((L - 1) / b)}); raise blurry_minor_percent or "
                    f"samples_per_new_class, or use fewer sessions"
                )
        g = k.groups[p]
        pools[k.intro[p]].append(g[:major])
        pos = major
        for u in range(L):
            if u != k.intro[p]:
                pools[u].append(g[pos : pos + minor])
                pos += minor
    return pools


def _spread(k: _Classes, first: np.ndarray, share: np.ndarray) -> Pools:
    """Class p: ``first[p]`` images in its own session, then ``share[u, p]`` in each later session u."""
    pools: Pools = [[] for _ in range(k.L)]
    for p in range(k.counts.size):
        g = k.groups[p]
        pools[k.intro[p]].append(g[: first[p]])
        pos = int(first[p])
        for u in range(k.intro[p] + 1, k.L):
            pools[u].append(g[pos : pos + share[u, p]])
            pos += int(share[u, p])
    return pools


def _proportional_pools(k: _Classes, r: _Request, ss_ties) -> Pools:
    """General setup, long-tailed data: shares in proportion to each class's size."""
    m = exact_fraction(r.old_class_percent) / 100
    spc_c, share = _proportional_general(k.counts, k.intro, k.L, m, ss_ties)
    return _spread(k, spc_c, share)


def _uniform_pools(k: _Classes, r: _Request, ss_ties) -> Pools:
    """General setup: ``samples_per_new_class`` per new class (by default the most every class allows),
    plus the same old-class share for every old class."""
    L, S, C, intro, counts = k.L, k.S, k.C, k.intro, k.counts
    m = exact_fraction(r.old_class_percent) / 100

    def need(spc: int) -> np.ndarray:
        later = np.cumsum(_general_shares(S, C, L, spc, m)[::-1])[::-1]  # sum of shares t..L-1
        tail = np.append(later[1:], 0)  # shares after intro
        return spc + tail[intro]

    spc = r.samples_per_new_class
    if spc is None:
        spc = int(counts.min())
        while spc > 0 and np.any(need(spc) > counts):
            spc -= 1
        if spc == 0:
            raise SplitError(
                f"no samples_per_new_class >= 1 fits old_class_percent={r.old_class_percent} "
                f"with the available images; lower old_class_percent"
            )
    short = np.flatnonzero(need(spc) > counts)
    if short.size:
        p = int(short[0])
        raise SplitError(
            f"class {int(k.class_order[p])} needs {int(need(spc)[p])} images (samples_per_new_class="
            f"{spc} plus later old-class shares at old_class_percent={r.old_class_percent}) but has "
            f"{counts[p]}; lower samples_per_new_class or old_class_percent, or pass "
            f"samples_per_new_class=None"
        )
    shares = np.asarray(_general_shares(S, C, L, spc, m), np.int64)
    return _spread(k, np.full(counts.size, spc, np.int64), np.repeat(shares[:, None], counts.size, 1))


# (setup, general_shares) -> the builder of that setup's session pools; general_shares only splits "general"
_POOLS = {
    ("disjoint", None): _disjoint_pools,
    ("blurry", None): _blurry_pools,
    ("general", "uniform"): _uniform_pools,
    ("general", "proportional"): _proportional_pools,
}


def _sessions(k: _Classes, pools: Pools, r: _Request, ss_val) -> tuple[Session, ...]:
    """Split each session's pool into train and val queries (module docstring)."""
    L, S, C = k.L, k.S, k.C
    frac = exact_fraction(r.val_fraction)
    val_rng = np.random.default_rng(ss_val)
    sessions = []
    for t in range(L):
        pool = np.concatenate(pools[t]) if pools[t] else np.empty(0, np.int64)
        if r.val_per_class is None:
            train, val = stratified_split(pool, k.plabels, frac, val_rng)
        else:
            train, val = per_class_split(pool, k.plabels, r.val_per_class, val_rng)
        lo = 0 if t == 0 else S + (t - 1) * C
        hi = S if t == 0 else lo + C
        outputs = k.counts.size if r.setup == "blurry" else hi
        sessions.append(
            Session(
                index=t,
                train=read_only(train),
                val=read_only(val),
                new_classes=read_only(np.arange(lo, hi)),
                num_outputs=outputs,
            )
        )
    return tuple(sessions)


def make_session_plan(
    train_labels: np.ndarray,
    *,
    setup: str,
    num_sessions: int,
    first_classes: int,
    classes_per_session: int,
    old_class_percent: float = 0.0,
    samples_per_new_class: int | None = None,
    blurry_minor_percent: float = 10.0,
    val_fraction: float = 0.1,
    num_classes: int | None = None,
    shuffle_classes: bool = True,
    seed: int = 0,
    val_per_class: int | None = None,
    general_shares: str = "uniform",
    max_per_class: int | None = None,
) -> SessionPlan:
    """Cut the train split into ``num_sessions`` sessions (see module docstring).

    ``num_classes``, if given, is the size of the dataset's label space: labels must lie in
    ``[0, num_classes)``. The class order is a permutation of the classes present in
    ``train_labels``; only its first ``first_classes + (num_sessions-1)*classes_per_session``
    entries are used and kept in ``class_order``.

    Validation queries: a stratified ``val_fraction`` of each session's pool, or, with
    ``val_per_class`` (Product-M: 2), that many images of every class in the pool (never its
    last image), drawn at random; ``val_fraction`` must then be 0.

    ``max_per_class`` (``:smoke``): each class keeps only the first that many of its train images in
    the seeded order, as if the data had no more; None (default) leaves the plan unchanged.
    """
    r = _Request(
        setup, num_sessions, first_classes, classes_per_session, old_class_percent, samples_per_new_class,
        blurry_minor_percent, val_fraction, num_classes, shuffle_classes, seed, val_per_class, general_shares,
        max_per_class,
    )  # fmt: skip
    _check_request(r)
    labels = _checked_labels(train_labels, num_classes)
    # (a fourth child leaves the first three, and so every earlier split, unchanged)
    ss_order, ss_sample, ss_val, ss_ties = np.random.SeedSequence(seed).spawn(4)
    k = _classes(labels, r, ss_order, ss_sample)
    pools = _POOLS[setup, general_shares if setup == "general" else None](k, r, ss_ties)
    return SessionPlan(setup=setup, class_order=k.class_order, sessions=_sessions(k, pools, r, ss_val))


def _config_request(config, num_classes: int | None) -> _Request:
    """The ``_Request`` of ``config.data``'s generator fields, drawn with ``split_seed(config)``."""
    d = config.data
    return _Request(
        d.setup, d.num_sessions, d.first_classes, d.classes_per_session, d.old_class_percent,
        d.samples_per_new_class, d.blurry_minor_percent, d.val_fraction, num_classes, d.shuffle_classes,
        split_seed(config), d.val_per_class, d.general_shares, d.max_per_class,
    )  # fmt: skip


def check_config(config) -> None:
    """Refuses ``config.data``'s generator fields that no dataset could satisfy (a blurry setup with
    S != C, a validation share outside [0, 1), ...), naming each ``data.<field>``: the config checks call
    it before any data is read; the checks that need the data stay in ``make_session_plan``."""
    _check_request(_config_request(config, None), prefix="data.")


def plan_from_config(train_labels: np.ndarray, config, *, num_classes: int) -> SessionPlan:
    """``make_session_plan`` with the fields of ``config.data``: the one place a config becomes a
    generated split, drawn with ``split_seed(config)``."""
    return make_session_plan(train_labels, **dataclasses.asdict(_config_request(config, num_classes)))


def split_seed(config) -> int:
    """The seed of a run's session plan: ``config.split_seed`` when set (one plan for every run seed),
    else ``config.seed``."""
    return config.seed if config.split_seed is None else config.split_seed
