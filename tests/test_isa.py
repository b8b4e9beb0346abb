"""ISA1 field table, encoder/decoder, assembler/disassembler and emulator unit tests (no conformance data needed)."""
from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.asm import assemble, disassemble, format_instr
from tvm_dpu.codegen.isa import (CONV, LOAD, MISC, SAVE, Instr, decode, decode_program, encode, encode_program,
                                 engine_mask, engine_names, instr_spec, instr_specs, make_instr, mask_from_str,
                                 mask_to_str)
from tvm_dpu.errors import EmulatorError, ISAError
from tvm_dpu.quant.fixpoint import saturate_int8
from tvm_dpu.emulator.core import Emulator

XML = Path(__file__).resolve().parent / "data" / "dpuv2-isa.xml"  # copy of shared/docs/dpuv2-isa.xml
NAMES = ["LOAD", "SAVE", "CONVINIT", "CONV", "POOLINIT", "POOL", "ALUINIT", "ALU", "DWINIT", "DPTWISE", "ELEWINIT",
         "ELEW", "END"]

B4096 = Arch(name="DPUCZDX8G_ISA1_B4096", family="DPUCZDX8G", isa=1, arch_index=7, pp=8, icp=16, ocp=16, alu_pp=4)
B1152 = Arch(name="DPUCZDX8G_ISA1_B1152", family="DPUCZDX8G", isa=1, arch_index=3, pp=4, icp=12, ocp=12, alu_pp=2)


# ---- field table ---------------------------------------------------------------------------------------------
def test_field_table_matches_xml():
    table = json.loads(resources.files("tvm_dpu.codegen").joinpath("isa_fields.json").read_text())
    ours = {i["name"]: i for i in table["instructions"]}
    seen = set()
    for el in ET.parse(XML).getroot():
        if not isinstance(el.tag, str) or int(el.get("opcode"), 16) > 15:
            continue  # DUMP* pseudo-instructions have no machine code
        name = el.tag.upper()
        seen.add(name)
        mine = ours[name]
        assert mine["opcode"] == int(el.get("opcode"), 16)
        assert mine["words"] == int(el.get("word_num")) == len(el)
        assert mine["category"] == el.get("category")
        want = [(f.tag, wi, int(f.get("pos")), int(f.get("len")), f.get("minus") == "1")
                for wi, w in enumerate(el) for f in w
                if f.tag not in ("opcode", "dpdon", "dpdby") and not f.tag.startswith("reserved")]
        got = [(f["name"], f["word"], f["pos"], f["len"], f["minus"]) for f in mine["fields"]]
        assert sorted(got) == sorted(want), name
    assert seen == set(ours) == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_fields_fit_and_do_not_overlap(name):
    spec = instr_spec(name)
    used = [0] * spec.words
    used[0] = 0xFFF << 20  # opcode, dpdon, dpdby
    for f in spec.fields:
        mask = ((1 << f.len) - 1) << f.pos
        assert f.pos + f.len <= 32 and 0 <= f.word < spec.words, f.name
        assert used[f.word] & mask == 0, f"{name}.{f.name} overlaps"
        used[f.word] |= mask


def test_opcodes_unique_and_categories():
    specs = instr_specs()
    assert len({s.opcode for s in specs.values()}) == len(specs) == 13
    assert specs["END"].category == "save" and specs["END"].words == 1
    assert specs["CONV"].engine == CONV and specs["ALU"].engine == MISC and specs["LOAD"].engine == LOAD


# ---- encoder / decoder ---------------------------------------------------------------------------------------
def test_minus_fields_store_value_minus_one():
    ins = make_instr("LOAD", dpdon=LOAD | CONV, dpdby=SAVE, length=8, channel=16, jump_read=16, jump_write=3,
                     bank_id=5, bank_addr=2047, ddr_addr=1000, reg_id=3)
    w = encode(ins)
    assert len(w) == 5
    assert w[0] == (0x0 << 28) | (0b0101 << 24) | (0b0010 << 20) | (5 << 14) | 2047
    assert w[1] == (15 << 10) | 2
    assert w[2] == 7 | (15 << 10)  # pad_idx defaults to 1, stored 0
    assert w[3] == 3 and w[4] == 1000
    assert decode(w) == (ins, 5)


@pytest.mark.parametrize("field,value", [("length", 0), ("length", 1025), ("bank_id", 64), ("ddr_addr", 1 << 29),
                                         ("reg_id", -1)])
def test_encode_range_errors_name_field(field, value):
    ins = make_instr("LOAD")
    ins.fields[field] = value
    with pytest.raises(ISAError, match=rf"LOAD: field {field}={value} outside"):
        encode(ins)


def test_encode_boundaries_accepted():
    ins = make_instr("LOAD", length=1024, channel=16384, jump_read=65536, bank_id=63, ddr_addr=(1 << 29) - 1)
    assert decode(encode(ins))[0] == ins


def test_encode_missing_unknown_and_bad_names():
    ins = make_instr("SAVE")
    del ins.fields["hp_id"]
    with pytest.raises(ISAError, match="SAVE: missing field hp_id"):
        encode(ins)
    with pytest.raises(ISAError, match="CONV: unknown field.*bogus"):
        encode(Instr("CONV", {**make_instr("CONV").fields, "bogus": 1}))
    with pytest.raises(ISAError, match="unknown instruction 'NOPE'"):
        encode(Instr("NOPE", {}))
    with pytest.raises(ISAError, match="dpdon=16"):
        encode(Instr("END", {}, dpdon=16))
    with pytest.raises(ISAError, match="ELEW: field num=1.5 is not an integer"):
        encode(_with(make_instr("ELEW"), num=1.5))
    with pytest.raises(ISAError, match="unknown field"):
        make_instr("END", length=3)


def _with(ins: Instr, **kw) -> Instr:
    ins.fields.update(kw)
    return ins


def test_decode_errors_name_word_offset():
    end = encode(make_instr("END"))
    with pytest.raises(ISAError, match=r"word 1: unknown opcode 0x3"):
        decode_program(np.array(end + [0x3000_0000], dtype=np.uint32))
    load = encode(make_instr("LOAD"))
    with pytest.raises(ISAError, match=r"word 1: truncated LOAD \(needs 5 words, 3 left\)"):
        decode_program(np.array(end + load[:3], dtype=np.uint32))
    with pytest.raises(ISAError, match="word 4"):
        decode([0], 4)


def test_encode_program_names_instruction_index():
    prog = [make_instr("END"), make_instr("END"), _with(make_instr("CONV"), channel_group=0)]
    with pytest.raises(ISAError, match=r"instruction 2: CONV: field channel_group=0 outside 1\.\.256"):
        encode_program(prog)


def test_program_round_trip_and_word_layout():
    prog = [make_instr("LOAD", length=3), make_instr("CONVINIT", kernel_h=3), make_instr("CONV"),
            make_instr("ELEWINIT", id=1, jump_read=0), make_instr("END", dpdby=SAVE)]
    code = encode_program(prog)
    assert code.dtype == np.uint32 and code.size == 5 + 4 + 5 + 3 + 1
    assert decode_program(code) == prog
    assert (code[-1] >> 28) == 7 and ((code[-1] >> 20) & 0xF) == SAVE


def test_engine_masks():
    assert engine_mask("load", "CONV") == 5 == LOAD | CONV
    assert engine_names(9) == ("load", "misc")
    assert mask_to_str(5) == "0101" and mask_from_str("1000") == MISC
    with pytest.raises(ISAError):
        engine_mask("dma")
    with pytest.raises(ISAError):
        mask_from_str("012")
    with pytest.raises(ISAError):
        mask_to_str(16)


def _field_values(spec):
    return st.fixed_dictionaries({f.name: st.integers(f.min_value, f.max_value) for f in spec.fields})


@st.composite
def _instrs(draw):
    spec = instr_spec(draw(st.sampled_from(NAMES)))
    return Instr(spec.name, draw(_field_values(spec)), draw(st.integers(0, 15)), draw(st.integers(0, 15)))


@settings(max_examples=300, deadline=None, database=None)
@given(_instrs())
def test_property_decode_encode_round_trip(ins):
    words = encode(ins)
    assert all(0 <= w < 1 << 32 for w in words)
    assert decode(words) == (ins, len(words))


@settings(max_examples=40, deadline=None, database=None)
@given(st.lists(_instrs(), min_size=1, max_size=12))
def test_property_program_and_listing_round_trip(prog):
    code = encode_program(prog)
    assert decode_program(code) == prog
    text = disassemble(code)
    assert text == disassemble(prog)
    assert assemble(text) == prog


# ---- assembler / disassembler ------------------------------------------------------------------------------------
def test_disassemble_format():
    prog = [make_instr("LOAD", dpdon=LOAD, length=8), make_instr("END", dpdby=MISC)]
    lines = disassemble(encode_program(prog)).splitlines()
    assert re.match(r"^\s*0 @0000000  LOAD dpdon=0001 dpdby=0000 bank_addr=0 bank_id=0 jump_write=1 jump_read=1 "
                    r"length=8 ", lines[0])
    assert lines[1].split() == ["1", "@0000005", "END", "dpdon=0000", "dpdby=1000"]
    assert format_instr(prog[1]) == "END dpdon=0000 dpdby=1000"


def test_assemble_accepts_bare_listing_and_comments():
    text = "# a comment\n\nEND dpdon=0000 dpdby=0001  # trailing\n  3 @0000010  end dpdon=1111 dpdby=0000\n"
    assert assemble(text) == [Instr("END", {}, 0, 1), Instr("END", {}, 15, 0)]


@pytest.mark.parametrize("text,msg", [
    ("END dpdon=0000 dpdby=0000\nEND\nFOO dpdon=0000", r"line 3: unknown instruction 'FOO'"),
    ("ELEWINIT dpdon=0000 dpdby=0000 id=0", r"line 1: ELEWINIT: missing field\(s\) .*bank_id_in"),
    ("END dpdon=0000 dpdby=0000 length=3", r"line 1: END: unknown field\(s\) length"),
    ("END dpdon=0000 dpdby=0000\nEND dpdon=2 dpdby=0000", r"line 2: .*dpdon"),
    ("END dpdon=0000 dpdby=0000 length", r"line 1: expected name=value"),
])
def test_assemble_errors_name_line(text, msg):
    with pytest.raises(ISAError, match=msg):
        assemble(text)


def test_assemble_range_error():
    line = format_instr(make_instr("ALU")).replace("kernel_d=1", "kernel_d=0")
    with pytest.raises(ISAError, match=r"line 1: ALU: field kernel_d=0 outside 1\.\.16"):
        assemble(line)


# ---- emulator --------------------------------------------------------------------------------------------------
def run(arch, prog, regions=None, **kw):
    emu = Emulator(arch, **kw)
    regions = regions if regions is not None else {}
    stats = emu.run(encode_program(prog), regions)
    return emu, stats


def load(**kw):
    base = dict(length=1, channel=16, jump_read=16, jump_write=1)
    base.update(kw)
    return make_instr("LOAD", **base)


def save(**kw):
    base = dict(length=1, channel=16, jump_read=1, jump_write=16)
    base.update(kw)
    return make_instr("SAVE", **base)


def test_load_save_zero_fill_and_wrap():
    rng = np.random.default_rng(1)
    src = rng.integers(0, 256, 64, dtype=np.uint8)
    regions = {2: src.copy(), 5: np.full(64, 0xA5, dtype=np.uint8)}
    emu = Emulator(B4096)
    emu.banks.bank(3)[...] = 0x55
    prog = [load(bank_id=3, bank_addr=2047, length=2, channel=20, jump_read=20, jump_write=3, reg_id=2, ddr_addr=3),
            save(bank_id=3, bank_addr=2047, length=1, channel=40, reg_id=5, ddr_addr=10), make_instr("END")]
    stats = emu.run(encode_program(prog), regions)
    bank = emu.banks.bank(3)
    # item 0 -> rows 2047, 0 (address wraps); item 1 -> rows 2047+3 = 2, 3; the tail of rows 0 and 3 is zeroed.
    assert bytes(bank[2047]) == bytes(src[3:19])
    assert bytes(bank[0, :4]) == bytes(src[19:23]) and not bank[0, 4:].any()
    assert bytes(bank[1]) == b"\x55" * 16
    assert bytes(bank[2]) == bytes(src[23:39])
    assert bytes(bank[3, :4]) == bytes(src[39:43]) and not bank[3, 4:].any()
    want = np.concatenate([src[3:23], np.zeros(12, np.uint8), np.full(8, 0x55, np.uint8)])
    assert np.array_equal(regions[5][10:50], want)
    assert (regions[5][:10] == 0xA5).all() and (regions[5][50:] == 0xA5).all()
    assert regions[2].tolist() == src.tolist()
    assert stats.counts == {"LOAD": 1, "SAVE": 1, "END": 1} and stats.load_bytes == 40 and stats.save_bytes == 40


def conv_init(**kw):
    base = dict(kernel_h=1, kernel_w=1, valid_pixel_parallel=1)
    base.update(kw)
    return make_instr("CONVINIT", **base)


def alu_init(**kw):
    return make_instr("ALUINIT", **kw)


@pytest.mark.parametrize("arch,prog,msg", [
    (B4096, [conv_init(), make_instr("CONV", bank_id_in=40)],
     r"^instruction 1 \(CONV\) field bank_id_in=40: not an image bank of DPUCZDX8G_ISA1_B4096 "
     r"\(VB0 0-7, VB1 8-15\)$"),
    (B1152, [conv_init(), make_instr("CONV", bank_id_out=8)],
     r"instruction 1 \(CONV\) field bank_id_out=8: not an image bank of DPUCZDX8G_ISA1_B1152 \(VB0 0-3, VB1 4-7\)"),
    (B4096, [save(bank_id=16)], r"instruction 0 \(SAVE\) field bank_id=16: not an image bank"),
    (B4096, [load(bank_id=34)], r"instruction 0 \(LOAD\) field bank_id=34: no such bank .*0-33"),
    (B4096, [load(ddr_addr=60)], r"field ddr_addr=60: access ends at byte 76, past the end of DDR region 0 \(64"),
    (B4096, [save(length=2, jump_write=40, ddr_addr=20)], r"SAVE\) field ddr_addr=20: access ends at byte 76"),
    (B4096, [load(reg_id=4)], r"field reg_id=4: DDR region 4 is not defined"),
    (B4096, [load(mode_avg=1)], r"field mode_avg=1: .*no mean-value bank"),
    (B4096, [make_instr("POOLINIT")], r"instruction 0 \(POOLINIT\): .*has no pool_engine"),
    (B4096, [make_instr("LOAD", length=1, channel=16), make_instr("DPTWISE")],
     r"instruction 1 \(DPTWISE\): .*has no dwconv_engine"),
    (B4096, [make_instr("CONV")], r"no CONVINIT before this CONV"),
    (B1152, [conv_init(valid_pixel_parallel=5), make_instr("CONV")], r"valid_pixel_parallel=5 > PP=4"),
    (B4096, [conv_init(shift_bias=21), make_instr("CONV")], r"shift_bias=21 > 20"),
    (B4096, [conv_init(stride_h=2, stride_offset_in=2), make_instr("CONV")], r"stride_offset_in=2 must be < "),
    (B4096, [conv_init(act_type=2), make_instr("CONV")], r"act_type=2 not allowed .* CONV"),
    (B4096, [conv_init(stride_w=9), make_instr("CONV")], r"stride 1x9 outside the conv stride white-list 1-8"),
    (B1152, [conv_init(kernel_h=16, valid_pixel_parallel=4), make_instr("CONV", bank_id_in=3)],
     r"field bank_id_in=3: window of 19 rows .* at most 3 wraps"),
    (B4096, [make_instr("ALU")], r"instruction 0 \(ALU\): no ALUINIT before this ALU"),
    (B4096, [alu_init(exec_mode=9), make_instr("ALU")], r"exec_mode=9 not an ALU mode"),
    (B4096, [alu_init(exec_mode=3, act_type=3), make_instr("ALU")], r"act_type=3 not allowed on .* ALU"),
    (B4096, [alu_init(exec_mode=1, kernel_w=3), make_instr("ALU")], r"mode prelu needs kernel, stride and kernel_d 1"),
    (B4096, [alu_init(), make_instr("ALU", valid_pixel_parallel=5)],
     r"field valid_pixel_parallel=5: > ALU pixel parallelism 4"),
    (B4096, [alu_init(), make_instr("ALU", bank_id_in=33)], r"field bank_id_in=33: not an image bank"),
    (B4096, [make_instr("ELEW")], r"ELEW\) field num=1: only 0 pending ELEWINIT"),
    (B4096, [make_instr("ELEWINIT", id=1), make_instr("ELEW")], r"pending ELEWINIT #0 has id=1, expected 0"),
    (B4096, [make_instr("ELEWINIT"), make_instr("ELEWINIT", id=1), make_instr("ELEWINIT", id=2),
             make_instr("ELEW", elew_type=1, num=3)], r"field num=3: mult needs exactly 2 inputs"),
    (B4096, [make_instr("ELEWINIT", jump_bank=3), make_instr("ELEW", valid_pixel_parallel=3)],
     r"input 0: jump_bank=3 \* vpp > PP=8"),
    (B4096, [make_instr("ELEWINIT", bank_id_in=20), make_instr("ELEW")],
     r"input 0: ELEWINIT bank_id_in=20 is not an image bank"),
    (B4096, [make_instr("ELEW", elew_type=2)], r"field elew_type=2: not an elew_type"),
])
def test_emulator_rejects(arch, prog, msg):
    with pytest.raises(EmulatorError, match=msg):
        run(arch, prog, {0: np.zeros(64, np.uint8)})


def test_conv_leaky_allowed_and_input_types_checked():
    run(B4096, [conv_init(act_type=3), make_instr("CONV")])
    emu = Emulator(B4096)
    with pytest.raises(EmulatorError, match="uint32"):
        emu.run(np.zeros(1, np.int64), {})
    with pytest.raises(EmulatorError, match="region 0 must be a 1-D uint8"):
        emu.run(encode_program([make_instr("END")]), {0: np.zeros(4, np.int8)})
    with pytest.raises(EmulatorError, match="cannot decode program: word 0: unknown opcode 0x3"):
        emu.run(np.array([0x3000_0000], np.uint32), {})


@pytest.mark.parametrize("stop", [True, False])
def test_end_stops_only_when_asked(stop):
    regions = {0: np.arange(16, dtype=np.uint8), 1: np.zeros(16, np.uint8)}
    prog = [load(), make_instr("END"), save(reg_id=1)]
    _, stats = run(B4096, prog, regions, stop_at_end=stop)
    assert stats.ended
    assert stats.skipped_after_end == (1 if stop else 0)
    assert regions[1].tolist() == ([0] * 16 if stop else list(range(16)))
    assert stats.counts["SAVE"] == (0 if stop else 1)


def test_save_argmax_and_const():
    vals = np.array([3, -7, 100, 100, -128, 5] + [0] * 10, dtype=np.int8).view(np.uint8)
    regions = {0: vals.copy(), 1: np.zeros(8, np.uint8)}
    prog = [load(), save(reg_id=1, argmax=2, channel=6), save(reg_id=1, argmax=3, channel=6, ddr_addr=1),
            save(reg_id=1, const_en=1, const_value=0xEE, channel=2, length=2, jump_write=3, ddr_addr=2)]
    run(B4096, prog, regions)
    assert regions[1].tolist() == [2, 100, 0xEE, 0xEE, 0, 0xEE, 0xEE, 0]


def test_elew_add_and_mult():
    rng = np.random.default_rng(3)
    a, b = rng.integers(-128, 128, (2, 4, 16), dtype=np.int8)
    emu = Emulator(B4096)
    for r in range(4):
        emu.banks.bank(r)[10] = a[r].view(np.uint8)  # operand 0: banks 0-3
        emu.banks.bank(8 + r)[20] = b[r].view(np.uint8)  # operand 1: banks 8-11
    prog = [make_instr("ELEWINIT", id=0, bank_id_in=0, bank_addr_in=10, shift_read=1),
            make_instr("ELEWINIT", id=1, bank_id_in=8, bank_addr_in=20),
            make_instr("ELEW", num=2, valid_pixel_parallel=4, bank_id_out=4, bank_addr_out=5, shift_write=17,
                       act_type=1),
            make_instr("ELEWINIT", id=0, bank_id_in=0, bank_addr_in=10),
            make_instr("ELEWINIT", id=1, bank_id_in=8, bank_addr_in=20),
            make_instr("ELEW", num=2, elew_type=1, valid_pixel_parallel=4, bank_id_out=12, bank_addr_out=0,
                       shift_write=22)]
    emu.run(encode_program(prog), {})
    # add: (a*4 >> 1) + 4b, times 2**-1, over 4, round half up, relu
    t = ((a.astype(np.int64) * 4) >> 1) + 4 * b.astype(np.int64)
    want_add = saturate_int8(np.maximum(np.floor(t / 8 + 0.5), 0))
    want_mul = saturate_int8(np.floor(16 * a.astype(np.int64) * b / 16 / 64 + 0.5))
    for r in range(4):
        assert np.array_equal(emu.banks.bank(4 + r)[5].view(np.int8), want_add[r])
        assert np.array_equal(emu.banks.bank(12 + r)[0].view(np.int8), want_mul[r])


def _bench_module():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_emulator.py"
    spec = importlib.util.spec_from_file_location("bench_emulator", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("arch,shape", [(B4096, (13, 11, 20, 36, 3)), (B1152, (9, 7, 12, 5, 5)),
                                        (B4096, (8, 6, 16, 16, 1))])
def test_tiled_conv_layer_matches_direct_convolution(arch, shape):
    """A whole layer tiled into CONVs (partial last tile, channel_offset, several output groups) vs numpy."""
    bench = _bench_module()
    h, w, cin, cout, k = shape
    code, setup, ref, _ = bench.build(arch, h, w, cin, cout, k, 9, np.random.default_rng(7))
    emu = Emulator(arch)
    setup(emu)
    stats = emu.run(code, {})
    assert np.array_equal(bench.read_output(emu, h, w, cout), ref)
    assert stats.macs >= h * w * cout * k * k * cin


def test_leaky_gated_by_fingerprint_flags():
    from dataclasses import replace

    run(replace(B4096, dw_leaky=True), [alu_init(exec_mode=0, act_type=3), make_instr("ALU")])
    with pytest.raises(EmulatorError, match=r"act_type=3 not allowed on .* CONV"):
        run(replace(B4096, conv_leaky=False), [conv_init(act_type=3), make_instr("CONV")])


def test_shared_decoding_equals_decoding_and_reports_the_same_errors():
    """iter_program(shared=True) gives decode_program's instructions for a program
    with repeated instructions, as one read-only Instr per distinct instruction, and fails on a truncated stream
    the way decode_program does."""
    from tvm_dpu.codegen.isa import iter_program, make_instr

    def decode_shared(code):
        return [ins for _, ins in iter_program(code, shared=True)]

    prog = [make_instr("LOAD", length=4, channel=16), make_instr("CONVINIT", kernel_h=3, kernel_w=3),
            make_instr("CONV", channel_group=2, length=8), make_instr("CONV", channel_group=2, length=8),
            make_instr("LOAD", length=4, channel=16), make_instr("END")]
    code = encode_program(prog)
    shared = decode_shared(code)
    assert shared == decode_program(code) == prog
    assert decode_program(code) == shared  # equal either way round
    assert shared[2] is shared[3] and shared[0] is shared[4]
    again = decode_shared(code)  # served from the shared table
    assert again == prog and all(a is b for a, b in zip(again, shared))
    with pytest.raises(ISAError, match="read-only"):
        shared[2].fields["length"] = 9
    with pytest.raises(ISAError, match="read-only"):
        shared[2].fields.update(length=9)
    with pytest.raises(ISAError, match="read-only"):
        shared[2].dpdon = 1
    assert shared[3]["length"] == 8 and shared[3].dpdon == 0
    plain = decode_program(code)
    plain[2].fields["length"] = 9  # a plain decode stays the caller's to change
    assert plain[2] != shared[2]
    for decoder in (decode_program, decode_shared):  # the first LOAD cut short
        with pytest.raises(ISAError, match="word 0: truncated LOAD"):
            decoder(code[:2])


def test_isa_enumerations_are_data_with_one_spelling():
    """The enumerated fields' codes (isa1-semantics.md 6.4, 8.3, 9.2, 7.1) come from isa_fields.json; the
    quantizer, the code generator and the emulator read the same table."""
    from tvm_dpu.codegen import alu
    from tvm_dpu.codegen.isa import enum_code, enum_codes, enum_name
    from tvm_dpu.emulator import alu as emu_alu, elew as emu_elew

    acts = enum_codes("act_type")
    assert dict(acts) == {"none": 0, "relu": 1, "prelu": 2, "leaky_relu": 3, "relu6": 4, "hard_sigmoid": 5,
                          "hard_swish": 6}
    assert dict(enum_codes("elew_type")) == {"add": 0, "mul": 1}
    assert enum_codes("alu_exec_mode")["hard_sigmoid"] == emu_alu.HARD_SIGMOID == 7
    assert enum_codes("alu_exec_mode")["leaky_relu"] == emu_alu.LEAKY == 4
    assert alu.ALU_MODES is enum_codes("alu_exec_mode") and emu_alu.ALU_MODES == frozenset(range(9))
    assert (emu_elew.ELEW_ADD, emu_elew.ELEW_MUL) == (0, 1)
    assert enum_name("pool_type", 1) == "avgpool"
    with pytest.raises(TypeError):
        acts["relu"] = 7  # read-only: nobody can change a code for everyone else
    with pytest.raises(ISAError, match="'hsigmoid' is not an ISA1 act_type"):
        enum_code("act_type", "hsigmoid")
    with pytest.raises(ISAError, match="unknown ISA enumeration 'act_types'"):
        enum_codes("act_types")
    with pytest.raises(ISAError, match="act_type 9 is not an ISA1 act_type code"):
        enum_name("act_type", 9)


def test_emulator_refuses_an_activation_name_it_does_not_know():
    """An Arch activation list naming something outside the ISA's act_type table is an error, not dropped."""
    from dataclasses import replace

    emu = Emulator(replace(B4096, alu_activations=("relu", "hsigmoid")))
    with pytest.raises(ISAError, match="'hsigmoid' is not an ISA1 act_type"):
        emu.allowed_acts("alu")
    assert Emulator(B4096).allowed_acts("alu") == frozenset({0, 1, 4})
