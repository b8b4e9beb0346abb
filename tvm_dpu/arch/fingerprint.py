"""The 64-bit DPU fingerprint: decode it to fields, build an `Arch` from it, encode an `Arch` back.

Layout (dpu-facts.md "arch.json and fingerprint", isa1-semantics.md 2.2, and the Vitis AI target factory
functions for DPUCZDX8G ISA0 / ISA1, read for facts):

    bits 63:56  family (0x01 DPUCZDX8G, 0x02 DPUCAHX8H, 0x06 DPUCVDX8G)
    bits 55:48  ISA version
    bits 47:0   feature code; its meaning depends on the ISA:

    bits    ISA1 (create_target_DPUCZDX8G_ISA1)     ISA0 (create_target_v2)
    3:0     arch index 0-7 = B512 ... B4096         same
    11:8    ALU (and eltwise) pixel parallelism     pool engine pixel parallelism
    15:12   -                                       depthwise engine pixel parallelism (0 = no engine)
    19:16   -                                       eltwise engine pixel parallelism
    25:24   image bank groups                       same
    26      channel augmentation (2*ICP)            same
    27      load mean-value reduction: both factories leave it commented out (decoded, not used)
    28      CONV LeakyReLU                          same
    29      ALU LeakyReLU                           CONV ReLU6
    30      SAVE argmax                             average pool
    31      -                                       depthwise ReLU6
    33:32   CONV write parallelism (2^n)            -
    35:34   ALU write parallelism (2^n)             -
    36      -                                       eltwise multiply
    37      -                                       pool max-reduce (downsample)

Family 0 is accepted as DPUCZDX8G: the conformance vectors (shared/conformance/isa1, made with AMD's simulator
from the target factory's DPUCZDX8G_ISA1 prototxts) write the fingerprint as isa << 48 | feature_code, i.e. the
target's own isa_version and feature_code fields without the type byte that the factory adds on top, and no
DPU type uses code 0. An `Arch` always encodes the canonical family 0x01, so 0x0001... round-trips to 0x0101....
"""
from __future__ import annotations

from typing import Any

from tvm_dpu.arch.arch import Arch, dpu_presets
from tvm_dpu.errors import ArchError

FAMILY_CODES = {0x01: "DPUCZDX8G", 0x02: "DPUCAHX8H", 0x06: "DPUCVDX8G"}
SUPPORTED_FAMILY = "DPUCZDX8G"
SUPPORTED_ISAS = (0, 1)

# Bits an Arch field represents, per ISA (arch index, bits 11:8, bank groups, augmentation, conv leaky; plus,
# on ISA1, dw leaky and argmax). Every other bit lives in Arch.fp_other_bits.
_ARCH_FIELD_MASK = {1: 0x7700_0F0F, 0: 0x1700_0F0F}
# Bits the factory of each ISA reads (bit 27 included: named in both factories, then commented out).
_KNOWN_MASK = {1: 0x0F_7F00_0F0F, 0: 0x30_FF0F_FF0F}
_FEATURE_MASK = (1 << 48) - 1


def _bit(fp: int, n: int) -> bool:
    return bool((fp >> n) & 1)


def _arch_table() -> dict[int, Arch]:
    """Arch index -> DPU preset: the ARCH table (PP, ICP, OCP) is defined once, in presets.json."""
    return {a.arch_index: a for a in dpu_presets()}


def parse_fingerprint(value: Any, where: str = "fingerprint") -> int:
    """A fingerprint from an int or a hexadecimal string ("0x101000016010407", the 0x is optional)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ArchError(
            f"{where}: fingerprint must be a hex string like \"0x101000016010407\" or an int, got {value!r}"
        )
    if isinstance(value, str):
        text = value.strip()
        digits = text[2:] if text.lower().startswith("0x") else text
        try:
            value = int(digits, 16)
        except ValueError:
            raise ArchError(f"{where}: fingerprint {text!r} is not a hexadecimal number") from None
    if not 0 <= value < 1 << 64:
        raise ArchError(f"{where}: fingerprint {value:#x} does not fit in 64 bits")
    return value


def decode_fingerprint(fp: int | str) -> dict[str, Any]:
    """Decode a DPUCZDX8G fingerprint into its fields.

    Always present: fingerprint (canonical, family 0 -> 0x01), family_code (as given), family, isa,
    feature_code, arch_index, arch_name ("B4096"), pp, icp, ocp, alu_pp (bits 11:8: ALU/eltwise PP on ISA1,
    pool PP on ISA0), img_bank_groups, channel_augmentation, load_mean, conv_leaky, dw_leaky, save_argmax,
    other_bits (bits no Arch field holds), unknown_bits (bits no factory reads).
    ISA1 adds conv_wp, alu_wp. ISA0 adds pool_pp, dwconv_pp, eltwise_pp, conv_relu6, pool_avg, dwconv_relu6,
    eltwise_mult, pool_max_reduce (dw_leaky and save_argmax are then False: ISA0 has neither).
    Raises ArchError naming the field and value when the fingerprint is not a DPUCZDX8G ISA0/ISA1 one.
    """
    fp = parse_fingerprint(fp)
    where = f"fingerprint 0x{fp:016X}"
    family_code = fp >> 56
    if family_code not in (0, 0x01):
        known = FAMILY_CODES.get(family_code, "unknown family")
        raise ArchError(
            f"{where}: family field (bits 63:56) = 0x{family_code:02X} ({known}); "
            f"only 0x01 {SUPPORTED_FAMILY} is supported (0x00 is read as {SUPPORTED_FAMILY})"
        )
    isa = (fp >> 48) & 0xFF
    if isa not in SUPPORTED_ISAS:
        raise ArchError(f"{where}: ISA version field (bits 55:48) = {isa}; {SUPPORTED_FAMILY} has ISA 0 and ISA 1")
    table = _arch_table()
    arch_index = fp & 0xF
    if arch_index not in table:
        known = ", ".join(f"{i} = B{a.ops_per_clock}" for i, a in sorted(table.items()))
        raise ArchError(f"{where}: arch index field (bits 3:0) = {arch_index}; known DPUCZDX8G indices: {known}")
    core = table[arch_index]
    img_bank_groups = (fp >> 24) & 0x3
    if img_bank_groups == 0:
        raise ArchError(f"{where}: image bank groups field (bits 25:24) = 0; a DPU needs at least one")
    alu_pp = (fp >> 8) & 0xF
    if isa == 1 and alu_pp == 0:
        raise ArchError(f"{where}: ALU pixel parallelism field (bits 11:8) = 0; an ISA1 DPU has an ALU engine")
    feature_code = fp & _FEATURE_MASK
    fields: dict[str, Any] = {
        "fingerprint": (0x01 << 56) | (fp & ((1 << 56) - 1)),
        "family_code": family_code,
        "family": SUPPORTED_FAMILY,
        "isa": isa,
        "feature_code": feature_code,
        "arch_index": arch_index,
        "arch_name": f"B{core.ops_per_clock}",
        "pp": core.pp,
        "icp": core.icp,
        "ocp": core.ocp,
        "alu_pp": alu_pp,
        "img_bank_groups": img_bank_groups,
        "channel_augmentation": _bit(fp, 26),
        "load_mean": _bit(fp, 27),
        "conv_leaky": _bit(fp, 28),
        "dw_leaky": isa == 1 and _bit(fp, 29),
        "save_argmax": isa == 1 and _bit(fp, 30),
        "other_bits": feature_code & ~_ARCH_FIELD_MASK[isa],
        "unknown_bits": feature_code & ~_KNOWN_MASK[isa],
    }
    if isa == 1:
        fields["conv_wp"] = 1 << ((fp >> 32) & 0x3)
        fields["alu_wp"] = 1 << ((fp >> 34) & 0x3)
    else:
        fields.update(
            pool_pp=alu_pp,
            dwconv_pp=(fp >> 12) & 0xF,
            eltwise_pp=(fp >> 16) & 0xF,
            conv_relu6=_bit(fp, 29),
            pool_avg=_bit(fp, 30),
            dwconv_relu6=_bit(fp, 31),
            eltwise_mult=_bit(fp, 36),
            pool_max_reduce=_bit(fp, 37),
        )
    return fields


def _activations(fields: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(CONV, ALU-or-depthwise) activation lists as the target factory builds them from the flags."""
    conv = ["relu"] + (["leaky_relu"] if fields["conv_leaky"] else [])
    if fields["isa"] == 1:
        conv.append("relu6")
        alu = ["relu"] + (["leaky_relu"] if fields["dw_leaky"] else []) + ["relu6"]
    else:
        conv += ["relu6"] if fields["conv_relu6"] else []
        alu = [] if fields["dwconv_pp"] == 0 else ["relu"] + (["relu6"] if fields["dwconv_relu6"] else [])
    return tuple(conv), tuple(alu)


def arch_from_fingerprint(fp: int | str) -> Arch:
    """The `Arch` a fingerprint describes: the DPU preset with that fingerprint if there is one, else a core
    named like the target factory does (DPUCZDX8G_ISA1_B4096_0101000016010407) with the bare-preset board
    defaults (clock, cores, DDR)."""
    fields = decode_fingerprint(fp)
    canonical = fields["fingerprint"]
    presets = dpu_presets()
    for preset in presets:
        if preset.fingerprint == canonical:
            return preset
    conv_acts, alu_acts = _activations(fields)
    template = presets[0]
    return Arch(
        name=f"{fields['family']}_ISA{fields['isa']}_{fields['arch_name']}_{canonical:016X}",
        family=fields["family"],
        isa=fields["isa"],
        arch_index=fields["arch_index"],
        pp=fields["pp"],
        icp=fields["icp"],
        ocp=fields["ocp"],
        alu_pp=fields["alu_pp"],
        bank_depth=template.bank_depth,
        img_bank_groups=fields["img_bank_groups"],
        channel_augmentation=fields["channel_augmentation"],
        conv_leaky=fields["conv_leaky"],
        dw_leaky=fields["dw_leaky"],
        save_argmax=fields["save_argmax"],
        conv_activations=conv_acts,
        alu_activations=alu_acts,
        elew_activations=("relu",),
        freq_mhz=template.freq_mhz,
        cores=template.cores,
        ddr_bytes_per_s=template.ddr_bytes_per_s,
        fp_other_bits=fields["other_bits"],
    )


def encode_fingerprint(arch: Arch) -> int:
    """The fingerprint of `arch` (family 0x01); ArchError if a field cannot be encoded."""
    family_code = {v: k for k, v in FAMILY_CODES.items()}.get(arch.family)
    if arch.family != SUPPORTED_FAMILY or family_code is None:
        raise ArchError(f"{arch.name}: family {arch.family!r} cannot be encoded; only {SUPPORTED_FAMILY} is supported")
    if arch.isa not in SUPPORTED_ISAS:
        raise ArchError(f"{arch.name}: ISA {arch.isa} cannot be encoded; {SUPPORTED_FAMILY} has ISA 0 and ISA 1")
    core = _arch_table().get(arch.arch_index)
    if core is None or (core.pp, core.icp, core.ocp) != (arch.pp, arch.icp, arch.ocp):
        raise ArchError(
            f"{arch.name}: arch_index {arch.arch_index} with PP {arch.pp}, ICP {arch.icp}, OCP {arch.ocp} "
            "is not an entry of the DPUCZDX8G ARCH table"
        )
    for field_name, value, limit in (("alu_pp", arch.alu_pp, 15), ("img_bank_groups", arch.img_bank_groups, 3)):
        if not 0 <= value <= limit:
            raise ArchError(f"{arch.name}: {field_name} {value} does not fit its fingerprint field [0,{limit}]")
    if arch.isa == 0 and (arch.dw_leaky or arch.save_argmax):
        raise ArchError(f"{arch.name}: ISA0 has no depthwise LeakyReLU or SAVE argmax (bits 29/30 mean other things)")
    if arch.fp_other_bits & ~(_FEATURE_MASK & ~_ARCH_FIELD_MASK[arch.isa]):
        raise ArchError(f"{arch.name}: fp_other_bits 0x{arch.fp_other_bits:X} overlap the fields or exceed 48 bits")
    fp = (family_code << 56) | (arch.isa << 48) | arch.arch_index | (arch.alu_pp << 8)
    fp |= (arch.img_bank_groups << 24) | (int(arch.channel_augmentation) << 26) | (int(arch.conv_leaky) << 28)
    if arch.isa == 1:
        fp |= (int(arch.dw_leaky) << 29) | (int(arch.save_argmax) << 30)
    return fp | arch.fp_other_bits
