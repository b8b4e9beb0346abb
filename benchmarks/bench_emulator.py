"""Micro-benchmark of the instruction emulator: one conv-heavy layer (default 56x56x64 -> 64, 3x3, pad 1, B4096).

The program is built by hand here (not by the compiler): the input sits in VB0 with row-stride 1 (image row h in
bank h % PP, slot h // PP), one CONV per (8-row tile, output-channel group), output in VB1 with the same layout.
The result is checked against a direct numpy convolution, then timed. The first run of an Emulator compiles the
program (cached for later runs); it is reported separately as `first_s`, the later runs as `best_s`.
Prints a table and writes JSON.

    python benchmarks/bench_emulator.py [--h 56 --w 56 --cin 64 --cout 64 --k 3 --repeat 3 --json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from tvm_dpu.arch.arch import Arch
from tvm_dpu.codegen.isa import encode_program, make_instr
from tvm_dpu.quant.fixpoint import saturate_int8, shift_round
from tvm_dpu.emulator.core import Emulator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_results  # noqa: E402  (benchmarks/results_io.py)

B4096 = Arch(name="DPUCZDX8G_ISA1_B4096", family="DPUCZDX8G", isa=1, arch_index=7, pp=8, icp=16, ocp=16, alu_pp=4)


def build(arch: Arch, h: int, w: int, cin: int, cout: int, k: int, shift_cut: int, rng: np.random.Generator):
    """(code, setup(emu), expected int8 (h, w, cout)) for a stride-1 'same' conv with ReLU."""
    pp, icp, ocp, depth = arch.pp, arch.icp, arch.ocp, arch.bank_depth
    cg, og = -(-cin // icp), -(-cout // ocp)
    pad = k // 2
    slot = w * cg  # rows per image row in one bank (pixel pitch = cg rows)
    oslot = w * og
    ntiles = -(-h // pp)
    if -(-h // pp) * max(slot, oslot) > depth:
        raise SystemExit("feature map does not fit the banks; choose a smaller size")
    if og * k * k * cg > depth:
        raise SystemExit("weights of all output-channel groups do not fit one CONVW bank; choose fewer channels")
    x = rng.integers(-128, 128, size=(h, w, cin), dtype=np.int8)
    wt = rng.integers(-128, 128, size=(cout, k, k, cin), dtype=np.int8)
    bias = rng.integers(-128, 128, size=cout, dtype=np.int8)
    sb = 4

    def setup(emu: Emulator) -> None:
        mem = emu.banks.mem
        xp = np.zeros((h, w, cg * icp), dtype=np.int8)
        xp[..., :cin] = x
        for r in range(h):
            rows = (r // pp) * slot + np.arange(w * cg)
            mem[r % pp, rows] = xp[r].reshape(w * cg, icp).view(np.uint8)
        wbase = arch.bank_group("CONVW").base_id
        for o in range(cout):
            g, ol = divmod(o, ocp)
            wp = np.zeros((k * k, cg * icp), dtype=np.int8)
            wp[:, :cin] = wt[o].reshape(k * k, cin)
            mem[wbase + ol, g * k * k * cg + np.arange(k * k * cg)] = wp.reshape(-1, icp).view(np.uint8)
        bb = np.zeros(og * ocp, dtype=np.int8)
        bb[:cout] = bias
        mem[arch.bank_group("BIAS").base_id, :og] = bb.reshape(og, ocp).view(np.uint8)

    instrs = [make_instr("CONVINIT", kernel_h=k, kernel_w=k, stride_h=1, stride_w=1, stride_out=1,
                         valid_pixel_parallel=pp, jump_read=cg, jump_read_endl=1, jump_write=og,
                         jump_write_endl=oslot, shift_cut=shift_cut, shift_bias=sb, act_type=1)]
    for t in range(ntiles):
        vpp = min(pp, h - t * pp)
        if vpp != pp:
            instrs.append(make_instr("CONVINIT", kernel_h=k, kernel_w=k, stride_h=1, stride_w=1, stride_out=1,
                                     valid_pixel_parallel=vpp, jump_read=cg, jump_read_endl=1, jump_write=og,
                                     jump_write_endl=oslot, shift_cut=shift_cut, shift_bias=sb, act_type=1))
        r0 = t * pp - pad  # first input row of the window
        bank0 = r0 % pp
        bases = [(((r0 // pp) + g) * slot - pad * cg) % depth for g in range(4)]
        top = max(0, -r0)
        real_h = vpp - 1 + k
        bottom_pad = max(0, r0 + real_h - h)
        for g in range(og):
            instrs.append(make_instr(
                "CONV", bank_id_in=bank0, bank_addr_in=bases[0], bank_addr_in_1=bases[1], bank_addr_in_2=bases[2],
                bank_addr_in_3=bases[3], pad_left=pad, pad_top=top, pad_right=k - 1 - pad,
                pad_bottom=k - 1 - bottom_pad, channel_group=cg, length=w,
                channel_offset=cg * icp - cin, bank_addr_weights=g * k * k * cg, bank_addr_bias=g,
                bank_id_out=pp, bank_addr_out=t * oslot + g))
    instrs.append(make_instr("END"))
    # Direct reference (independent of the emulator's window code).
    xpad = np.zeros((h + 2 * pad, w + 2 * pad, cin), dtype=np.int64)
    xpad[pad:pad + h, pad:pad + w] = x
    acc = np.zeros((h, w, cout), dtype=np.int64)
    for i in range(k):
        for j in range(k):
            acc += np.tensordot(xpad[i:i + h, j:j + w], wt[:, i, j, :].astype(np.int64), axes=([2], [1]))
    ref = saturate_int8(np.maximum(shift_round(2 * acc + (bias.astype(np.int64) << sb), shift_cut + 1), 0))
    return encode_program(instrs), setup, ref, len(instrs)


def read_output(emu: Emulator, h: int, w: int, cout: int) -> np.ndarray:
    arch = emu.arch
    pp, ocp = arch.pp, arch.ocp
    og = -(-cout // ocp)
    out = np.zeros((h, w, og * ocp), dtype=np.int8)
    for r in range(h):
        rows = (r // pp) * w * og + np.arange(w * og)
        out[r] = emu.banks.mem[pp + r % pp, rows].view(np.int8).reshape(w, og * ocp)
    return out[..., :cout]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--h", type=int, default=56)
    ap.add_argument("--w", type=int, default=56)
    ap.add_argument("--cin", type=int, default=64)
    ap.add_argument("--cout", type=int, default=64)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--shift-cut", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs after the first (compiling) one")
    ap.add_argument("--json", default="bench_emulator.json")
    a = ap.parse_args()
    if a.repeat < 1:
        ap.error("--repeat must be >= 1")
    rng = np.random.default_rng(0)
    code, setup, ref, n_instr = build(B4096, a.h, a.w, a.cin, a.cout, a.k, a.shift_cut, rng)
    emu = Emulator(B4096)
    times = []
    ok = True
    for _ in range(a.repeat + 1):
        emu.reset()
        setup(emu)
        t0 = time.perf_counter()
        stats = emu.run(code, {})
        times.append(time.perf_counter() - t0)
        ok = ok and bool(np.array_equal(read_output(emu, a.h, a.w, a.cout), ref))
    first, times = times[0], times[1:]
    best = min(times)
    macs = a.h * a.w * a.cout * a.k * a.k * a.cin
    row = {"layer": f"{a.h}x{a.w}x{a.cin}->{a.cout} {a.k}x{a.k}", "arch": B4096.name, "instructions": n_instr,
           "conv_instrs": stats.counts["CONV"], "first_s": first, "best_s": best,
           "ms_per_conv": 1e3 * best / stats.counts["CONV"],
           "gmacs_per_s": macs / best / 1e9, "matches_reference": ok}
    print(f"{'layer':<24}{'instrs':>8}{'CONVs':>7}{'first s':>9}{'best s':>9}{'ms/CONV':>9}{'GMAC/s':>8}  ref")
    print(f"{row['layer']:<24}{n_instr:>8}{row['conv_instrs']:>7}{first:>9.4f}{best:>9.4f}{row['ms_per_conv']:>9.3f}"
          f"{row['gmacs_per_s']:>8.2f}  {'ok' if ok else 'MISMATCH'}")
    write_results(a.json, row, indent=1)
    if not ok:
        raise SystemExit("emulator output differs from the direct convolution")


if __name__ == "__main__":
    main()
