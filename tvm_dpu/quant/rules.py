"""From tensor fix_points to the integer parameters of each DPU op, with the DPU's constraints.

Every function takes the op name first and raises `QuantizationError` naming it when the DPU cannot compute the
op exactly as the fix_points ask. The golden reference (xgraph) and the code generator both take their shifts and
multipliers from here, so the two see the same parameters; each then applies them on its own.

Field encodings (isa1-semantics.md 6.4, 8.3, 9.2) are exposed next to the semantic values:

* CONV / ALU dwconv: t = (acc + bias * 2**shift_bias) / 2**shift_cut. The ISA field is shift_bias + 1, because
  the ISA1 datapath computes V = 2*acc + bias * 2**field and divides by 2**(shift_cut + 1) (bias not doubled);
  so shift_bias may be -1 (field 0: a bias with one more fraction bit than the accumulator).
* ALU shift_cut for pooling ("tsc"): field < 8 -> multiply by 2**field; field >= 8 -> divide by 2**(field - 8).
* ALU shift_prelu_p / shift_prelu_n ("shp"): field >= 32 -> divide by 2**(field - 32); field < 32 -> multiply by
  2**field.
* ELEW shift_write (5 bits): field < 16 -> multiply by 2**field; field >= 16 -> divide by 2**(field - 16).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tvm_dpu.arch.arch import LEAKY_NUM, LEAKY_SHIFT
from tvm_dpu.codegen.isa import enum_code, enum_codes
from tvm_dpu.errors import QuantizationError
from tvm_dpu.quant.fixpoint import (
    HSIGMOID_SHIFT,
    INT8_MAX,
    LEAKY_ALPHA,
    RELU6_FIX_POINT,
    avgpool_factor,
)

#: Range of CONV / dwconv shift_cut = fp_in + fp_w - fp_out (dpu-facts.md).
SHIFT_CUT_MIN, SHIFT_CUT_MAX = 0, 16
#: Upper bound of the shift_bias ISA field checked by CONV and ALU.
SHIFT_BIAS_ISA_MAX = 20
#: Lowest shift_bias = fp_in + fp_w - fp_bias: ISA field 0. The datapath computes V = 2*acc + bias * 2**field, so a
#: bias one fraction bit finer than the accumulator (fp_bias = fp_in + fp_w + 1) is exact with field 0; vai_c
#: emits that (its TF2 dense layer has fp_bias 13 = fp_in + fp_w + 1).
SHIFT_BIAS_MIN = -1
#: Slopes accepted as "LeakyReLU with alpha 26/256": the quantizer replaces them by exactly 26/256.
LEAKY_ALPHA_TOLERANCE = 1 / 256
#: Output fix_point of a hard-sigmoid: 1.0 = 128 saturates to 127, which is the only upper clamp the ALU has.
HSIGMOID_FIX_POINT = 7
#: ELEW field widths.
SHIFT_READ_MAX = 15
SHIFT_WRITE_MAX_EXP = 15
#: ALU 6-bit shift fields.
ALU_SHIFT_FIELD_MAX = 63

#: Activations each engine can fuse on ISA1 (conformance README: CONV {none, relu, leaky, relu6}; ALU
#: {none, relu, relu6}; ELEW {none, relu}).
ENGINE_ACTS = {
    "conv": ("none", "relu", "leaky_relu", "relu6"),
    "alu": ("none", "relu", "relu6"),
    "elew": ("none", "relu"),
}


# -- field encodings ----------------------------------------------------------------------------------
def encode_tsc(exponent: int, op_name: str = "?") -> int:
    """ALU pooling shift_cut field for a scale of 2**exponent (left shift up to 7, right shift up to 55)."""
    if 0 <= exponent < 8:
        return exponent
    if exponent < 0 and 8 - exponent <= ALU_SHIFT_FIELD_MAX:
        return 8 - exponent
    raise QuantizationError(f"op {op_name!r}: scale 2**{exponent} is outside the ALU shift_cut range "
                            "2**-55 .. 2**7")


def decode_tsc(field: int) -> int:
    """Exponent e of the scale 2**e an ALU pooling shift_cut field applies."""
    return field if field < 8 else -(field - 8)


def encode_shp(divide_exp: int, op_name: str = "?") -> int:
    """ALU shift_prelu_{p,n} field that divides by 2**divide_exp (negative = multiply)."""
    if 0 <= divide_exp <= ALU_SHIFT_FIELD_MAX - 32:
        return 32 + divide_exp
    if -31 <= divide_exp < 0:
        return -divide_exp
    raise QuantizationError(f"op {op_name!r}: prelu/leaky shift 2**-{divide_exp} is outside the ALU range "
                            "2**-31 .. 2**31")


def decode_shp(field: int) -> int:
    """Divide exponent of an ALU shift_prelu_{p,n} field."""
    return field - 32 if field >= 32 else -field


def encode_shift_write(exponent: int, op_name: str = "?") -> int:
    """ELEW shift_write field for a scale of 2**exponent (|exponent| <= 15)."""
    if 0 <= exponent <= SHIFT_WRITE_MAX_EXP:
        return exponent
    if -SHIFT_WRITE_MAX_EXP <= exponent < 0:
        return 16 - exponent
    raise QuantizationError(f"op {op_name!r}: ELEW write scale 2**{exponent} is outside 2**-15 .. 2**15")


def decode_shift_write(field: int) -> int:
    """Exponent e of the scale 2**e an ELEW shift_write field applies."""
    return field if field < 16 else -(field - 16)


# -- conv family ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConvQuant:
    """CONV (or ALU dwconv) parameters. Semantics: t = (acc + bias * 2**shift_bias) / 2**shift_cut, act on the
    unrounded t, DPURound. `shift_bias_isa` is the CONVINIT/ALUINIT field value (= shift_bias + 1)."""

    shift_cut: int
    shift_bias: int
    shift_bias_isa: int
    act: str
    act_type: int


def check_leaky_alpha(op_name: str, alpha: float | None) -> None:
    """Accept a LeakyReLU slope the quantizer may replace by 26/256; reject anything further away."""
    if alpha is None:
        return
    if abs(float(alpha) - LEAKY_ALPHA) > LEAKY_ALPHA_TOLERANCE:
        raise QuantizationError(f"op {op_name!r}: LeakyReLU alpha {alpha} is not representable; the DPU fixes "
                                f"alpha = {LEAKY_NUM}/{1 << LEAKY_SHIFT} (accepted within {LEAKY_ALPHA_TOLERANCE})")


def conv_params(op_name: str, fp_in: int, fp_w: int, fp_out: int, fp_bias: int | None = None,
                act: str = "none", alpha: float | None = None, engine: str = "conv") -> ConvQuant:
    """Parameters of a conv-class op (conv2d, dense, transposed conv on CONV; depthwise on the ALU, engine="alu").

    Constraints: shift_cut = fp_in + fp_w - fp_out in [0, 16]; shift_bias = fp_in + fp_w - fp_bias >= -1 and its
    ISA field shift_bias + 1 <= 20; relu6 needs fp_out == 4; the activation must be fusable on the engine;
    leaky alpha ~ 26/256. Without a bias (fp_bias None) the bias is zero and shift_bias is 0.
    """
    if engine not in ENGINE_ACTS:
        raise ValueError(f"unknown engine {engine!r}")
    if act not in enum_codes("act_type"):
        raise QuantizationError(f"op {op_name!r}: unknown activation {act!r}")
    if act not in ENGINE_ACTS[engine]:
        raise QuantizationError(f"op {op_name!r}: activation {act!r} cannot be fused on the ISA1 {engine} engine "
                                f"(allowed: {', '.join(ENGINE_ACTS[engine])})")
    shift_cut = fp_in + fp_w - fp_out
    if not SHIFT_CUT_MIN <= shift_cut <= SHIFT_CUT_MAX:
        raise QuantizationError(f"op {op_name!r}: shift_cut = fp_in + fp_w - fp_out = {fp_in} + {fp_w} - {fp_out} "
                                f"= {shift_cut} is outside [{SHIFT_CUT_MIN}, {SHIFT_CUT_MAX}]")
    if fp_bias is None:
        shift_bias = 0
    else:
        shift_bias = fp_in + fp_w - fp_bias
        if shift_bias < SHIFT_BIAS_MIN:
            raise QuantizationError(f"op {op_name!r}: bias shift = fp_in + fp_w - fp_bias = {fp_in} + {fp_w} - "
                                    f"{fp_bias} = {shift_bias} < {SHIFT_BIAS_MIN} (the DPU adds the bias to twice "
                                    f"the accumulator, so it can weigh a bias at most half an accumulator unit)")
        if shift_bias + 1 > SHIFT_BIAS_ISA_MAX:
            raise QuantizationError(f"op {op_name!r}: shift_bias field = fp_in + fp_w - fp_bias + 1 = "
                                    f"{shift_bias + 1} > {SHIFT_BIAS_ISA_MAX}")
    if act == "relu6" and fp_out != RELU6_FIX_POINT:
        raise QuantizationError(f"op {op_name!r}: relu6 clamps at 96 = 6 * 2**4, so the output fix_point must be "
                                f"{RELU6_FIX_POINT}, not {fp_out}")
    if act == "leaky_relu":
        check_leaky_alpha(op_name, alpha)
    return ConvQuant(shift_cut, shift_bias, shift_bias + 1, act, enum_code("act_type", act))


# -- element-wise ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EltwiseQuant:
    """ELEW parameters: a_i = floor(4 * x_i / 2**shift_read[i]); add: T = sum a_i, t = T * 2**write_exp / 4;
    mul: T = a_0 * a_1, t = T * 2**write_exp / 16; act; DPURound. `shift_write` is the 5-bit field.
    `exact` is False when some shift_read > 2, i.e. the read truncates low bits of that input."""

    kind: str
    shift_read: tuple[int, ...]
    shift_write: int
    write_exp: int
    act: str
    act_type: int
    exact: bool


def eltwise_params(op_name: str, kind: str, fp_ins: Sequence[int], fp_out: int, act: str = "none") -> EltwiseQuant:
    """ELEW add (1-4 inputs) or mul (2 inputs), each input with its own fix_point.

    add: input i contributes x_i * 2**(write_exp - shift_read[i]) and must equal x_i * 2**(fp_out - fp_i), so
    shift_read[i] = write_exp + fp_i - fp_out. The smallest write_exp keeping every shift_read >= 0 is chosen (the
    least truncation). A read is exact while its shift_read <= 2 (the x4 guard bits), so the op is exact when
    max(fp_i) - min(fp_i) <= 2 (and the write scale fits). Otherwise the inputs with larger fix_points lose low
    bits (floor): an error below 2**(write_exp - 2) output LSBs per truncated input before the final rounding,
    so at most 1 LSB after rounding when fp_out <= min(fp_i) (write_exp <= 0, at most 3 truncated inputs).
    mul: shift_read[0] + shift_read[1] = write_exp + fp_0 + fp_1 - fp_out; both reads 0 when the write shift can
    absorb the scale, else the excess is split between the two reads.
    """
    if kind not in ("add", "mul"):
        raise ValueError(f"unknown eltwise kind {kind!r}")
    if act not in ENGINE_ACTS["elew"]:
        raise QuantizationError(f"op {op_name!r}: activation {act!r} cannot be fused on ELEW (allowed: none, relu)")
    fps = [int(f) for f in fp_ins]
    if kind == "add" and not 1 <= len(fps) <= 4:
        raise QuantizationError(f"op {op_name!r}: ELEW add takes 1 to 4 inputs, got {len(fps)}")
    if kind == "mul" and len(fps) != 2:
        raise QuantizationError(f"op {op_name!r}: ELEW mul takes exactly 2 inputs, got {len(fps)}")
    if kind == "add":
        d = [f - fp_out for f in fps]
        write_exp = max(-SHIFT_WRITE_MAX_EXP, -min(d))
        reads = tuple(write_exp + di for di in d)
        if write_exp > SHIFT_WRITE_MAX_EXP or max(reads) > SHIFT_READ_MAX:
            raise QuantizationError(f"op {op_name!r}: input fix_points {fps} and output fix_point {fp_out} need "
                                    f"read shifts {list(reads)} and write scale 2**{write_exp}; ELEW allows "
                                    f"shift_read 0..{SHIFT_READ_MAX} and a write scale within 2**+-15")
    else:
        total = fps[0] + fps[1] - fp_out
        write_exp = max(-SHIFT_WRITE_MAX_EXP, -total)
        excess = write_exp + total
        reads = ((excess + 1) // 2, excess // 2)
        if write_exp > SHIFT_WRITE_MAX_EXP or max(reads) > SHIFT_READ_MAX:
            raise QuantizationError(f"op {op_name!r}: product of fix_points {fps} to {fp_out} needs write scale "
                                    f"2**{write_exp} and read shifts {list(reads)}, outside the ELEW fields")
    return EltwiseQuant(kind, reads, encode_shift_write(write_exp, op_name), write_exp, act, enum_code("act_type", act),
                        exact=max(reads) <= 2)


# -- pooling ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AvgPoolQuant:
    """ALU mode 2: t = float32(sum * multi_factor) * 2**exponent, DPURound; `shift_cut` is the tsc field.
    `exact` is True when multi_factor / 2**s is exactly 1 / (kh*kw) (power-of-two windows)."""

    multi_factor: int
    shift_cut: int
    exponent: int
    exact: bool


def avgpool_params(op_name: str, kh: int, kw: int, fp_in: int, fp_out: int) -> AvgPoolQuant:
    """Average pool: 1/(kh*kw) ~ multi_factor / 2**s (fixpoint.avgpool_factor), scale 2**(fp_out - fp_in - s).

    The divisor is always kh*kw: the DPU counts padded positions (count_include_pad=True), see
    `check_avgpool_padding`.
    """
    if kh <= 0 or kw <= 0:
        raise QuantizationError(f"op {op_name!r}: avg pool window {kh}x{kw} is empty")
    mf, s = avgpool_factor(kh, kw)
    if not 0 < mf <= INT8_MAX:
        raise QuantizationError(f"op {op_name!r}: multi_factor {mf} must be in 1..127 (the ALU reads it as int8)")
    exponent = fp_out - fp_in - s
    field = encode_tsc(exponent, op_name)
    return AvgPoolQuant(mf, field, exponent, exact=mf * (kh * kw) == (1 << s))


def check_avgpool_padding(op_name: str, pads: Sequence[int], count_include_pad: bool) -> None:
    """The DPU divides by the whole window, padding included; a model that excludes padding from the divisor
    (count_include_pad=False) is only the same op when there is no padding."""
    if not count_include_pad and any(int(p) for p in pads):
        raise QuantizationError(f"op {op_name!r}: avg pool with padding {list(pads)} and count_include_pad=False; "
                                "the DPU always divides by the full kernel window")


@dataclass(frozen=True)
class MaxPoolQuant:
    """ALU mode 3: t = max(window) * 2**exponent, DPURound; `shift_cut` is the tsc field."""

    shift_cut: int
    exponent: int


def maxpool_params(op_name: str, fp_in: int, fp_out: int) -> MaxPoolQuant:
    """Max pool (or a 1x1 requantizing copy): scale 2**(fp_out - fp_in)."""
    exponent = fp_out - fp_in
    return MaxPoolQuant(encode_tsc(exponent, op_name), exponent)


# -- standalone activations on the ALU ----------------------------------------------------------------
@dataclass(frozen=True)
class PreluQuant:
    """ALU mode 4 (leaky, slope multi_factor) or 1 (prelu, per-channel int8 slopes):
    v = x * slope if x < 0 else x; t = v / 2**(shift_n if v < 0 else shift_p); DPURound.
    `shift_prelu_p` / `shift_prelu_n` are the ALUINIT fields."""

    multi_factor: int
    shift_p: int
    shift_n: int
    shift_prelu_p: int
    shift_prelu_n: int


def leaky_params(op_name: str, fp_in: int, fp_out: int, alpha: float | None = None) -> PreluQuant:
    """Standalone LeakyReLU (ALU mode 4) with alpha = 26/256: x >= 0 -> x * 2**(fp_out - fp_in),
    x < 0 -> x * 26 / 2**(8 + fp_in - fp_out)."""
    check_leaky_alpha(op_name, alpha)
    shift_p = fp_in - fp_out
    shift_n = fp_in - fp_out + LEAKY_SHIFT
    return PreluQuant(LEAKY_NUM, shift_p, shift_n, encode_shp(shift_p, op_name), encode_shp(shift_n, op_name))


def prelu_params(op_name: str, fp_in: int, fp_alpha: int, fp_out: int,
                 slopes: np.ndarray | None = None) -> PreluQuant:
    """PReLU (ALU mode 1) with int8 per-channel slopes of fix_point fp_alpha.

    The ALU picks the negative-side shift from the sign *after* the slope multiplication, so a negative slope
    sends x < 0 through shift_p; that equals the model only when both shifts agree (fp_alpha == 0).
    """
    shift_p = fp_in - fp_out
    shift_n = fp_in + fp_alpha - fp_out
    if slopes is not None and np.any(np.asarray(slopes) < 0) and shift_p != shift_n:
        raise QuantizationError(f"op {op_name!r}: PReLU with negative slopes needs fp_alpha == 0 (the ALU chooses "
                                f"the shift by the sign of x*alpha); got fp_alpha = {fp_alpha}")
    return PreluQuant(0, shift_p, shift_n, encode_shp(shift_p, op_name), encode_shp(shift_n, op_name))


@dataclass(frozen=True)
class HSigmoidQuant:
    """ALU mode 7: t = min(2**32, max(0, x*2731 + 3*2731*2**shift_bias)) / 2**shift_cut, DPURound."""

    shift_bias: int
    shift_cut: int


def hsigmoid_params(op_name: str, fp_in: int, fp_out: int) -> HSigmoidQuant:
    """Hard sigmoid relu6(x + 3) / 6 ~ (x + 3) * 2731 / 2**14 (fixpoint.HSIGMOID_MUL / 2**HSIGMOID_SHIFT):
    shift_bias = fp_in, shift_cut = fp_in + 14 - fp_out.

    The ALU has no clamp at 1.0 other than int8 saturation, so fp_out must be 7 (1.0 -> 128 saturates to 127).
    """
    if fp_out != HSIGMOID_FIX_POINT:
        raise QuantizationError(f"op {op_name!r}: hard-sigmoid output fix_point must be {HSIGMOID_FIX_POINT} "
                                f"(the ALU clamps at 1.0 only through int8 saturation), got {fp_out}")
    if not 0 <= fp_in <= SHIFT_BIAS_ISA_MAX:
        raise QuantizationError(f"op {op_name!r}: hard-sigmoid shift_bias = fp_in = {fp_in} is outside "
                                f"[0, {SHIFT_BIAS_ISA_MAX}]")
    shift_cut = fp_in + HSIGMOID_SHIFT - fp_out
    if not 0 <= shift_cut <= ALU_SHIFT_FIELD_MAX:
        raise QuantizationError(f"op {op_name!r}: hard-sigmoid shift_cut {shift_cut} is outside [0, 63]")
    return HSigmoidQuant(fp_in, shift_cut)


@dataclass(frozen=True)
class ReluQuant(ConvQuant):
    """Standalone relu / relu6 as ALU mode 6 (depthwise 1x1 conv without bias): acc = x * weight, then the
    ConvQuant semantics (t = acc / 2**shift_cut, act, DPURound; mode 6 applies shift_cut as is)."""

    weight: int = 1


def relu_params(op_name: str, fp_in: int, fp_out: int, act: str) -> ReluQuant:
    """relu / relu6 on its own: x * 2**k / 2**shift_cut with shift_cut = fp_in + k - fp_out in [0, 16] and the
    smallest k in [0, 6] (the weight 2**k must be an int8) that makes shift_cut >= 0. relu6 needs fp_out == 4
    (the clamp is at 96 = 6 * 2**4), like a fused relu6."""
    if act not in ("relu", "relu6"):
        raise ValueError(f"relu_params: act {act!r} is not relu / relu6")
    k = max(0, fp_out - fp_in)
    if k > 6:
        raise QuantizationError(f"op {op_name!r}: standalone {act} with output fix_point {fp_out} more than 6 above "
                                f"the input's {fp_in} needs a weight 2**{k} beyond int8")
    q = conv_params(op_name, fp_in, k, fp_out, None, act, None, "alu")
    return ReluQuant(q.shift_cut, 0, 0, act, q.act_type, 1 << k)


# -- data movement --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConcatQuant:
    """Concat: `free` when every input already has the output fix_point (the DPU writes producers into place).
    Otherwise each differing input is requantized like an ALU 1x1 maxpool (mode 3): DPURound(x * 2**exp);
    `requant[i]` is that MaxPoolQuant, or None for inputs that need no change."""

    free: bool
    requant: tuple[MaxPoolQuant | None, ...]


def concat_params(op_name: str, fp_ins: Sequence[int], fp_out: int) -> ConcatQuant:
    """Concat with one output fix_point; inputs with another fix_point get a requantizing copy (say so: free=False)."""
    req = tuple(None if int(f) == fp_out else maxpool_params(op_name, int(f), fp_out) for f in fp_ins)
    return ConcatQuant(all(r is None for r in req), req)


def same_fix_point(op_name: str, fp_in: int, fp_out: int, what: str) -> None:
    """Ops that only move data (upsample) keep the fix_point."""
    if fp_in != fp_out:
        raise QuantizationError(f"op {op_name!r}: {what} keeps the fix_point, but input has {fp_in} and output "
                                f"{fp_out}")
