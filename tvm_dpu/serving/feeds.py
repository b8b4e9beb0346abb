"""Arrays users hand in (model inputs, calibration data, .npz files), checked once, with one clear error each.

Accepted dtypes: float32 as is; float64 and float16 are cast to float32 (the DPU side quantizes float32 anyway,
and float64 is numpy's default); integer arrays (e.g. uint8 images) are cast to float32. Rejected: bool, complex,
object, strings and structured arrays. NaN or Inf anywhere is an error (the DPU would silently turn them into
finite numbers). .npz files are read without pickle; an object array or pickled payload is refused as such.
"""
from __future__ import annotations

import math
import os
import zipfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tvm_dpu.errors import InputError
from tvm_dpu.security.safe_io import check_regular

_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"
_EMPTY_ZIP = b"PK\x05\x06"


#: Default cap on the bytes one .npz may decode to, and on one array a caller hands in: far above any input
#: or calibration set of the zoo's models, far below what would exhaust a board's memory.
#: TVM_DPU_MAX_INPUT_BYTES overrides it.
DEFAULT_MAX_INPUT_BYTES = 4 << 30


def max_input_bytes() -> int:
    raw = os.environ.get("TVM_DPU_MAX_INPUT_BYTES")
    if raw is None:
        return DEFAULT_MAX_INPUT_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise InputError(f"TVM_DPU_MAX_INPUT_BYTES={raw!r} is not a whole number of bytes") from None
    if value < 1:
        raise InputError(f"TVM_DPU_MAX_INPUT_BYTES={raw!r} must be at least 1")
    return value


#: check(member name, shape, dtype) -> None, raising InputError; called on each member's header before its data.
MemberCheck = Callable[[str, tuple[int, ...], np.dtype], None]


def npz_file(path: str | Path, what: str = "input file", accepts: str = "") -> Path:
    """`path` when it names an .npz archive (checked by its first bytes, nothing more is read); InputError naming
    `what`, the file and, with `accepts`, what the option takes."""
    path = Path(path)
    takes = f"; {accepts}" if accepts else ""
    if path.is_dir():
        raise InputError(f"{what} {path}: is a directory{takes or '; expected an .npz file'}")
    # before the open: a FIFO would block it, a device would never end
    try:
        check_regular(path, what, InputError)
    except InputError as e:
        raise InputError(f"{e}{takes}") from None
    try:
        with path.open("rb") as f:
            head = f.read(8)
    except OSError as e:
        raise InputError(f"{what} {path}: cannot read: {e.strerror}{takes}") from None
    if not head:
        raise InputError(f"{what} {path}: the file is empty (expected an .npz archive from numpy.savez){takes}")
    if head.startswith(_NPY_MAGIC):
        raise InputError(f"{what} {path}: a single-array .npy file, not an .npz archive: save it with "
                         f"numpy.savez(path, name=array){takes}")
    if not (head.startswith(_ZIP_MAGIC) or head.startswith(_EMPTY_ZIP)):
        raise InputError(f"{what} {path}: not an .npz archive (it starts with {head[:8]!r}; expected a zip "
                         f"written by numpy.savez){takes}")
    return path


def load_npz(path: str | Path, what: str = "input file", *, check: MemberCheck | None = None,
             max_bytes: int | None = None) -> dict[str, np.ndarray]:
    """Arrays of an .npz file by name; InputError naming `what` and the file for anything else.

    Every member's .npy header (dtype, shape) is read and checked before any data: its size must match what the
    zip directory says the member holds, the arrays together must stay within `max_bytes` (default
    `max_input_bytes()`), and `check` (e.g. the model's input shapes) must accept it. So a small file claiming a
    huge array, or a huge one of the wrong shape, is refused without allocating it."""
    path = npz_file(path, what)
    limit = max_input_bytes() if max_bytes is None else int(max_bytes)
    try:
        with zipfile.ZipFile(path) as zf:
            members = _checked_members(zf, path, what, limit, check)
            out = {}
            for name, info in members:
                with zf.open(info) as f:
                    out[name] = np.lib.format.read_array(f, allow_pickle=False)
    except InputError:
        raise
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as e:
        raise InputError(f"{what} {path}: not a readable .npz archive ({type(e).__name__}: {e})") from None
    if not out:
        raise InputError(f"{what} {path}: the archive holds no arrays")
    return out


def input_shape_check(inputs: Sequence[Any], samples: bool = False, what: str = "input") -> MemberCheck:
    """A `load_npz` check that an array meant for one of `inputs` (InputSpecs: .name, .shape) has its shape, or,
    with `samples`, is a stack of samples of it (N x shape, or samples along the batch axis, of any batch size:
    (N, ...) or (N, k, ...)).
    Arrays named after no input, in a model with several, are left to the caller's name check."""
    by_name = {s.name: s for s in inputs}

    def check(name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
        spec = by_name.get(name) or (inputs[0] if len(inputs) == 1 else None)
        if spec is None:
            return
        want = tuple(spec.shape)
        ok = shape == want or (samples and len(shape) == len(want) + 1 and shape[1:] == want) or \
            (samples and len(want) > 0 and len(shape) == len(want) and shape[1:] == want[1:] and shape[0] > 0) or \
            (samples and len(want) > 0 and len(shape) == len(want) + 1 and shape[2:] == want[1:])
        if not ok:
            more = " or (N, ...) samples of it" if samples else ""
            raise InputError(f"{what} {spec.name!r} has shape {shape}; expected {want}{more} (checked from the "
                             "file's header, before reading the data)")

    return check


def _checked_members(zf: zipfile.ZipFile, path: Path, what: str, limit: int,
                     check: MemberCheck | None) -> list[tuple[str, zipfile.ZipInfo]]:
    infos = zf.infolist()
    seen: set[str] = set()
    members = []
    total = 0
    for info in infos:
        if not info.filename.endswith(".npy"):
            raise InputError(f"{what} {path}: member {info.filename!r} is not an array (.npy); numpy.savez "
                             "writes only arrays")
        name = info.filename[:-4]
        if name in seen:
            raise InputError(f"{what} {path}: array {name!r} appears more than once in the archive (which one "
                             "would be used is ambiguous)")
        seen.add(name)
        with zf.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(f)
            elif version in ((2, 0), (3, 0)):
                shape, _, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise InputError(f"{what} {path}: array {name!r} has .npy format version {version}")
            header_bytes = f.tell()
        if dtype.hasobject:
            raise InputError(f"{what} {path}: array {name!r} holds Python objects (pickled data), which are not "
                             "accepted: save plain numeric arrays")
        nbytes = math.prod(int(d) for d in shape) * dtype.itemsize
        if info.file_size != header_bytes + nbytes:
            raise InputError(f"{what} {path}: array {name!r} claims shape {tuple(shape)} {dtype} ({nbytes} bytes) "
                             f"but its member holds {info.file_size - header_bytes} bytes of data")
        total += nbytes
        if total > limit:
            raise InputError(f"{what} {path}: its arrays need {total} bytes or more, over the limit of {limit} "
                             "(set TVM_DPU_MAX_INPUT_BYTES to raise it)")
        if check is not None:
            check(name, tuple(int(d) for d in shape), dtype)
        members.append((name, info))
    return members


def check_array(name: str, a: Any, shape: Sequence[int] | None = None, what: str = "input") -> np.ndarray:
    """`a` as a C-contiguous float32 array (see the module docstring for the dtype rules), checked for NaN/Inf
    and, when given, for `shape`."""
    arr = np.asarray(a)
    kind = arr.dtype.kind
    if kind not in "fiu" or arr.dtype.fields is not None:
        raise InputError(f"{what} {name!r} has dtype {arr.dtype}: give float32 (or float64/float16/integer "
                         "arrays, which are cast); bool, complex, object and string arrays are not accepted")
    # Checked on the (possibly strided, zero-copy) view before the float32 copy is made.
    if shape is not None and tuple(arr.shape) != tuple(shape):
        raise InputError(f"{what} {name!r} has shape {tuple(arr.shape)}, expected {tuple(shape)}")
    limit = max_input_bytes()
    if arr.size * 4 > limit:
        raise InputError(f"{what} {name!r} has {arr.size} elements ({arr.size * 4} bytes as float32), over the "
                         f"limit of {limit} (set TVM_DPU_MAX_INPUT_BYTES to raise it)")
    arr = np.ascontiguousarray(arr, dtype=np.float32)
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
