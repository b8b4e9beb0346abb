"""Arrays users hand in (model inputs, calibration data, .npz files), checked once, with one clear error each.

Accepted dtypes: float32 as is; float64 and float16 are cast to float32 (the DPU side quantizes float32 anyway,
and float64 is numpy's default); integer arrays (e.g. uint8 images) are cast to float32. Rejected: bool, complex,
object, strings and structured arrays. NaN or Inf anywhere is an error (the DPU would silently turn them into
finite numbers). .npz files are read without pickle; an object array or pickled payload is refused as such.
"""
from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from tvm_dpu.errors import InputError

_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"
_EMPTY_ZIP = b"PK\x05\x06"


def load_npz(path: str | Path, what: str = "input file") -> dict[str, np.ndarray]:
    """Arrays of an .npz file by name; InputError naming `what` and the file for anything else."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            head = f.read(8)
    except OSError as e:
        raise InputError(f"{what} {path}: cannot read: {e.strerror}") from None
    if not head:
        raise InputError(f"{what} {path}: the file is empty (expected an .npz archive from numpy.savez)")
    if head.startswith(_NPY_MAGIC):
        raise InputError(f"{what} {path}: a single-array .npy file, not an .npz archive: save it with "
                         "numpy.savez(path, name=array)")
    if not (head.startswith(_ZIP_MAGIC) or head.startswith(_EMPTY_ZIP)):
        raise InputError(f"{what} {path}: not an .npz archive (it starts with {head[:8]!r}; expected a zip "
                         "written by numpy.savez)")
    try:
        with np.load(path, allow_pickle=False) as z:
            out = {}
            for name in z.files:
                try:
                    out[name] = z[name]
                except ValueError as e:
                    if "pickle" in str(e).lower() or "object" in str(e).lower():
                        raise InputError(f"{what} {path}: array {name!r} holds Python objects (pickled data), which "
                                         "are not accepted: save plain numeric arrays") from None
                    raise InputError(f"{what} {path}: array {name!r} cannot be read: {e}") from None
    except InputError:
        raise
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise InputError(f"{what} {path}: not a readable .npz archive ({type(e).__name__}: {e})") from None
    if not out:
        raise InputError(f"{what} {path}: the archive holds no arrays")
    return out


def check_array(name: str, a: Any, shape: Sequence[int] | None = None, what: str = "input") -> np.ndarray:
    """`a` as a C-contiguous float32 array (see the module docstring for the dtype rules), checked for NaN/Inf
    and, when given, for `shape`."""
    arr = np.asarray(a)
    kind = arr.dtype.kind
    if kind not in "fiu" or arr.dtype.fields is not None:
        raise InputError(f"{what} {name!r} has dtype {arr.dtype}: give float32 (or float64/float16/integer "
                         "arrays, which are cast); bool, complex, object and string arrays are not accepted")
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if shape is not None and tuple(arr.shape) != tuple(shape):
        raise InputError(f"{what} {name!r} has shape {tuple(arr.shape)}, expected {tuple(shape)}")
    if kind == "f":
        bad = int(arr.size - np.count_nonzero(np.isfinite(arr)))
        if bad:
            raise InputError(f"{what} {name!r} has {bad} NaN/Inf value(s) of {arr.size}: the DPU computes in "
                             "fixed point and cannot represent them")
    return arr


def arrays_by_name(data: Any, names: Sequence[str], what: str = "input") -> list[Any]:
    """The arrays for `names` (in order) from a dict (extra or missing names are an InputError), a list in order,
    or a single array (one-input models)."""
    if isinstance(data, Mapping):
        missing = [n for n in names if n not in data]
        extra = sorted(str(k) for k in data if k not in names)
        if missing or extra:
            parts = ([f"missing {missing}"] if missing else []) + ([f"unexpected {extra}"] if extra else [])
            raise InputError(f"{what}: {' and '.join(parts)}; the model takes {list(names)}")
        return [data[n] for n in names]
    if isinstance(data, np.ndarray) or not isinstance(data, Sequence):
        data = [data]
    if len(data) != len(names):
        raise InputError(f"{what}: the model takes {len(names)} input(s) {list(names)}, got {len(data)}")
    return list(data)
