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


@pytest.mark.parametrize(
    "option, named",
    [
        (["--port", "99999"], "--port 99999 is not a TCP port"),  # was bind()'s OverflowError, a traceback
        (["--port", "-1"], "--port -1 is not a TCP port"),
        (["--poll_s", "0"], "--poll_s=0.0"),  # was a watcher spinning a core
        (["--max_upload_mb", "0"], "--max_upload_mb=0.0"),  # was every request refused as too large
        (["--read_timeout_s", "-1"], "--read_timeout_s=-1.0"),
        (["--max_wait_ms", "-5"], "--max_wait_ms=-5.0"),
        (["--host", "host.invalid"], "pass a --host this machine has"),  # was "pass another --port"
    ],
)
def test_a_bad_option_is_one_line_before_the_run_is_read(tmp_path, capsys, monkeypatch, option, named):
    monkeypatch.delenv(command.TOKEN_ENV, raising=False)
    fv = flags.FlagValues()
    command.define_flags(fv)
    token = ["--token", "t"] if "--host" in option else []
    argv = fv(["serve", "--workdir", str(tmp_path / "none"), "--port", "8765", *option, *token])
    assert command.main(argv, fv) == 2  # the workdir (no run) is never read: the option is refused first
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and named in err[0], err


def test_a_workdir_that_holds_no_run_is_one_line(tmp_path, capsys, monkeypatch):
    """The start's line about compiling comes once the run is read: a wrong --workdir printed it, then the error."""
    monkeypatch.delenv(command.TOKEN_ENV, raising=False)
    fv = flags.FlagValues()
    command.define_flags(fv)
    (tmp_path / "empty").mkdir()
    argv = fv(["serve", "--workdir", str(tmp_path / "empty"), "--port", "8766"])
    assert command.main(argv, fv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "holds no cvs_jax run" in err[0], err
