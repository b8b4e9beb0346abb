"""The emulator's compiled-program path: caching, error order, exact float32 GEMM, BLAS threads, benchmarks."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from tvm_dpu.arch.arch import find_preset
from tvm_dpu.codegen.isa import encode_program, make_instr
from tvm_dpu.errors import EmulatorError
from tvm_dpu.quant.fixpoint import saturate_int8, shift_round
from tvm_dpu.emulator import threads as emu_threads
from tvm_dpu.emulator import core as emu_mod
from tvm_dpu.emulator.conv import GEMM_CHUNK, exact_matmul_t
from tvm_dpu.emulator.core import Emulator, blas_threads

ARCH = find_preset("DPUCZDX8G_ISA1_B4096")
BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load_bench(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _convinit(shift_cut: int):
    return make_instr("CONVINIT", kernel_h=1, kernel_w=1, stride_h=1, stride_w=1, stride_out=1,
                      valid_pixel_parallel=1, jump_read=1, jump_read_endl=1, jump_write=1, jump_write_endl=1,
                      shift_cut=shift_cut, shift_bias=0, act_type=0)


CONV_1X1 = make_instr("CONV", bank_id_in=0, channel_group=1, length=1, bank_id_out=8)


def _setup_1x1(emu: Emulator, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = rng.integers(-128, 128, size=16, dtype=np.int8)
    w = rng.integers(-128, 128, size=(16, 16), dtype=np.int8)
    b = rng.integers(-128, 128, size=16, dtype=np.int8)
    emu.banks.bank(0)[0] = x.view(np.uint8)
    for o in range(16):
        emu.banks.bank(emu.banks.base_id["CONVW"] + o)[0] = w[o].view(np.uint8)
    emu.banks.bank(emu.banks.base_id["BIAS"])[0] = b.view(np.uint8)
    return x, w, b


def test_cached_program_follows_convinit_state():
    """A CONV compiled against the CONVINIT left by an earlier program must be recompiled when that state changes."""
    rng = np.random.default_rng(1)
    emu = Emulator(ARCH)
    x, w, b = _setup_1x1(emu, rng)
    acc = w.astype(np.int64) @ x.astype(np.int64)
    conv_only = encode_program([CONV_1X1])
    for shift_cut in (2, 5, 2):
        emu.run(encode_program([_convinit(shift_cut)]), {})
        emu.run(conv_only, {})
        want = saturate_int8(shift_round(2 * acc + b.astype(np.int64), shift_cut + 1))
        assert np.array_equal(emu.banks.bank(8)[0].view(np.int8), want)


def test_second_run_reuses_compiled_program(monkeypatch):
    calls = []
    real = Emulator._compile

    def counting(self, code):
        calls.append(len(code))
        return real(self, code)
    monkeypatch.setattr(Emulator, "_compile", counting)
    rng = np.random.default_rng(2)
    emu = Emulator(ARCH)
    code = encode_program([_convinit(3), CONV_1X1, make_instr("END")])
    emu.prepare(code, {})
    x, w, b = _setup_1x1(emu, rng)
    first = emu.run(code, {})
    out1 = emu.banks.bank(8)[0].copy()
    x2, w2, b2 = _setup_1x1(emu, rng)  # new data, same program
    second = emu.run(code, {})
    assert len(calls) == 1
    assert first.counts == second.counts and second.macs == 16 * 16 and second.ended
    want = saturate_int8(shift_round(2 * (w2.astype(np.int64) @ x2.astype(np.int64)) + b2.astype(np.int64), 4))
    assert np.array_equal(emu.banks.bank(8)[0].view(np.int8), want)
    assert not np.array_equal(out1, emu.banks.bank(8)[0])


def test_check_failure_raises_after_earlier_instructions_ran():
    """A check that fails while compiling is raised when execution reaches that instruction, not before."""
    load = make_instr("LOAD", bank_id=2, bank_addr=7, length=1, channel=16, jump_read=16, jump_write=1,
                      broadcast=7, const_value=0x5A, reg_id=0)
    bad_save = make_instr("SAVE", bank_id=2, bank_addr=7, length=1, channel=16, jump_read=1, jump_write=16,
                          reg_id=5)
    emu = Emulator(ARCH)
    with pytest.raises(EmulatorError, match=r"instruction 1 \(SAVE\) field reg_id=5.*not defined"):
        emu.run(encode_program([load, bad_save, make_instr("END")]), {0: np.zeros(64, dtype=np.uint8)})
    assert np.all(emu.banks.bank(2)[7] == 0x5A)
    assert emu.stats.counts == {"LOAD": 1} and emu.stats.load_bytes == 16 and not emu.stats.ended


@pytest.mark.parametrize("k", [GEMM_CHUNK, GEMM_CHUNK + 1, 9 * 512])
def test_float32_gemm_is_exact_at_the_extremes(k):
    rng = np.random.default_rng(k)
    a = np.full((5, k), -128, dtype=np.int64)
    a[1] = 127
    a[2:] = rng.integers(-128, 128, size=(3, k))
    w = np.full((16, k), -128, dtype=np.int64)
    w[3] = 127
    got = exact_matmul_t(a.astype(np.float32), w.astype(np.float32))
    assert got.dtype == np.int64
    assert np.array_equal(got, a @ w.T)


def test_blas_threads_restores_previous_count(monkeypatch):
    setter = emu_threads.openblas_thread_setter()
    if setter is None:
        pytest.skip("numpy's OpenBLAS not found")
    before = setter(3)
    try:
        with blas_threads(1):
            assert setter(1) == 1
        assert setter(3) == 3
        monkeypatch.setenv("TVM_DPU_EMU_BLAS_THREADS", "two")
        with pytest.raises(EmulatorError, match="TVM_DPU_EMU_BLAS_THREADS"):
            with blas_threads():
                pass
    finally:
        setter(before)


def test_bench_emulator_conv_with_wrapping_windows(tmp_path):
    """The hand-built conv benchmark (its first tile's windows wrap the bank depth) matches its direct numpy
    convolution on every run, compiled and cached."""
    bench = _load_bench("bench_emulator")
    code, setup, ref, _ = bench.build(bench.B4096, 20, 12, 40, 20, 3, 10, np.random.default_rng(0))
    emu = Emulator(bench.B4096)
    for _ in range(2):
        emu.reset()
        setup(emu)
        emu.run(code, {})
        assert np.array_equal(bench.read_output(emu, 20, 12, 20), ref)


@pytest.mark.slow
def test_bench_e2e_quick(tmp_path):
    bench = _load_bench("bench_e2e")
    out = tmp_path / "e2e.json"
    assert bench.main(["--quick", "--runs", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    row = doc["models"][0]
    assert row["model"] == "resnet50" and row["reduced"] and row["instructions"] > 0 and row["macs"] > 0
    assert len(row["run_s"]["all"]) == 1 and row["emulator_s"]["median"] > 0


def test_bench_e2e_times_a_vai_c_xmodel(tmp_path, capsys):
    """--xmodel times a vai_c program's warm runs (the vendored MNIST classifier here: 230 instructions) and
    records them under "xmodels", with the goal given and the counts of what ran."""
    bench = _load_bench("bench_e2e")
    xmodel = Path(__file__).resolve().parent / "data" / "xmodel" / "dpu_pynq" / "dpu_mnist_classifier.xmodel"
    out = tmp_path / "e2e.json"
    assert bench.main(["--xmodel", str(xmodel), "--xmodel-goal", "0.3", "--runs", "2", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["models"] == [] and "condition" not in doc and "host" in doc
    (row,) = doc["xmodels"]
    assert row["xmodel"] == xmodel.name and row["goals"] == {"run_s_median_max": 0.3}
    assert len(row["run_s"]["all"]) == 2 and row["emulator_s"]["median"] > 0
    assert row["instructions"] == sum(row["counts"].values()) and row["counts"]["END"] == 1 and row["macs"] > 0
    assert xmodel.name[:43] in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--xmodel", str(tmp_path / "missing.xmodel")])


def test_load_and_save_on_strided_regions():
    """DDR regions may be strided 1-D views; pitched LOAD / SAVE items must follow the view, not its buffer."""
    backing = np.arange(512, dtype=np.uint8)
    src = backing[::2]  # 256 bytes, element stride 2
    dst_backing = np.zeros(512, dtype=np.uint8)
    dst = dst_backing[::2]
    load = make_instr("LOAD", bank_id=1, bank_addr=0, length=3, channel=16, jump_read=40, jump_write=1, reg_id=0,
                      ddr_addr=8)
    save = make_instr("SAVE", bank_id=1, bank_addr=0, length=3, channel=16, jump_read=1, jump_write=24, reg_id=1,
                      ddr_addr=4)
    Emulator(ARCH).run(encode_program([load, save, make_instr("END")]), {0: src, 1: dst})
    want = np.zeros(256, dtype=np.uint8)
    for i in range(3):
        want[4 + 24 * i:4 + 24 * i + 16] = src[8 + 40 * i:8 + 40 * i + 16]
    assert np.array_equal(dst, want)
    assert not dst_backing[1::2].any()


def _conv_run_program(outs: list[tuple[int, int]], weights_rows: list[int]) -> np.ndarray:
    """CONVINIT then adjacent 3x3 CONVs over one window of bank 0, CONV k reading weights at row
    `weights_rows[k]` and writing (bank, row) `outs[k]`."""
    return encode_program(_conv_run_instrs(outs, weights_rows))


def _conv_run_instrs(outs: list[tuple[int, int]], weights_rows: list[int]) -> list:
    init = make_instr("CONVINIT", kernel_h=3, kernel_w=3, stride_h=1, stride_w=1, stride_out=1,
                      valid_pixel_parallel=4, jump_read=2, jump_read_endl=20, jump_write=1, jump_write_endl=8,
                      shift_cut=6, shift_bias=1, act_type=1)
    convs = [make_instr("CONV", bank_id_in=0, channel_group=2, length=4, bank_id_out=bo, bank_addr_out=ro,
                        bank_addr_weights=wr, bank_addr_bias=k, pad_top=1, pad_left=1, pad_bottom=2,
                        pad_right=2, channel_offset=3)
             for k, ((bo, ro), wr) in enumerate(zip(outs, weights_rows))]
    return [init] + convs


def _fill_banks(emu: Emulator, seed: int) -> None:
    rng = np.random.default_rng(seed)
    emu.banks.mem[...] = rng.integers(0, 256, size=emu.banks.mem.shape, dtype=np.uint8)
    emu.banks.mem[0, :4] = 0x80  # -128 everywhere in some window rows (saturating products)
    emu.banks.mem[emu.banks.base_id["CONVW"], :18] = 0x80


@pytest.mark.parametrize("outs, wrows, batched", [
    ([(8, 0), (8, 64), (9, 0), (10, 200)], [0, 18, 36, 54], True),  # a layer's output-channel groups
    ([(8, 0), (0, 0), (9, 0)], [0, 18, 36], False),  # CONV 1 overwrites the window: one by one
])
def test_batched_conv_run_equals_one_by_one(monkeypatch, outs, wrows, batched):
    """Adjacent CONVs over one window run as one GEMM only when nothing one writes another reads; either way the
    banks end exactly as executing them one after the other leaves them."""
    code = _conv_run_program(outs, wrows)
    results = []
    for batch in (True, False):
        if not batch:
            monkeypatch.setattr(emu_mod, "_batch_conv_runs", lambda steps, names: list(steps))
        emu = Emulator(ARCH)
        _fill_banks(emu, 7)
        stats = emu.run(code, {})
        program = next(iter(emu._programs.values()))
        results.append((emu.banks.mem.copy(), stats.counts, stats.macs))
        if batch:
            assert (emu_mod._skip in program.steps) == batched
    (mem_b, counts_b, macs_b), (mem_s, counts_s, macs_s) = results
    assert np.array_equal(mem_b, mem_s) and counts_b == counts_s and macs_b == macs_s
    assert counts_b["CONV"] == len(outs)


def _load(bank: int, row: int) -> object:
    return make_instr("LOAD", bank_id=bank, bank_addr=row, length=2, channel=16, jump_read=16, jump_write=1,
                      reg_id=0, ddr_addr=64)


def _save(bank: int, row: int) -> object:
    return make_instr("SAVE", bank_id=bank, bank_addr=row, length=2, channel=16, jump_read=1, jump_write=16,
                      reg_id=1, ddr_addr=32)


def _alu(bank_in: int, row_in: int, bank_out: int, row_out: int) -> list:
    """ALUINIT + a 1x1 maxpool ALU (a copy) of 2 rows x 2 pixels."""
    return [make_instr("ALUINIT", exec_mode=3, channel_group=1, length=2, jump_read=1, jump_write=1),
            make_instr("ALU", valid_pixel_parallel=2, bank_id_in=bank_in, bank_addr_in=row_in, bank_id_out=bank_out,
                       bank_addr_out=row_out)]


CONVW0 = ARCH.bank_group("CONVW").base_id


@pytest.mark.parametrize("between, batched", [
    ([_load(CONVW0, 100)], True),  # the next group's weights, loaded beside this one's (vai_c's order)
    ([_load(CONVW0 + 3, 5)], False),  # overwrites CONV 0's weights: it must run first
    ([_load(2, 1)], False),  # overwrites the window
    ([_save(12, 500)], True),
    ([_save(8, 1)], False),  # saves CONV 0's output
    (_alu(4, 300, 12, 400), True),  # another layer's ALU
    (_alu(9, 0, 12, 400), False),  # reads CONV 0's output
    (_alu(4, 300, 8, 2), False),  # overwrites CONV 0's output
])
def test_conv_group_across_other_instructions_equals_one_by_one(monkeypatch, between, batched):
    """CONVs over one window separated by LOADs, SAVEs and ALUs run as one GEMM at the last CONV's place only when
    none of those touches what the earlier CONV reads or writes; either way banks and DDR end as executing the
    program in order leaves them."""
    init, conv0, conv1 = _conv_run_instrs([(8, 0), (8, 64)], [0, 18])
    prog = encode_program([init, conv0, *between, conv1])
    results = []
    for batch in (True, False):
        if not batch:
            monkeypatch.setattr(emu_mod, "_batch_conv_runs", lambda steps, names: list(steps))
        emu = Emulator(ARCH)
        _fill_banks(emu, 5)
        regions = {0: np.random.default_rng(1).integers(0, 256, 256, dtype=np.uint8), 1: np.zeros(256, np.uint8)}
        stats = emu.run(prog, regions)
        program = next(iter(emu._programs.values()))
        results.append((emu.banks.mem.copy(), regions[1].copy(), stats.counts))
        if batch:
            assert (emu_mod._skip in program.steps) == batched
    (mem_b, ddr_b, counts_b), (mem_s, ddr_s, counts_s) = results
    assert np.array_equal(mem_b, mem_s) and np.array_equal(ddr_b, ddr_s) and counts_b == counts_s


def _elewinit(i: int, bank: int, row: int, shift: int):
    return make_instr("ELEWINIT", id=i, bank_id_in=bank, bank_addr_in=row, shift_read=shift, jump_read=1,
                      jump_read_endl=3, share_pp=0, jump_bank=1)


ELEW_ADD = make_instr("ELEW", num=2, valid_pixel_parallel=2, channel_group=2, length=3, bank_id_out=8,
                      bank_addr_out=5, shift_write=17, jump_write=1, jump_write_endl=3, elew_type=0, act_type=1)


@pytest.mark.parametrize("split", [False, True])
def test_planned_elew_equals_interpreted(monkeypatch, split):
    """An ELEW planned ahead (its ELEWINITs pushed by the same program) leaves the banks exactly as the
    interpreted ELEW; with an operand pushed by an earlier program it is interpreted, and still right."""
    inits = [_elewinit(0, 0, 0, 1), _elewinit(1, 2, 7, 2)]
    results = []
    for plan in (True, False):
        if not plan:
            def refuse(*args, **kwargs):
                raise EmulatorError("planning disabled by the test")
            monkeypatch.setattr(emu_mod.emu_elew, "plan_elew", refuse)
        emu = Emulator(ARCH)
        emu.banks.mem[...] = np.random.default_rng(3).integers(0, 256, size=emu.banks.mem.shape, dtype=np.uint8)
        emu.banks.mem[0, :2] = 0x7F  # saturating sums
        if split:
            emu.run(encode_program([inits[0]]), {})
            stats = emu.run(encode_program([inits[1], ELEW_ADD]), {})
        else:
            stats = emu.run(encode_program(inits + [ELEW_ADD]), {})
        assert stats.counts["ELEW"] == 1 and emu.elew_fifo == []
        results.append(emu.banks.mem.copy())
    assert np.array_equal(results[0], results[1])
