"""Artifacts that lie: header values edited with checksums recomputed (a buggy writer or a tampered file), DPU
programs edited inside the library, and Ed25519 signatures. Every case is the project's ArtifactError or a run
that gives the original output; never another exception type, a crash or a silently different answer."""
from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.security.container import FIXED_SIZE, pack, unpack
from tvm_dpu.errors import ArtifactError, DPUError
from tvm_dpu.security.program_blob import MAGIC as BLOB_MAGIC
from tvm_dpu.security.program_blob import unpack_program
import functools

from tvm_dpu.runtime.artifact import FORMAT_VERSION, MAGIC, read_header
from tvm_dpu.runtime.artifact import load as _load

# These tests forge artifacts (edited, then re-packed with checksums recomputed) to reach the checks behind the
# trust policy, so they load with trust="unsigned"; the policy itself is tested in test_trust_policy.py.
load = functools.partial(_load, trust="unsigned")
from tvm_dpu.security.signing import SignatureError, generate_keypair
from tvm_dpu.util.toolchains import host_machine

ARCH = "zcu102"
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    model = zoo.build_model("mixed_cnn")
    compiled = tvm_dpu.build(model, arch=ARCH, calibration=[zoo.random_input(model, seed=s) for s in range(2)],
                             progress=False)
    d = tmp_path_factory.mktemp("sec")
    path = compiled.export(d / "m.tvmdpu")
    x = zoo.random_input(model, seed=3)
    return path, x, compiled.run(x)[0], d


def _container(path):
    c = unpack(path.read_bytes(), MAGIC, FORMAT_VERSION, str(path), "tvm-dpu artifact", "tvm-dpu-artifact")
    header = {k: v for k, v in c.header.items() if k != "sections"}
    return header, {n: c.section(n) for n in c.header["sections"]}


def _paths(obj, prefix=()):
    """Every (path, value) leaf and inner node of a JSON value."""
    yield prefix, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


def _set(obj, path, value):
    for p in path[:-1]:
        obj = obj[p]
    obj[path[-1]] = value


JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False),
                        st.text(max_size=8), st.lists(st.integers(-3, 300), max_size=4),
                        st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


def _outcome(path, x, expected):
    """Load and run; a clean project error or the original output."""
    try:
        m = load(path)
        y = m.run(x)[0]
    except DPUError:
        return "error"
    np.testing.assert_array_equal(y, expected)  # loaded and ran: must be the same answer
    return "same"


@FUZZ
@given(data=st.data())
def test_header_mutations_with_recomputed_checksums(built, data, tmp_path):
    path, x, expected, _ = built
    header, sections = _container(path)
    leaves = [p for p, _ in _paths(header) if p and p[0] != "build"]
    target = data.draw(st.sampled_from(leaves))
    _set(header, target, data.draw(JSON_VALUES))
    bad = tmp_path / "mutant.tvmdpu"
    bad.write_bytes(pack(MAGIC, FORMAT_VERSION, header, sections))
    _outcome(bad, x, expected)
    try:  # inspect / report go through the same validation
        read_header(bad)
    except ArtifactError:
        pass


def _blob_header_span(lib: bytes) -> tuple[int, int, int]:
    """(blob start, header start, header length) of the first DPU program inside a library."""
    pos = lib.find(BLOB_MAGIC)
    hlen = int.from_bytes(lib[pos + 12: pos + 20], "little")
    return pos, pos + FIXED_SIZE, hlen


def _first_digest(sections) -> str:
    """Digest recorded for the first program of the original library (the one the mutation edits)."""
    return _ORIGINAL_DIGEST[0]


_ORIGINAL_DIGEST: list[str] = []


def _reseal_blob(lib: bytearray, pos: int) -> None:
    hlen = int.from_bytes(lib[pos + 12: pos + 20], "little")
    blen = int.from_bytes(lib[pos + 20: pos + 28], "little")
    lib[pos + 28: pos + 60] = hashlib.sha256(bytes(lib[pos + FIXED_SIZE: pos + FIXED_SIZE + hlen + blen])).digest()


@FUZZ
@given(data=st.data())
def test_program_mutations_inside_the_library(built, data, tmp_path):
    """Numbers in a DPU program's header (feature-map pitches, offsets, region sizes, fix_points, shapes) edited in
    place inside the library with the program's own checksum recomputed. Left at that, the artifact header's
    program digest refuses it at load. Made fully consistent (the header's digest and the file's checksums
    recomputed too, which only a signature can detect), it is refused by the program's schema or runs to
    completion; never a crash or a foreign exception (the row_pitch / region-size cases once crashed)."""
    path, x, expected, _ = built
    header, sections = _container(path)
    lib = bytearray(sections[f"lib.{host_machine()}"])
    pos, hstart, hlen = _blob_header_span(bytes(lib))
    _ORIGINAL_DIGEST[:] = [bytes(lib[pos + 28: pos + 60]).hex()]
    text = lib[hstart: hstart + hlen].decode()
    numbers = [m for m in re.finditer(r"(?<=[:\[,])-?\d+", text)]
    m = data.draw(st.sampled_from(numbers))
    width = m.end() - m.start()
    new = str(data.draw(st.integers(0, 10 ** width - 1))).rjust(width, "0")
    if new.startswith("0") and len(new) > 1:  # JSON has no leading zeros: keep it valid JSON of the same length
        new = " " * (len(new) - len(new.lstrip("0"))) + (new.lstrip("0") or "0")
        new = new[-width:].rjust(width)
    text = text[:m.start()] + new + text[m.end():]
    lib[hstart: hstart + hlen] = text.encode()
    _reseal_blob(lib, pos)
    sections[f"lib.{host_machine()}"] = bytes(lib)
    bad = tmp_path / "prog.tvmdpu"
    bad.write_bytes(pack(MAGIC, FORMAT_VERSION, header, sections))
    changed = new != m.group(0)
    if changed:
        with pytest.raises(ArtifactError):
            load(bad)
    digest = bytes(lib[pos + 28: pos + 60]).hex()
    for sg in header["subgraphs"]:
        if sg["program_sha256"] == _first_digest(sections):
            sg["program_sha256"] = digest
    sections_ok = dict(sections)
    bad.write_bytes(pack(MAGIC, FORMAT_VERSION, header, sections_ok))
    try:
        m_ = load(bad)
        y = m_.run(x)[0]
    except DPUError:
        return
    assert y.shape == expected.shape
    if not changed:
        np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("edit,pattern", [
    ({"row_pitch": 1}, r"row_pitch = 1 outside"),
    ({"offset": 10 ** 9}, r"reaches past DDR region|offset = \d+ outside"),
    ({"reg_id": 9}, r"reg_id = 9 outside"),
])
def test_program_schema_names_the_field(built, edit, pattern):
    path, _, _, _ = built
    _, sections = _container(path)
    lib = sections[f"lib.{host_machine()}"]
    pos, hstart, hlen = _blob_header_span(lib)
    blen = int.from_bytes(lib[pos + 20: pos + 28], "little")
    c = unpack(lib[pos: hstart + hlen + blen], BLOB_MAGIC, 1, "p", "DPU subgraph", "tvm-dpu-subgraph")
    h = {k: v for k, v in c.header.items() if k != "sections"}
    h["inputs"][0]["fmap"].update(edit)
    blob = pack(BLOB_MAGIC, 1, h, {"code": c.section("code"), "params": c.section("params")})
    with pytest.raises(ArtifactError, match=pattern):
        unpack_program(blob, "edited")


@pytest.mark.parametrize("shape", [[1, 3, 32, 32], [7], [1, 3, 64, 64, 1]])
def test_header_input_shape_that_lies(built, tmp_path, shape):
    """The header's input shape disagrees with the library: loading works (nothing to cross-check it against
    without running), running fails with the project's error, never TVM's own exception type."""
    path, _, _, _ = built
    header, sections = _container(path)
    header["inputs"][0]["shape"] = shape
    bad = tmp_path / "shape.tvmdpu"
    bad.write_bytes(pack(MAGIC, FORMAT_VERSION, header, sections))
    m = load(bad)
    with pytest.raises(DPUError):
        m.run(np.zeros(shape, np.float32))


def test_section_table_hash_is_checked(built, tmp_path):
    path, _, _, _ = built
    c = unpack(path.read_bytes(), MAGIC, FORMAT_VERSION, str(path), "tvm-dpu artifact", "tvm-dpu-artifact")
    raw = bytearray(path.read_bytes())
    hlen = int.from_bytes(raw[12:20], "little")
    head = json.loads(raw[FIXED_SIZE: FIXED_SIZE + hlen])
    name = f"lib.{host_machine()}"
    head["sections"][name]["sha256"] = "0" * 64  # table edited, payload checksum recomputed
    hb = json.dumps(head, sort_keys=True, separators=(",", ":")).encode()
    assert len(hb) == hlen
    payload = hb + bytes(raw[FIXED_SIZE + hlen:])
    raw[FIXED_SIZE:] = payload
    raw[28:60] = hashlib.sha256(payload).digest()
    bad = tmp_path / "table.tvmdpu"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ArtifactError, match="does not match its own sha256"):
        load(bad)
    assert c.header["sections"][name]["nbytes"] > 0


def test_signed_artifact_round_trip_and_refusals(built, tmp_path):
    path, x, expected, d = built
    model = zoo.build_model("mixed_cnn")
    priv, pub = generate_keypair(tmp_path / "dev")
    _, other_pub = generate_keypair(tmp_path / "other")
    compiled = tvm_dpu.build(model, arch=ARCH, calibration=[zoo.random_input(model, seed=s) for s in range(2)],
                             progress=False)
    signed = compiled.export(tmp_path / "signed.tvmdpu", sign=priv)
    assert signed.read_bytes()[: path.stat().st_size] == path.read_bytes()  # the same file plus a trailer
    np.testing.assert_array_equal(load(signed, trusted_keys=[pub]).run(x)[0], expected)
    np.testing.assert_array_equal(load(signed).run(x)[0], expected)  # no keys given: the signature is not required
    with pytest.raises(SignatureError, match="not a trusted key"):
        load(signed, trusted_keys=[other_pub])
    with pytest.raises(SignatureError, match="not signed"):
        load(path, trusted_keys=[pub])
    raw = bytearray(signed.read_bytes())
    raw[len(raw) // 2] ^= 1  # any byte, here inside the library: the signature fails before the library is loaded
    tampered = tmp_path / "tampered.tvmdpu"
    tampered.write_bytes(bytes(raw))
    with pytest.raises(SignatureError, match="does not match the file's bytes"):
        load(tampered, trusted_keys=[pub])


def test_cli_sign_and_require_signature(built, tmp_path, capsys):
    from tvm_dpu.cli import main

    assert main(["keygen", str(tmp_path / "k")]) == 0
    out = tmp_path / "o"
    assert main(["compile", "examples/mixed_cnn.onnx", "--arch", ARCH, "-o", str(out), "--calib",
                 "examples/mixed_cnn_calib.npz", "--sign", str(tmp_path / "k.key"), "-q"]) == 0
    art = str(out / "mixed_cnn.tvmdpu")
    assert main(["run", art, "--require-signature", str(tmp_path / "k.pub")]) == 0
    _, pub2 = generate_keypair(tmp_path / "k2")
    assert main(["run", art, "--require-signature", str(pub2)]) == 2
    assert "not a trusted key" in capsys.readouterr().err


def test_same_bytes_from_another_process(built, tmp_path):
    """Byte-identical artifacts across processes (different hash seeds, temp dirs, wall clocks)."""
    import os
    import subprocess
    import sys

    path, _, _, _ = built
    code = f"""
import tvm_dpu
from tvm_dpu import zoo
model = zoo.build_model("mixed_cnn")
c = tvm_dpu.build(model, arch={ARCH!r}, calibration=[zoo.random_input(model, seed=s) for s in range(2)], progress=False)
c.export({str(tmp_path / 'other.tvmdpu')!r})
"""
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "other.tvmdpu").read_bytes() == path.read_bytes()


def test_loaded_model_from_8_threads(built):
    """One loaded model, 8 threads x 20 runs: every output equals the sequential one, no crash."""
    from concurrent.futures import ThreadPoolExecutor

    path, _, _, _ = built
    m = load(path)
    model = zoo.build_model("mixed_cnn")
    xs = [zoo.random_input(model, seed=s) for s in range(4)]
    expected = [m.run(x)[0] for x in xs]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda i: (i % 4, m.run(xs[i % 4])[0]), range(160)))
    assert len(results) == 160
    for i, y in results:
        np.testing.assert_array_equal(y, expected[i])
