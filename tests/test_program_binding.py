"""The DPU program that runs is exactly the one the artifact header (and `inspect`) describes: a library with a
second program for a subgraph, or one the header does not list, is refused at load, and a loaded model's run may
execute only the programs its header lists."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from tvm_dpu import zoo
from tvm_dpu.security.container import FIXED_SIZE, pack, unpack
from tvm_dpu.errors import ArtifactError, DPUError
from tvm_dpu.security.program_blob import MAGIC as BLOB_MAGIC
import functools

from tvm_dpu.runtime.artifact import FORMAT_VERSION, MAGIC, programs
from tvm_dpu.runtime.artifact import load as _load
from tvm_dpu.runtime.dispatch import use_device
from tvm_dpu.util.toolchains import host_machine

# Forged libraries: loaded with trust="unsigned" to reach the checks behind the trust policy.
load = functools.partial(_load, trust="unsigned")


@pytest.fixture()
def built(small_artifact):
    return small_artifact


def _sections(path):
    c = unpack(path.read_bytes(), MAGIC, FORMAT_VERSION, str(path), "tvm-dpu artifact", "tvm-dpu-artifact")
    header = {k: v for k, v in c.header.items() if k != "sections"}
    return header, {name: c.section(name) for name in c.header["sections"]}


def _first_blob(lib: bytes) -> bytes:
    pos = lib.find(BLOB_MAGIC)
    hlen = int.from_bytes(lib[pos + 12: pos + 20], "little")
    blen = int.from_bytes(lib[pos + 20: pos + 28], "little")
    return lib[pos: pos + FIXED_SIZE + hlen + blen]


def test_a_second_program_for_a_subgraph_is_refused(built, tmp_path):
    header, sections = _sections(built)
    key = f"lib.{host_machine()}"
    sections[key] = sections[key] + _first_blob(sections[key])  # a copy appended after the ELF's end
    bad = tmp_path / "dup.tvmdpu"
    bad.write_bytes(pack(MAGIC, FORMAT_VERSION, header, sections))
    with pytest.raises(ArtifactError, match="two DPU programs for subgraph"):
        load(bad)
    with pytest.raises(ArtifactError, match="two DPU programs for subgraph"):
        programs(bad)  # inspect / report read programs through the same check


def test_a_program_the_header_does_not_list_is_refused(built, tmp_path):
    header, sections = _sections(built)
    dropped = header["subgraphs"].pop()  # the library keeps that subgraph's program
    sections.pop(f"{dropped['key']}.xgraph", None)
    bad = tmp_path / "extra.tvmdpu"
    bad.write_bytes(pack(MAGIC, FORMAT_VERSION, header, sections))
    with pytest.raises(ArtifactError, match="header does not list"):
        load(bad)


def test_a_run_executes_only_the_listed_programs(built):
    model = load(built)
    x = zoo.random_input("mixed_cnn", reduced=True)
    assert model._listed_programs() == frozenset(r.program_digest for r in model.runners.values())
    model.run(x)
    with use_device(model.dpu_device(), programs=frozenset({hashlib.sha256(b"other").digest()})):
        with pytest.raises(DPUError, match="header does not list: refusing to run it"):
            model.vm["main"](*[__import__("tvm").runtime.tensor(np.asarray(x, np.float32))])
