"""The trust policy: an artifact's native code is loaded only when it is signed by a trusted key, built by this
user on this machine, or explicitly allowed unsigned; a trusted-keys file in the user's config makes signatures
mandatory. Reading a header (inspect, report) needs no trust."""
from __future__ import annotations

import warnings

import pytest

import tvm_dpu
from tvm_dpu import zoo
from tvm_dpu.security import signing, trust
from tvm_dpu.cli import main
from tvm_dpu.runtime.artifact import read_header


@pytest.fixture()
def config(tmp_path, monkeypatch):
    d = tmp_path / "config"
    monkeypatch.setenv("TVM_DPU_CONFIG_DIR", str(d))
    return d


@pytest.fixture(scope="module")
def compiled():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tvm_dpu.build(zoo.build_model("mixed_cnn", reduced=True), arch="zcu102", progress=False)


def test_an_artifact_built_here_loads_and_a_foreign_one_is_refused(compiled, config, tmp_path, monkeypatch):
    path = compiled.export(tmp_path / "m.tvmdpu")
    assert (config / "built").read_text().split() == [trust.artifact_id(path.read_bytes())]
    tvm_dpu.load(path)
    # The same file on another machine (another user's config): not built there, unsigned.
    monkeypatch.setenv("TVM_DPU_CONFIG_DIR", str(tmp_path / "elsewhere"))
    with pytest.raises(signing.SignatureError, match="not built by this user on this machine"):
        tvm_dpu.load(path)
    tvm_dpu.load(path, trust="unsigned")  # the user vouches for it
    read_header(path)  # reading the header loads no native code: no trust needed
    with pytest.raises(signing.SignatureError, match="trust='sometimes'"):
        tvm_dpu.load(path, trust="sometimes")


def test_a_changed_local_build_is_refused(compiled, config, tmp_path):
    import hashlib

    from tvm_dpu.security.container import FIXED_SIZE
    from tvm_dpu.errors import ArtifactError

    path = compiled.export(tmp_path / "m.tvmdpu")
    data = bytearray(path.read_bytes())
    data[FIXED_SIZE + 100] ^= 1
    changed = tmp_path / "changed.tvmdpu"
    changed.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        tvm_dpu.load(changed)  # the recorded identity holds the payload's sha256, which no longer matches
    data[28:60] = hashlib.sha256(bytes(data[FIXED_SIZE:])).digest()  # a forger recomputes the checksum ...
    changed.write_bytes(bytes(data))
    with pytest.raises(signing.SignatureError, match="not built by this user"):
        tvm_dpu.load(changed)  # ... which changes the identity: no longer a local build


def test_signed_artifacts_from_elsewhere_load_with_their_key(compiled, config, tmp_path, monkeypatch):
    priv, pub = signing.generate_keypair(tmp_path / "k")
    path = compiled.export(tmp_path / "s.tvmdpu", sign=priv)
    monkeypatch.setenv("TVM_DPU_CONFIG_DIR", str(tmp_path / "board"))
    with pytest.raises(signing.SignatureError):
        tvm_dpu.load(path)  # a signature by a key nobody listed is no trust
    tvm_dpu.load(path, trusted_keys=pub)


def test_a_trusted_keys_file_makes_signatures_mandatory(compiled, config, tmp_path):
    priv, pub = signing.generate_keypair(tmp_path / "k")
    local = compiled.export(tmp_path / "local.tvmdpu")
    signed = compiled.export(tmp_path / "signed.tvmdpu", sign=priv)
    config.mkdir(parents=True, exist_ok=True)
    (config / "trusted_keys").write_text(f"# team key\n{pub}\n")
    tvm_dpu.load(signed)
    for how in ({}, {"trust": "unsigned"}):  # neither a local build nor an explicit allowance overrides the file
        with pytest.raises(signing.SignatureError, match="signatures are required by"):
            tvm_dpu.load(local, **how)
    (config / "trusted_keys").write_text("\n# nothing\n")
    with pytest.raises(signing.SignatureError, match="lists no key"):
        tvm_dpu.load(signed)


def test_cli_allow_unsigned(compiled, config, tmp_path, monkeypatch, capsys):
    path = compiled.export(tmp_path / "m.tvmdpu")
    monkeypatch.setenv("TVM_DPU_CONFIG_DIR", str(tmp_path / "board"))
    assert main(["run", str(path)]) == 2
    assert "--allow-unsigned" in capsys.readouterr().err
    assert main(["run", str(path), "--allow-unsigned"]) == 0
    assert main(["run", str(path), "--allow-unsigned", "--require-signature", str(path)]) == 2
    assert "contradict" in capsys.readouterr().err


def test_an_unwritable_config_only_costs_the_local_record(compiled, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TVM_DPU_CONFIG_DIR", str(blocker / "config"))
    path = compiled.export(tmp_path / "m.tvmdpu")  # no error: the record is a convenience
    with pytest.raises(signing.SignatureError, match="not built by this user"):
        tvm_dpu.load(path)


def test_allow_unsigned_still_needs_a_tvm_library_checked_without_running_it(compiled, config, tmp_path):
    """Under trust="unsigned" the artifact's library is still checked to be a TVM library with a VM executable
    before it is loaded: one replaced by a library with a constructor (the original's bytes appended, so its DPU
    programs are still found) is refused and the constructor never runs."""
    import shutil
    import subprocess

    from tvm_dpu.security.container import pack, unpack
    from tvm_dpu.errors import ArtifactError
    from tvm_dpu.runtime.artifact import FORMAT_VERSION, MAGIC
    from tvm_dpu.util.toolchains import host_machine

    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build the replacement library")
    marker = tmp_path / "constructor_ran"
    src = tmp_path / "evil.c"
    src.write_text(f'#include <stdio.h>\n__attribute__((constructor)) static void run(void) {{ '
                   f'FILE* f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')
    so = tmp_path / "evil.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
    path = compiled.export(tmp_path / "m.tvmdpu")
    c = unpack(path.read_bytes(), MAGIC, FORMAT_VERSION, str(path), "tvm-dpu artifact", "tvm-dpu-artifact")
    sections = {n: c.section(n) for n in c.header["sections"]}
    key = f"lib.{host_machine()}"
    sections[key] = so.read_bytes() + sections[key]
    bad = tmp_path / "replaced.tvmdpu"
    bad.write_bytes(pack(MAGIC, FORMAT_VERSION, {k: v for k, v in c.header.items() if k != "sections"}, sections))
    with pytest.raises(ArtifactError, match="not a TVM library: it exports no __tvm_ffi__library_bin"):
        tvm_dpu.load(bad, trust="unsigned")
    assert not marker.exists()
    tvm_dpu.load(path, trust="unsigned").run(zoo.random_input("mixed_cnn", reduced=True))  # the real one loads
