"""``population=N``: N members in one vmapped step equal N separate runs (seeds s..s+N-1, the split of s):
the same recalls, validation recalls and selected epochs, losses within float tolerance; and a population
killed mid-session and rerun equals the uninterrupted population exactly.

Why ``train.lr`` is 0.003 here, a tenth of the recipe's: the vmapped program batches the members'
convolutions, whose float code differs from a single run's in the last bits (first-epoch losses 1e-7
apart).  At lr 0.03 the tiny model's training (T = 0.05 softmax, width 4, batch 16) is chaotic: that
1e-7 grew to 3.5e-3 and 9.7e-3 (seeds 0 and 1) over 2 sessions x 2 epochs, and recalls of its 8-d
embedding flipped by a query (``python benchmarks/population_drift.py --lr 0.03``); two separate runs on
two machines would drift the same way.
At lr 0.003 the same runs stay within 7e-7 (seed 0; ``--lr 0.003``; at most 4e-4 over seeds 0-4, 2 and 3 sessions;
1.0e-4 for seed 0 with XLA's backend optimisations off, a stand-in for another CPU's float code) and
every recall is equal, so the test can assert what the population promises: the members are the
separate runs, not merely runs like them.
"""

import json
import os

import numpy as np
import pytest

from cvs_jax import config_checks, population, trainer
from cvs_jax.errors import ConfigError
from tests import methods_runs as mr
from tests.tiny_data import tiny_config, write_fashion_idx

LR = 0.003  # a non-chaotic regime of the tiny model (see the module docstring)
RTOL = 1e-3  # metrics.jsonl floats, member vs separate run (measured 7.1e-7; 1.0e-4 with XLA backend opts off)


@pytest.fixture(scope="module")
def manual(tmp_path_factory):
    return write_fashion_idx(str(tmp_path_factory.mktemp("idx")), train_per_class=40, test_per_class=6)


def _config(manual, tmp_path, method="cvs", seed=0):
    c = tiny_config(manual, tmp_path, method=method, sessions=2)
    c.data.samples_per_new_class = 30
    c.memory.budget = 20
    c.train.checkpoint_every_steps = 3
    c.train.lr = LR
    c.seed = seed
    return c


def _same_run(member, separate):
    """results.json equal (every recall, selected epoch, size); metrics.jsonl: recalls equal, the other
    floats within ``RTOL``."""
    assert member[0] == separate[0]
    assert len(member[1]) == len(separate[1])
    for a, b in zip(member[1], separate[1]):
        assert a.keys() == b.keys()
        for key in a:
            if key.startswith("test_") or key == "val_recall1" or not isinstance(a[key], float):
                assert a[key] == b[key], key
            else:
                np.testing.assert_allclose(a[key], b[key], rtol=RTOL, err_msg=key)


def test_population_refuses_methods_it_cannot_stack(manual, tmp_path):
    c = _config(manual, tmp_path, method="ewc")
    c.population = 2
    with pytest.raises(ConfigError, match="population=2 is not supported for method='ewc'"):
        config_checks.check(c, num_devices=1)
    assert population.member_config(_config(manual, tmp_path, seed=5), 1).seed == 6
    assert population.member_config(_config(manual, tmp_path, seed=5), 1).split_seed == 5


def test_population_equals_separate_runs_and_resumes(manual, tmp_path):
    c = _config(manual, tmp_path, seed=0)
    c.population = 2
    wd = str(tmp_path / "pop")
    out = trainer.run(c, wd)
    with open(os.path.join(wd, "population.json")) as f:
        listed = json.load(f)
    assert [(m["seed"], m["workdir"]) for m in listed["members"]] == [(0, "member0"), (1, "member1")]
    assert listed["split_seed"] == 0 and len(out["results"]) == 2
    members = [mr.outcome(os.path.join(wd, f"member{m}")) for m in range(2)]
    assert members[0][0]["seed"] == 0 and members[1][0]["seed"] == 1
    assert members[0][0]["per_session"] != members[1][0]["per_session"]  # different members
    for m in range(2):
        sep = _config(manual, tmp_path, seed=m)
        sep.split_seed = 0
        sep_wd = str(tmp_path / f"separate{m}")
        trainer.run(sep, sep_wd)
        _same_run(members[m], mr.outcome(sep_wd))

    # killed mid-session (session 1, epoch 2, before its checkpoint at step 9), rerun: the same outcome
    cmd = mr.main_cmd(manual, str(tmp_path / "tfds"), str(tmp_path / "killed"), "cvs") + [
        "--config.population=2",
        f"--config.train.lr={LR}",
    ]
    assert mr.run(cmd, "step:8").returncode == -9
    resumed = mr.run(cmd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.count("resumed session 1 at step 6/") == 2
    for m in range(2):
        assert mr.outcome(str(tmp_path / "killed" / f"member{m}")) == members[m]
