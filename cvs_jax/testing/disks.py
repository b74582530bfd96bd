"""File systems that refuse a run's writes, made for real (no fault injection): a read-only bind mount of a
run, a small tmpfs that fills up, and a root that obeys permission bits (a run owned by another user).

Each needs root and a sandbox that allows it (CI runs as root on a machine like this project's; a container
may forbid mounts): ``unavailable()`` says why not in one line, for ``pytest.skip``."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from typing import Iterator

# ``setpriv`` keeps uid 0 but drops the capabilities that let root write anywhere: permission bits then hold,
# as for another user, while the interpreter under /root stays readable (it is root's own)
AS_ANOTHER_USER = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]


def _mount(*args: str) -> str | None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    return None if done.returncode == 0 else (done.stderr.strip() or f"mount exited with {done.returncode}")


def unavailable(*, setpriv: bool = False) -> str | None:
    """Why these file systems cannot be made here (not root, no mount, no setpriv), or None."""
    if os.geteuid() != 0:
        return "needs root (mounts a file system)"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "no mount command"
    if setpriv and shutil.which("setpriv") is None:
        return "no setpriv command"
    return None


def _umount(path: str) -> None:
    """Unmounts ``path``; a mount still in use (a file a failed test left open) is detached lazily, so that no
    test leaves a mount behind."""
    if subprocess.run(["umount", path], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", path], check=True, capture_output=True)


@contextlib.contextmanager
def read_only_view(folder: str, at: str) -> Iterator[str]:
    """``folder`` seen read-only at ``at`` (a bind mount, then remounted read-only: every write there is
    EROFS, as on a read-only disk); raises ``OSError`` when the sandbox forbids it."""
    os.makedirs(at, exist_ok=True)
    problem = _mount("--bind", folder, at)
    if problem is not None:
        raise OSError(f"cannot bind-mount {folder}: {problem}")
    try:
        problem = _mount("-o", "remount,ro,bind", at)
        if problem is not None:
            raise OSError(f"cannot remount {at} read-only: {problem}")
        yield at
    finally:
        _umount(at)


@contextlib.contextmanager
def small_disk(at: str, size: str) -> Iterator[str]:
    """A tmpfs of ``size`` (``"2m"``) at ``at``: a disk that fills up (ENOSPC); removed with what it holds."""
    os.makedirs(at, exist_ok=True)
    problem = _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", at)
    if problem is not None:
        raise OSError(f"cannot mount a tmpfs at {at}: {problem}")
    try:
        yield at
    finally:
        _umount(at)


@contextlib.contextmanager
def or_skip(mount: contextlib.AbstractContextManager[str], what: str) -> Iterator[str]:
    """``mount`` (``read_only_view(...)``, ``small_disk(...)``) entered for a test, or the test skipped in one line:
    why these file systems cannot be made here (``unavailable``), or the sandbox's refusal of ``what``."""
    import pytest  # pylint: disable=g-import-not-at-top  # a test helper; the package does not need pytest

    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    with contextlib.ExitStack() as stack:
        try:
            at = stack.enter_context(mount)
        except OSError as e:
            pytest.skip(f"this sandbox forbids {what} ({e})")
        yield at


def fill(folder: str, leave: int = 0) -> str:
    """Fills the disk of ``folder`` up to ``leave`` bytes free with one file (returned: delete it to free the
    space); a disk with a few kB of slack reports a little more free than a file can take."""
    path = os.path.join(folder, "filler")
    free = shutil.disk_usage(folder).free - leave
    with open(path, "wb") as f:
        try:
            f.write(b"\0" * max(free, 0))
            f.flush()
            os.fsync(f.fileno())
        except OSError:  # ENOSPC: full
            pass
    return path
