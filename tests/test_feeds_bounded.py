"""Inputs are checked before they are loaded: an .npz member's header (dtype, shape, size) before its data, a
caller's array (even a zero-copy strided view) before the float32 copy, with a byte cap; duplicate members and
non-array members are errors."""
from __future__ import annotations

import io
import tracemalloc
import zipfile

import numpy as np
import pytest

from tvm_dpu.errors import InputError
from tvm_dpu.serving.feeds import check_array, input_shape_check, load_npz
from tvm_dpu.types import InputSpec

SPEC = [InputSpec("x", (1, 3, 32, 32), "float32")]


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a)
    return buf.getvalue()


def _peak_mib(fn) -> float:
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak / 2 ** 20


def test_a_tiny_file_claiming_1e13_elements_is_refused_from_its_header(tmp_path):
    raw = _npy(np.zeros(10, np.float32)).replace(b"'shape': (10,)", b"'shape': (10000000000000,)")
    with zipfile.ZipFile(tmp_path / "a.npz", "w") as z:
        z.writestr("x.npy", raw)
    assert (tmp_path / "a.npz").stat().st_size < 400
    with pytest.raises(InputError, match=r"claims shape \(10000000000000,\)"):
        load_npz(tmp_path / "a.npz")


def test_a_compressed_array_of_the_wrong_shape_is_refused_before_decompression(tmp_path):
    np.savez_compressed(tmp_path / "big.npz", x=np.zeros((1, 3, 2048, 2048), np.float32))  # 48 MiB of zeros
    assert (tmp_path / "big.npz").stat().st_size < 200_000
    err = []

    def load():
        try:
            load_npz(tmp_path / "big.npz", check=input_shape_check(SPEC))
        except InputError as e:
            err.append(str(e))

    peak = _peak_mib(load)
    assert err and "has shape (1, 3, 2048, 2048); expected (1, 3, 32, 32)" in err[0]
    assert peak < 8, f"{peak:.1f} MiB allocated before the shape was refused"


def test_the_byte_cap_counts_all_members(tmp_path, monkeypatch):
    np.savez(tmp_path / "two.npz", a=np.zeros(1000, np.float32), b=np.zeros(1000, np.float32))
    monkeypatch.setenv("TVM_DPU_MAX_INPUT_BYTES", "6000")
    with pytest.raises(InputError, match="need 8000 bytes or more, over the limit of 6000"):
        load_npz(tmp_path / "two.npz")
    monkeypatch.setenv("TVM_DPU_MAX_INPUT_BYTES", "lots")
    with pytest.raises(InputError, match="not a whole number"):
        load_npz(tmp_path / "two.npz")
    monkeypatch.delenv("TVM_DPU_MAX_INPUT_BYTES")
    assert sorted(load_npz(tmp_path / "two.npz")) == ["a", "b"]


def test_duplicate_and_non_array_members_are_errors(tmp_path):
    raw = _npy(np.ones((1, 3, 32, 32), np.float32))
    with pytest.warns(UserWarning), zipfile.ZipFile(tmp_path / "dup.npz", "w") as z:
        z.writestr("x.npy", raw)
        z.writestr("x.npy", _npy(np.zeros((1, 3, 32, 32), np.float32)))
    with pytest.raises(InputError, match="'x' appears more than once"):
        load_npz(tmp_path / "dup.npz")
    with zipfile.ZipFile(tmp_path / "other.npz", "w") as z:
        z.writestr("x.npy", raw)
        z.writestr("notes.txt", b"hello")
    with pytest.raises(InputError, match="'notes.txt' is not an array"):
        load_npz(tmp_path / "other.npz")


def test_calibration_stacks_pass_the_header_check(tmp_path):
    check = input_shape_check(SPEC, samples=True)
    check("x", (8, 3, 32, 32), np.dtype(np.float32))      # 8 samples of a batch-1 input
    check("x", (8, 1, 3, 32, 32), np.dtype(np.float32))   # 8 samples with the batch axis kept
    with pytest.raises(InputError, match=r"or \(N, \.\.\.\) samples"):
        check("x", (8, 3, 16, 16), np.dtype(np.float32))


def test_a_strided_view_is_checked_before_it_is_copied(monkeypatch):
    base = np.zeros(16, np.float32)
    huge = np.lib.stride_tricks.as_strided(base, shape=(1, 3, 65536, 65536), strides=(0, 0, 0, 0))  # 48 GiB view
    peak = _peak_mib(lambda: pytest.raises(InputError, check_array, "x", huge, (1, 3, 32, 32)))
    assert peak < 8
    with pytest.raises(InputError, match="has shape"):
        check_array("x", huge, (1, 3, 32, 32))
    with pytest.raises(InputError, match="over the limit"):
        check_array("x", huge)  # no expected shape: the byte cap still holds
    monkeypatch.setenv("TVM_DPU_MAX_INPUT_BYTES", "100")
    with pytest.raises(InputError, match="over the limit of 100"):
        check_array("x", np.zeros(26, np.float32))
