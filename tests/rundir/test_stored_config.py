"""A run's recorded config.json is read by laying it over today's defaults (cvs_jax/config/base.py)."""

import json

import pytest

from configs import base
from cvs_jax.config import recorded
from cvs_jax.errors import ConfigError


def _write(tmp_path, config_dict):
    (tmp_path / "config.json").write_text(json.dumps(config_dict))
    return str(tmp_path)


def test_a_field_added_since_the_run_takes_its_one_default(tmp_path):
    stored = base.get_config().to_dict()
    del stored["train"]["steps_per_call"]  # as if the run predates the field
    del stored["population"]
    stored["train"]["epochs"] = 3  # the run's own value is kept
    config = recorded.stored_config(_write(tmp_path, stored))
    assert config.train.steps_per_call == base.get_config().train.steps_per_call
    assert config.population == base.get_config().population
    assert config.train.epochs == 3


def test_added_keys_keep_the_value_the_run_used_not_todays_default(tmp_path):
    stored = base.get_config().to_dict()
    del stored["model"]["head"]  # recorded before model.head existed: the run trained the cosine head
    assert base.get_config().model.head != "cosine"
    assert recorded.stored_config(_write(tmp_path, stored)).model.head == "cosine"


def test_a_recorded_field_that_no_longer_exists_is_refused_by_name(tmp_path):
    stored = base.get_config().to_dict()
    stored["train"]["warp_speed"] = 9
    with pytest.raises(ConfigError, match=r"train\.warp_speed"):
        recorded.stored_config(_write(tmp_path, stored))
