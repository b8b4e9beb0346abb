"""Arch presets, arch.json loading and the fingerprint (tvm_dpu.arch)."""
from __future__ import annotations

import dataclasses
import json

import pytest

from tvm_dpu.arch import Arch, arch_from_fingerprint, decode_fingerprint, list_presets, load_arch
from tvm_dpu.errors import ArchError

# (name, PP, ICP=OCP, arch index) from the dpu-facts.md configuration table.
DPU_TABLE = [
    ("DPUCZDX8G_ISA1_B512", 4, 8, 0),
    ("DPUCZDX8G_ISA1_B800", 4, 10, 1),
    ("DPUCZDX8G_ISA1_B1024", 8, 8, 2),
    ("DPUCZDX8G_ISA1_B1152", 4, 12, 3),
    ("DPUCZDX8G_ISA1_B1600", 8, 10, 4),
    ("DPUCZDX8G_ISA1_B2304", 8, 12, 5),
    ("DPUCZDX8G_ISA1_B3136", 8, 14, 6),
    ("DPUCZDX8G_ISA1_B4096", 8, 16, 7),
]
# (board, DPU, MHz, cores, DDR bytes/s or None when unverified) from dpu-facts.md.
BOARD_TABLE = [
    ("zcu102", "DPUCZDX8G_ISA1_B4096", 281.0, 3, 17.1e9),
    ("zcu104", "DPUCZDX8G_ISA1_B4096", 300.0, 2, None),
    ("kv260", "DPUCZDX8G_ISA1_B4096", 300.0, 1, None),
    ("ultra96", "DPUCZDX8G_ISA1_B1600", 287.0, 1, None),
    ("dnnvm-zu2", "DPUCZDX8G_ISA1_B1152", 330.0, 1, None),
    ("dnnvm-zu9", "DPUCZDX8G_ISA1_B4096", 330.0, 3, None),
]


def test_list_presets_has_every_dpu_and_board():
    names = list_presets()
    assert names == [n for n, *_ in DPU_TABLE] + [b for b, *_ in BOARD_TABLE]


@pytest.mark.parametrize("name,pp,cp,index", DPU_TABLE)
def test_dpu_preset(name, pp, cp, index):
    arch = load_arch(name)
    assert (arch.name, arch.dpu_name, arch.family, arch.isa) == (name, name, "DPUCZDX8G", 1)
    assert (arch.pp, arch.icp, arch.ocp, arch.arch_index) == (pp, cp, cp, index)
    assert arch.ops_per_clock == pp * cp * cp * 2 == int(name.rsplit("_B", 1)[1])
    assert arch.peak_gops == pytest.approx(arch.ops_per_clock * arch.freq_mhz / 1000)
    assert arch.alu_pp == pp // 2
    assert (arch.bank_depth, arch.img_bank_groups) == (2048, 2)
    assert arch.channel_augmentation and arch.conv_leaky and not arch.dw_leaky
    assert arch.conv_activations == ("relu", "leaky_relu", "relu6")
    assert arch.alu_activations == ("relu", "relu6")
    assert arch.elew_activations == ("relu",)
    assert arch.board is None and arch.target_label == name
    # bank groups follow the target factory order and sizes
    assert [g.name for g in arch.bank_groups] == ["VB0", "VB1", "CONVW", "DWCONVW", "BIAS"]
    assert arch.bank_group("CONVW").ids == range(2 * pp, 2 * pp + cp)
    assert arch.num_banks == 2 * pp + cp + 2


def test_conformance_alu_pp():
    # conformance README: B4096 ALU PP 4, B1152 ALU PP 2
    assert load_arch("DPUCZDX8G_ISA1_B4096").alu_pp == 4
    assert load_arch("DPUCZDX8G_ISA1_B1152").alu_pp == 2


@pytest.mark.parametrize("board,dpu,mhz,cores,ddr", BOARD_TABLE)
def test_board_preset(board, dpu, mhz, cores, ddr):
    arch = load_arch(board)
    core = load_arch(dpu)
    assert (arch.name, arch.board, arch.dpu_name) == (board, board, dpu)
    assert arch.target_label == f"{dpu} ({board})"
    assert (arch.freq_mhz, arch.cores) == (mhz, cores)
    assert arch.ddr_bytes_per_s > 1e9
    if ddr is not None:
        assert arch.ddr_bytes_per_s == ddr
    # the board carries the DPU preset's hardware unchanged
    hw = dataclasses.replace(arch, name=core.name, board=None, freq_mhz=core.freq_mhz, cores=core.cores,
                             ddr_bytes_per_s=core.ddr_bytes_per_s, onchip_bytes=None)
    assert hw == core
    assert arch.peak_gops == pytest.approx(arch.ops_per_clock * mhz / 1000)


def test_dnnvm_peaks_match_paper():
    # DNNVM: ZU2 peak 380 GOPS, ZU9 peak 4.05 TOPS (3 cores)
    zu2, zu9 = load_arch("dnnvm-zu2"), load_arch("dnnvm-zu9")
    assert zu2.peak_gops == pytest.approx(380, rel=0.01)
    assert zu9.peak_gops * zu9.cores == pytest.approx(4050, rel=0.01)
    assert zu2.onchip_bytes == 660000 and zu9.onchip_bytes == 4000000


@pytest.mark.parametrize("spec", ["b4096", "B4096", "dpuczdx8g_isa1_b4096", " DPUCZDX8G_ISA1_B4096 "])
def test_name_forms(spec):
    assert load_arch(spec) is load_arch("DPUCZDX8G_ISA1_B4096")


def test_board_name_case_insensitive():
    assert load_arch("ZCU102") is load_arch("zcu102")


def test_arch_passes_through():
    arch = load_arch("zcu104")
    assert load_arch(arch) is arch


def test_arch_json_by_target(tmp_path):
    path = tmp_path / "arch.json"
    path.write_text(json.dumps({"target": "DPUCZDX8G_ISA1_B1152"}))
    assert load_arch(path) is load_arch("B1152")
    assert load_arch(str(path)) is load_arch("B1152")


@pytest.mark.parametrize("fp", ["0x101000056010203", 0x101000056010203, "0x0001000056010203", "101000056010203"])
def test_arch_json_by_fingerprint(tmp_path, fp):
    path = tmp_path / "arch.json"
    path.write_text(json.dumps({"fingerprint": fp}))
    assert load_arch(path) is load_arch("DPUCZDX8G_ISA1_B1152")
    assert load_arch({"fingerprint": fp}) is load_arch("DPUCZDX8G_ISA1_B1152")


def test_fingerprint_spec_forms():
    assert load_arch(0x101000056010407) is load_arch("B4096")
    assert load_arch("0x101000056010407") is load_arch("B4096")


def test_target_and_fingerprint_must_agree():
    assert load_arch({"target": "B4096", "fingerprint": "0x101000056010407"}) is load_arch("B4096")
    with pytest.raises(ArchError, match="does not match fingerprint 0x0101000056010203"):
        load_arch({"target": "B4096", "fingerprint": "0x101000056010203"})


def _known_names_listed(msg: str) -> None:
    for name in list_presets():
        assert name in msg


def test_unknown_name_lists_known():
    with pytest.raises(ArchError, match="unknown DPU architecture 'B9999'") as e:
        load_arch("B9999")
    _known_names_listed(str(e.value))


def test_unknown_target_in_json_lists_known(tmp_path):
    path = tmp_path / "arch.json"
    path.write_text(json.dumps({"target": "DPUCZDX8G_ISA0_B4096_MAX_BG2"}))
    with pytest.raises(ArchError, match="unknown target 'DPUCZDX8G_ISA0_B4096_MAX_BG2'") as e:
        load_arch(path)
    _known_names_listed(str(e.value))


def test_missing_file_lists_known(tmp_path):
    with pytest.raises(ArchError, match="does not exist") as e:
        load_arch(tmp_path / "nope.json")
    _known_names_listed(str(e.value))


@pytest.mark.parametrize("text,msg", [
    ('{"target": ', "malformed JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    ("{}", "no 'target' or 'fingerprint' key"),
    ('{"target": "B4096", "dcf": "x"}', "unknown key\\(s\\) dcf"),
    ('{"target": 4096}', "'target' must be a string"),
    ('{"fingerprint": "0xZZ"}', "fingerprint '0xZZ' is not a hexadecimal number"),
    ('{"fingerprint": 1.5}', "fingerprint must be a hex string"),
    ('{"fingerprint": true}', "fingerprint must be a hex string"),
])
def test_bad_json(tmp_path, text, msg):
    path = tmp_path / "arch.json"
    path.write_text(text)
    with pytest.raises(ArchError, match=msg):
        load_arch(path)


def test_bad_spec_type():
    with pytest.raises(ArchError, match="cannot make an architecture from a float"):
        load_arch(1.5)  # type: ignore[arg-type]


# ---- fingerprint ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", list_presets())
def test_fingerprint_round_trip(name):
    arch = load_arch(name)
    fp = arch.fingerprint
    assert fp >> 56 == 0x01 and (fp >> 48) & 0xFF == 1
    core = arch_from_fingerprint(fp)
    assert core.fingerprint == fp
    assert core is load_arch(arch.dpu_name)
    fields = decode_fingerprint(fp)
    assert (fields["pp"], fields["icp"], fields["ocp"], fields["alu_pp"]) == (arch.pp, arch.icp, arch.ocp, arch.alu_pp)
    assert fields["arch_name"] == f"B{arch.ops_per_clock}"


def test_preset_fingerprints_are_the_target_factory_ones():
    # type 0x01 << 56 | isa_version << 48 | prototxt feature_code
    assert load_arch("B4096").fingerprint == 0x0101000056010407
    assert load_arch("B1152").fingerprint == 0x0101000056010203
    assert load_arch("B512").fingerprint == 0x0101000056010200


def test_decode_dpu_facts_example():
    f = decode_fingerprint(0x101000016010407)
    assert f["family"] == "DPUCZDX8G" and f["family_code"] == 1 and f["isa"] == 1
    assert f["arch_index"] == 7 and f["arch_name"] == "B4096"
    assert (f["pp"], f["icp"], f["ocp"], f["alu_pp"], f["img_bank_groups"]) == (8, 16, 16, 4, 2)
    assert f["channel_augmentation"] and f["conv_leaky"]
    assert not f["dw_leaky"] and not f["save_argmax"] and not f["load_mean"]
    assert (f["conv_wp"], f["alu_wp"]) == (1, 1)
    assert f["unknown_bits"] == 0x10000  # bits 23:16 = 0x01, unread by the ISA1 factory
    arch = arch_from_fingerprint(0x101000016010407)
    assert arch.fingerprint == 0x101000016010407
    assert arch.name == "DPUCZDX8G_ISA1_B4096_0101000016010407"
    assert dataclasses.replace(arch, name="DPUCZDX8G_ISA1_B4096", save_argmax=True) == load_arch("B4096")


def test_decode_isa0_example():
    f = decode_fingerprint("0x1000020f6014407")
    assert f["isa"] == 0 and f["arch_name"] == "B4096" and f["img_bank_groups"] == 2
    assert (f["pool_pp"], f["dwconv_pp"], f["eltwise_pp"]) == (4, 4, 1)
    assert f["channel_augmentation"] and f["conv_leaky"] and f["conv_relu6"]
    assert f["pool_avg"] and f["dwconv_relu6"] and f["pool_max_reduce"] and not f["eltwise_mult"]
    assert not f["dw_leaky"] and not f["save_argmax"]
    assert f["unknown_bits"] == 0
    arch = arch_from_fingerprint(0x1000020F6014407)
    assert arch.isa == 0 and arch.dpu_name == "DPUCZDX8G_ISA0_B4096"
    assert arch.fingerprint == 0x1000020F6014407
    assert arch.alu_activations == ("relu", "relu6")


@pytest.mark.parametrize("fp,name,alu_pp", [(0x0001000056010407, "DPUCZDX8G_ISA1_B4096", 4),
                                           (0x0001000056010203, "DPUCZDX8G_ISA1_B1152", 2)])
def test_conformance_fingerprints_family_zero(fp, name, alu_pp):
    f = decode_fingerprint(fp)
    assert f["family_code"] == 0 and f["family"] == "DPUCZDX8G"
    assert f["alu_pp"] == alu_pp and f["save_argmax"]
    assert f["fingerprint"] == fp | (1 << 56)
    assert arch_from_fingerprint(fp) is load_arch(name)


@pytest.mark.parametrize("fp,msg", [
    (0x0601000056010407, r"family field \(bits 63:56\) = 0x06 \(DPUCVDX8G\)"),
    (0x0901000056010407, r"family field \(bits 63:56\) = 0x09 \(DPUCV2DX8G\); tvm-dpu decodes no DPUCV2DX8G"),
    (0x0A01000056010407, r"family field \(bits 63:56\) = 0x0A is no DPU family \(known: 0x01 DPUCZDX8G"),
    (0x0202000000000099, r"0x02 \(DPUCAHX8H\); AMD's target factory knows DPUCAHX8H by its registered targets only"),
    (0x0102000056010407, r"ISA version field \(bits 55:48\) = 2"),
    (0x0101000056010408, r"arch index field \(bits 3:0\) = 8; known DPUCZDX8G indices: 0 = B512"),
    (0x010100005601040F, r"arch index field \(bits 3:0\) = 15"),
    (0x0101000054010407, r"image bank groups field \(bits 25:24\) = 0"),
    (0x0101000056010007, r"ALU pixel parallelism field \(bits 11:8\) = 0"),
])
def test_bad_fingerprint(fp, msg):
    with pytest.raises(ArchError, match=msg):
        decode_fingerprint(fp)
    with pytest.raises(ArchError, match=msg):
        load_arch({"fingerprint": hex(fp)})


@pytest.mark.parametrize("value,msg", [
    ("0xnothex", "not a hexadecimal number"),
    ("", "not a hexadecimal number"),
    (-1, "does not fit in 64 bits"),
    (1 << 64, "does not fit in 64 bits"),
])
def test_bad_fingerprint_value(value, msg):
    with pytest.raises(ArchError, match=msg):
        decode_fingerprint(value)


def test_encode_rejects_inconsistent_arch():
    b4096 = load_arch("B4096")
    with pytest.raises(ArchError, match="arch_index 3 with PP 8, ICP 16, OCP 16 is not an entry"):
        _ = dataclasses.replace(b4096, arch_index=3).fingerprint
    with pytest.raises(ArchError, match="alu_pp 16 does not fit"):
        _ = dataclasses.replace(b4096, alu_pp=16).fingerprint
    with pytest.raises(ArchError, match="family 'DPUCVDX8G' cannot be encoded"):
        _ = dataclasses.replace(b4096, family="DPUCVDX8G").fingerprint
    with pytest.raises(ArchError, match="overlap the fields"):
        _ = dataclasses.replace(b4096, fp_other_bits=0x7).fingerprint


def test_existing_constructor_still_works():
    # other stages build Arch directly with these keywords
    arch = Arch(name="t", family="DPUCZDX8G", isa=1, arch_index=7, pp=8, icp=16, ocp=16, alu_pp=4,
                bank_depth=2048, img_bank_groups=2)
    assert arch.bank_group("CONVW").base_id == 16 and arch.dpu_name == "DPUCZDX8G_ISA1_B4096"
    # the defaults are those of the shipped ISA1 targets: a hand-built core equals its preset
    assert arch.fingerprint == 0x0101000056010407
    assert dataclasses.replace(arch, name="DPUCZDX8G_ISA1_B4096") == load_arch("B4096")
