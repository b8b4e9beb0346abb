"""The second DPU family as data: DPUCAHX8H (Alveo U50/U50LV/U280) targets from AMD's target factory, its "DPUV3E"
instruction set as a field table served by the one encoder/decoder, and vai_c's U50LV programs (tests/data/xmodel/
dpucahx8h, see PROVENANCE.md there) decoded instruction by instruction, run on the DPUV3E emulator and checked
against the ISA1 build of the same network and tvm-dpu's golden reference; compiling is refused naming what is
missing."""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tvm_dpu.arch import load_arch, list_presets
from tvm_dpu.arch.arch import arch_from_fingerprint, decode_fingerprint, families, family_targets, require_support
from tvm_dpu.codegen.asm import disassemble, format_instr
from tvm_dpu.codegen.isa import (ISA_FILES, Instr, decode, decode_program, encode, encode_program, instr_specs,
                                 make_instr)
from tvm_dpu.errors import ArchError, ISAError, XModelError
from tvm_dpu.xmodel.commands import inspect_json, inspect_text
from tvm_dpu.xmodel.model import read_xmodel
from tvm_dpu.xmodel.runner import load_xmodel

DATA = Path(__file__).parent / "data" / "xmodel" / "dpucahx8h"
U50LV = DATA / "tf2_custom_op_vai2.0_u50lv.xmodel"
U50LV_DWC = DATA / "tf2_custom_op_vai2.0_u50lv_dwc.xmodel"
#: every vendored file and its target: Vitis AI 2.0's carry the older fingerprints (aliases), 2.5's the current ones
FILES = [(U50LV, "DPUCAHX8H_ISA2", 0x020200000000002A), (U50LV_DWC, "DPUCAHX8H_ISA2_DWC", 0x020200000000002B),
         (DATA / "tf2_custom_op_vai2.5_u50lv.xmodel", "DPUCAHX8H_ISA2", 0x020200000010002A),
         (DATA / "tf2_custom_op_vai2.5_u50lv_dwc.xmodel", "DPUCAHX8H_ISA2_DWC", 0x020200000010002B)]
# The simulator's DPUV3E table (dpuv3e.xml): name -> (opcode, words)
TABLE = {"LOAD": (0x0, 6), "SAVE": (0x4, 4), "CONVINIT": (0x9, 4), "CONV": (0x8, 5), "POOLINIT": (0x6, 2),
         "POOL": (0xC, 5), "DWINIT": (0xB, 4), "DPTWISE": (0xA, 5), "ELEWINIT": (0xD, 2), "ELEW": (0xE, 3),
         "END": (0x7, 1)}


# ---- the field table -----------------------------------------------------------------------------------------
def test_dpuv3e_table_has_the_simulators_instructions():
    specs = instr_specs("DPUV3E")
    assert {n: (s.opcode, s.words) for n, s in specs.items()} == TABLE
    # DPUV3E differs from DPUV2 where vai_c's U50 programs need it: LOAD is 6 words with a second DDR address,
    # SAVE 4 words, bank addresses 13 bits (8192-row image banks); there is no ALU
    v2 = instr_specs()
    assert v2["LOAD"].words == 5 and v2["SAVE"].words == 5 and "ALU" in v2 and "ALU" not in specs
    load = {f.name: f for f in specs["LOAD"].fields}
    assert (load["ddr_addr_1"].word, load["reg_id_1"].pos, load["bank_addr"].len) == (5, 29, 13)


@pytest.mark.parametrize("isa", list(ISA_FILES))
def test_fields_fit_their_words_and_never_overlap(isa):
    header = 0xFFF00000  # opcode, dpdon, dpdby
    for spec in instr_specs(isa).values():
        used = [header] + [0] * (spec.words - 1)
        for f in spec.fields:
            assert 0 <= f.pos and f.pos + f.len <= 32 and 0 <= f.word < spec.words, (isa, spec.name, f.name)
            mask = ((1 << f.len) - 1) << f.pos
            assert not used[f.word] & mask, (isa, spec.name, f.name)
            used[f.word] |= mask


@pytest.mark.parametrize("name", list(TABLE))
def test_every_instruction_round_trips_at_min_and_max(name):
    spec = instr_specs("DPUV3E")[name]
    lo = make_instr(name, isa="DPUV3E")
    hi = Instr(name, {f.name: f.max_value for f in spec.fields}, 15, 15)
    for ins in (lo, hi):
        words = encode(ins, "DPUV3E")
        assert len(words) == spec.words and words[0] >> 28 == spec.opcode
        assert decode(words, 0, "DPUV3E") == (ins, spec.words)
    # at the maximum every bit a field owns is set, and nothing else: reserved bits stay 0
    owned = [spec.opcode << 28 | 0x0FF00000] + [0] * (spec.words - 1)
    for f in spec.fields:
        owned[f.word] |= ((1 << f.len) - 1) << f.pos
    assert encode(hi, "DPUV3E") == owned


def test_errors_name_the_instruction_set():
    with pytest.raises(ISAError, match="unknown instruction 'ALU' in DPUV3E"):
        make_instr("ALU", isa="DPUV3E")
    with pytest.raises(ISAError, match=r"unknown opcode 0x1 \(word 0x10000000\) in DPUV3E"):
        decode([0x10000000], 0, "DPUV3E")
    with pytest.raises(ISAError, match="unknown instruction set 'DPUV9'"):
        decode([0], 0, "DPUV9")
    with pytest.raises(ISAError, match="instruction 1: LOAD: field bank_addr=8192 outside 0..8191"):
        encode_program([make_instr("END", isa="DPUV3E"), make_instr("LOAD", isa="DPUV3E", bank_addr=8192)],
                       "DPUV3E")


# ---- the family: targets, fingerprints, what is supported ----------------------------------------------------
def test_targets_are_the_target_factory_prototxts():
    ahx = {a.dpu_name: a for a in family_targets()}
    assert list(ahx) == ["DPUCAHX8H_ISA2", "DPUCAHX8H_ISA2_DWC", "DPUCAHX8H_ISA2_ELP2"]
    # type 0x02 << 56 | isa_version 2 << 48 | the prototxt's feature_code
    assert [a.fingerprint for a in ahx.values()] == [0x020200000010002A, 0x020200000010002B, 0x020200000000002E]
    for a in ahx.values():
        assert (a.family, a.isa, a.instruction_set, a.pp, a.icp, a.ocp) == ("DPUCAHX8H", 2, "DPUV3E", 8, 16, 16)
        assert a.ops_per_clock == 4096 and load_arch(a.dpu_name) is a and arch_from_fingerprint(a.fingerprint) is a
        assert a.dpu_name not in list_presets()  # not a compile target until its code generator exists
    groups = {a: [(g.name, g.base_id, g.count, g.width, g.depth) for g in ahx[a].bank_groups] for a in ahx}
    assert groups["DPUCAHX8H_ISA2"] == [("VB0", 0, 8, 16, 8192), ("VB1", 8, 8, 16, 8192), ("CONVW", 16, 16, 16, 2048),
                                        ("BIAS", 32, 1, 16, 2048)]
    assert groups["DPUCAHX8H_ISA2_DWC"][3:] == [("CONVB", 32, 1, 16, 2048), ("DWCONVW", 33, 1, 16, 2048),
                                                ("DWCONVB", 34, 1, 16, 256)]
    assert ahx["DPUCAHX8H_ISA2_ELP2"].alu_pp == 2 and ahx["DPUCAHX8H_ISA2"].alu_pp == 1
    assert ahx["DPUCAHX8H_ISA2_DWC"].alu_activations == ("relu", "relu6")


def test_vitis_ai_2_0_fingerprints_select_the_same_targets():
    # Vitis AI 2.0's target factory had feature codes 0x2a / 0x2b (0x10002a / 0x10002b since 2.5)
    assert load_arch(0x020200000000002A).dpu_name == "DPUCAHX8H_ISA2"
    f = decode_fingerprint("0x020200000000002B")
    assert (f["family"], f["isa"], f["target"], f["instruction_set"]) == ("DPUCAHX8H", 2, "DPUCAHX8H_ISA2_DWC",
                                                                          "DPUV3E")
    assert f["fingerprint"] == 0x020200000010002B


def test_every_family_of_the_factory_is_known_and_dpuczdx8g_and_dpucahx8h_compile():
    fams = families()
    assert {f.code: n for n, f in fams.items()} == {1: "DPUCZDX8G", 2: "DPUCAHX8H", 3: "DPUCAHX8L", 4: "DPUCZDI4G",
                                                    5: "DPUCVDX8H", 6: "DPUCVDX8G", 7: "DPUCADF8H", 8: "IPU_PHX",
                                                    9: "DPUCV2DX8G"}
    assert all(iset in ISA_FILES for f in fams.values() for iset in f.instruction_sets.values() if iset)
    assert [n for n, f in fams.items() if f.compile] == ["DPUCZDX8G", "DPUCAHX8H"]
    for name in ("B4096", "DPUCAHX8H_ISA2", "DPUCAHX8H_ISA2_DWC"):
        require_support(load_arch(name), "compile")
        require_support(load_arch(name), "run")
    # what is still missing for DPUCAHX8H is said where it matters (no fusion templates, an unfitted timing model)
    assert not fams["DPUCAHX8H"].fusion and fams["DPUCZDX8G"].fusion
    assert "not yet validated" in fams["DPUCAHX8H"].missing and "fusion templates" in fams["DPUCAHX8H"].missing


def test_an_unsupported_family_is_refused_naming_it_and_what_is_missing(tmp_path, capsys):
    from tvm_dpu.cli import main

    model = Path(__file__).resolve().parents[1] / "examples" / "mixed_cnn.onnx"
    assert main(["compile", str(model), "--arch", "0x0300000000000001", "-o", str(tmp_path / "out")]) != 0
    err = capsys.readouterr().err
    assert "0x03 (DPUCAHX8L); tvm-dpu decodes no DPUCAHX8L fingerprint yet (no instruction table (AMD's simulator " \
           "calls its set DPUV3ME)); it compiles for 0x01 DPUCZDX8G, 0x02 DPUCAHX8H" in err
    assert not list(tmp_path.rglob("*.tvmdpu"))


# ---- vai_c's U50LV programs ----------------------------------------------------------------------------------
def test_the_vendored_files_are_there():
    assert sorted(DATA.glob("*.xmodel")) == sorted(p for p, *_ in FILES)


@pytest.mark.parametrize("path,target,fingerprint", FILES, ids=lambda v: v.name if isinstance(v, Path) else "")
def test_vai_c_u50lv_programs_decode_and_round_trip(path, target, fingerprint):
    subs = read_xmodel(path).dpu_subgraphs()
    assert [(s.dpu_name, s.fingerprint) for s in subs] == [(target, fingerprint)] * 2
    counts = []
    for s in subs:
        assert load_arch(s.fingerprint).dpu_name == target and s.instruction_set == "DPUV3E"
        words = np.frombuffer(s.mc_code, "<u4")
        prog = decode_program(words, "DPUV3E")
        assert np.array_equal(encode_program(prog, "DPUV3E"), words)  # words -> fields -> words, exact
        assert prog[-1].name == "END" and all(ins.name != "END" for ins in prog[:-1])
        # every LOAD and SAVE names one of the subgraph's regions; weights go to CONVW/BIAS (bank ids >= 16)
        for ins in prog:
            if ins.name in ("LOAD", "SAVE"):
                assert f"REG_{ins['reg_id']}" in {r.name for r in s.regions.values()}
        counts.append(Counter(ins.name for ins in prog))
    assert counts == [Counter(LOAD=39, CONV=14, POOL=10, CONVINIT=4, POOLINIT=2, SAVE=2, END=1),
                      Counter(LOAD=4, CONVINIT=1, CONV=1, SAVE=1, END=1)]
    # read with the DPUCZDX8G table the same words do not even split into instructions
    with pytest.raises(ISAError, match="truncated LOAD"):
        decode_program(np.frombuffer(subs[0].mc_code, "<u4"))


def test_inspect_lists_the_u50lv_programs_with_their_table():
    model = read_xmodel(U50LV)
    text = inspect_text(model, disasm=True)
    assert "DPUCAHX8H_ISA2 fingerprint 0x020200000000002a: 72 instructions" in text
    listing = disassemble(np.frombuffer(model.dpu_subgraphs()[1].mc_code, "<u4").astype(np.uint32), "DPUV3E")
    assert listing.rstrip("\n") in text and "ddr_addr_1=" in listing
    assert [d["instructions"]["LOAD"] for d in inspect_json(model)["dpu_subgraphs"]] == [39, 4]


@pytest.mark.parametrize("path", [p for p, *_ in FILES], ids=lambda p: p.name)
def test_weights_are_split_over_two_hbm_regions(path):
    """vai_c's U50 convention: a conv's weights are split over REG_2 (HBM segment W0) and REG_3 (W1) at the same
    offset, and one LOAD reads both parts (reg_id/ddr_addr and reg_id_1/ddr_addr_1) into bank 63; the XIR tensor
    names REG_2 and the whole size. `--check-vart`'s tensor-region rule knows the split (each part in its region),
    and names a W1 region too small for it."""
    from tvm_dpu.xmodel.vart_check import check_vart

    model = read_xmodel(path)
    for s in model.dpu_subgraphs():
        assert (s.attrs["reg_id_to_hw_segment"]["REG_2"], s.attrs["reg_id_to_hw_segment"]["REG_3"]) == ("W0", "W1")
        assert s.regions[2].size == s.regions[3].size
        weights = [model.op(n).output for n in s.subgraph.all_ops() if model.op(n).type == "const-fix"
                   and model.op(n).output.reg_id == 2]
        # each group of OCP = 16 output channels: its first 8 in W0, the other 8 (zero-padded) in W1, so each region
        # holds ceil(oc / 16) * 8 output channels of every weight tensor (conv: 784 + 25088 + 25600 = 51472 bytes;
        # dense, 10 channels: 8 + 2 padded to 8, 2048 bytes each)
        assert sum(-(-t.shape[0] // 16) * 8 * (t.nbytes // t.shape[0]) for t in weights) == s.regions[2].size
        weight_loads = [i for i in decode_program(np.frombuffer(s.mc_code, "<u4"), "DPUV3E")
                        if i.name == "LOAD" and i["reg_id"] == 2]
        assert weight_loads and all((i["reg_id_1"], i["ddr_addr_1"], i["bank_id"]) == (3, i["ddr_addr"], 63)
                                    for i in weight_loads)
    assert check_vart(model) == []
    conv = model.dpu_subgraphs()[0].subgraph
    conv.attrs["reg_id_to_size"]["REG_3"] = 25872  # W1 too small for the last conv's half (from 25872)
    conv.attrs["reg_id_to_parameter_value"]["REG_3"] = conv.attrs["reg_id_to_parameter_value"]["REG_3"][:25872]
    (finding,) = check_vart(model)
    assert finding.rule == "tensor-region" and "split to REG_3 (W1) need bytes [25872, 51472)" in finding.message


ISA1_BUILD = DATA.parent / "tf2_custom_op_vai2.5_isa1.xmodel"


@pytest.mark.parametrize("path,target,fingerprint", FILES, ids=lambda v: v.name if isinstance(v, Path) else "")
def test_vai_c_u50lv_programs_run_to_the_end_as_the_isa1_build_does(path, target, fingerprint):
    """The U50LV programs run on the DPUV3E emulator (the hard sigmoid vai_c left on the CPU for this family on the
    host) and give, input for input, the outputs of vai_c 2.5's DPUCZDX8G ISA1 build of the same quantized
    network, which the DPUV2 emulator runs."""
    ours, isa1 = load_xmodel(path), load_xmodel(ISA1_BUILD)
    assert ours.arch.dpu_name == target
    for seed in range(2):
        x = np.random.default_rng(seed).uniform(-40, 40, (1, 28, 28, 1)).astype(np.float32)
        (got,), (want,) = ours.run(x), isa1.run(x)
        assert got.std() > 0
        np.testing.assert_array_equal(got, want)
    assert {n: (st.instructions, st.ended) for n, st in ours.last_stats.items()} == {
        "subgraph_quant_conv2d": (71, True), "subgraph_quant_dense(TransferMatMulToConv2d)": (7, True)}


def test_split_weights_read_back_as_the_isa1_build_holds_them():
    """W0/W1 joined back (DpuSubgraph.const_values) are the weights the ISA1 build keeps in one region."""
    u50, isa1 = read_xmodel(FILES[2][0]), read_xmodel(ISA1_BUILD)  # vai_c 2.5 both: the same op names
    owner = {n: d for d in isa1.dpu_subgraphs() for n in d.subgraph.all_ops()}
    checked = 0
    for d in u50.dpu_subgraphs():
        assert d.weight_split() == (2, 3, 16)
        for n in d.subgraph.all_ops():
            if u50.op(n).type == "const-fix":
                want = owner[n].const_values(isa1.op(n).output)
                np.testing.assert_array_equal(d.const_values(u50.op(n).output), want)
                checked += u50.op(n).output.reg_id == 2
    assert checked == 4  # three conv weights and the dense layer's


def test_compare_puts_vai_c_beside_tvm_dpus_program(capsys):
    """compare runs vai_c's U50LV program and tvm-dpu's own DPUV3E program for the same network (rebuilt from the
    file's quantized ops) side by side: outputs and per-layer maps equal, both timed on the DPUCAHX8H model."""
    from tvm_dpu.cli import main
    from tvm_dpu.xmodel.compare import compare

    res = compare(FILES[2][0])
    assert not res.not_compared and len(res.subgraphs) == 2
    for s in res.subgraphs:
        assert s.outputs_equal and s.total > 0 and s.against == "tvm-dpu's program" and s.ours.programs == 1
        assert s.vai_c.timing_error is None and s.vai_c.cycles > 0 and s.ours.cycles > 0
        assert sum(s.ours.instructions.values()) > 0 and s.ours.instructions["CONV"] == s.vai_c.instructions["CONV"]
    conv = res.subgraphs[0]
    assert [c.op for c in conv.layers] == ["quant_conv2d", "quant_max_pooling2d"] and conv.layers_equal
    assert main(["compare", str(FILES[2][0])]) == 0
    assert "ratio ours/vai_c: 1.000" in capsys.readouterr().out  # the dense subgraph: the same program


def test_report_times_the_u50lv_programs(tmp_path, capsys):
    from tvm_dpu.cli import main

    assert main(["report", str(U50LV_DWC), "-o", str(tmp_path / "r.html")]) == 0
    out = capsys.readouterr().out
    assert "timing for 2/2 subgraph(s)" in out and "no timing model" not in out
    assert re.search(r"subgraph_quant_conv2d: [0-9,]+ cycles", out)
    assert (tmp_path / "r.html").stat().st_size > 0


# ---- AMD's simulator's own assembler (tests/data/dpuv3e_conformance, see README.md there) ---------------------
ENCODING = Path(__file__).parent / "data" / "dpuv3e_conformance" / "encoding.json"


def test_simulator_encoding_vectors():
    vectors = json.loads(ENCODING.read_text())
    assert Counter(v["instr"] for v in vectors) == {name: 12 for name in TABLE}
    for i, v in enumerate(vectors):
        ins = Instr(v["instr"], v["fields"], int(v["dpdon"], 2), int(v["dpdby"], 2))
        assert encode(ins, "DPUV3E") == v["words"], (i, v["instr"])
        assert decode(v["words"], 0, "DPUV3E") == (ins, len(v["words"])), (i, v["instr"])


#: the LOAD/SAVE-only programs (the compute ones are run by tests/test_emu_dpuv3e.py)
PROGRAMS = [c for c in json.loads((ENCODING.parent / "cases.json").read_text())
            if set(c["instructions"]) <= {"LOAD", "SAVE", "END"}]


@pytest.mark.parametrize("case", PROGRAMS, ids=lambda c: c["name"])
def test_simulator_program_vectors_decode_and_save_only_where_they_say(case):
    """The simulator's LOAD/SAVE runs: the code decodes with the DPUV3E table to the case's listing, and each region
    changed only inside the bytes its SAVEs address (ddr_addr + pixel * jump_write, channel bytes), where it holds
    bytes the LOADs read from reg 0."""
    z = np.load(ENCODING.parent / f"{case['name']}.npz")
    prog = decode_program(z["code"], "DPUV3E")
    assert "\n".join(format_instr(i, "DPUV3E") for i in prog) == str(z["listing"])
    assert [i.name for i in prog][-1] == "END" and json.loads(str(z["arch"]))["name"] == case["arch"]
    written = {rid: np.zeros(z[f"reg{rid}_in"].size, bool) for rid in case["regs_out"]}
    for s in (i for i in prog if i.name == "SAVE"):
        for p in range(s["length"]):
            start = s["ddr_addr"] + p * s["jump_write"]
            written[s["reg_id"]][start:start + s["channel"]] = True
    loaded = set(z["reg0_in"].tolist()) | {0}  # zero: bank bytes no LOAD wrote (banks start zeroed)
    for rid, mask in written.items():
        before, after = z[f"reg{rid}_in"], z[f"reg{rid}_out"]
        assert np.array_equal(before[~mask], after[~mask]), (case["name"], rid)
        assert mask.any() == (rid != 0) and set(after[mask].tolist()) <= loaded, (case["name"], rid)


# ---- the dependency protocol as vai_c's U50 programs use it (docs/dependency-protocol.md, "DPUCAHX8H") --------
def _programs(path):
    """(label, decoded DPUV3E instructions) of every DPU subgraph and every per-layer child program of a file."""
    model = read_xmodel(path)
    for d in model.dpu_subgraphs():
        yield d.name, decode_program(np.frombuffer(d.mc_code, "<u4"), "DPUV3E")
        for c in d.subgraph.children:
            if isinstance(c.attrs.get("mc_code"), bytes):
                yield c.name, decode_program(np.frombuffer(c.attrs["mc_code"], "<u4"), "DPUV3E")


@pytest.mark.parametrize("path,target,fingerprint", FILES, ids=lambda v: v.name if isinstance(v, Path) else "")
def test_u50_programs_balance_their_tokens(path, target, fingerprint):
    """Every program balances its tokens pair by pair and ends `SAVE ..by=S; END on=S`; vai_c 2.0 sets each
    instruction's own-engine bits as on DPUCZDX8G, vai_c 2.5 clears them all but the last SAVE's post to END (and,
    in two of the per-layer programs, one LOAD's post to a later LOAD)."""
    from tvm_dpu.timing.depcheck import check, engine_of

    vai2_0 = "vai2.0" in path.name
    for label, ins in _programs(path):
        r = check(ins, isa="DPUV3E")
        assert r.ok and (r.posts == r.waits).all(), (label, r.problems)
        assert (ins[-1].name, ins[-1].dpdon, ins[-1].dpdby) == ("END", 0b0010, 0b0010 if vai2_0 else 0), label
        own = [i for i, x in enumerate(ins) if (x.dpdon | x.dpdby) >> engine_of(x, "DPUV3E") & 1]
        if vai2_0:
            assert own == list(range(len(ins))), label
        else:  # the SAVE -> END token, and in some per-layer programs one LOAD -> LOAD token
            assert own[-2:] == [len(ins) - 2, len(ins) - 1] and {ins[i].name for i in own[:-2]} <= {"LOAD"}, label


def test_vai_c_2_5_only_cleared_the_own_bits():
    """Vitis AI 2.0's and 2.5's U50LV programs are the same instructions with the same cross-engine tokens."""
    from tvm_dpu.timing.depcheck import engine_of

    for old, new in ((U50LV, FILES[2][0]), (U50LV_DWC, FILES[3][0])):
        for (_, a), (_, b) in zip(_programs(old), _programs(new), strict=True):
            assert [(x.name, x.fields) for x in a] == [(y.name, y.fields) for y in b]
            cross = [~(1 << engine_of(x, "DPUV3E")) & 0xF for x in a]
            assert [(x.dpdon & m, x.dpdby & m) for x, m in zip(a, cross)] == \
                [(y.dpdon & m, y.dpdby & m) for y, m in zip(b, cross)]


def test_inspect_check_deps_counts_the_tokens_of_a_u50_file(capsys):
    """`inspect --check-deps` decodes with the file's instruction set and checks the tokens, and the races with the
    access sets the DPUV3E emulator records."""
    from tvm_dpu.cli import main

    assert main(["inspect", str(FILES[2][0]), "--check-deps"]) == 0
    out = capsys.readouterr().out
    assert out.count("races checked: ok") == 2 and "load->conv:10/10(1) save->save:1/1(2)" in out
