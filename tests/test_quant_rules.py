"""quant.rules: every DPU constraint on both sides of its boundary, and the ISA field encodings."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_dpu.errors import QuantizationError
from tvm_dpu.quant import rules
from tvm_dpu.quant.fixpoint import LEAKY_ALPHA


# -- conv ------------------------------------------------------------------------------------------
def test_conv_shift_cut_range():
    assert rules.conv_params("c", 3, 4, 7).shift_cut == 0
    with pytest.raises(QuantizationError, match="'c'.*shift_cut.*= -1"):
        rules.conv_params("c", 3, 4, 8)
    assert rules.conv_params("c", 10, 8, 2).shift_cut == 16
    with pytest.raises(QuantizationError, match="'c'.*shift_cut.*= 17"):
        rules.conv_params("c", 10, 8, 1)


def test_conv_bias_shift_semantic_and_isa_field():
    q = rules.conv_params("c", 4, 6, 5, fp_bias=10)
    assert (q.shift_bias, q.shift_bias_isa) == (0, 1)
    q = rules.conv_params("c", 4, 6, 5, fp_bias=11)  # one bit finer than the accumulator: field 0 (2*acc + bias)
    assert (q.shift_bias, q.shift_bias_isa) == (-1, 0)
    with pytest.raises(QuantizationError, match="'c'.*bias shift.*= -2 < -1"):
        rules.conv_params("c", 4, 6, 5, fp_bias=12)
    q = rules.conv_params("c", 12, 8, 10, fp_bias=1)  # semantic 19 -> field 20, the largest allowed
    assert (q.shift_bias, q.shift_bias_isa) == (19, 20)
    with pytest.raises(QuantizationError, match="'c'.*shift_bias field.*= 21 > 20"):
        rules.conv_params("c", 12, 8, 10, fp_bias=0)
    q = rules.conv_params("c", 4, 6, 5)  # no bias
    assert q.shift_bias == 0


def test_conv_relu6_needs_fix_point_4():
    assert rules.conv_params("c", 4, 6, 4, act="relu6").act_type == 4
    for fp_out in (3, 5):
        with pytest.raises(QuantizationError, match="'c'.*relu6.*must be 4"):
            rules.conv_params("c", 4, 6, fp_out, act="relu6")


def test_leaky_alpha_tolerance():
    for alpha in (None, LEAKY_ALPHA, 0.1, LEAKY_ALPHA + rules.LEAKY_ALPHA_TOLERANCE,
                  LEAKY_ALPHA - rules.LEAKY_ALPHA_TOLERANCE):
        assert rules.conv_params("c", 4, 6, 5, act="leaky_relu", alpha=alpha).act_type == 3
    for alpha in (LEAKY_ALPHA + rules.LEAKY_ALPHA_TOLERANCE + 1e-6, 0.01, 0.2):
        with pytest.raises(QuantizationError, match="'c'.*alpha"):
            rules.conv_params("c", 4, 6, 5, act="leaky_relu", alpha=alpha)


def test_engine_activations():
    assert rules.conv_params("d", 4, 6, 4, act="relu6", engine="alu").act == "relu6"
    with pytest.raises(QuantizationError, match="'d'.*leaky_relu.*alu"):
        rules.conv_params("d", 4, 6, 5, act="leaky_relu", engine="alu")
    with pytest.raises(QuantizationError, match="'c'.*hard_swish.*conv"):
        rules.conv_params("c", 4, 6, 5, act="hard_swish")
    with pytest.raises(QuantizationError, match="unknown activation"):
        rules.conv_params("c", 4, 6, 5, act="gelu")


# -- eltwise ----------------------------------------------------------------------------------------
def test_eltwise_add_input_count():
    assert rules.eltwise_params("e", "add", [3], 3).shift_read == (0,)
    assert len(rules.eltwise_params("e", "add", [3] * 4, 3).shift_read) == 4
    for n in (0, 5):
        with pytest.raises(QuantizationError, match="'e'.*1 to 4 inputs"):
            rules.eltwise_params("e", "add", [3] * n, 3)


def test_eltwise_add_shift_read_range():
    q = rules.eltwise_params("e", "add", [15, 0], 0)
    assert q.shift_read == (15, 0) and q.write_exp == 0
    with pytest.raises(QuantizationError, match="'e'.*read shifts \\[16, 0\\]"):
        rules.eltwise_params("e", "add", [16, 0], 0)
    # inputs much finer than the output: the write shift stops at 2**-15, the reads take the rest
    q = rules.eltwise_params("e", "add", [30, 30], 0)
    assert q.write_exp == -15 and q.shift_read == (15, 15) and q.shift_write == 31
    with pytest.raises(QuantizationError, match="'e'"):
        rules.eltwise_params("e", "add", [31, 30], 0)


def test_eltwise_add_write_shift_range():
    q = rules.eltwise_params("e", "add", [0, 0], 15)
    assert q.write_exp == 15 and q.shift_write == 15
    with pytest.raises(QuantizationError, match="'e'.*write scale 2\\*\\*16"):
        rules.eltwise_params("e", "add", [0, 0], 16)


def test_eltwise_add_exactness_boundary():
    assert rules.eltwise_params("e", "add", [5, 3], 3).exact  # spread 2: read shift 2 keeps every bit
    assert not rules.eltwise_params("e", "add", [6, 3], 3).exact  # spread 3 truncates one bit
    assert rules.eltwise_params("e", "add", [5, 3], 3).act_type == 0
    assert rules.eltwise_params("e", "add", [5, 3], 3, act="relu").act_type == 1
    with pytest.raises(QuantizationError, match="'e'.*relu6.*ELEW"):
        rules.eltwise_params("e", "add", [5, 3], 3, act="relu6")


def test_eltwise_mul():
    with pytest.raises(QuantizationError, match="'m'.*exactly 2"):
        rules.eltwise_params("m", "mul", [3, 3, 3], 3)
    q = rules.eltwise_params("m", "mul", [0, 0], 15)  # needs a left shift of 15: the limit
    assert q.write_exp == 15 and q.shift_read == (0, 0)
    with pytest.raises(QuantizationError, match="'m'"):
        rules.eltwise_params("m", "mul", [0, 0], 16)
    q = rules.eltwise_params("m", "mul", [10, 9], 0)  # 19 bits to drop: 15 by the write, 2 + 2 by the reads
    assert q.write_exp == -15 and q.shift_read == (2, 2) and q.exact
    assert not rules.eltwise_params("m", "mul", [10, 10], 0).exact
    assert rules.eltwise_params("m", "mul", [23, 22], 0).shift_read == (15, 15)
    with pytest.raises(QuantizationError, match="'m'"):
        rules.eltwise_params("m", "mul", [23, 23], 0)


def test_shift_write_encoding():
    for e in range(-15, 16):
        f = rules.encode_shift_write(e)
        assert 0 <= f <= 31 and rules.decode_shift_write(f) == e
    assert rules.encode_shift_write(-1) == 17
    for e in (-16, 16):
        with pytest.raises(QuantizationError):
            rules.encode_shift_write(e)


# -- pooling ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("k,mf,field,exact", [((3, 3), 7, 14, False), ((2, 2), 1, 10, True), ((7, 7), 21, 18, False),
                                              ((5, 5), 10, 16, False), ((14, 14), 21, 20, False),
                                              ((4, 4), 1, 12, True), ((1, 1), 1, 0, True)])
def test_avgpool_factors_and_fields(k, mf, field, exact):
    q = rules.avgpool_params("p", *k, 5, 5)
    assert (q.multi_factor, q.shift_cut, q.exact) == (mf, field, exact)
    assert rules.decode_tsc(q.shift_cut) == q.exponent


def test_avgpool_shift_range():
    assert rules.avgpool_params("p", 1, 1, 0, 7).shift_cut == 7
    with pytest.raises(QuantizationError, match="'p'.*2\\*\\*8"):
        rules.avgpool_params("p", 1, 1, 0, 8)
    assert rules.avgpool_params("p", 2, 2, 53, 0).shift_cut == 63  # 2**-55
    with pytest.raises(QuantizationError, match="'p'.*2\\*\\*-56"):
        rules.avgpool_params("p", 2, 2, 54, 0)


def test_avgpool_multiplier_fits_int8():
    for k in range(1, 40):
        q = rules.avgpool_params("p", k, k, 8, 8)
        assert 1 <= q.multi_factor <= 127


def test_avgpool_count_include_pad():
    rules.check_avgpool_padding("p", [0, 0, 0, 0], False)
    rules.check_avgpool_padding("p", [1, 1, 1, 1], True)
    with pytest.raises(QuantizationError, match="'p'.*count_include_pad=False"):
        rules.check_avgpool_padding("p", [0, 0, 1, 0], False)


def test_maxpool_shift_range():
    assert rules.maxpool_params("m", 5, 5).shift_cut == 0
    assert rules.maxpool_params("m", 0, 7).shift_cut == 7
    with pytest.raises(QuantizationError, match="'m'"):
        rules.maxpool_params("m", 0, 8)
    assert rules.maxpool_params("m", 55, 0).shift_cut == 63
    with pytest.raises(QuantizationError, match="'m'"):
        rules.maxpool_params("m", 56, 0)
    for e in range(-55, 8):
        assert rules.decode_tsc(rules.encode_tsc(e)) == e


# -- activations -----------------------------------------------------------------------------------
def test_leaky_params():
    q = rules.leaky_params("l", 4, 4)
    assert (q.multi_factor, q.shift_prelu_p, q.shift_prelu_n) == (26, 32, 40)
    q = rules.leaky_params("l", 2, 5)  # output finer than input: positive side multiplies by 2**3
    assert (q.shift_p, q.shift_n, q.shift_prelu_p, q.shift_prelu_n) == (-3, 5, 3, 37)
    assert rules.leaky_params("l", 23, 0).shift_prelu_n == 63
    with pytest.raises(QuantizationError, match="'l'"):
        rules.leaky_params("l", 24, 0)
    assert rules.leaky_params("l", 0, 31).shift_prelu_p == 31
    with pytest.raises(QuantizationError, match="'l'"):
        rules.leaky_params("l", 0, 32)
    with pytest.raises(QuantizationError, match="'l'.*alpha"):
        rules.leaky_params("l", 4, 4, alpha=0.3)


def test_shp_encoding():
    for s in range(-31, 32):
        assert rules.decode_shp(rules.encode_shp(s)) == s
    for s in (-32, 32):
        with pytest.raises(QuantizationError):
            rules.encode_shp(s)


def test_prelu_negative_slopes():
    pos = np.array([1, 2, 0], np.int8)
    neg = np.array([1, -2, 0], np.int8)
    assert rules.prelu_params("p", 4, 7, 4, pos).shift_n == 7
    assert rules.prelu_params("p", 4, 0, 4, neg).shift_n == 0  # fp_alpha 0: both shifts agree
    with pytest.raises(QuantizationError, match="'p'.*negative slopes"):
        rules.prelu_params("p", 4, 1, 4, neg)


def test_hsigmoid_params():
    q = rules.hsigmoid_params("h", 4, 7)
    assert (q.shift_bias, q.shift_cut) == (4, 11)
    assert rules.hsigmoid_params("h", 0, 7).shift_bias == 0
    assert rules.hsigmoid_params("h", 20, 7).shift_bias == 20
    for fp_in in (-1, 21):
        with pytest.raises(QuantizationError, match="'h'.*shift_bias"):
            rules.hsigmoid_params("h", fp_in, 7)
    for fp_out in (6, 8):
        with pytest.raises(QuantizationError, match="'h'.*must be 7"):
            rules.hsigmoid_params("h", 4, fp_out)


# -- data movement ----------------------------------------------------------------------------------
def test_concat_params():
    q = rules.concat_params("c", [3, 3, 3], 3)
    assert q.free and q.requant == (None, None, None)
    q = rules.concat_params("c", [3, 5, 10], 3)
    assert not q.free and q.requant[0] is None
    assert q.requant[1].exponent == -2 and q.requant[2].exponent == -7
    with pytest.raises(QuantizationError, match="'c'"):
        rules.concat_params("c", [3, -5], 3)  # needs 2**8


def test_same_fix_point():
    rules.same_fix_point("u", 3, 3, "upsample")
    with pytest.raises(QuantizationError, match="'u'.*upsample"):
        rules.same_fix_point("u", 3, 4, "upsample")
