"""A fixed-simplex method trained with another head says so in one ``note:`` line at the start of ``main``
and ``update`` (the photo config's ``linear_reset`` head would otherwise replace CL²R's, HOC's or CoReS's
simplex without a word).  Every method and head pair of the registry is checked, and ``runner.run`` is
checked to print the line (a note computed but never printed breaks the second test)."""

import pytest

from cvs_jax.config import base
from cvs_jax.engine import runner
from cvs_jax.methods import registry
from cvs_jax.models.heads import HEADS
from cvs_jax.testing.tiny_data import tiny_config


def _config(method, head):
    config = base.get_config()
    config.method, config.model.head = method, head
    return config


@pytest.mark.parametrize("method", sorted(registry.METHODS))
def test_the_note_names_exactly_the_simplex_methods_off_their_simplex(method):
    official = registry.get_method(_config(method, "official")).official_head
    for head in ("official", *HEADS):
        note = registry.head_note(_config(method, head))
        resolved = official if head == "official" else head
        if official == "simplex" and resolved != "simplex":
            assert note.startswith(f"note: {method} trains here with the {resolved} head"), note
            assert "--config.model.head=official" in note
        else:
            assert note is None, (method, head, note)


class _Stop(Exception):
    pass


@pytest.mark.parametrize(("method", "head", "noted"), [("cl2r", "cosine", True), ("cvs", "cosine", False)])
def test_a_run_prints_the_note_first(manual_dir, tmp_path, monkeypatch, capsys, method, head, noted):
    config = tiny_config(manual_dir, tmp_path, method=method, sessions=2)
    config.model.head = head

    def stop(*args, **kwargs):
        raise _Stop

    monkeypatch.setattr(runner, "build_context", stop)
    with pytest.raises(_Stop):
        runner.run(config, str(tmp_path / "run"))
    out = capsys.readouterr().out
    assert ("note: cl2r trains here with the cosine head" in out) is noted, out
