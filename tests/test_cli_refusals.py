"""The CLI refuses what it cannot honour, with exit 2 and one message: counts below 1, and replacing a key."""
from __future__ import annotations

import pytest

from tvm_dpu.cli import main


@pytest.mark.parametrize("argv", [
    ["run", "m.tvmdpu", "--cores", "0"],
    ["run", "m.tvmdpu", "--runs", "-3"],
    ["compile", "m.onnx", "--cores", "0", "-o", "out"],
    ["pipeline", "m.onnx", "--boards", "0", "-o", "out"],
    ["run", "m.tvmdpu", "--cores", "two"],
])
def test_counts_below_one_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "must be at least 1" in err or "'two' is not a whole number" in err


def test_keygen_refuses_to_overwrite_without_force(tmp_path, capsys):
    prefix = str(tmp_path / "k")
    assert main(["keygen", prefix]) == 0
    key = (tmp_path / "k.key").read_bytes()
    assert main(["keygen", prefix]) == 2
    assert "already exist" in capsys.readouterr().err
    assert (tmp_path / "k.key").read_bytes() == key  # untouched
    assert main(["keygen", prefix, "--force"]) == 0
    assert (tmp_path / "k.key").read_bytes() != key
