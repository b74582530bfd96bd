"""A run's recorded config.json is read by laying it over today's defaults (cvs_jax/config/stored.py);
its loss weights stay as recorded for readers and are completed from today's methods for a run that
trains on (cvs_jax/config/recorded.py ``continued_config``)."""

import json

import pytest

from configs import base
from cvs_jax.config import recorded
from cvs_jax.config.stored import stored_config
from cvs_jax.errors import ConfigError


def _write(tmp_path, config_dict):
    (tmp_path / "config.json").write_text(json.dumps(config_dict))
    return str(tmp_path)


def test_a_field_added_since_the_run_takes_its_one_default(tmp_path):
    stored = base.get_config().to_dict()
    del stored["train"]["steps_per_call"]  # as if the run predates the field
    del stored["population"]
    stored["train"]["epochs"] = 3  # the run's own value is kept
    config = stored_config(_write(tmp_path, stored))
    assert config.train.steps_per_call == base.get_config().train.steps_per_call
    assert config.population == base.get_config().population
    assert config.train.epochs == 3


def test_added_keys_keep_the_value_the_run_used_not_todays_default(tmp_path):
    stored = base.get_config().to_dict()
    del stored["model"]["head"]  # recorded before model.head existed: the run trained the cosine head
    assert base.get_config().model.head != "cosine"
    assert stored_config(_write(tmp_path, stored)).model.head == "cosine"


def test_a_recorded_field_that_no_longer_exists_is_refused_by_name(tmp_path):
    stored = base.get_config().to_dict()
    stored["train"]["warp_speed"] = 9
    with pytest.raises(ConfigError, match=r"train\.warp_speed"):
        stored_config(_write(tmp_path, stored))


def test_readers_get_the_loss_weights_as_the_run_recorded_them(tmp_path):
    stored = base.get_config().to_dict()
    del stored["loss_weights"]["L_m"]  # recorded before the term existed
    stored["loss_weights"]["L_d"] = 7.0
    assert dict(stored_config(_write(tmp_path, stored)).loss_weights) == stored["loss_weights"]


def test_a_run_that_trains_on_gets_a_term_added_since_at_its_declared_weight(tmp_path):
    stored = base.get_config().to_dict()
    del stored["loss_weights"]["L_m"]
    stored["loss_weights"]["L_d"] = 7.0  # the run's own weight is kept
    config = recorded.continued_config(_write(tmp_path, stored))
    assert config.loss_weights.L_m == base.get_config().loss_weights.L_m
    assert config.loss_weights.L_d == 7.0
    assert dict(config.loss_weights).keys() == dict(base.get_config().loss_weights).keys()
    del config.loss_weights["L_m"]
    assert stored_config(str(tmp_path)) == config  # every other field as the readers read it


def test_a_run_that_trains_on_refuses_a_term_no_method_declares(tmp_path):
    stored = base.get_config().to_dict()
    stored["loss_weights"]["L_gone"] = 1.0
    with pytest.raises(ConfigError, match=r"loss_weights\.L_gone"):
        recorded.continued_config(_write(tmp_path, stored))
    assert stored_config(str(tmp_path)).loss_weights.L_gone == 1.0
