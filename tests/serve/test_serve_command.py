"""The command's refusals before anything loads: a non-loopback address needs a token."""

import pytest
from absl import flags

from cvs_jax.errors import UserError
from cvs_jax.serve import __main__ as command


def test_other_addresses_need_a_token(monkeypatch):
    monkeypatch.delenv(command.TOKEN_ENV, raising=False)
    assert command.check_token("127.0.0.1", None) is None  # loopback: /add is open to this machine
    with pytest.raises(UserError, match="--token T or CVS_JAX_TOKEN=T"):
        command.check_token("0.0.0.0", None)
    assert command.check_token("0.0.0.0", "t1") == "t1"
    monkeypatch.setenv(command.TOKEN_ENV, "t2")
    assert command.check_token("0.0.0.0", None) == "t2"


def test_the_command_stops_with_one_line_before_loading(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(command.TOKEN_ENV, raising=False)
    fv = flags.FlagValues()
    command.define_flags(fv)
    argv = fv(["serve", "--workdir", str(tmp_path / "none"), "--host", "0.0.0.0"])
    assert command.main(argv, fv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --host 0.0.0.0")
