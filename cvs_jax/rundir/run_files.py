"""A run's own JSON files as its commands read them: ``config.json``, ``results.json``, ``protocol.json`` and a
from-added folder's ``rows.json`` (``read_json``), and the log ``metrics.jsonl`` (``read_metrics``).

A file cut short (a full disk, an interrupted copy), emptied, overwritten with other bytes, holding another
kind of value or lacking a field its readers need is one ``error:`` line naming the file, what is wrong with
it and what to do (``DamagedFileError``, a ``UserError``), never a traceback; what to do depends on the file
(``_FIXES``).  ``metrics.jsonl`` is a log a crash may leave with a last line cut short: its readers skip the
lines that do not decode.  ``write_json`` replaces a file whole, so that a kill while writing leaves the
previous file, not a truncated one (``write_whole``, which ``write_json`` uses, for any file).
"""

from __future__ import annotations

import json
import os
from typing import IO, Any, Callable, Iterable

from cvs_jax.errors import UserError, not_writable
from cvs_jax.rundir import paths

_BACKUP = "restore it from a copy of the run (a backup, or cp -r of the workdir made before the damage)"
_FIXES = {
    paths.CONFIG: (
        f"{_BACKUP}, or from the config.json in a python -m cvs_jax.export of this run (the same content for a "
        "run that never moved)"
    ),
    paths.RESULTS: (
        "move it aside (mv results.json results.json.damaged) and rerun the run's last python -m cvs_jax.main "
        "or python -m cvs_jax.update command: a finished session trains nothing again, and the file is written "
        "anew from the session checkpoints"
    ),
    paths.PROTOCOL: f"{_BACKUP}; it is the session plan and class names the run was trained with",
    os.path.basename(paths.ADDITIONS_CHAIN): (
        "delete it: each segment of checkpoints/additions records its rows, and the chain is rebuilt from them "
        "at the next read (a segment folder deleted as well, such as the newest, can then no longer be told missing)"
    ),
    paths.FROM_ADDED_RECORD: (
        f"{_BACKUP}; it records which added rows that session learnt (update --from_added must not learn them twice)"
    ),
}
PROTOCOL_FIELDS = ("class_names", "sessions", "image_shape")  # what protocol.json's readers use


class DamagedFileError(UserError):
    """A file of a run is missing, cut short, not JSON, or not what its readers expect."""


def fix_for(path: str) -> str:
    return _FIXES.get(os.path.basename(path), _BACKUP)


def damaged(path: str, problem: str) -> DamagedFileError:
    """The one message for a damaged run file: the file, what is wrong, what to do."""
    return DamagedFileError(f"{path} {problem}; {fix_for(path)}.")


def _text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise damaged(path, "is missing") from None
    except IsADirectoryError:
        raise damaged(path, "is a folder, not a file") from None
    except OSError as e:
        refusal = not_writable(e, path)  # permission denied: the user's to fix
        if refusal is not None:
            raise refusal from e
        raise  # an I/O error: the environment's, keeps its traceback
    if not data.strip():
        raise damaged(path, "is empty")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise damaged(path, f"is not text (bytes that are not UTF-8 at byte {e.start}: overwritten?)") from None


def _decoded(path: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg.startswith("Unterminated string") or e.pos >= len(text.rstrip()):
            raise damaged(path, f"is cut short ({len(text.encode())} bytes, its JSON unfinished)") from None
        raise damaged(path, f"is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None


def read_json(path: str, *, fields: Iterable[str] = (), missing: Any = ...) -> Any:
    """The JSON object in ``path`` (a dict with every key of ``fields``), or ``DamagedFileError``.
    ``missing``: what to return when the file does not exist (default: a missing file is damage too)."""
    if missing is not ... and not os.path.lexists(path):
        return missing
    value = _decoded(path, _text(path))
    if not isinstance(value, dict):
        raise damaged(path, f"holds a JSON {type(value).__name__} where a JSON object is expected")
    lacking = [k for k in fields if k not in value]
    if lacking:
        raise damaged(path, f"lacks the field(s) {', '.join(lacking)}")
    return value


def read_metrics(path: str) -> list[dict]:
    """The records of a ``metrics.jsonl`` (none when it is missing), skipping every line that does not decode
    to a JSON object: one cut short by a crash, or bytes written over it."""
    if not os.path.exists(path):
        return []
    out = []
    with open(path, "rb") as f:
        for line in f:
            try:
                record = json.loads(line.decode("utf-8"))
            except ValueError:  # UnicodeDecodeError and JSONDecodeError: a damaged or half-written line
                continue
            if isinstance(record, dict):
                out.append(record)
    return out


def write_whole(path: str, fill: Callable[[IO], None], binary: bool = False) -> None:
    """Writes ``path`` whole: ``fill`` writes a temporary file, then a rename puts it in place, so a kill while
    writing leaves the previous file; a write or rename that fails removes the temporary file."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb" if binary else "w") as f:
            fill(f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.isfile(tmp):
            os.remove(tmp)
        raise


def write_json(path: str, value: Any, indent: int | None = None) -> None:
    """Writes ``path`` whole (``write_whole``): a kill while writing leaves the previous file."""
    write_whole(path, lambda f: json.dump(value, f, indent=indent))
