"""DPUV3E field conventions the code generator writes and the DPUV3E emulator reads (AMD's simulator, the
`<DPUVersion::DPUV3E>` paths of Load / Conv / Pool / Elew.cpp): defined once here, below both (the encoders are
the code generator's, codegen/dpuv3e_ops.py)."""
from __future__ import annotations

#: LOAD bank_id of a weight load: both DDR ports, one CONV weight bank per output channel (Load<DPUV3E>::Exec).
WEIGHT_LOAD_BANK = 0x3F
#: CONVINIT / DWINIT shift_bias from this value on are negative shifts (32 - field), as in Conv::bias.
SHIFT_BIAS_NEGATIVE = 32
#: POOLINIT shift_cut and ELEW shift_write (4 bits): below this a scale 2**field, from it on 2**(SHIFT_SPLIT - field).
SHIFT_SPLIT = 8
#: The simulator's average pool divides by kernel_w's table entry: these widths use the DPU's reciprocal table
#: (fixpoint.avgpool_factor of a square kernel), the others divide by kernel_h * kernel_w in floating point.
AVG_TABLE_WIDTHS = frozenset({3, 5, 6, 7})


def scale_exponent(field: int) -> int:
    """The exponent e of the scale 2**e a POOL shift_cut / ELEW shift_write field applies."""
    return field if field < SHIFT_SPLIT else SHIFT_SPLIT - field


def shift_bias_exponent(field: int) -> int:
    """The shift s of a CONVINIT / DWINIT shift_bias field: the bias weighs 2**s accumulator units."""
    return field if field < SHIFT_BIAS_NEGATIVE else SHIFT_BIAS_NEGATIVE - field


def avg_table_exact(kh: int, kw: int) -> bool:
    """Whether the DPUV3E average pool divides exactly as the golden reference's fixpoint.avgpool_factor does."""
    k = kh * kw
    return (kh == kw and kw in AVG_TABLE_WIDTHS) or k & (k - 1) == 0
