"""Rainbow Memory as the author's fork (docs/config-provenance.md), rule by rule, each pinned against a direct
transcription of the rule written here; the earlier cvs-jax rules stay reachable through ``config.rainbow``."""

import types
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cvs_jax.augment import autoaugment
from cvs_jax.augment import transforms as augment
from cvs_jax.errors import ConfigError
from cvs_jax.methods import baselines, policies, replay
from cvs_jax.methods.policies import ReplayMemory
from cvs_jax.methods.seams import PolicyView
from cvs_jax.testing.tiny_data import tiny_config

# ---------------------------------------------------------------- transcriptions of the fork's rules


def fork_stride(unc, labels, budget):
    """``uncertainty_sampling``: quota = budget // classes; a class of <= quota candidates: all of them;
    otherwise sorted ascending, then ``[::len // quota][:quota]``."""
    classes = sorted(set(labels.tolist()))
    quota = budget // len(classes)
    out = []
    for c in classes:
        rows = [i for i in range(len(labels)) if labels[i] == c]
        if len(rows) <= quota:
            out += rows
        else:
            ranked = sorted(rows, key=lambda i: unc[i])  # Python's sort is stable: ties keep candidate order
            out += ranked[:: len(rows) // quota][:quota]
    return out


def fork_votes_uncertainty(preds):
    """``variance_ratio``: per sample, 1 - (votes of the most-voted class) / T."""
    t = len(preds)
    return [1 - Counter(preds[:, i].tolist()).most_common(1)[0][1] / t for i in range(preds.shape[1])]


def candidates(seed, sizes):
    """Labels of unequal classes (some under the quota) in a shuffled order; uncertainties with many ties."""
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    unc = rng.integers(0, 13, size=labels.size) / 12.0  # 13 values, as 12 votes give
    return labels, unc


# ---------------------------------------------------------------- selection rules (replay.py)


@pytest.mark.parametrize("seed", range(4))
def test_stride_picks_match_the_fork(seed):
    labels, unc = candidates(seed, [40, 23, 7, 3, 61])  # budget 40 -> quota 8: classes of 7 and 3 keep all
    rows = replay.stride_rows(unc, labels, 40)
    assert rows.tolist() == fork_stride(unc, labels, 40)
    for c, n in zip(range(5), [40, 23, 7, 3, 61]):
        picked = rows[labels[rows] == c]
        assert len(picked) == min(n, 8)
        if n > 8:  # ascending: the first pick is (one of) the most certain of its class
            assert unc[picked[0]] == unc[labels == c].min()
    assert len(rows) == 8 + 8 + 7 + 3 + 8


def test_stride_on_distinct_uncertainties_is_every_jump_th_rank():
    labels = np.zeros(23, np.int64)
    unc = np.random.default_rng(0).permutation(23) / 23.0
    ranks = np.argsort(unc)
    np.testing.assert_array_equal(replay.stride_rows(unc, labels, 5), ranks[[0, 4, 8, 12, 16]])  # 23 // 5 = 4
    np.testing.assert_array_equal(replay.stride_rows(unc, labels, 23), np.arange(23))  # <= quota: all, unsorted
    with pytest.raises(ValueError, match="memory_budget=1"):
        replay.stride_rows(unc, np.arange(23) % 2, 1)


@pytest.mark.parametrize("seed", range(3))
def test_refill_fills_the_budget_from_the_remaining_candidates(seed):
    labels, unc = candidates(seed, [40, 23, 7, 3, 61])
    ids = np.arange(labels.size) + 1000
    chosen = fork_stride(unc, labels, 41)  # quota 8: 34 chosen, 7 slots left
    sel_ids, sel_labels = replay.uncertainty_select(
        unc, labels, ids, 41, selection="stride", refill_rng=np.random.default_rng(seed)
    )
    assert len(sel_ids) == 41 and len(set(sel_ids.tolist())) == 41
    assert (sel_ids[: len(chosen)] - 1000).tolist() == chosen
    refilled = sel_ids[len(chosen) :] - 1000
    assert len(refilled) == 41 - len(chosen) == 7 and not set(refilled.tolist()) & set(chosen)
    np.testing.assert_array_equal(sel_labels, labels[sel_ids - 1000])
    # the refill is a uniform draw without replacement from the remaining candidates
    remaining = [i for i in range(labels.size) if i not in set(chosen)]
    expected = np.random.default_rng(seed).choice(remaining, size=7, replace=False)
    np.testing.assert_array_equal(refilled, expected)
    # no refill: the slots stay empty
    assert len(replay.uncertainty_select(unc, labels, ids, 41, selection="stride")[0]) == len(chosen)


def test_refill_with_fewer_candidates_than_the_budget_keeps_them_all():
    labels, unc = candidates(0, [5, 2, 9])
    sel, _ = replay.uncertainty_select(unc, labels, np.arange(16), 30, refill_rng=np.random.default_rng(0))
    assert sorted(sel.tolist()) == list(range(16))


@pytest.mark.parametrize("seed", range(3))
def test_first_session_random_equal_shares(seed):
    labels, _ = candidates(seed, [30, 12, 4, 25])
    ids = np.arange(labels.size) + 500
    sel, sel_labels = replay.random_class_select(labels, ids, 30, np.random.default_rng(seed), refill=False)
    counts = Counter(sel_labels.tolist())
    assert counts == {0: 7, 1: 7, 2: 4, 3: 7}  # quota 30 // 4 = 7; the class of 4 keeps all
    assert len(set(sel.tolist())) == len(sel) and all(labels[i - 500] == y for i, y in zip(sel, sel_labels))
    # transcription: per class, a draw of min(quota, n) without replacement, then the refill
    rng = np.random.default_rng(seed)
    rows = []
    for c in range(4):
        members = np.flatnonzero(labels == c)
        rows += rng.choice(members, size=min(7, members.size), replace=False).tolist()
    assert (sel - 500).tolist() == rows
    remaining = [i for i in range(labels.size) if i not in set(rows)]
    rows += rng.choice(remaining, size=30 - len(rows), replace=False).tolist()
    refilled, _ = replay.random_class_select(labels, ids, 30, np.random.default_rng(seed))
    assert (refilled - 500).tolist() == rows and len(refilled) == 30
    # a random draw: another seed picks other items
    other, _ = replay.random_class_select(labels, ids, 30, np.random.default_rng(seed + 10))
    assert not np.array_equal(np.sort(other), np.sort(refilled))


# ---------------------------------------------------------------- uncertainty from 12 votes (policies.py)


def fake_view(sessions, labels, table, seed=0):
    """What ``UncertaintyMemory.update`` reads; 'images' are the dataset indices, predictions come from a
    table; ``keys`` collects the perturbation keys, in call order."""
    keys = []

    def predict(variables, images, key, valid_classes):
        keys.append(np.asarray(jax.random.key_data(key)).tolist())
        return jnp.asarray(table[len(keys) - 1][np.asarray(images)[:, 0]])

    view = PolicyView(
        plan=types.SimpleNamespace(sessions=[types.SimpleNamespace(train=t, num_outputs=5) for t in sessions]),
        train_labels=labels,
        train_images=lambda idx: np.asarray(idx, np.int64)[:, None],
        embed=None,
        log=lambda message: None,
        num_classes=5,
        seed=seed,
        batch_size=8,
        eval_batch_size=256,
        loss_weights={},
        compiled=lambda name, build: predict,
    )
    return view, keys


def test_uncertainty_from_twelve_votes_and_the_fork_memory():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 5, size=120).astype(np.int32)
    table = rng.integers(0, 3, size=(12, 120))  # labels predicted under each of the 12 perturbations
    session0, session1 = np.arange(0, 60), np.arange(60, 120)
    mem = ReplayMemory(np.arange(0, 60, 3), labels[0:60:3], built_after=0, seen=60)
    view, keys = fake_view([session0, session1], labels, table, seed=3)
    policy = policies.UncertaintyMemory(22)
    assert (policy.perturbations, policy.perturbation, policy.selection) == (12, "randaugment", "stride")
    out = policy.update(view, mem, None, 2)
    assert len(keys) == 12 and len({tuple(k) for k in keys}) == 12  # 12 draws, each its own key
    # transcription: candidates = the previous session shuffled, then the memory; votes; stride; refill
    r = np.random.default_rng([3, 2, 13])
    pool = np.concatenate([session1[r.permutation(60)], mem.source_ids])
    unc = fork_votes_uncertainty(table[:, pool])
    fresh, _ = fake_view([session0, session1], labels, table)
    np.testing.assert_allclose(policy.uncertainty(fresh, None, pool, 2), unc)
    rows = fork_stride(np.asarray(unc), labels[pool], 22)
    remaining = [i for i in range(len(pool)) if i not in set(rows)]
    rows += r.choice(remaining, size=22 - len(rows), replace=False).tolist()
    assert out.source_ids.tolist() == pool[rows].tolist() and len(out) == 22
    np.testing.assert_array_equal(out.labels, labels[out.source_ids])
    assert (out.built_after, out.seen) == (1, 120)
    # the same call again gives the same memory (resume)
    again, _ = fake_view([session0, session1], labels, table, seed=3)
    assert policy.update(again, mem, None, 2).source_ids.tolist() == out.source_ids.tolist()


def test_first_memory_is_random_without_votes():
    labels = np.repeat(np.arange(4), 15).astype(np.int32)
    view, keys = fake_view([np.arange(60)], labels, table=None, seed=1)
    out = policies.UncertaintyMemory(30).update(view, ReplayMemory.empty(), None, 1)
    assert keys == [] and len(out) == 30 and len(set(out.source_ids.tolist())) == 30
    assert all(n >= 7 for n in Counter(out.labels.tolist()).values())  # equal shares (quota 7), then refill
    # the earlier rule votes from the first session on
    view, keys = fake_view([np.arange(60)], labels, np.zeros((8, 60), np.int64), seed=1)
    legacy = policies.UncertaintyMemory(30, 8, "train_pipeline", "spread", False, "uncertainty")
    assert len(legacy.update(view, ReplayMemory.empty(), None, 1)) == 28 and len(keys) == 8


def test_randaugment_perturbation_then_eval_transform():
    images = jnp.asarray(np.random.default_rng(0).integers(0, 256, (6, 12, 12, 3)).astype(np.uint8))
    pipe = augment.Pipeline(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), padding=2)
    key = jax.random.key(4)
    x = policies.perturb_images(pipe, "randaugment", key, images)
    np.testing.assert_array_equal(x, pipe.eval(autoaugment.rand_augment(key, images)))
    np.testing.assert_array_equal(policies.perturb_images(pipe, "train_pipeline", key, images), pipe.train(key, images))


def test_unknown_switches_are_config_errors():
    with pytest.raises(ConfigError, match="rainbow.selection='median'"):
        policies.UncertaintyMemory(20, selection="median")
    with pytest.raises(ConfigError, match="rainbow.memory_batches"):
        policies.HalfMemoryBatches("iid")
    with pytest.raises(ConfigError, match="rainbow.first_session"):
        policies.UncertaintyMemory(20, first_session="herding")


# ---------------------------------------------------------------- cycling memory batches


def fork_cycle(seed, session, epoch, n):
    """The fork's ``cycle(memory_loader)``, restarted every epoch: pass after pass, a new order each pass."""
    c = 0
    while True:
        yield from np.random.default_rng([seed, session, epoch, c, 2]).permutation(n).tolist()
        c += 1


def test_cycling_memory_batches():
    stream, mem = np.arange(0, 40), np.arange(1000, 1007)  # 7 memory items, 4 memory rows per batch of 8
    memory_state = ReplayMemory(mem, np.zeros(7, np.int32), built_after=0)
    b = policies.HalfMemoryBatches().plan(stream, memory_state, batch_size=8, seed=5, session=1)
    assert b.split == (4, 4) and b.steps_per_epoch == 10
    for e in range(3):
        batches = [b.batch(e, i) for i in range(b.steps_per_epoch)]
        assert sorted(np.concatenate([x[:4] for x in batches]).tolist()) == stream.tolist()  # stream once per epoch
        rows = np.concatenate([x[4:] for x in batches]) - 1000
        passes = [rows[k : k + 7] for k in range(0, 35, 7)]  # 40 rows: 5 whole passes, then a partial one
        assert all(sorted(p.tolist()) == list(range(7)) for p in passes)  # every memory item once per pass
        assert len({tuple(p.tolist()) for p in passes}) > 1  # a new order each pass
        gen = fork_cycle(5, 1, e, 7)
        assert rows.tolist() == [next(gen) for _ in range(40)]  # = zip(stream loader, cycle(memory loader))
    # a pure function of (seed, session, epoch, step): recomputed in any order, from a fresh object, it matches
    sequential = [b.batch(e, i).tolist() for e in range(3) for i in range(10)]
    policies.memory_pass_order.cache_clear()
    policies.epoch_order.cache_clear()
    again = policies.HalfMemoryBatches().plan(stream.copy(), memory_state, batch_size=8, seed=5, session=1)
    for k in np.random.default_rng(0).permutation(30):
        assert again.batch(*divmod(int(k), 10)).tolist() == sequential[k]
    other = policies.HalfMemoryBatches().plan(stream, memory_state, batch_size=8, seed=6, session=1)
    assert other.batch(0, 0).tolist() != sequential[0]


def test_cycle_with_a_memory_smaller_than_half_a_batch_and_odd_batches():
    mem = ReplayMemory(np.array([7, 9]), np.zeros(2, np.int32), built_after=0)
    b = policies.HalfMemoryBatches().plan(np.arange(30), mem, batch_size=9, seed=0, session=2)
    assert b.split == (5, 4) and b.steps_per_epoch == 6  # the fork: memory batch_size // 2, stream the rest
    for i in range(6):
        x = b.batch(0, i)
        assert len(x) == 9 and sorted(x[5:].tolist()) == [7, 7, 9, 9]  # two passes of 2 per batch


def test_with_replacement_memory_batches_are_the_earlier_rule():
    stream, mem = np.arange(0, 40), np.arange(1000, 1008)
    memory_state = ReplayMemory(mem, np.zeros(8, np.int32), built_after=0)
    b = policies.HalfMemoryBatches("with_replacement").plan(stream, memory_state, batch_size=9, seed=0, session=1)
    assert b.split == (4, 5) and b.steps_per_epoch == 10
    order = policies.epoch_order(0, 1, 2, 40)
    draws = np.random.default_rng([0, 1, 2, 3, 1]).integers(0, 8, 5)
    np.testing.assert_array_equal(b.batch(2, 3), np.concatenate([stream[order[12:16]], mem[draws]]))


# ---------------------------------------------------------------- make_rainbow (its whole run: tests/runs/)


def test_make_rainbow_reads_config_rainbow(manual_dir, tmp_path):
    c = tiny_config(manual_dir, tmp_path, method="rainbow")
    m = baselines.make_rainbow(c)
    assert m.memory == policies.UncertaintyMemory(c.memory.budget, 12, "randaugment", "stride", True, "random")
    assert m.batches == policies.HalfMemoryBatches("cycle")
    c.rainbow.selection, c.rainbow.memory_batches = "spread", "with_replacement"
    m = baselines.make_rainbow(c)
    assert m.memory.selection == "spread" and m.batches.memory_batches == "with_replacement"
