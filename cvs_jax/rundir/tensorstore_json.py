"""A workaround for a reference leak in tensorstore's Python bindings, which orbax reads every array through.

``to_json()`` of a tensorstore object builds its dicts with ``PyDict_SetItem(d, key.release(),
value.release())`` (``JsonToPyObject``, ``python/tensorstore/json_type_caster.cc``, 0.1.72 to 0.1.86 at
least); ``PyDict_SetItem`` does not steal references, so each key and each value of every dict of the
answer keeps one reference that nothing owns, and none of them is ever freed (100,000 calls of a zarr
spec's ``to_json()`` kept 700,000 objects, 296 MiB). orbax calls ``ts.Spec.to_json()`` (an array's
metadata) and ``ts.KvStore.Spec.to_json()`` (its read spec) for every array it reads, so each model a
server switched to kept what reading it had converted: 1.3 MiB and ~2,150 objects per switch on a
two-session tiny photo run (``benchmarks/switch_memory.py``), more with every session's gallery part.

``install()`` wraps those two methods to give back that one reference per key and value, and only where
a probe shows exactly one extra reference (a tensorstore that fixed it, or changed otherwise, is left
alone).  ``Py_DecRef`` comes through ``ctypes.pythonapi``, which holds the GIL, and each object is still
held by its dict when its extra reference is dropped."""

from __future__ import annotations

import ctypes
import sys
from typing import Any, Callable

import tensorstore as ts

_decref = ctypes.pythonapi.Py_DecRef
_decref.argtypes = [ctypes.py_object]
_decref.restype = None

_ORIGINALS: dict[type, tuple[Callable, Any]] = {}  # class -> (its to_json, its class attribute) while wrapped


def _probes() -> dict[type, tuple[Callable[[], Any], str]]:
    """Per class, an object of it and the key path in its ``to_json()`` answer to a dict holding a fresh
    value (never shared or cached) under ``"path"``."""
    return {
        ts.Spec: (lambda: ts.Spec({"driver": "zarr", "kvstore": {"driver": "memory", "path": "probe/"}}), "kvstore"),
        ts.KvStore.Spec: (lambda: ts.KvStore.Spec({"driver": "memory", "path": "probe/"}), ""),
    }


def extra_references(cls: type) -> int:
    """References that nothing owns on a value of a dict that tensorstore's own ``to_json()`` of ``cls``
    returned: 1 with the leak, 0 without (the dict's reference and ``getrefcount``'s argument not counted)."""
    make, key = _probes()[cls]
    answer = _ORIGINALS[cls][0](make()) if cls in _ORIGINALS else make().to_json()
    held = answer[key] if key else answer
    return sys.getrefcount(held["path"]) - 2


def _release(value: Any) -> None:
    """Drops the one reference each dict key and value of a ``to_json()`` answer kept, depth first."""
    if isinstance(value, dict):
        for k, v in value.items():
            _release(v)
            _decref(k)
            _decref(v)
    elif isinstance(value, list):
        for v in value:
            _release(v)


def _wrapped(original: Callable) -> Callable:
    def to_json(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        _release(out)
        return out

    to_json.__doc__ = original.__doc__
    return to_json


def install() -> list[str]:
    """Wraps each leaking ``to_json`` (once); returns the names of the classes wrapped now or before."""
    for cls in _probes():
        if cls not in _ORIGINALS and extra_references(cls) == 1:
            _ORIGINALS[cls] = (cls.to_json, vars(cls)["to_json"])  # the function, and the method it is bound as
            cls.to_json = _wrapped(cls.to_json)
    return sorted(cls.__qualname__ for cls in _ORIGINALS)


def uninstall() -> None:
    """Puts tensorstore's own methods back (``benchmarks/switch_memory.py`` measures the leak with them)."""
    for cls, (_, attribute) in list(_ORIGINALS.items()):
        cls.to_json = attribute
        del _ORIGINALS[cls]
