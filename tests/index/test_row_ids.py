"""``RowIds``, the ids an index holds, against a Python set: ids out of order, repeated within one call
and across calls, and marked held by ``hold``.  ``new`` returns each id's first occurrence not held yet,
in the order given (an insert that lost the sort, or a membership test off by one position, breaks it)."""

import numpy as np

from cvs_jax.index.base import RowIds


def test_new_and_hold_match_a_set_over_random_calls():
    rng = np.random.default_rng(0)
    ids, held = RowIds(2), set()
    for call in range(60):
        n = int(rng.integers(0, 40))
        rows = rng.integers(0, 300, n)
        if call % 7 == 3:
            ids.hold(rows)
            held |= set(rows.tolist())
            assert len(ids) == len(held)
            continue
        emb = np.arange(2 * n, dtype=np.float32).reshape(n, 2)
        got_rows, got_emb, _, _ = ids.new(rows, emb, np.zeros(n, int), np.zeros(n, int))
        expected, seen = [], set()
        for i, r in enumerate(rows.tolist()):
            if r not in held and r not in seen:
                expected.append(i)
                seen.add(r)
        np.testing.assert_array_equal(got_rows, rows[expected])
        np.testing.assert_array_equal(got_emb, emb[expected])
        held |= seen
        assert len(ids) == len(held)
    assert len(held) > 200  # the calls reached most ids, so held and new ones were both tested
