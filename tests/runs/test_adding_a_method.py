"""The worked example of ``docs/adding-a-method.md``, run from the page itself: one module plus one
registry line makes a method that trains, whose term is weighted by ``config.loss_weights`` (its
declared default, or the user's override), and a term without a weight stops with one ``error:`` line
before anything runs."""

import json
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

from cvs_jax.engine import runner
from cvs_jax.errors import ConfigError
from cvs_jax.methods import registry
from cvs_jax.rundir import paths
from cvs_jax.testing.tiny_data import tiny_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(REPO, "docs", "adding-a-method.md")


def _page_module_source() -> str:
    """The page's first Python block: the whole method module."""
    with open(PAGE) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
    return blocks[0]


def _load(source: str) -> types.ModuleType:
    module = types.ModuleType("pull")
    exec(compile(source, PAGE, "exec"), module.__dict__)  # noqa: S102 - the page's own example
    return module


@pytest.fixture
def pull(monkeypatch):
    """The page's module, registered as ``pull`` for this test only (the page's registry line)."""
    module = _load(_page_module_source())
    monkeypatch.setitem(registry.METHODS, "pull", module.make_pull)
    return module


def test_the_term_against_numpy(pull):
    rng = np.random.default_rng(0)
    new, old = rng.standard_normal((2, 16, 8)).astype(np.float32)
    cos = np.sum(new * old, -1) / (np.linalg.norm(new, axis=-1) * np.linalg.norm(old, axis=-1))
    assert float(pull.pull_loss(new, old)) == pytest.approx(float(np.mean(1 - cos)), rel=1e-5)
    assert float(pull.pull_loss(new, new)) == pytest.approx(0.0, abs=1e-6)


def test_registered_it_gets_its_default_weight_and_its_declarations(pull, tmp_path):
    config = tiny_config(str(tmp_path), tmp_path, method="pull")
    assert config.loss_weights.L_pull == 1.0  # the declared default, with no edit of the base config
    assert config.loss_weights.L_m == 10.0 and config.loss_weights.L_reg == 100.0  # the others' unchanged
    method = registry.get_method(config)
    assert method.population and method.shares_first_session and method.uses_memory
    assert "pull" in registry.population_methods(config)


def test_a_tiny_run_trains_it_with_the_users_weight(fashion_idx, pull, tmp_path):
    manual = fashion_idx(60, 6)
    config = tiny_config(manual, tmp_path, method="pull", sessions=2)
    config.train.epochs = 1
    config.data.samples_per_new_class = 30
    # --config.loss_weights.L_pull=1000: large, so that the weighted term stands out of L_c in the logged
    # loss (after one epoch the new model is still close to the old one: L_pull is ~1e-3)
    config.loss_weights.L_pull = 1000.0
    workdir = str(tmp_path / "run")
    results = runner.run(config, workdir)
    assert len(results["per_session"]) == 2
    with open(paths.metrics_file(workdir)) as f:
        records = [json.loads(line) for line in f]
    pulled = [r for r in records if "L_pull" in r]
    assert pulled, "session 2 logs the new term"
    for r in pulled:  # the logged loss is L_c + 1000 L_pull (epoch means of a linear sum)
        assert r["L_pull"] > 0
        assert r["loss"] - r["L_c"] == pytest.approx(1000.0 * r["L_pull"], rel=1e-2)


def test_a_term_without_a_weight_is_refused_when_defined(pull, tmp_path):
    broken = _load(_page_module_source().replace('loss_terms={"L_pull": 1.0}', 'loss_terms={"L_pull": None}'))
    with pytest.raises(ConfigError, match="loss term 'L_pull' has no default weight"):
        broken.make_pull(tiny_config(str(tmp_path), tmp_path))
    no_terms = _load(_page_module_source().replace('loss_terms={"L_pull": 1.0}', "loss_terms={}"))
    with pytest.raises(ConfigError, match="declares none"):
        no_terms.make_pull(tiny_config(str(tmp_path), tmp_path))


def test_the_cli_says_it_in_one_error_line_before_any_run(tmp_path):
    """``main`` with the weightless method registered: one ``error:`` line, exit 2, no run directory."""
    source = _page_module_source().replace('loss_terms={"L_pull": 1.0}', 'loss_terms={"L_pull": None}')
    (tmp_path / "pull_module.py").write_text(source)
    workdir = tmp_path / "run"
    script = (
        "import runpy, sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "import pull_module\n"
        "from cvs_jax.methods import registry\n"
        "registry.METHODS['pull'] = pull_module.make_pull\n"
        f"sys.argv = ['main', '--config', 'configs/fashion_mnist_general.py', '--workdir', {str(workdir)!r},"
        " '--config.method=pull']\n"
        "runpy.run_module('cvs_jax.main', run_name='__main__')\n"
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: method 'pull': loss term 'L_pull'"), done.stderr
    assert not workdir.exists()


def test_one_term_gets_one_default(monkeypatch, tmp_path):
    """The config holds one weight per term: a second method giving L_m another default is refused."""
    from cvs_jax.methods.base import Method

    def make_other(config):
        return Method(name="other", extra_terms=lambda x: {}, loss_terms={"L_m": 5.0})

    monkeypatch.setitem(registry.METHODS, "other", make_other)
    with pytest.raises(ConfigError, match="loss term 'L_m' has default weight 10.0 in one method and 5.0"):
        tiny_config(str(tmp_path), tmp_path)


def test_a_factory_reading_a_missing_section_is_refused_in_one_line(monkeypatch):
    """A ``make_<name>`` that reads a section the defaults do not declare stops config building with one
    line naming the method and the field (not a bare AttributeError from every command)."""
    from cvs_jax.config import base
    from cvs_jax.methods.base import Method

    def make_needy(config):
        return Method(name="needy", description=f"pulls with weight {config.needy.weight}")

    monkeypatch.setitem(registry.METHODS, "needy", make_needy)
    with pytest.raises(ConfigError, match=r"^method 'needy': make_needy reads config field 'needy', which "):
        base.get_config()


def test_building_configs_builds_each_method_once(monkeypatch):
    """What a method declares is read when it is registered: a second config build runs no factory."""
    from cvs_jax.config import base
    from cvs_jax.methods.base import Method

    calls = []

    def make_counted(config):
        calls.append(1)
        return Method(name="counted")

    monkeypatch.setitem(registry.METHODS, "counted", make_counted)
    base.get_config()
    base.get_config()
    assert len(calls) == 1


def test_session_two_groups_follow_the_registered_methods(monkeypatch):
    """``compare`` shares session 1 for entries overriding only groups read from session 2 on: the
    engine's, each method's own sections and ``memory`` where a method keeps one.  A new method's own
    section joins them without an edit of the engine."""
    from cvs_jax.config import fashion_mnist_general
    from cvs_jax.engine import comparison
    from cvs_jax.methods.base import Method

    c = fashion_mnist_general.get_config()
    assert set(comparison.session_two_groups(c)) == {"cvs", "rainbow", "memory", "loss_weights", "retrieval"}
    monkeypatch.setitem(registry.METHODS, "pull2", lambda config: Method(name="pull2", own_sections=("pull2",)))
    assert "pull2" in comparison.session_two_groups(c)
