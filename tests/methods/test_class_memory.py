"""CL²R's and HOC's memory (continuum's fixed random rehearsal) against a transcription of continuum."""

import numpy as np

from cvs_jax.methods.class_memory import PerClassRandomMemory, add_per_class
from cvs_jax.methods.seams import MemoryPolicy, ReplayMemory, misfit


def _continuum_add(mem_x, mem_y, x, y, per_class, rng):
    """continuum RehearsalMemory.add with herd_random and fixed memory, in numpy."""
    idx = np.concatenate(
        [
            rng.choice(np.where(y == c)[0], size=min(per_class, len(np.where(y == c)[0])), replace=False)
            for c in np.unique(y)
        ]
    )
    mx, my = np.concatenate((mem_x, x[idx])), np.concatenate((mem_y, y[idx]))
    keep = [np.where(my == c)[0][:per_class] for c in np.unique(my)]  # _reduce
    return np.concatenate([mx[k] for k in keep]), np.concatenate([my[k] for k in keep])


def test_per_class_draws_keep_old_images_and_top_up_short_classes():
    rng = np.random.default_rng(0)
    ids1, y1 = np.arange(100, 150), np.repeat([0, 1, 2], [20, 27, 3])
    ids, labels = add_per_class([], [], ids1, y1, 5, np.random.default_rng(1))
    want = _continuum_add(np.zeros(0, np.int64), np.zeros(0, np.int64), ids1, y1, 5, np.random.default_rng(1))
    np.testing.assert_array_equal(ids, want[0])
    np.testing.assert_array_equal(labels, want[1])
    assert np.bincount(labels).tolist() == [5, 5, 3]  # class 2 has only 3 images
    # a later (blurry) session: class 1 is full and keeps its images, class 2 is topped up, class 3 is new
    ids2, y2 = np.arange(200, 230), rng.permutation(np.repeat([1, 2, 3], 10))
    ids_b, labels_b = add_per_class(ids, labels, ids2, y2, 5, np.random.default_rng(2))
    want = _continuum_add(ids, labels, ids2, y2, 5, np.random.default_rng(2))
    np.testing.assert_array_equal(ids_b, want[0])
    np.testing.assert_array_equal(labels_b, want[1])
    assert np.bincount(labels_b).tolist() == [5, 5, 5, 5]
    np.testing.assert_array_equal(ids_b[labels_b == 1], ids[labels == 1])
    np.testing.assert_array_equal(ids_b[labels_b == 2][:3], ids[labels == 2])
    assert np.all(ids_b[labels_b == 2][3:] >= 200)


def test_the_policy_fits_the_memory_seam_and_reads_the_previous_session():
    assert misfit(PerClassRandomMemory(), MemoryPolicy) is None

    class Plan:
        sessions = [type("S", (), {"train": np.arange(0, 12)})(), type("S", (), {"train": np.arange(12, 20)})()]

    view = type("View", (), {"plan": Plan(), "train_labels": np.arange(20) % 3, "seed": 4})()
    mem = PerClassRandomMemory(per_class=2).update(view, ReplayMemory.empty(), None, 1)
    assert len(mem) == 6 and mem.built_after == 0 and mem.seen == 12
    assert np.all(mem.source_ids < 12) and np.bincount(mem.labels).tolist() == [2, 2, 2]
    np.testing.assert_array_equal(view.train_labels[mem.source_ids], mem.labels)
    again = PerClassRandomMemory(per_class=2).update(view, ReplayMemory.empty(), None, 1)
    np.testing.assert_array_equal(again.source_ids, mem.source_ids)  # seeded by (seed, session)
