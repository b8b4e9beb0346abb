"""Reliability campaigns: bad artifacts and bad inputs against the runtime, counted per outcome.

Campaigns (each case runs in a child process, so a crash or a hang is seen and counted, not suffered):

* header   artifact header values replaced by random JSON values, all checksums recomputed
* program  numbers in a DPU program's header edited inside the library, the program's and the file's checksums
           recomputed (the header's program digest left as written)
* forged   the same, with the header's program digest recomputed too: only a signature can tell (outcomes are
           listed; a run with a trusted key must refuse every one)
* bytes    bit flips, truncations, byte runs and header swaps with no checksum recomputed
* npz      bad .npz files given to `tvm-dpu run --input`
* inputs   NaN/Inf, wrong dtypes, extra/missing names, wrong shapes given to `CompiledModel.run`
* threads  one loaded model, 8 threads x 20 runs
* bounded  inputs that would need huge memory if read before being checked: a 300-byte .npz claiming 1e13
           elements, a compressed 1x3x4096x4096 member of the wrong shape, a duplicate member, a strided view of 48 GiB
* onnx     invalid ONNX models through `tvm-dpu compile` (negative pads, zero dilations, kernel_shape against the
           weights, a wrong output declaration, int64 input, int64 output, NonZero, no inputs) and deeply nested
           JSON (--arch file, --options)
* plugins  a plugin raising in partition / float_reference / compile, returning NaN, a broken entry point
* pipeline a signed pipeline tampered with (wire fix point +2, a stage of another pipeline signed by the same key,
           the manifest signature removed, a deeply nested manifest), loaded with its key and run
* binding  a library carrying a second program for a subgraph (the duplicate-program forgery)
* trust    the forged files loaded under the default trust policy (not built here, not signed): every one refused
           (the mutation campaigns above load with trust="unsigned" to reach the checks behind the policy)
* keys     trusted_keys given as a short byte string, an int, a dict
* leak     2,000 loads of one artifact: RSS growth and mappings of deleted files (a figure, not a case count)

Outcome columns: `clean` (the project's error), `same` (ran, same output), `changed` (forged only: ran with another
output), `other_exc` (any other exception), `crash` (the child died), `hang` (timeout), `wrong` (ran with another
output where that is a defect). The bad columns are other_exc, crash, hang, wrong (and, for forged, a signed run
that is not refused).

    python benchmarks/bench_reliability.py                 # 200 cases per mutation campaign -> results/reliability.json
    python benchmarks/bench_reliability.py --cases 20      # a quick run (CI runs a seeded part like this)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_results  # noqa: E402  (benchmarks/results_io.py)

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "reliability.json"
ROOT = Path(__file__).resolve().parents[1]
ARCH = "zcu102"
BAD = ("other_exc", "memory", "crash", "hang", "wrong")
#: Address-space cap of every case's child process: an allocation past it is a `memory` outcome, not a dead host.
MEMORY_CAP_GIB = 5


# ------------------------------------------------------------------------------------------ building the cases
def _container(path: Path):
    from tvm_dpu.security.container import unpack
    from tvm_dpu.runtime.artifact import FORMAT_VERSION, MAGIC

    c = unpack(path.read_bytes(), MAGIC, FORMAT_VERSION, str(path), "tvm-dpu artifact", "tvm-dpu-artifact")
    return {k: v for k, v in c.header.items() if k != "sections"}, {n: c.section(n) for n in c.header["sections"]}


def _pack(header, sections) -> bytes:
    from tvm_dpu.security.container import pack
    from tvm_dpu.runtime.artifact import FORMAT_VERSION, MAGIC

    return pack(MAGIC, FORMAT_VERSION, header, sections)


def _leaves(obj, prefix=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, prefix + (i,))
    if prefix:
        yield prefix


def _random_json(rng: random.Random):
    return rng.choice([None, True, False, 0, -1, 1, 7, 2**31, -2**40, 2**70, 0.5, 1e308, "", "x", "0x1",
                       "lib.x86_64", [], [1, 2], [-1], {}, {"a": 1}, [[1, 3, 64, 64]], "sg0", "float64"])


def header_cases(art: Path, n: int, seed: int, d: Path) -> list[Path]:
    header, sections = _container(art)
    paths = list(p for p in _leaves(header) if p[0] != "build")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        h = json.loads(json.dumps(header))
        path = rng.choice(paths)
        node = h
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = _random_json(rng)
        f = d / f"header{i}.tvmdpu"
        f.write_bytes(_pack(h, sections))
        out.append(f)
    return out


def _program_mutant(header, sections, rng: random.Random, forge: bool) -> bytes:
    from tvm_dpu.security.program_blob import MAGIC as BLOB_MAGIC
    from tvm_dpu.util.toolchains import host_machine

    key = f"lib.{host_machine()}"
    lib = bytearray(sections[key])
    starts = [m.start() for m in re.finditer(re.escape(BLOB_MAGIC), bytes(lib))]
    pos = rng.choice(starts)
    hlen = int.from_bytes(lib[pos + 12: pos + 20], "little")
    blen = int.from_bytes(lib[pos + 20: pos + 28], "little")
    old_digest = bytes(lib[pos + 28: pos + 60]).hex()
    text = lib[pos + 60: pos + 60 + hlen].decode()
    nums = list(re.finditer(r"(?<=[:\[,])\d+", text))
    m = rng.choice(nums)
    width = m.end() - m.start()
    new = m.group(0)
    while new.strip() == m.group(0):  # a real change: same length, still valid JSON (leading blanks)
        new = str(rng.randrange(10 ** width)).rjust(width)
    text = text[:m.start()] + new + text[m.end():]
    lib[pos + 60: pos + 60 + hlen] = text.encode()
    lib[pos + 28: pos + 60] = hashlib.sha256(bytes(lib[pos + 60: pos + 60 + hlen + blen])).digest()
    h = json.loads(json.dumps(header))
    if forge:
        for sg in h["subgraphs"]:
            if sg.get("program_sha256") == old_digest:
                sg["program_sha256"] = bytes(lib[pos + 28: pos + 60]).hex()
    s = dict(sections)
    s[key] = bytes(lib)
    return _pack(h, s)


def program_cases(art: Path, n: int, seed: int, d: Path, forge: bool) -> list[Path]:
    header, sections = _container(art)
    rng = random.Random(seed)
    out = []
    for i in range(n):
        f = d / f"{'forged' if forge else 'program'}{i}.tvmdpu"
        f.write_bytes(_program_mutant(header, sections, rng, forge))
        out.append(f)
    return out


def byte_cases(art: Path, n: int, seed: int, d: Path) -> list[Path]:
    data = art.read_bytes()
    rng = random.Random(seed)
    out = []
    for i in range(n):
        b = bytearray(data)
        kind = rng.choice(["flip", "truncate", "run", "swap"])
        if kind == "flip":
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif kind == "truncate":
            del b[rng.randrange(len(b)):]
        elif kind == "run":
            at = rng.randrange(len(b))
            b[at: at + rng.randint(1, 64)] = bytes([rng.randrange(256)]) * rng.randint(1, 64)
        else:
            b[:60] = bytes(rng.randrange(256) for _ in range(60))
        f = d / f"bytes{i}.tvmdpu"
        f.write_bytes(bytes(b))
        out.append(f)
    return out


def npz_cases(d: Path) -> list[Path]:
    import pickle

    x = np.zeros((1, 3, 64, 64), np.float32)
    (d / "empty.npz").write_bytes(b"")
    (d / "text.npz").write_text("input = 1\n")
    np.save(d / "one.npy", x)
    os.replace(d / "one.npy", d / "renamed.npz")
    np.savez(d / "objects.npz", input=np.array([x, None], dtype=object))
    (d / "pickled.npz").write_bytes(pickle.dumps({"input": x}))
    np.savez(d / "wrongname.npz", a=x, b=x)
    np.savez(d / "nan.npz", input=np.full_like(x, np.nan))
    np.savez(d / "complex.npz", input=x.astype(np.complex64))
    np.savez(d / "shape.npz", input=x[:, :, :5])
    return [d / f for f in ("empty.npz", "text.npz", "renamed.npz", "objects.npz", "pickled.npz", "wrongname.npz",
                            "nan.npz", "complex.npz", "shape.npz", "missing.npz")]


# ------------------------------------------------------------------------------------------ xmodel mutations
XMODELS = sorted((ROOT / "tests" / "data" / "xmodel").rglob("*.xmodel"))
#: Mutations after which the file must be refused (a run would be a defect, counted `wrong`); after the others a run
#: with another output is a legitimate model (counted `changed`: e.g. 16 random bytes of mc_code that happen to decode
#: as ISA1 instructions are another program).
MUST_REFUSE = ("mc_odd", "mc_empty", "mc_no_end", "dim_zero", "dim_max", "dim_extra", "dim_huge",
               "self_input", "cycle", "missing_input", "size_huge", "size_negative", "const_short", "ddr_huge",
               "stride_zero", "stride_negative", "stride_len", "fingerprint", "sub_dup_op", "attr_kind",
               "truncate")


def _dpu_sub(g: dict) -> dict:
    return next(c for c in g["subg_root"]["subg_child"] if c["subg_attr"].get("device", None) is not None
                and c["subg_attr"]["device"].value == "DPU")


def _io_tensors(g: dict) -> list[dict]:
    """The tensors a run reads or writes: the model's inputs, the DPU's inputs (upload) and outputs (download's)."""
    by_name = {op["op_name"]: op for op in g["op_node"]}
    read = [by_name[a["arg_ops"][0]] for op in g["op_node"] if op["op_type"] == "download" for a in op["args"]]
    return [op["output_tensor"] for op in g["op_node"] if op["op_type"] in ("upload", "data", "data-fix")] + [
        op["output_tensor"] for op in read]


def _xmodel_mutant(g: dict, kind: str, rng: random.Random) -> None:
    """Edit the decoded graph `g` in place by mutation `kind`."""
    from tvm_dpu.xmodel.reader import Attr

    sub = _dpu_sub(g)
    a = sub["subg_attr"]
    code = a["mc_code"].value
    ops = g["op_node"]
    io = _io_tensors(g)
    t = rng.choice(io)
    if kind.startswith(("ddr", "stride")):  # placement edits: a tensor the run reads or writes in DDR
        t = rng.choice([x for x in io if "ddr_addr" in x["tensor_attr"]])
    if kind == "mc_odd":
        a["mc_code"] = Attr(a["mc_code"].kind, code[:-1])
    elif kind == "mc_empty":
        a["mc_code"] = Attr(a["mc_code"].kind, b"")
    elif kind == "mc_no_end":
        a["mc_code"] = Attr(a["mc_code"].kind, code[:-4])  # END is the last word
    elif kind == "mc_random":
        at = rng.randrange(len(code) // 4) * 4
        junk = bytes(rng.randrange(256) for _ in range(16))
        a["mc_code"] = Attr(a["mc_code"].kind, code[:at] + junk + code[at + 16:])
    elif kind in ("dim_zero", "dim_max", "dim_huge"):
        i = rng.randrange(len(t["tensor_dim"]))
        t["tensor_dim"][i] = {"dim_zero": 0, "dim_max": 2**32 - 1, "dim_huge": 65536}[kind]
    elif kind == "dim_extra":
        t["tensor_dim"].insert(0, rng.choice([2, 7, 4096]))
    elif kind == "self_input":
        op = rng.choice([o for o in ops if o["args"]])
        op["args"][0]["arg_ops"] = [op["op_name"]]
    elif kind == "cycle":
        op = rng.choice([o for o in ops if o["args"]])
        src = next(o for o in ops if o["op_name"] == op["args"][0]["arg_ops"][0])
        src["args"] = [{"arg_name": "input", "arg_ops": [op["op_name"]]}]
    elif kind == "missing_input":
        op = rng.choice([o for o in ops if o["args"]])
        op["args"][0]["arg_ops"] = ["no_such_op"]
    elif kind in ("size_huge", "size_negative", "size_zero"):
        sizes = dict(a["reg_id_to_size"].value)
        k = rng.choice(sorted(sizes))
        sizes[k] = {"size_huge": 1 << 40, "size_negative": -5, "size_zero": 0}[kind]
        a["reg_id_to_size"] = Attr(a["reg_id_to_size"].kind, sizes)
    elif kind == "const_short":
        sizes = dict(a["reg_id_to_size"].value)
        params = a["reg_id_to_parameter_value"].value
        k = next(iter(params))
        params[k] = params[k][: len(params[k]) // 2]
    elif kind == "ddr_huge":
        t["tensor_attr"]["ddr_addr"] = Attr("int32_value", rng.choice([2**31 - 1, -7]))
    elif kind in ("stride_zero", "stride_negative", "stride_len"):
        st = t["tensor_attr"].get("stride")
        n = len(t["tensor_dim"])
        v = {"stride_zero": [0] * n, "stride_negative": [-1] * n, "stride_len": [1] * (n + 2)}[kind]
        t["tensor_attr"]["stride"] = Attr(st.kind if st else "int32_vec_value", v)
    elif kind == "fingerprint":
        a["dpu_fingerprint"] = Attr(a["dpu_fingerprint"].kind, rng.randrange(1 << 63))
    elif kind == "sub_dup_op":
        leaf = next(s for s in sub["subg_child"] if s["op_name"]) if sub["subg_child"] else sub
        other = next(c for c in g["subg_root"]["subg_child"] if c is not sub and c["op_name"])
        other["op_name"].append(leaf["op_name"][0])
    elif kind == "attr_kind":
        key = rng.choice(["mc_code", "reg_id_to_size", "dpu_fingerprint", "reg_id_to_parameter_value"])
        a[key] = rng.choice([Attr("string_value", "x"), Attr("int32_value", 3), Attr("bool_value", True)])
    elif kind == "fix_point":
        t["tensor_attr"]["fix_point"] = Attr("int32_value", rng.choice([-200, 100, 2**31 - 1]))
    elif kind == "data_type":
        t["data_type"], t["tensor_bit_width"] = rng.choice([(4, 32), (0, 64), (9, 8), (0, 0)])
    elif kind == "op_type":
        rng.choice(ops)["op_type"] = rng.choice(["conv2d-fix", "no-such-op", "", "softmax"])
    else:
        raise ValueError(kind)


XMODEL_SEMANTIC = list(MUST_REFUSE[:-1]) + ["mc_random", "size_zero", "fix_point", "data_type", "op_type"]


def xmodel_cases(n: int, seed: int, d: Path) -> list[dict]:
    """`n` mutations of each vendored xmodel: semantic edits of the decoded graph (re-encoded) and byte-level flips
    and truncations. Each item says whether running it would be a defect (`must_refuse`)."""
    from tvm_dpu.xmodel.encode import encode_graph
    from tvm_dpu.xmodel.reader import decode_graph

    rng = random.Random(seed)
    items = []
    for src in XMODELS:
        data = src.read_bytes()
        for i in range(n):
            kind = XMODEL_SEMANTIC[i % len(XMODEL_SEMANTIC)] if i < len(XMODEL_SEMANTIC) else rng.choice(
                XMODEL_SEMANTIC + ["truncate", "flip"])
            if kind == "truncate":
                b = data[: rng.randrange(len(data))]
            elif kind == "flip":
                b = bytearray(data)
                for _ in range(rng.randint(1, 8)):
                    b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
                b = bytes(b)
            else:
                g = decode_graph(data, str(src))
                _xmodel_mutant(g, kind, rng)
                b = encode_graph(g)
            f = d / f"{src.stem}.{i}.{kind}.xmodel"
            f.write_bytes(b)
            items.append({"kind": "xmodel", "path": str(f), "mutation": kind, "must_refuse": kind in MUST_REFUSE})
    return items


def xmodel_case(item: dict) -> str:
    """inspect (text and JSON) and run one mutated xmodel the way the CLI does; the outcome."""
    from tvm_dpu.cli import _feeds_for
    from tvm_dpu.xmodel.commands import inspect_json, inspect_text
    from tvm_dpu.xmodel.model import read_xmodel
    from tvm_dpu.xmodel.runner import load_xmodel

    model = read_xmodel(item["path"])
    inspect_text(model, disasm=True)
    inspect_json(model)
    runner = load_xmodel(model)
    runner.run(_feeds_for(runner, None, "--input"))
    return "wrong" if item["must_refuse"] else "changed"


# ------------------------------------------------------------------------------------------ round three (issue 40)
RUNNER_CASES = ["out_uint8", "out_int32", "out_int64", "wait_str", "wait_none", "wait_float", "timeout_negative",
                "after_close", "threads_str", "threads_float", "threads_huge"]
TRUST_FILE_CASES = ["record_0666", "record_dir_0777", "record_other_owner", "keys_file_0666", "listed_key_0666"]
STREAM_KINDS = ["artifact", "xmodel", "key", "manifest", "signature", "npz"]


def runner_case(case: str) -> None:
    """One misuse of the VART-style runner on the vendored MNIST xmodel; raises what the project raises."""
    from tvm_dpu.serving.runner import create_runner

    mnist = str(XMODELS[0])
    if case.startswith("threads_"):
        create_runner(mnist, num_threads={"threads_str": "2", "threads_float": 2.5, "threads_huge": 10 ** 6}[case])
        return
    r = create_runner(mnist)
    (t_in,), (t_out,) = r.get_input_tensors(), r.get_output_tensors()
    x = np.zeros(t_in.shape, np.float32)
    if case.startswith("out_"):
        r.run(x, [np.zeros(t_out.shape, {"out_uint8": np.uint8, "out_int32": np.int32, "out_int64": np.int64}[case])])
    elif case == "after_close":
        r.close()
        r.execute_async(x)
    else:
        job = r.execute_async(x)
        r.wait(*{"wait_str": ("abc",), "wait_none": (None,), "wait_float": (float(job.id) + 0.7,),
                 "timeout_negative": (job, -1)}[case])


def trust_file_case(case: str, artifact: str) -> str:
    """Load an artifact built elsewhere whose identity is vouched for by a build record (or signed by a key listed
    in a trusted-keys file) that another user could write: it must be refused."""
    from tvm_dpu.security import signing, trust

    import tvm_dpu

    cfg = Path(tempfile.mkdtemp(prefix="tvm_dpu_cfg_"))
    os.environ["TVM_DPU_CONFIG_DIR"] = str(cfg)
    data = Path(artifact).read_bytes()
    if case.startswith("record"):
        rec = cfg / "built"
        rec.write_text(trust.artifact_id(signing.split(data)[0]) + "\n")
        os.chmod(rec, 0o666 if case == "record_0666" else 0o600)
        if case == "record_dir_0777":
            os.chmod(cfg, 0o777)
        if case == "record_other_owner":
            if os.getuid() != 0:
                return "clean"  # only root can give a file away; nothing to test as another user
            os.chown(rec, 12345, 12345)
        tvm_dpu.load(artifact)
        return "wrong"
    priv, pub = signing.generate_keypair(cfg / "k")
    signed = cfg / "signed.tvmdpu"
    signed.write_bytes(signing.sign(data, priv))
    (cfg / "trusted_keys").write_text("k.pub\n")
    os.chmod(cfg / "trusted_keys", 0o666 if case == "keys_file_0666" else 0o600)
    os.chmod(pub, 0o666 if case == "listed_key_0666" else 0o644)
    tvm_dpu.load(signed)
    return "wrong"


def stream_case(kind: str, path: str) -> None:
    """An endless stream (/dev/zero) or a FIFO given where a file of `kind` is read; raises what the project raises."""
    import tvm_dpu

    if kind == "artifact":
        tvm_dpu.load(path, trust="unsigned")
    elif kind == "xmodel":
        from tvm_dpu.xmodel.model import read_xmodel

        read_xmodel(path)
    elif kind == "key":
        from tvm_dpu.security.signing import public_key_bytes

        public_key_bytes(path)
    elif kind in ("manifest", "signature"):
        from tvm_dpu.pipeline.model import read_pipeline_json

        d = Path(tempfile.mkdtemp(prefix="tvm_dpu_pipe_"))
        if kind == "signature":
            (d / "pipeline.json").write_text("{}")
            os.symlink(path, d / "pipeline.sig")
            read_pipeline_json(d / "pipeline.json", trusted_keys=[b"\1" * 32])
        else:
            os.symlink(path, d / "pipeline.json")
            read_pipeline_json(d / "pipeline.json")
    elif kind == "npz":
        from tvm_dpu.serving.feeds import load_npz

        load_npz(path)
    else:
        raise ValueError(kind)


def stream_items(d: Path) -> list[dict]:
    fifo = d / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    return [{"kind": "stream", "case": k, "path": p} for k in STREAM_KINDS for p in ("/dev/zero", str(fifo))]


def cli_arg_items(d: Path) -> list[dict]:
    """argv that must exit 2: counts past their bound, dse flags that are invalid or would be ignored."""
    onnx_path = d / "dse.onnx"
    from tvm_dpu import zoo

    import onnx

    onnx.save(zoo.build_model("mixed_cnn", reduced=True), onnx_path)
    m = str(onnx_path)
    argv = [["benchmark", str(XMODELS[0]), "--runs", "10000000000000000000000"],
            ["run", str(XMODELS[0]), "--runs", "10000000000000000000000"],
            ["dse", m, "--part", "zu3eg", "--ddr-gbps", "-5"],
            ["dse", m, "--part", "zu3eg", "--ddr-gbps", "0.001"],
            ["dse", m, "--dsp", "1000", "--bram", "200", "--ddr-gbps", "nan"],
            ["dse", m, "--dsp", "-3", "--bram", "200"],
            ["dse", m, "--part", "zu3eg", "--clock-mhz", "inf"],
            ["run", str(XMODELS[0]), "--min-release", "2"]]
    return [{"kind": "cli", "argv": a} for a in argv]


# ------------------------------------------------------------------------------------------ the child: run cases
def child(args) -> None:
    import tvm_dpu
    from tvm_dpu.errors import DPUError

    cases = json.loads(Path(args.child).read_text())
    x = np.load(cases["x"]) if "x" in cases else None
    expected = np.load(cases["expected"]) if "expected" in cases else None
    import contextlib

    protocol = sys.stdout
    for i in range(args.start, len(cases["items"])):
        item = cases["items"][i]
        kind = item["kind"]
        detail = ""
        try:
            quiet = contextlib.redirect_stdout(sys.stderr)  # stdout carries only the outcome records
            quiet.__enter__()
            if kind == "artifact":
                m = tvm_dpu.load(item["path"], trusted_keys=item.get("trusted"), trust=item.get("trust", "unsigned"))
                y = m.run(x)[0]
                out = "same" if np.array_equal(y, expected) else ("changed" if item.get("forged") else "wrong")
            elif kind == "npz":
                from tvm_dpu.cli import main

                rc = main(["run", cases["artifact"], "--input", item["path"]])
                out = "clean" if rc == 2 else "wrong"
            elif kind == "input":
                m = tvm_dpu.load(cases["artifact"])
                m.run(_bad_input(item["case"], x))
                out = "wrong"  # a bad input that ran
            elif kind == "cli":
                from tvm_dpu.cli import main

                try:
                    rc = main(item["argv"])
                except SystemExit as e:  # argparse's own refusals exit 2 too
                    rc = e.code
                out = "clean" if rc == 2 else "wrong"
            elif kind == "pipeline":
                from tvm_dpu.pipeline import PipelineModel

                pipe = PipelineModel.load(item["path"], trusted_keys=item.get("trusted"),
                                          trust=item.get("trust", "auto"), min_release=item.get("min_release"))
                with pipe:
                    y = pipe.run(np.load(item["x"]))[0]
                out = "same" if item.get("benign") and np.array_equal(y, np.load(item["expected"])) else "wrong"
            elif kind == "plugin":
                _plugin_case(item["case"], cases["onnx"], x)
                out = "wrong"
            elif kind == "keys":
                tvm_dpu.load(cases["artifact"], trusted_keys=_bad_keys(item["case"]))
                out = "wrong"
            elif kind == "xmodel":
                out = xmodel_case(item)
            elif kind == "runner":
                runner_case(item["case"])
                out = "wrong"
            elif kind == "trustfile":
                out = trust_file_case(item["case"], cases["artifact"])
            elif kind == "stream":
                stream_case(item["case"], item["path"])
                out = "wrong"
            elif kind == "array":
                m = tvm_dpu.load(cases["artifact"])
                base = np.zeros(16, np.float32)
                m.run(np.lib.stride_tricks.as_strided(base, shape=(1, 3, 65536, 65536), strides=(0, 0, 0, 0)))
                out = "wrong"
            else:
                raise ValueError(kind)
        except DPUError:
            out = "clean"
        except MemoryError as e:
            out, detail = "memory", f"MemoryError: {str(e)[:200]}"
        except Exception as e:  # noqa: BLE001 - counting foreign exceptions is the point
            out, detail = "other_exc", f"{type(e).__name__}: {str(e)[:200]}"
        finally:
            quiet.__exit__(None, None, None)
        print(json.dumps({"i": i, "outcome": out, "detail": detail}), file=protocol, flush=True)


def _bad_input(case: str, x: np.ndarray):
    return {"nan": np.where(np.arange(x.size).reshape(x.shape) % 7 == 0, np.nan, x),
            "inf": x * np.inf, "bool": x > 0, "complex": x.astype(np.complex64),
            "object": np.array(x, dtype=object), "str": x.astype(str), "extra": {"input": x, "more": x},
            "missing": {"other": x}, "shape": x[:, :, :10], "rank": x[0], "list": [x, x]}[case]


INPUT_CASES = ["nan", "inf", "bool", "complex", "object", "str", "extra", "missing", "shape", "rank", "list"]


PLUGIN_CASES = ["partition", "float_reference", "compile", "nan_reference", "inf_runner", "broken_entry_point",
                "bad_claims"]


def _plugin_case(case: str, onnx_path: str, x: np.ndarray) -> None:
    """Build (and run) the model with a misbehaving plugin that claims its last op; raises what the project
    raises."""
    import tvm_dpu
    from tvm_dpu.plugins import Plugin, get_plugin

    class Misbehaving(Plugin):
        name = f"bad_{case}"

        def partition(self, graph):
            if case == "partition":
                raise ZeroDivisionError("plugin bug")
            if case == "bad_claims":
                return [42, None, "x"]
            return graph.ops[-1:]

        def float_reference(self, subgraph, inputs):
            if case == "float_reference":
                raise ZeroDivisionError("plugin bug")
            fill = np.nan if case == "nan_reference" else 0.0
            return [np.full(s, fill, np.float32) for s in subgraph.output_shapes]

        def compile(self, subgraph, calibration):
            if case == "compile":
                raise ZeroDivisionError("plugin bug")
            return b"\x00"

        def sim(self, payload, inputs):
            return [np.full_like(inputs[0], np.inf)]

        ref = sim

    if case == "broken_entry_point":
        from importlib.metadata import EntryPoint

        import tvm_dpu.plugins.registry as registry

        ep = EntryPoint(name="broken_ep", value="no_such_module_xyz:P", group=registry.ENTRY_POINT_GROUP)
        registry.entry_points = lambda group: [ep]
        get_plugin("broken_ep")
        return
    compiled = tvm_dpu.build(onnx_path, arch=ARCH, calibration=[x], progress=False, plugins=[Misbehaving])
    compiled.run(x)


def _bad_keys(case: str):
    return {"short": b"\x01" * 7, "int": 12345, "dict": {"k": 1}}[case]


def bounded_npz_cases(d: Path) -> list[Path]:
    """.npz files that cost huge memory if read before their headers are checked."""
    import io
    import zipfile

    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.zeros(10, np.float32))
    with zipfile.ZipFile(d / "claims_1e13.npz", "w") as z:
        z.writestr("input.npy", buf.getvalue().replace(b"'shape': (10,)", b"'shape': (10000000000000,)"))
    np.savez_compressed(d / "bomb.npz", input=np.zeros((1, 3, 4096, 4096), np.float32))
    raw = io.BytesIO()
    np.lib.format.write_array(raw, np.zeros((1, 3, 64, 64), np.float32))
    import warnings

    with warnings.catch_warnings(), zipfile.ZipFile(d / "dup.npz", "w") as z:
        warnings.simplefilter("ignore")
        z.writestr("input.npy", raw.getvalue())
        z.writestr("input.npy", raw.getvalue())
    return [d / "claims_1e13.npz", d / "bomb.npz", d / "dup.npz"]


def onnx_cases(d: Path) -> list[list[str]]:
    """argv of `tvm-dpu compile` on invalid models (and nested JSON options): each must exit 2."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh
    from onnx import save

    def conv(name, pads=(1, 1, 1, 1), dil=(1, 1), ks=(3, 3), out=(1, 8, 8, 8), x_type=T.FLOAT):
        w = nh.from_array(np.ones((8, 3, 3, 3), np.float32), "W")
        nodes = [h.make_node("Conv", ["x", "W"], ["y"], pads=list(pads), dilations=list(dil), kernel_shape=list(ks))]
        if x_type != T.FLOAT:
            nodes.insert(0, h.make_node("Cast", ["xi"], ["x"], to=T.FLOAT))
        g = h.make_graph(nodes, "g", [h.make_tensor_value_info("xi" if x_type != T.FLOAT else "x", x_type,
                                                               [1, 3, 8, 8])],
                         [h.make_tensor_value_info("y", T.FLOAT, list(out))], [w])
        save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), d / f"{name}.onnx")
        return d / f"{name}.onnx"

    def graph(name, nodes, inputs, outputs, inits=()):
        save(h.make_model(h.make_graph(nodes, "g", inputs, outputs, list(inits)),
                          opset_imports=[h.make_opsetid("", 17)]), d / f"{name}.onnx")
        return d / f"{name}.onnx"

    x = h.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])
    models = [conv("pads", pads=(-1, -1, -1, -1), out=(1, 8, 4, 4)), conv("dil0", dil=(0, 0)),
              conv("kshape", ks=(5, 5)), conv("outdecl", out=(1, 5)), conv("int64_in", x_type=T.INT64),
              graph("int64_out", [h.make_node("ArgMax", ["x"], ["y"], axis=1)], [x],
                    [h.make_tensor_value_info("y", T.INT64, [1, 1, 8, 8])]),
              graph("nonzero", [h.make_node("NonZero", ["x"], ["n"]), h.make_node("Cast", ["n"], ["y"], to=T.FLOAT)],
                    [x], [h.make_tensor_value_info("y", T.FLOAT, [4, None])]),
              graph("noinput", [h.make_node("Relu", ["c"], ["y"])], [], [h.make_tensor_value_info("y", T.FLOAT, [4])],
                    [nh.from_array(np.ones(4, np.float32), "c")])]
    out = [["compile", str(m), "-o", str(d / "o"), "-q"] for m in models]
    deep = d / "deep_arch.json"
    deep.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    ok = conv("ok")
    out.append(["compile", str(ok), "--arch", str(deep), "-o", str(d / "o"), "-q"])
    out.append(["compile", str(ok), "--options", "[" * 100_000 + "]" * 100_000, "-o", str(d / "o"), "-q"])
    return out


def pipeline_cases(d: Path) -> tuple[list[dict], str]:
    """Signed pipelines (of a one-subgraph model: a reduced ResNet-18) tampered with; returns the items and the
    trusted public key."""
    import shutil

    import tvm_dpu
    from tvm_dpu import zoo
    from tvm_dpu.pipeline import PipelineModel
    from tvm_dpu.security.signing import generate_keypair

    x = zoo.random_input("resnet18", reduced=True, seed=3)
    compiled = tvm_dpu.build(zoo.build_model("resnet18", reduced=True), arch=ARCH, calibration=[x], progress=False)
    np.save(d / "pipe_x.npy", x)
    priv, pub = generate_keypair(d / "pipekey")
    good, other = d / "pipe_good", d / "pipe_other"
    three = PipelineModel.from_model(compiled, boards=3)
    three.save(good, sign=priv, release="2.0")
    three.save(d / "pipe_release1", sign=priv, release="1.9")  # an older signed release of the same pipeline
    PipelineModel.from_model(compiled, boards=2).save(other, sign=priv)
    np.save(d / "pipe_expected.npy", compiled.run(x)[0])
    items = [{"kind": "pipeline", "path": str(good), "benign": True}]

    def variant(name, edit):
        v = d / f"pipe_{name}"
        shutil.copytree(good, v)
        edit(v)
        items.append({"kind": "pipeline", "path": str(v)})

    def fix_point(v):
        doc = json.loads((v / "pipeline.json").read_text())
        k = next(iter(doc["stages"][0]["wire_fix_points"]))
        doc["stages"][0]["wire_fix_points"][k] += 2
        (v / "pipeline.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")

    def foreign(v):
        data = (other / "stage1.tvmdpu").read_bytes()
        (v / "stage1.tvmdpu").write_bytes(data)
        doc = json.loads((v / "pipeline.json").read_text())
        doc["stages"][1]["sha256"] = hashlib.sha256(data).hexdigest()
        (v / "pipeline.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")

    variant("fixpoint", fix_point)
    variant("foreign_stage", foreign)
    variant("unsigned", lambda v: (v / "pipeline.sig").unlink(missing_ok=True))
    variant("deep", lambda v: (v / "pipeline.json").write_bytes(b"[" * 100_000 + b"]" * 100_000))
    for it in items:
        it.update(trusted=[str(pub)], x=str(d / "pipe_x.npy"), expected=str(d / "pipe_expected.npy"))
    # the edited fix point with no key at all and --allow-unsigned: the stages' own headers must refuse it
    items.append({**items[1], "trusted": None, "trust": "unsigned"})
    items.append({**items[0], "path": str(d / "pipe_release1"), "benign": False, "min_release": "2.0"})
    items.append({**items[0], "min_release": "2.0"})  # the current release passes the same bar
    return items, str(pub)


def binding_cases(art: Path, d: Path) -> list[Path]:
    """The duplicate-program forgery: a second copy of a subgraph's program appended to the library."""
    from tvm_dpu.security.program_blob import MAGIC as BLOB_MAGIC
    from tvm_dpu.util.toolchains import host_machine

    header, sections = _container(art)
    key = f"lib.{host_machine()}"
    lib = sections[key]
    pos = lib.find(BLOB_MAGIC)
    hlen = int.from_bytes(lib[pos + 12: pos + 20], "little")
    blen = int.from_bytes(lib[pos + 20: pos + 28], "little")
    sections[key] = lib + lib[pos: pos + 60 + hlen + blen]
    f = d / "dup_program.tvmdpu"
    f.write_bytes(_pack(header, sections))
    return [f]


def leak_figure(art: Path, loads: int = 2000) -> dict:
    """RSS growth and mappings of deleted files over `loads` loads (every 10th load runs), in a child process."""
    code = f"""
import gc, json, numpy as np, tvm_dpu
from tvm_dpu import zoo
def rss(): return int(open('/proc/self/statm').read().split()[1]) * 4096 / 2 ** 20
def maps(): return sum(1 for l in open('/proc/self/maps') if '(deleted)' in l)
x = np.load({str(art.parent / 'x.npy')!r})
m = tvm_dpu.load({str(art)!r}); m.run(x); del m; gc.collect()
r0, m0 = rss(), maps()
for i in range({loads}):
    m = tvm_dpu.load({str(art)!r})
    if i % 10 == 0: m.run(x)
    del m
gc.collect()
print(json.dumps({{"loads": {loads}, "rss_growth_mib": round(rss() - r0, 1), "deleted_mappings_before": m0,
                  "deleted_mappings_after": maps()}}))
"""
    # cwd: the temp dir, so "-c"'s sys.path[0] ('') does not shadow the tvm_dpu under test
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800, cwd=art.parent)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _memory_cap(gib: float):
    """A preexec_fn capping the child's address space at `gib` GiB (so a blow-up is a MemoryError there)."""
    def cap() -> None:
        import resource

        limit = int(gib * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return cap


def run_campaign(name: str, items: list[dict], common: dict, d: Path, timeout: float,
                 memory_gib: float = MEMORY_CAP_GIB) -> dict:
    counts = {k: 0 for k in ("cases", "clean", "same", "changed") + BAD}
    bad_cases: list[str] = []
    spec = d / f"{name}.json"
    spec.write_text(json.dumps({**common, "items": items}))
    start = 0
    while start < len(items):
        proc = subprocess.Popen([sys.executable, __file__, "--child", str(spec), "--start", str(start)],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                preexec_fn=_memory_cap(memory_gib))
        done = start
        t_case = time.monotonic()
        try:
            import selectors

            sel = selectors.DefaultSelector()
            sel.register(proc.stdout, selectors.EVENT_READ)
            while True:
                if not sel.select(timeout=max(0.0, timeout - (time.monotonic() - t_case))):
                    proc.kill()
                    counts["hang"] += 1
                    bad_cases.append(f"{_case_name(items[done])}: hang")
                    done += 1
                    break
                line = proc.stdout.readline()
                if not line:
                    proc.wait()
                    if done < len(items):  # died in the middle of case `done`
                        counts["crash"] += 1
                        bad_cases.append(f"{_case_name(items[done])}: crash (status {proc.returncode})")
                        done += 1
                    break
                if not line.startswith('{"i"'):
                    continue  # anything else a case printed (the CLI's own output goes to stderr; be safe)
                rec = json.loads(line)
                counts[rec["outcome"]] += 1
                if rec["outcome"] in BAD:
                    bad_cases.append(_case_name(items[rec["i"]]) + (f": {rec['detail']}" if rec["detail"] else ""))
                done = rec["i"] + 1
                t_case = time.monotonic()
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        start = done
    counts["cases"] = len(items)
    if bad_cases:
        counts["bad_cases"] = bad_cases[:50]
        for line in bad_cases[:20]:
            print(f"  {name}: {line}")
    return counts


def _case_name(item: dict) -> str:
    return Path(item["path"]).name if "path" in item else str(item.get("case", item.get("argv", item["kind"])))


def thread_campaign(art: Path, x: np.ndarray, expected: np.ndarray, threads: int = 8, runs: int = 20) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    import tvm_dpu

    m = tvm_dpu.load(art)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        results = list(pool.map(lambda _: m.run(x)[0], range(threads * runs)))
    wrong = sum(not np.array_equal(y, expected) for y in results)
    return {"cases": len(results), "clean": 0, "same": len(results) - wrong, "changed": 0, "other_exc": 0,
            "memory": 0, "crash": 0, "hang": 0, "wrong": wrong}


def artifact_campaigns(args, d: Path, only: set[str] | None) -> tuple[dict[str, dict], dict | None]:
    """The campaigns on a compiled artifact (all but xmodel) and the leak figure."""
    import onnx

    import tvm_dpu
    from tvm_dpu import zoo
    from tvm_dpu.security.signing import generate_keypair

    model = zoo.build_model("mixed_cnn")
    compiled = tvm_dpu.build(model, arch=ARCH, calibration=[zoo.random_input(model, seed=s) for s in range(2)],
                             progress=False)
    art = compiled.export(d / "model.tvmdpu")
    priv, pub = generate_keypair(d / "key")
    x = zoo.random_input(model, seed=3)
    expected = compiled.run(x)[0]
    np.save(d / "x.npy", x)
    np.save(d / "expected.npy", expected)
    onnx.save(model, d / "model.onnx")
    common = {"x": str(d / "x.npy"), "expected": str(d / "expected.npy"), "artifact": str(art),
              "onnx": str(d / "model.onnx")}
    n = args.cases
    forged = program_cases(art, n, args.seed + 2, d, forge=True)
    campaigns = {
        "header": [{"kind": "artifact", "path": str(p)} for p in header_cases(art, n, args.seed, d)],
        "program": [{"kind": "artifact", "path": str(p)} for p in program_cases(art, n, args.seed + 1, d, False)],
        "forged": [{"kind": "artifact", "path": str(p), "forged": True} for p in forged],
        "bytes": [{"kind": "artifact", "path": str(p)} for p in byte_cases(art, n, args.seed + 3, d)],
        "npz": [{"kind": "npz", "path": str(p)} for p in npz_cases(d)],
        "inputs": [{"kind": "input", "case": c} for c in INPUT_CASES],
        "bounded": [{"kind": "npz", "path": str(p)} for p in bounded_npz_cases(d)] + [{"kind": "array"}],
        "onnx": [{"kind": "cli", "argv": a} for a in onnx_cases(d)],
        "plugins": [{"kind": "plugin", "case": c} for c in PLUGIN_CASES],
        "binding": [{"kind": "artifact", "path": str(p)} for p in binding_cases(art, d)],
        "keys": [{"kind": "keys", "case": c} for c in ("short", "int", "dict")],
        "trust": [{"kind": "artifact", "path": str(p), "trust": "auto"} for p in forged],
        "trust_files": [{"kind": "trustfile", "case": c} for c in TRUST_FILE_CASES],
    }
    pipe_items, _ = pipeline_cases(d)
    campaigns["pipeline"] = pipe_items
    # Forged files carrying the trailer of the original's signature: with the key trusted, every one must be
    # refused (the signature covers every byte).
    from tvm_dpu.security.signing import TRAILER_SIZE, sign

    trailer = sign(art.read_bytes(), priv)[-TRAILER_SIZE:]
    signed = []
    for p in forged[: max(1, n // 4)]:
        q = p.with_suffix(".signed")
        q.write_bytes(p.read_bytes() + trailer)
        signed.append({"kind": "artifact", "path": str(q), "trusted": [str(pub)]})
    campaigns["forged+signature"] = signed
    results = {}
    for name, items in campaigns.items():
        if only is None or name in only:
            results[name] = run_campaign(name, items, common, d, args.timeout)
    if only is None or "threads" in only:
        results["threads"] = thread_campaign(art, x, expected)
    if only is not None and "leak" not in only:
        return results, None
    leak = leak_figure(art, args.loads)
    print(f"leak: {leak['loads']} loads -> RSS +{leak['rss_growth_mib']} MiB, mappings of deleted files "
          f"{leak['deleted_mappings_before']} -> {leak['deleted_mappings_after']}")
    # A signed forged file that loaded would be a defect: count it as wrong; so would a forged file the trust
    # policy let through.
    for name in ("forged+signature", "trust"):
        fs = results.get(name)
        if fs is not None:
            fs["wrong"] += fs["same"] + fs["changed"]
            fs["same"] = fs["changed"] = 0
    return results, leak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=200, help="cases per mutation campaign (default 200)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one case may take before it is a hang")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    ap.add_argument("--loads", type=int, default=2000, help="loads in the leak figure (default 2000)")
    ap.add_argument("--only", help="comma-separated campaigns to run (e.g. xmodel); default all, with the leak figure")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    t0 = time.perf_counter()
    d = Path(tempfile.mkdtemp(prefix="tvm_dpu_rel_"))
    # The trust policy's records of artifacts built here go to this run's own config (children inherit it).
    os.environ["TVM_DPU_CONFIG_DIR"] = str(d / "config")
    only = set(args.only.split(",")) if args.only else None
    n = args.cases
    results: dict[str, dict] = {}
    leak = None
    standalone = {"xmodel": lambda: xmodel_cases(n, args.seed + 5, d),
                  "runner_args": lambda: [{"kind": "runner", "case": c} for c in RUNNER_CASES],
                  "streams": lambda: stream_items(d), "cli_args": lambda: cli_arg_items(d)}
    if only is None or only - set(standalone):
        results, leak = artifact_campaigns(args, d, only)
    for name, items in standalone.items():
        if only is None or name in only:
            results[name] = run_campaign(name, items(), {}, d, args.timeout)
    cols = ("cases", "clean", "same", "changed") + BAD
    rows = [("campaign",) + cols] + [(k,) + tuple(str(v[c]) for c in cols) for k, v in results.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for j, r in enumerate(rows):
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if j == 0:
            print("  ".join("-" * w for w in widths))
    bad = sum(v[c] for v in results.values() for c in BAD)
    print(f"bad outcomes (other exceptions, crashes, hangs, wrong outputs): {bad}; "
          f"{time.perf_counter() - t0:.0f} s")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.json, {"cases_per_campaign": n, "seed": args.seed, "results": results,
                                     "bad_total": bad, "leak": leak})
    print(f"wrote {args.json}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
