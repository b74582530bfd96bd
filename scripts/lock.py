"""Writes requirements.lock: every package cvs_jax[dev] needs, at the version installed in this
environment (the one whose test suite passed), so that CI and ``scripts/setup.sh`` install what was
tested instead of whatever is newest within pyproject.toml's ranges.

Refresh (after a dependency change, or to move to newer versions), from the repository root:

    python3 -m venv /tmp/fresh && /tmp/fresh/bin/pip install -e '.[dev]'   # newest within the ranges
    /tmp/fresh/bin/python -m pytest -q -n 2 --dist loadfile tests           # the suite passes on them
    /tmp/fresh/bin/python scripts/lock.py > requirements.lock              # then commit the lock

Only the dependency closure of ``cvs_jax[dev]`` is written (walked through the installed packages'
metadata, markers evaluated here), so packages installed by hand beside it are not locked.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def closure(root: str, extras: set[str]) -> dict[str, str]:
    """Canonical name -> installed version of every distribution ``root[extras]`` needs."""
    found: dict[str, str] = {}
    todo = [(root, frozenset(extras))]
    seen: set[tuple[str, frozenset]] = set()
    while todo:
        name, wanted = todo.pop()
        if (name, wanted) in seen:
            continue
        seen.add((name, wanted))
        dist = metadata.distribution(name)
        key = canonicalize_name(dist.metadata["Name"])
        if key != canonicalize_name(root):
            found[key] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None:
                env = default_environment()
                if not any(req.marker.evaluate({**env, "extra": e}) for e in (wanted or {""})):
                    continue
            todo.append((req.name, frozenset(req.extras)))
    return found


def main() -> None:
    pinned = closure("cvs_jax", {"dev"})
    print("# cvs_jax[dev] as tested (CPU jax): written by scripts/lock.py; refresh as its docstring says.")
    print(f"# python {sys.version_info.major}.{sys.version_info.minor}")
    for name in sorted(pinned):
        print(f"{name}=={pinned[name]}")


if __name__ == "__main__":
    main()
