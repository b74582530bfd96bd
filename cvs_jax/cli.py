"""What the command-line entry points share: one convention, the ``--config`` help, logging, the one
error boundary.

Every ``python -m cvs_jax.<command>`` module has the same three pieces:

* its docstring is its ``--help``: what the command is for, the fields a user changes, an example;
* ``define_flags(flag_values=flags.FLAGS)`` defines its absl flags (when it runs, so that tests can
  import every entry point together, and on a ``FlagValues`` of their own);
* ``main(argv, flag_values=flags.FLAGS) -> int``, decorated with ``@cli.command``, makes one library
  call and returns the exit status; ``if __name__ == "__main__": cli.run(main, define_flags)``.

A problem the user must fix (``errors.UserError``) is one ``error: <message>`` line on stderr and
exit status 2 (``command``); so are a write the file system refuses (a read-only or full disk:
``errors.not_writable``) and absl's own flag errors (an unknown flag, a missing required flag, a bad
value: ``run``).  Every other exception keeps its traceback.

A closed stdout (``... | head`` has read its lines) stops the printing, not the work (``_Printout``): the
command finishes what it does (a training run trains on and writes its results), prints nothing more and
exits with status 141, as a tool ended by SIGPIPE does.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import logging as std_logging
import os
import sys
from typing import Callable

from absl import app, flags, logging

from cvs_jax.errors import UserError, not_writable


class _HelpFlag(app.HelpFlag):
    """``--help`` / ``-?``: the command's usage and flags, exit status 0 (absl's own exits with 1)."""

    def __init__(self):
        super().__init__()
        self.allow_override = True  # replaces absl's flag of the same name

    def parse(self, arg):
        if self._parse(arg):
            app.usage(shorthelp=True, writeto_stdout=True)
            print("\nTry --helpfull to get a list of all flags.")
            sys.exit(0)


class _HelpshortFlag(_HelpFlag):
    NAME = "helpshort"
    SHORT_NAME = None


class _HelpfullFlag(app.HelpfullFlag):
    """``--helpfull``: every flag, exit status 0."""

    def __init__(self):
        super().__init__()
        self.allow_override = True

    def parse(self, arg):
        if self._parse(arg):
            app.usage(writeto_stdout=True)
            sys.exit(0)


def enable_compile_cache() -> None:
    """JAX's persistent compilation cache, on for every command: nothing is compiled twice across
    commands (an ``update`` compiles what ``main`` compiled).  The folder: ``$CVS_JAX_COMPILE_CACHE``
    (``off`` turns the cache off), else ``$JAX_COMPILATION_CACHE_DIR`` (read by JAX itself), else
    ``$XDG_CACHE_HOME/cvs_jax/xla`` (``~/.cache/cvs_jax/xla``).

    Programs that compile in under a second are cached too (JAX's default leaves them out): ``serve``
    compiles about 40 small ones at start, one per batch bucket, and its second start on the same run
    took 7.7 s instead of 14.2 s with them cached (``benchmarks/serve.py --quick``, 2-core host under
    load).  ``$JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` still sets the threshold when given."""
    setting = os.environ.get("CVS_JAX_COMPILE_CACHE")
    if setting is not None and setting.strip().lower() in ("", "0", "off", "false", "none"):
        return
    import jax  # pylint: disable=g-import-not-at-top

    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    if setting is None and os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.expanduser(setting) if setting else os.path.join(cache_home, "cvs_jax", "xla")
    jax.config.update("jax_compilation_cache_dir", folder)


INTERRUPTED_STATUS = 130  # a shell's status for a process ended by SIGINT
READER_GONE_STATUS = 141  # a shell's status for a process ended by SIGPIPE (128 + 13): its reader went away


class _Printout:
    """``sys.stdout`` / ``sys.stderr`` while a command runs.  A write to a pipe whose reader has gone (``| head``
    done, a ``tee`` killed) points the stream at /dev/null and is dropped, where Python raised BrokenPipeError
    from whichever ``print`` came next: in a training run that was before ``results.json`` was written, and the
    run stopped.  SIGPIPE itself stays ignored (Python's default), so a server on a closed socket lives on."""

    def __init__(self, stream):
        self._stream = stream
        self.reader_gone = False

    def _gone(self) -> None:
        """From now on the stream writes to /dev/null, so that no later flush (the interpreter's last one
        included) meets the closed pipe again."""
        self.reader_gone = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
            self._stream.flush()  # what it still holds goes to /dev/null
        except (OSError, ValueError, AttributeError):  # no file descriptor (a test's stream): dropped as it is
            pass

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._gone()
        return len(text)

    def flush(self) -> None:
        if not self.reader_gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._gone()

    def __getattr__(self, name: str):  # fileno, isatty, encoding, buffer...: the stream's own
        return getattr(self._stream, name)


@contextlib.contextmanager
def _printing():
    """``sys.stdout`` and ``sys.stderr`` as ``_Printout``s for the block (left as they are when they already
    are: ``run`` installs them for the whole process); yields them."""
    outs = [getattr(sys, name) for name in ("stdout", "stderr")]
    mine = [not isinstance(out, _Printout) for out in outs]
    wrapped = [_Printout(out) if new else out for out, new in zip(outs, mine)]
    sys.stdout, sys.stderr = wrapped
    try:
        yield wrapped
    finally:
        for name, out, new in zip(("stdout", "stderr"), outs, mine):
            if new:
                setattr(sys, name, out)


INTERRUPTED = "interrupted (Ctrl-C): what the last checkpoint holds is kept; rerun the same command to resume from it."


def command(main: Callable[[list[str], flags.FlagValues], int]) -> Callable[..., int]:
    """The one error boundary of an entry point's ``main``: a ``UserError``, or a write the file system refused
    (``errors.not_writable``: read-only, permission, no space), becomes one ``error:`` line and exit status 2
    (also when a test calls ``main`` in-process); Ctrl-C (SIGINT) one ``interrupted`` line and status 130, as a
    shell reports it (the ``finally`` blocks have closed the run by then); a reader of stdout that went away
    (``| head``) status 141 once ``main`` has finished (``_Printout``); anything else is a bug and keeps its
    traceback."""

    @functools.wraps(main)
    def wrapped(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> int:
        with _printing() as outs:
            status = _guarded(main, argv, flag_values)
            for out in outs:  # what is still buffered: a reader that left meets it here, not at the exit
                out.flush()
        return READER_GONE_STATUS if status == 0 and any(out.reader_gone for out in outs) else status

    return wrapped


def _guarded(main: Callable[[list[str], flags.FlagValues], int], argv: list[str], flag_values: flags.FlagValues) -> int:
    """``command``'s boundary itself: ``main``'s status, or that of the problem it stopped on."""
    try:
        return main(argv, flag_values)
    except UserError as e:
        return report(e)
    except OSError as e:  # the file system refused a write (read-only, no space): the user's to fix
        refusal = not_writable(e)
        if refusal is None:
            raise
        return report(refusal)
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return INTERRUPTED_STATUS


def run(main: Callable[[list[str]], int], define_flags: Callable[[], None]) -> None:
    """Defines the command's flags and runs ``main`` under absl (its return value is the exit status):
    ``--help`` exits with status 0, flag errors are one ``error:`` line with exit status 2, and the
    persistent compilation cache is on (``enable_compile_cache``); a closed stdout is ``_Printout``'s from the
    start (``--help | head`` too)."""
    sys.stdout, sys.stderr = _Printout(sys.stdout), _Printout(sys.stderr)
    enable_compile_cache()
    define_flags()
    app.define_help_flags()
    for flag in (_HelpFlag(), _HelpshortFlag(), _HelpfullFlag()):
        flags.DEFINE_flag(flag)
    app.run(_ending_at_once_when_interrupted(_with_absl_handler_only(main)), flags_parser=_parse_flags)


def _with_absl_handler_only(main: Callable[[list[str]], int]) -> Callable[[list[str]], int]:
    """``main`` with absl's log handler alone on the root logger. absl's ``log()`` before ``app.run`` calls
    ``logging.basicConfig()`` (orbax logs through absl while it is imported) and ``app.run`` then adds absl's
    handler beside that one: every warning was printed twice, once as ``WARNING:name:msg`` and once in absl's
    format."""

    @functools.wraps(main)
    def wrapped(argv: list[str]) -> int:
        if logging.get_absl_handler() in std_logging.root.handlers:
            for handler in list(std_logging.root.handlers):
                if type(handler) is std_logging.StreamHandler:  # basicConfig's (absl's is its own class)
                    std_logging.root.removeHandler(handler)
        return main(argv)

    return wrapped


def _ending_at_once_when_interrupted(main: Callable[[list[str]], int]) -> Callable[[list[str]], int]:
    """After Ctrl-C (``command``'s status 130, the run's ``finally`` blocks done) the process ends at once,
    as ``kill -9`` would end it there (which a rerun resumes from): the interpreter's exit would otherwise
    wait for every background thread, and orbax's checkpoint threads, interrupted mid-save, waited for a
    signal for their 300 s timeout."""

    @functools.wraps(main)
    def wrapped(argv: list[str]) -> int:
        status = main(argv)
        if status == INTERRUPTED_STATUS:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        return status

    return wrapped


def _parse_flags(argv: list[str], flag_values: flags.FlagValues | None = None) -> list[str]:
    """absl's flag parsing, except that a ``UserError`` raised while loading the config (e.g. an unknown
    ``:variant``), absl's flag errors and an unknown ``--config.<field>`` are reported like any other
    problem to fix: one ``error:`` line, exit status 2."""
    fv = flags.FLAGS if flag_values is None else flag_values
    try:
        args = fv(argv)
        _check_config_file(fv)
        return args
    except UserError as e:
        sys.exit(report(e))
    except flags.Error as e:
        cause = e.__cause__ or e.__context__
        while cause is not None and not isinstance(cause, UserError):
            cause = cause.__cause__ or cause.__context__
        sys.exit(report(cause if cause is not None else flag_error(e, fv)))
    except (AttributeError, KeyError) as e:  # ml_collections: a --config.<field> that the config lacks
        overrides = [a.split("=", 1)[0] for a in argv[1:] if a.startswith("--config.")]
        if not overrides:
            raise
        text = str(e.args[0] if e.args else e).replace("\\n", " ").replace("\\", "").replace("'", "")
        text = " ".join(text.split())
        sys.exit(report(UserError(f"unknown config field among {', '.join(overrides)}: {text} (see --helpfull)")))


def _check_config_file(fv: flags.FlagValues) -> None:
    """ml_collections loads ``--config PATH`` during the parse but keeps a failure for the config's first use
    (an object whose every attribute raises): a path that cannot be read (a relative one from another folder)
    passed the parse and was an ``OSError`` traceback once the command ran."""
    if "config" not in fv:
        return
    error = getattr(fv["config"].value, "_error", None)  # ml_collections' _ErrorConfig holds the failure
    if isinstance(error, OSError):
        path = str(getattr(fv["config"], "config_filename", "the config"))
        file = path.split(":", 1)[0]  # without its :variants
        why = "no such file" if not os.path.exists(file) else "it cannot be read as a config file"
        raise UserError(
            f"--config {path}: {why} (looked from {os.getcwd()}); give the path of a configs/<name>.py file "
            "from this folder, or an absolute one."
        )


def flag_error(error: Exception, flag_values: flags.FlagValues | None = None) -> UserError:
    """absl's flag errors (unknown flag, missing required flag, bad value) as one line to fix.  A
    ``--config.<field>`` unknown to a command that takes only some fields (``update``: the rest is the run's)
    names those it takes: absl's own "Did you mean" named one of them as if it were the field meant."""
    text = " ".join(str(error).split())
    name = getattr(error, "flagname", None)
    if isinstance(error, flags.UnrecognizedFlagError) and name and name.startswith("config.") and flag_values:
        taken = sorted(n for n in flag_values if n.startswith("config."))
        if taken and "config" not in flag_values:
            close = difflib.get_close_matches(name, taken, n=1, cutoff=0.85)  # a typo of one it takes
            return UserError(
                f"--{name}: {f'did you mean --{close[0]}? ' if close else ''}this command takes only "
                f"{', '.join('--' + n for n in taken)} of the config (the rest is the run's, fixed when it "
                f"started) (see --help)"
            )
    return UserError(f"{text} (see --help)")


def config_help() -> str:
    """Help text of ``--config``: the variants a config accepts and the method names."""
    from cvs_jax.config import variants  # pylint: disable=g-import-not-at-top
    from cvs_jax.methods.registry import METHODS  # pylint: disable=g-import-not-at-top

    text = "Path to a configs/<name>.py file, optionally with variants: configs/<name>.py:<variant>[,<variant>...]"
    text += f" (variants: {variants.listed()}; the files are cvs_jax/config/<name>.py in an installed package)"
    return text + f". Override any field with --config.<key>=<value>; --config.method is one of {', '.join(METHODS)}."


def quiet_logging() -> None:
    """The one logging path: every module logs through Python's ``logging`` (``logging.getLogger(__name__)``;
    absl's, which orbax uses, writes there too) and the commands print what a person reads.  WARNING and
    above (orbax logs every file it writes at INFO), unless ``--verbosity``/``-v`` was passed: then the
    package's INFO lines as well."""
    verbose = "verbosity" in flags.FLAGS and flags.FLAGS["verbosity"].present
    std_logging.getLogger("cvs_jax").setLevel(std_logging.INFO if verbose else std_logging.WARNING)
    if not verbose:
        logging.set_verbosity(logging.WARNING)


def report(error: UserError) -> int:
    """Prints ``error: <message>`` to stderr; returns the exit status of a user error (2)."""
    print(f"error: {error}", file=sys.stderr)
    return 2
