"""A signed pipeline is one signed unit: the manifest (stage order, wire fix points, each stage's sha256) is
signed, so an edited fix point or a stage from another pipeline signed by the same key is refused; executors run
the bytes checked at load, never the files read again; JSON is bounded before parsing; trusted_keys is typed."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.security import signing
from tvm_dpu.security.container import FIXED_SIZE
from tvm_dpu.errors import ArchError, ArtifactError
from tvm_dpu.pipeline.model import SIGNATURE_FILE, PipelineError, PipelineModel

NAME = "resnet18"


@pytest.fixture(scope="module")
def single():
    return tvm_dpu.build(zoo.build_model(NAME, reduced=True), arch="zcu102",
                         calibration=[zoo.random_input(NAME, reduced=True, seed=s) for s in range(2)], progress=False)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    return signing.generate_keypair(d / "a"), signing.generate_keypair(d / "b")


def _save_signed(single, keys, tmp_path_factory, name, boards):
    (priv, _), _ = keys
    out = tmp_path_factory.mktemp(name)
    PipelineModel.from_model(single, boards=boards).save(out, sign=priv)
    return out


@pytest.fixture(scope="module")
def signed(single, keys, tmp_path_factory):
    return _save_signed(single, keys, tmp_path_factory, "signed", boards=3)


@pytest.fixture(scope="module")
def other(single, keys, tmp_path_factory):
    """Another pipeline of the same model, signed by the same key (2 boards: other stage contents)."""
    return _save_signed(single, keys, tmp_path_factory, "other", boards=2)


def _copy(src, dst):
    for f in src.iterdir():
        shutil.copy(f, dst / f.name)
    return dst


def test_signed_pipeline_loads_and_matches(single, signed, keys):
    (_, pub), _ = keys
    assert (signed / SIGNATURE_FILE).stat().st_size == signing.TRAILER_SIZE
    x = zoo.random_input(NAME, reduced=True, seed=9)
    pipe = PipelineModel.load(signed, trusted_keys=[pub])
    assert all(np.array_equal(a, b) for a, b in zip(pipe.run(x), single.run(x)))


def test_edited_wire_fix_point_breaks_the_signature(signed, keys, tmp_path):
    (_, pub), _ = keys
    d = _copy(signed, tmp_path)
    doc = json.loads((d / "pipeline.json").read_text())
    name = next(iter(doc["stages"][0]["wire_fix_points"]))
    doc["stages"][0]["wire_fix_points"][name] += 2
    (d / "pipeline.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    with pytest.raises(signing.SignatureError, match="does not match the file's bytes"):
        PipelineModel.load(d, trusted_keys=[pub])


def test_stage_from_another_pipeline_signed_by_the_same_key_is_refused(signed, other, keys, tmp_path):
    (_, pub), _ = keys
    d = _copy(signed, tmp_path)
    foreign = (other / "stage1.tvmdpu").read_bytes()
    assert foreign != (d / "stage1.tvmdpu").read_bytes()
    (d / "stage1.tvmdpu").write_bytes(foreign)
    with pytest.raises(PipelineError, match="stage 1: stage1.tvmdpu does not match the sha256"):
        PipelineModel.load(d, trusted_keys=[pub])
    # ... and recording its sha256 in the manifest breaks the manifest's signature.
    import hashlib

    doc = json.loads((d / "pipeline.json").read_text())
    doc["stages"][1]["sha256"] = hashlib.sha256(foreign).hexdigest()
    (d / "pipeline.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    with pytest.raises(signing.SignatureError):
        PipelineModel.load(d, trusted_keys=[pub])


def test_manifest_signature_required_and_key_checked(signed, keys, tmp_path):
    (_, pub), (_, other_pub) = keys
    d = _copy(signed, tmp_path)
    with pytest.raises(signing.SignatureError, match="not a trusted key"):
        PipelineModel.load(d, trusted_keys=[other_pub])
    (d / SIGNATURE_FILE).unlink()
    with pytest.raises(signing.SignatureError, match="pipeline manifest is not signed"):
        PipelineModel.load(d, trusted_keys=[pub])
    PipelineModel.load(d)  # without trusted keys nothing is required (the trust policy is the artifact's)


def test_unsigned_save_removes_a_stale_signature(single, signed, tmp_path):
    d = _copy(signed, tmp_path)
    PipelineModel.from_model(single, boards=3).save(d)
    assert not (d / SIGNATURE_FILE).exists()


def test_stage_file_replaced_after_load_changes_nothing(single, signed, other, keys, tmp_path):
    (_, pub), _ = keys
    d = _copy(signed, tmp_path)
    pipe = PipelineModel.load(d, trusted_keys=[pub])
    (d / "stage1.tvmdpu").write_bytes((other / "stage1.tvmdpu").read_bytes())
    x = zoo.random_input(NAME, reduced=True, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(pipe.run(x), single.run(x)))
    from tvm_dpu.pipeline.ray_executor import stage_artifact_bytes

    assert stage_artifact_bytes(pipe.stages[1], tmp_path) == (signed / "stage1.tvmdpu").read_bytes()


def test_stage_file_replaced_after_load_changes_nothing_on_ray(single, signed, other, tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'tvm-dpu[cluster]')")
    d = _copy(signed, tmp_path)
    pipe = PipelineModel.load(d, executor="ray",
                              init_options={"num_cpus": 1, "object_store_memory": 96 * 1024 * 1024})
    try:
        for i in range(3):  # every stage file swapped between load and the actors' start
            (d / f"stage{i}.tvmdpu").write_bytes(b"not an artifact")
        x = zoo.random_input(NAME, reduced=True, seed=4)
        with pipe:
            got = pipe.run(x)
        assert all(np.array_equal(a, b) for a, b in zip(got, single.run(x)))
    finally:
        if ray.is_initialized():
            ray.shutdown()


@pytest.mark.parametrize("bad, message", [
    (b"\x01" * 7, "7 bytes is not a raw Ed25519 public key"),
    (12345, "got int"),
    ([b"\x01" * 31], r"trusted_keys\[0\]"),
    ({"k": 1}, "got dict"),
])
def test_trusted_keys_of_the_wrong_type_are_one_clear_error(signed, bad, message):
    with pytest.raises(signing.SignatureError, match=message):
        tvm_dpu.load(signed / "stage0.tvmdpu", trusted_keys=bad)


def test_a_single_key_path_is_one_key(signed, keys):
    (_, pub), _ = keys
    assert tvm_dpu.load(signed / "stage0.tvmdpu", trusted_keys=str(pub)) is not None
    assert tvm_dpu.load(signed / "stage0.tvmdpu", trusted_keys=signing.public_key_bytes(pub)) is not None


DEEP = b"[" * 200_000 + b"]" * 200_000


def test_deeply_nested_json_is_refused_before_parsing(signed, tmp_path):
    d = _copy(signed, tmp_path)
    (d / "pipeline.json").write_bytes(DEEP)
    with pytest.raises(PipelineError, match="nests 200000 levels deep"):
        PipelineModel.load(d)
    (tmp_path / "arch.json").write_bytes(DEEP)
    with pytest.raises(ArchError, match="nests 200000 levels deep"):
        tvm_dpu.load_arch(str(tmp_path / "arch.json"))


def test_deeply_nested_artifact_header_is_refused(signed, tmp_path):
    import hashlib
    import struct

    raw = bytearray(signing.split((signed / "stage0.tvmdpu").read_bytes())[0])
    hlen = struct.unpack_from("<Q", raw, 12)[0]  # header length (the fixed part's layout: container.py)
    raw[FIXED_SIZE:FIXED_SIZE + hlen] = b"[" * (hlen // 2) + b"]" * (hlen - hlen // 2)
    raw[28:60] = hashlib.sha256(bytes(raw[FIXED_SIZE:])).digest()  # checksum recomputed: only the depth is wrong
    path = tmp_path / "deep.tvmdpu"
    path.write_bytes(bytes(raw))
    with pytest.raises(ArtifactError, match=f"nests {hlen // 2} levels deep"):
        tvm_dpu.load(path, trust="unsigned")  # past the trust policy, to the header parser


def _edit_fix_point(d):
    doc = json.loads((d / "pipeline.json").read_text())
    k = next(iter(doc["stages"][0]["wire_fix_points"]))
    doc["stages"][0]["wire_fix_points"][k] += 2
    (d / "pipeline.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def test_configured_trusted_keys_make_the_manifest_signature_mandatory(signed, keys, tmp_path, monkeypatch):
    """With a trusted-keys file and no --require-signature, an edited pipeline.json is refused (it ran, with wrong
    output, before); --allow-unsigned skips the manifest's signature, yet the edited wire fix point disagrees with
    the stages' own artifacts and is refused too."""
    import os

    (_, pub), _ = keys
    config = tmp_path / "config"
    config.mkdir(mode=0o700)
    (config / "trusted_keys").write_text(f"{pub}\n")
    os.chmod(config / "trusted_keys", 0o600)
    os.chmod(pub, 0o644)
    monkeypatch.setenv("TVM_DPU_CONFIG_DIR", str(config))
    (tmp_path / "p").mkdir()
    d = _copy(signed, tmp_path / "p")
    PipelineModel.load(d).close()  # intact: the configured key verifies manifest and stages
    _edit_fix_point(d)
    with pytest.raises(signing.SignatureError):
        PipelineModel.load(d)
    with pytest.raises(PipelineError, match=r"at fix point .* artifact records"):
        PipelineModel.load(d, trust="unsigned")


def test_release_identity_is_signed_and_a_downgrade_refused(single, keys, tmp_path, monkeypatch):
    (priv, pub), _ = keys
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764633600")
    pipe = PipelineModel.from_model(single, boards=2)
    old, new, again = tmp_path / "old", tmp_path / "new", tmp_path / "again"
    pipe.save(old, sign=priv, release="1.4")
    pipe.save(new, sign=priv, release="1.10")
    pipe.save(again, sign=priv, release="1.10")
    doc = json.loads((new / "pipeline.json").read_text())
    assert doc["release"] == {"version": "1.10", "built": "2025-12-02T00:00:00Z"}
    assert (again / "pipeline.json").read_bytes() == (new / "pipeline.json").read_bytes()  # SOURCE_DATE_EPOCH
    with PipelineModel.load(new, trusted_keys=[pub], min_release="1.9") as p:
        assert p.release["version"] == "1.10"
    with pytest.raises(PipelineError, match="release 1.4 is older than the required 1.9"):
        PipelineModel.load(old, trusted_keys=[pub], min_release="1.9")
    with pytest.raises(PipelineError, match="dotted whole numbers"):
        PipelineModel.load(new, trusted_keys=[pub], min_release="latest")
    doc["release"]["version"] = "99"  # raising one's own version breaks the signature
    (new / "pipeline.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    with pytest.raises(signing.SignatureError):
        PipelineModel.load(new, trusted_keys=[pub], min_release="1.9")
