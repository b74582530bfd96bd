"""``compare``'s markdown cells: mean ± std over seeds, and no invented spread for one seed."""

from cvs_jax.reports import tables


def test_one_seed_has_no_spread_and_two_have_one():
    one = {"mean": 71.5, "std": 0.0, "per_seed": {"0": 71.5}}
    two = {"mean": 71.0, "std": 0.7071, "per_seed": {"0": 70.5, "1": 71.5}}
    assert tables._mean_std_cell(one) == "71.50 ± n/a"
    assert tables._mean_std_cell(two) == "71.00 ± 0.71"
    assert tables._mean_std_cell(None) == "n/a"
