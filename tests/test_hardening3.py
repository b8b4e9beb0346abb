"""Issue 40 (hardening, round three): files that vouch for artifacts must be the user's own, every file is read as a
regular file up to a limit, and the runner's arguments are checked with one clear error."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tvm_dpu.errors import ArtifactError, DPUError, InputError
from tvm_dpu.security.signing import SignatureError, generate_keypair

MNIST = Path(__file__).resolve().parent / "data" / "xmodel" / "dpu_pynq" / "dpu_mnist_classifier.xmodel"
DIGEST = "ab" * 32


@pytest.fixture
def config(tmp_path, monkeypatch):
    d = tmp_path / "config"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("TVM_DPU_CONFIG_DIR", str(d))
    return d


# -------------------------------------------------------------------------------------------- trust files
def test_own_build_record_vouches(config):
    from tvm_dpu.security.trust import built_here

    (config / "built").write_text(DIGEST + "\n")
    os.chmod(config / "built", 0o600)
    assert built_here(DIGEST) and not built_here("cd" * 32)


@pytest.mark.parametrize("how", ["record_0666", "record_0620", "dir_0777", "other_owner"])
def test_build_record_others_can_write_is_not_honoured(config, how):
    from tvm_dpu.security.trust import built_here

    record = config / "built"
    record.write_text(DIGEST + "\n")
    os.chmod(record, 0o600)
    if how == "record_0666":
        os.chmod(record, 0o666)
    elif how == "record_0620":
        os.chmod(record, 0o620)
    elif how == "dir_0777":
        os.chmod(config, 0o777)
    else:
        if os.getuid() != 0:
            pytest.skip("only root can give a file to another user")
        os.chown(record, 12345, 12345)
    with pytest.raises(SignatureError, match="build record is not honoured") as e:
        built_here(DIGEST)
    assert str(config) in str(e.value)


def test_trusted_keys_file_and_listed_keys_must_be_private(config):
    from tvm_dpu.security.trust import configured_keys

    _, pub = generate_keypair(config / "k")
    listing = config / "trusted_keys"
    listing.write_text(f"{pub.name}\n")
    os.chmod(listing, 0o600)
    os.chmod(pub, 0o644)
    assert configured_keys() == [str(pub)]
    os.chmod(pub, 0o666)
    with pytest.raises(SignatureError, match=r"key is not honoured.*writable by others"):
        configured_keys()
    os.chmod(pub, 0o644)
    os.chmod(listing, 0o646)
    with pytest.raises(SignatureError, match="trusted-keys file is not honoured"):
        configured_keys()


def test_unsafe_record_is_not_written_to(config):
    from tvm_dpu.security.trust import record_build

    record = config / "built"
    record.write_text(DIGEST + "\n")
    os.chmod(record, 0o666)
    art = config / "a.bin"
    art.write_bytes(b"\0" * 128)
    record_build(art)
    assert record.read_text() == DIGEST + "\n"


# -------------------------------------------------------------------------------------------- bounded reads
@pytest.fixture
def fifo(tmp_path):
    p = tmp_path / "fifo"
    os.mkfifo(p)
    return p


def test_endless_streams_and_fifos_are_refused(tmp_path, fifo):
    """/dev/zero and a FIFO given as an artifact, an xmodel, a key, a pipeline manifest or an input file: one
    clear error each, no read until memory runs out and no wait for a writer."""
    import tvm_dpu
    from tvm_dpu.errors import XModelError
    from tvm_dpu.serving.feeds import load_npz
    from tvm_dpu.pipeline.model import read_pipeline_json
    from tvm_dpu.pipeline.stages import PipelineError
    from tvm_dpu.security.signing import public_key_bytes
    from tvm_dpu.xmodel.model import read_xmodel

    for path in ("/dev/zero", fifo):
        with pytest.raises(ArtifactError, match="not a regular file"):
            tvm_dpu.load(path, trust="unsigned")
        with pytest.raises(XModelError, match="not a regular file"):
            read_xmodel(path)
        with pytest.raises(SignatureError, match="key is a .* not a regular file"):
            public_key_bytes(str(path))
        with pytest.raises(PipelineError, match="manifest is a .* not a regular file"):
            read_pipeline_json(Path(path))
        with pytest.raises(InputError, match="not a regular file"):
            load_npz(path)


def test_size_limit_per_kind(tmp_path, monkeypatch):
    from tvm_dpu.security import safe_io

    big = tmp_path / "big.pub"
    big.write_bytes(b"x" * 100)
    monkeypatch.setitem(safe_io.LIMITS, "key", 64)
    with pytest.raises(SignatureError, match="has 100 bytes, more than the 64"):
        safe_io.read_regular(big, "key", SignatureError)


# -------------------------------------------------------------------------------------------- runner arguments
@pytest.fixture(scope="module")
def runner():
    from tvm_dpu.serving.runner import create_runner

    r = create_runner(str(MNIST))
    yield r
    r.close()


def _x(r):
    (t,) = r.get_input_tensors()
    return np.zeros(t.shape, np.float32)


@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.int64, np.float64, np.int16])
def test_output_buffer_must_be_float32_or_int8(runner, dtype):
    (t,) = runner.get_output_tensors()
    with pytest.raises(InputError, match=f"output buffer .* is {np.dtype(dtype)}"):
        runner.execute_async(_x(runner), [np.zeros(t.shape, dtype)])


def test_float32_and_int8_outputs_agree(runner):
    (t,) = runner.get_output_tensors()
    f = np.zeros(t.shape, np.float32)
    runner.run(_x(runner), [f])
    assert np.isfinite(f).all() and f.any()
    if t.fix_point is not None:
        q = np.zeros(t.shape, np.int8)
        runner.run(_x(runner), [q])
        assert np.allclose(q * 2.0 ** -t.fix_point, f, atol=2.0 ** -t.fix_point)


@pytest.mark.parametrize("job", ["abc", None, 1.7, True, [1]])
def test_wait_job_must_be_a_job_or_int(runner, job):
    with pytest.raises(DPUError, match="expected a Job"):
        runner.wait(job)


@pytest.mark.parametrize("timeout", [-1, float("nan"), float("inf"), "1", True])
def test_wait_timeout_must_be_seconds(runner, timeout):
    job = runner.execute_async(_x(runner))
    with pytest.raises(DPUError, match="timeout"):
        runner.wait(job, timeout=timeout)
    assert runner.wait(job, timeout=60) == 0


@pytest.mark.parametrize("n", ["2", 2.5, 0, -1, True, 10 ** 6])
def test_num_threads_checked(n):
    from tvm_dpu.serving.runner import create_runner

    with pytest.raises(DPUError, match="num_threads"):
        create_runner(str(MNIST), num_threads=n)


def test_use_after_close_is_a_clear_error():
    from tvm_dpu.serving.runner import create_runner

    r = create_runner(str(MNIST))
    r.close()
    with pytest.raises(DPUError, match="closed runner"):
        r.execute_async(_x(r))


def test_cli_counts_have_an_upper_bound(capsys):
    from tvm_dpu.cli import main

    with pytest.raises(SystemExit) as e:
        main(["benchmark", str(MNIST), "--runs", "10000000000000000000000"])
    assert e.value.code == 2
    assert "more than 1,000,000" in capsys.readouterr().err
