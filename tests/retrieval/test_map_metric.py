"""mAP against a brute-force numpy ranking, and AC under both tie rules on hand-made ties."""

import numpy as np
import pytest

from cvs_jax.retrieval import compatibility
from cvs_jax.retrieval.average_precision import average_precisions, mean_average_precision


def _brute_ap(q, ql, g, gl):
    """Rank every gallery row by cosine (stable: ties by row index), AP = mean of precision at each hit."""
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    gn = g / np.linalg.norm(g, axis=1, keepdims=True)
    out = []
    for i in range(len(q)):
        order = np.argsort(-(gn @ qn[i]), kind="stable")
        rel = gl[order] == ql[i]
        if not rel.any():
            out.append(np.nan)
            continue
        hits = np.flatnonzero(rel)
        out.append(np.mean([(n + 1) / (rank + 1) for n, rank in enumerate(hits)]))
    return np.array(out)


def test_map_matches_a_brute_force_ranking():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(5, 8))
    gl = rng.integers(0, 5, size=60)
    g = centres[gl] + 1.2 * rng.normal(size=(60, 8))
    ql = np.concatenate([rng.integers(0, 5, size=19), [7]])  # label 7: no relevant row
    q = np.concatenate([centres[ql[:19]], np.zeros((1, 8))]) + rng.normal(size=(20, 8))
    want = _brute_ap(q, ql, g, gl)
    got = average_precisions(q, ql, g, gl, chunk=8)  # chunks of 8: the last one padded
    assert np.isnan(got[-1]) and np.isnan(want[-1])
    np.testing.assert_allclose(got[:-1], want[:-1], rtol=1e-5)
    assert mean_average_precision(q, ql, g, gl, chunk=8) == pytest.approx(np.nanmean(want), rel=1e-5)
    assert 0 < np.nanmean(want) < 1


def test_map_by_hand_with_ties_broken_by_row_index():
    # query along x; gallery rows 0 and 1 tie (same direction), row 2 is next, row 3 the farthest
    g = np.array([[1.0, 0], [2.0, 0], [1.0, 1.0], [-1.0, 0]])
    q = np.array([[1.0, 0]])
    # label 0 on rows 1 and 3: ranking 0, 1, 2, 3 -> hits at ranks 2 and 4: (1/2 + 2/4) / 2
    assert average_precisions(q, [0], g, [1, 0, 1, 0])[0] == pytest.approx(0.5)
    # rows 0 and 2 relevant: ranks 1 and 3 -> (1 + 2/3) / 2
    assert average_precisions(q, [0], g, [0, 1, 0, 1])[0] == pytest.approx((1 + 2 / 3) / 2)
    assert mean_average_precision(q, [5], g, [0, 1, 0, 1]) is None


def test_ac_under_both_tie_rules_on_hand_made_ties():
    m = [
        [0.60, None, None],
        [0.60, 0.70, None],  # (1, 0): a tie
        [0.59, 0.70, 0.80],  # (2, 0) worse; (2, 1): a tie
    ]
    # iamcl2r fails a pair on <=: only strict wins count -> 0 of 3; CoReS/CL2R fail on <: the two ties pass
    assert compatibility.average_compatibility(m, "fail") == 0.0
    assert compatibility.average_compatibility(m, "pass") == pytest.approx(2 / 3)
    assert compatibility.average_compatibility(m) == 0.0  # the default stays iamcl2r's
    assert compatibility.average_compatibility_rules(m) == {"ties_fail": 0.0, "ties_pass": pytest.approx(2 / 3)}
    no_ties = [[0.5, None], [0.6, 0.7]]
    assert compatibility.average_compatibility_rules(no_ties) == {"ties_fail": 1.0, "ties_pass": 1.0}
    with pytest.raises(ValueError, match="ties='maybe'"):
        compatibility.average_compatibility(m, "maybe")


def _reference_ac(matrix, fails):
    """cores/metrics.py and iamcl2r/compatibility_metrics.py: count failing pairs over all T(T-1)/2 pairs."""
    steps = matrix.shape[0]
    failed = sum(fails(matrix[i][j], matrix[j][j]) for j in range(steps) for i in range(j + 1, steps))
    return (steps * (steps - 1) / 2 - failed) / (steps * (steps - 1) / 2)


def test_ac_rules_match_the_reference_code_on_random_matrices_with_ties():
    rng = np.random.default_rng(1)
    for _ in range(20):
        m = np.tril(rng.integers(0, 4, size=(5, 5)) / 4)  # few distinct values: many ties
        assert compatibility.average_compatibility(m, "fail") == pytest.approx(_reference_ac(m, lambda a, b: a <= b))
        assert compatibility.average_compatibility(m, "pass") == pytest.approx(_reference_ac(m, lambda a, b: a < b))
