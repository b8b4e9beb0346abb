"""Per-target operator limits (tvm_dpu.arch.check_op): every rule on both sides of its boundary.

Each case is built from the arch's channel parallelism (cp) and bank depth, so the same table runs on
DPUCZDX8G_ISA1_B1152 (cp 12) and DPUCZDX8G_ISA1_B4096 (cp 16). A case expects either [] (supported) or the exact
list of reasons.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tvm_dpu.arch import Arch, OpDesc, check_op, load_arch
from tvm_dpu.arch.limits import input_channel_chunks
from tvm_dpu.errors import ArchError

ARCHS = ["DPUCZDX8G_ISA1_B1152", "DPUCZDX8G_ISA1_B4096"]


def _conv(kind="conv2d", c=32, oc=None, hw=16, **kw) -> OpDesc:
    oc = c if oc is None else oc
    base = dict(kind=kind, in_shape=(1, c, hw, hw), out_shape=(1, oc, hw, hw), kernel=(3, 3), pad=(1, 1, 1, 1))
    return OpDesc(**{**base, **kw})


def _dw(c=32, **kw) -> OpDesc:
    return _conv("depthwise_conv2d", c=c, groups=c, **kw)


def _tconv(kind="conv2d_transpose", c=32, oc=None, **kw) -> OpDesc:
    oc = c if oc is None else oc
    base = dict(kind=kind, in_shape=(1, c, 8, 8), out_shape=(1, oc, 16, 16), kernel=(4, 4), stride=(2, 2),
                pad=(1, 1, 1, 1), groups=c if kind.startswith("depthwise") else 1)
    return OpDesc(**{**base, **kw})


def _pool(kind="max_pool2d", hw=300, **kw) -> OpDesc:
    base = dict(kind=kind, in_shape=(1, 32, hw, hw), out_shape=(1, 32, hw // 2, hw // 2), kernel=(3, 3),
                stride=(2, 2), pad=(1, 1, 1, 1))
    return OpDesc(**{**base, **kw})


def _gap(h, w, **kw) -> OpDesc:
    return OpDesc("global_avg_pool", (1, 32, h, w), (1, 32, 1, 1), **kw)


def _elew(c=32, n=2, kind="eltwise_add", **kw) -> OpDesc:
    return OpDesc(kind, (1, c, 8, 8), (1, c, 8, 8), num_inputs=n, **kw)


def _up(scale=(2, 2), out=(20, 20), **kw) -> OpDesc:
    return OpDesc("upsample_nearest", (1, 32, 10, 10), (1, 32) + out, scale=scale, **kw)


def _dense(features, oc=10, **kw) -> OpDesc:
    return OpDesc("dense", (1, features), (1, oc), **kw)


def cases(arch: Arch) -> list[tuple[str, OpDesc, list[str]]]:
    """(id, op, expected reasons) for one ISA1 arch."""
    t, cp, bd, pp = arch.target_label, arch.icp, arch.bank_depth, arch.pp
    n = 256 * cp  # the 256*channel_parallel channel ceiling
    conv_acts = "relu, leaky_relu, relu6"
    c_in_ok = bd // 256 * cp  # 16x16 kernel: 256*ceil(ic/cp) <= bank_depth
    rows16 = 256 * (bd // 256 + 1)  # 16x16 kernel, one channel group too many
    in_size16 = f"kw*kh*ceil(ic/cp) = 16*16*ceil({c_in_ok + 1}/{cp}) = {rows16} exceeds bank_depth {bd} on {t}"
    return [
        # ---- conv2d
        ("conv_ok", _conv(), []),
        ("conv_kernel_1", _conv(kernel=(1, 1), pad=(0, 0, 0, 0)), []),
        ("conv_kernel_0", _conv(kernel=(0, 1), pad=(0, 0, 0, 0)),
         [f"kernel 0x1 is below [1,16] on {t}", f"pad_top 0 exceeds [0,-1] ((kernel_h-1)*dilation_h) on {t}",
          f"pad_bottom 0 exceeds [0,-1] ((kernel_h-1)*dilation_h) on {t}"]),
        ("conv_kernel_16", _conv(kernel=(16, 16), pad=(0, 0, 0, 0)), []),
        ("conv_kernel_17", _conv(kernel=(17, 17), pad=(0, 0, 0, 0)), [f"kernel 17x17 exceeds [1,16] on {t}"]),
        ("conv_kernel_w17", _conv(kernel=(1, 17), pad=(0, 0, 0, 0)), [f"kernel 1x17 exceeds [1,16] on {t}"]),
        ("conv_stride_8", _conv(stride=(8, 8)), []),
        ("conv_stride_9", _conv(stride=(9, 9)), [f"stride 9x9 exceeds [1,8] on {t}"]),
        ("conv_stride_w9", _conv(stride=(1, 9)), [f"stride 1x9 exceeds [1,8] on {t}"]),
        ("conv_stride_1", _conv(stride=(1, 1)), []),
        ("conv_stride_0", _conv(stride=(0, 1)), [f"stride 0x1 is below [1,8] on {t}"]),
        ("conv_dil1_ic_max", _conv(c=n, oc=32, kernel=(1, 1), pad=(0, 0, 0, 0)), []),
        # beyond one CONV's reduction (dilation*input_channels, in_size) or output channels: split on ISA1
        # (partial convs over input-channel slices, output-channel chunks); the ISA0 reasons in test_isa0_no_split
        ("conv_dil1_ic_over", _conv(c=n + 1, oc=32, kernel=(1, 1), pad=(0, 0, 0, 0)), []),
        ("conv_dil2_ic_max", _conv(c=n // 2, oc=32, dilation=(2, 2), pad=(0, 0, 0, 0)), []),
        ("conv_dil2_ic_over", _conv(c=n // 2 + 1, oc=32, dilation=(2, 2), pad=(0, 0, 0, 0)), []),
        ("conv_dil_w_only", _conv(c=n // 2 + 1, oc=32, dilation=(1, 2), pad=(0, 0, 0, 0)), []),
        ("conv_pad_max", _conv(dilation=(2, 2), pad=(4, 4, 4, 4)), []),
        ("conv_pad_top", _conv(dilation=(2, 2), pad=(5, 0, 0, 0)),
         [f"pad_top 5 exceeds [0,4] ((kernel_h-1)*dilation_h) on {t}"]),
        ("conv_pad_left", _conv(dilation=(1, 2), pad=(0, 5, 0, 0)),
         [f"pad_left 5 exceeds [0,4] ((kernel_w-1)*dilation_w) on {t}"]),
        ("conv_pad_bottom", _conv(pad=(0, 0, 3, 0)), [f"pad_bottom 3 exceeds [0,2] ((kernel_h-1)*dilation_h) on {t}"]),
        ("conv_pad_right", _conv(pad=(0, 0, 0, 3)), [f"pad_right 3 exceeds [0,2] ((kernel_w-1)*dilation_w) on {t}"]),
        ("conv_pad_zero", _conv(pad=(0, 0, 0, 0)), []),
        ("conv_pad_negative", _conv(pad=(-1, 0, 0, 0)), [f"pad_top -1 is below [0,2] on {t}"]),
        ("conv_in_size_max", _conv(c=c_in_ok, kernel=(16, 16), pad=(0, 0, 0, 0)), []),
        ("conv_in_size_over", _conv(c=c_in_ok + 1, kernel=(16, 16), pad=(0, 0, 0, 0)), []),
        ("conv_in_size_kw_first", _conv(c=2 * c_in_ok + 1, kernel=(16, 8), pad=(0, 0, 0, 0)), []),
        ("conv_split_relu6", _conv(c=c_in_ok + 1, kernel=(16, 16), pad=(0, 0, 0, 0), activation="relu6"),
         [f"activation relu6 of a conv split over input channels (too many for one CONV) is applied by the ELEW "
          f"add summing the partial convs, which supports relu on {t}"]),
        ("conv_grouped_in_size_over", _conv(c=2 * (c_in_ok + 1), oc=64, groups=2, kernel=(16, 16),
                                            pad=(0, 0, 0, 0)),
         [f"each of the 2 group convs: {in_size16}"]),
        ("conv_oc_max", _conv(oc=n, kernel=(1, 1), pad=(0, 0, 0, 0)), []),
        ("conv_oc_over", _conv(oc=n + 1, kernel=(1, 1), pad=(0, 0, 0, 0)), []),
        ("conv_relu", _conv(activation="relu"), []),
        ("conv_relu6", _conv(activation="relu6"), []),
        ("conv_leaky_26", _conv(activation="leaky_relu", alpha=26 / 256), []),
        ("conv_leaky_0.1", _conv(activation="leaky_relu", alpha=0.1), []),
        ("conv_leaky_25.5", _conv(activation="leaky_relu", alpha=25.5 / 256), []),
        ("conv_leaky_26.5", _conv(activation="leaky_relu", alpha=26.5 / 256),
         [f"LeakyReLU alpha 0.103516 quantizes to 27/256, DPU supports only 26/256 on {t}"]),
        ("conv_leaky_25.49", _conv(activation="leaky_relu", alpha=25.49 / 256),
         [f"LeakyReLU alpha 0.0995703 quantizes to 25/256, DPU supports only 26/256 on {t}"]),
        ("conv_leaky_0.2", _conv(activation="leaky_relu", alpha=0.2),
         [f"LeakyReLU alpha 0.2 quantizes to 51/256, DPU supports only 26/256 on {t}"]),
        ("conv_leaky_no_alpha", _conv(activation="leaky_relu"),
         [f"LeakyReLU alpha unknown, cannot check that it quantizes to 26/256 on {t}"]),
        ("conv_hswish", _conv(activation="hard_swish"),
         [f"activation hard_swish not supported for conv2d on {t} (supported: {conv_acts})"]),
        ("conv_prelu", _conv(activation="prelu"),
         [f"activation prelu not supported for conv2d on {t} (supported: {conv_acts})"]),
        # grouped (not depthwise): checked as one of its group convs (in/G -> out/G channels)
        ("conv_groups_2", _conv(groups=2), []),
        ("conv_groups_32x4d", _conv(c=128, groups=32), []),
        ("conv_groups_not_dividing", _conv(c=32, oc=30, groups=4),
         [f"groups 4 do not divide in_channels 32 and out_channels 30 on {t}"]),
        ("conv_groups_oc_per_group_max", _conv(c=8, oc=2 * n, groups=2, kernel=(1, 1), pad=(0, 0, 0, 0)), []),
        ("conv_groups_oc_per_group_over", _conv(c=8, oc=2 * n + 2, groups=2, kernel=(1, 1), pad=(0, 0, 0, 0)),
         [f"each of the 2 group convs: output channels {n + 1} exceed 256*{cp}={n} on {t}"]),
        ("conv_groups_hswish", _conv(groups=2, activation="hard_swish"),
         [f"activation hard_swish not supported for grouped conv2d (each of its 2 group convs) on {t} "
          f"(supported: {conv_acts})"]),
        ("conv_groups_dw", _conv(groups=32), []),
        ("conv_groups_dw_leaky", _conv(groups=32, activation="leaky_relu", alpha=0.1),
         [f"activation leaky_relu not supported for conv2d (as depthwise_conv2d) on {t} (supported: relu, relu6)"]),
        # ---- depthwise
        ("dw_ok", _dw(), []),
        ("dw_kernel_16", _dw(kernel=(16, 16), pad=(0, 0, 0, 0)), []),
        ("dw_kernel_17", _dw(kernel=(16, 17), pad=(0, 0, 0, 0)), [f"kernel 16x17 exceeds [1,16] on {t}"]),
        ("dw_kernel_1", _dw(kernel=(1, 1), pad=(0, 0, 0, 0)), []),
        ("dw_stride_8", _dw(stride=(8, 8)), []),
        ("dw_stride_9", _dw(stride=(9, 8)), [f"stride 9x8 exceeds [1,8] on {t}"]),
        ("dw_stride_0", _dw(stride=(1, 0)), [f"stride 1x0 is below [1,8] on {t}"]),
        ("dw_ic_max", _dw(c=n, kernel=(1, 1), pad=(0, 0, 0, 0)), []),
        ("dw_ic_over", _dw(c=n + 1, kernel=(1, 1), pad=(0, 0, 0, 0)),
         [f"dilation*input_channels = 1*{n + 1} = {n + 1} exceeds 256*{cp}={n} on {t}",
          f"output channels {n + 1} exceed 256*{cp}={n} on {t}"]),
        ("dw_dil2_ic_max", _dw(c=n // 2, dilation=(2, 2), pad=(0, 0, 0, 0)), []),
        ("dw_dil2_ic_over", _dw(c=n // 2 + 1, dilation=(2, 2), pad=(0, 0, 0, 0)),
         [f"dilation*input_channels = 2*{n // 2 + 1} = {n + 2} exceeds 256*{cp}={n} on {t}"]),
        ("dw_pad_max", _dw(pad=(2, 2, 2, 2)), []),
        ("dw_pad_bottom", _dw(pad=(0, 0, 3, 0)), [f"pad_bottom 3 exceeds [0,2] ((kernel_h-1)*dilation_h) on {t}"]),
        ("dw_pad_left", _dw(pad=(0, 3, 0, 0)), [f"pad_left 3 exceeds [0,2] ((kernel_w-1)*dilation_w) on {t}"]),
        ("dw_alu_pad_ok", _dw(kernel=(16, 16), dilation=(2, 2), pad=(15, 15, 30, 30)), []),
        ("dw_alu_pad_top", _dw(kernel=(16, 16), dilation=(2, 2), pad=(16, 0, 0, 0)),
         [f"pad_top 16 exceeds the ALU pad field [0,15] on {t}"]),
        ("dw_alu_pad_left", _dw(kernel=(16, 16), dilation=(2, 2), pad=(0, 16, 0, 0)),
         [f"pad_left 16 exceeds the ALU pad field [0,15] on {t}"]),
        ("dw_pad_bottom_dil", _dw(kernel=(16, 16), dilation=(2, 2), pad=(0, 0, 31, 0)),
         [f"pad_bottom 31 exceeds [0,30] ((kernel_h-1)*dilation_h) on {t}"]),
        ("dw_in_size_max", _dw(c=c_in_ok, kernel=(16, 16), pad=(0, 0, 0, 0)), []),
        ("dw_in_size_over", _dw(c=c_in_ok + 1, kernel=(16, 16), pad=(0, 0, 0, 0)),
         [in_size16]),
        ("dw_relu6", _dw(activation="relu6"), []),
        ("dw_relu", _dw(activation="relu"), []),
        ("dw_leaky", _dw(activation="leaky_relu", alpha=0.1),
         [f"activation leaky_relu not supported for depthwise_conv2d on {t} (supported: relu, relu6)"]),
        ("dw_hsigmoid", _dw(activation="hard_sigmoid"),
         [f"activation hard_sigmoid not supported for depthwise_conv2d on {t} (supported: relu, relu6)"]),
        ("dw_multiplier", _dw(oc=64),
         [f"depthwise needs groups == in_channels == out_channels, got groups 32, in_channels 32, "
          f"out_channels 64 on {t}"]),
        # ---- transposed conv
        ("tconv_ok", _tconv(), []),
        ("tconv_ratio_16", _tconv(kernel=(16, 16), stride=(1, 1), pad=(0, 0, 0, 0)), []),
        ("tconv_ratio_17", _tconv(kernel=(17, 16), stride=(1, 1), pad=(0, 0, 0, 0)),
         [f"kernel_h/stride_h = 17/1 exceeds [1,16] on {t}"]),
        ("tconv_ratio_32_2", _tconv(kernel=(32, 32), stride=(2, 2), pad=(0, 0, 0, 0)), []),
        ("tconv_ratio_34_2", _tconv(kernel=(32, 34), stride=(2, 2), pad=(0, 0, 0, 0)),
         [f"kernel_w/stride_w = 34/2 exceeds [1,16] on {t}"]),
        ("tconv_ratio_1", _tconv(kernel=(2, 2), stride=(2, 2), pad=(0, 0, 0, 0)), []),
        ("tconv_ratio_half", _tconv(kernel=(1, 2), stride=(2, 2), pad=(0, 0, 0, 0)),
         [f"kernel_h/stride_h = 1/2 is below [1,16] on {t}"]),
        ("tconv_stride_0", _tconv(stride=(2, 0)), [f"stride_w 0 is below 1 on {t}"]),
        ("tconv_pad_max", _tconv(pad=(3, 3, 3, 3)), []),
        ("tconv_pad_left", _tconv(pad=(0, 4, 0, 0)), [f"pad_left 4 exceeds [0,3] (kernel_w-1) on {t}"]),
        ("tconv_pad_bottom", _tconv(pad=(0, 0, 4, 0)), [f"pad_bottom 4 exceeds [0,3] (kernel_h-1) on {t}"]),
        ("tconv_pad_negative", _tconv(pad=(0, 0, 0, -1)), [f"pad_right -1 is below [0,3] on {t}"]),
        ("tconv_dilation_2", _tconv(dilation=(2, 2)), [f"dilation 2x2 exceeds [1,1] on {t}"]),
        ("tconv_oc_max", _tconv(oc=n), []),
        ("tconv_oc_over", _tconv(oc=n + 1), [f"output channels {n + 1} exceed 256*{cp}={n} on {t}"]),
        ("tconv_leaky", _tconv(activation="leaky_relu", alpha=26 / 256), []),
        ("tconv_hsigmoid", _tconv(activation="hard_sigmoid"),
         [f"activation hard_sigmoid not supported for conv2d_transpose on {t} (supported: {conv_acts})"]),
        ("tconv_groups_2", _tconv(groups=2),
         [f"groups 2 not supported on {t}: conv2d_transpose needs groups == 1, or groups == in_channels == "
          f"out_channels for depthwise (in_channels 32, out_channels 32)"]),
        ("tconv_groups_dw_leaky", _tconv(groups=32, activation="leaky_relu", alpha=0.1),
         [f"activation leaky_relu not supported for conv2d_transpose (as depthwise_conv2d_transpose) on {t} "
          f"(supported: relu, relu6)"]),
        # ---- depthwise transposed conv
        ("dwt_ok", _tconv("depthwise_conv2d_transpose", activation="relu6"), []),
        ("dwt_ratio_17", _tconv("depthwise_conv2d_transpose", kernel=(17, 17), stride=(1, 1), pad=(0, 0, 0, 0)),
         [f"kernel_h/stride_h = 17/1 exceeds [1,16] on {t}", f"kernel_w/stride_w = 17/1 exceeds [1,16] on {t}"]),
        ("dwt_pad_top", _tconv("depthwise_conv2d_transpose", pad=(4, 0, 0, 0)),
         [f"pad_top 4 exceeds [0,3] (kernel_h-1) on {t}"]),
        ("dwt_oc_max", _tconv("depthwise_conv2d_transpose", c=n), []),
        ("dwt_oc_over", _tconv("depthwise_conv2d_transpose", c=n + 1),
         [f"output channels {n + 1} exceed 256*{cp}={n} on {t}"]),
        ("dwt_leaky", _tconv("depthwise_conv2d_transpose", activation="leaky_relu", alpha=0.1),
         [f"activation leaky_relu not supported for depthwise_conv2d_transpose on {t} (supported: relu, relu6)"]),
        ("dwt_multiplier", _tconv("depthwise_conv2d_transpose", oc=64),
         [f"depthwise needs groups == in_channels == out_channels, got groups 32, in_channels 32, "
          f"out_channels 64 on {t}"]),
        # ---- pooling on the ISA1 ALU
        *[
            entry
            for kind, tag in (("max_pool2d", "max"), ("avg_pool2d", "avg"))
            for entry in (
                (f"{tag}_ok", _pool(kind), []),
                (f"{tag}_kernel_256", _pool(kind, kernel=(256, 256), stride=(256, 256), pad=(0, 0, 0, 0)), []),
                (f"{tag}_kernel_257", _pool(kind, kernel=(257, 257), stride=(256, 256), pad=(0, 0, 0, 0)),
                 [f"kernel 257x257 exceeds [1,256] on {t}"]),
                # the window of one output row: (kh-1)//sh < 4 * PP (four base addresses per ALU fetch)
                (f"{tag}_wraps_max", _pool(kind, kernel=(4 * pp, 4 * pp), stride=(1, 1), pad=(0, 0, 0, 0)), []),
                (f"{tag}_wraps_over", _pool(kind, kernel=(4 * pp + 1, 4 * pp + 1), stride=(1, 1), pad=(0, 0, 0, 0)),
                 [f"kernel_h {4 * pp + 1} with stride_h 1: one output row's window spans 5 wraps of the PP={pp} "
                  f"image banks, more than the 4 base addresses of an ALU fetch on {t}"]),
                (f"{tag}_wraps_strided", _pool(kind, kernel=(8 * pp, 8 * pp), stride=(2, 2),
                                               pad=(0, 0, 0, 0)), []),
                (f"{tag}_kernel_1", _pool(kind, kernel=(1, 1), stride=(1, 1), pad=(0, 0, 0, 0)), []),
                (f"{tag}_stride_256", _pool(kind, stride=(256, 256)), []),
                (f"{tag}_stride_257", _pool(kind, stride=(257, 257)), [f"stride 257x257 exceeds [1,256] on {t}"]),
                (f"{tag}_stride_0", _pool(kind, stride=(0, 0)), [f"stride 0x0 is below [1,256] on {t}"]),
                (f"{tag}_pad_max", _pool(kind, pad=(2, 2, 2, 2)), []),
                (f"{tag}_pad_right", _pool(kind, pad=(0, 0, 0, 3)), [f"pad_right 3 exceeds [0,2] (kernel_w-1) on {t}"]),
                (f"{tag}_pad_top", _pool(kind, pad=(3, 0, 0, 0)), [f"pad_top 3 exceeds [0,2] (kernel_h-1) on {t}"]),
                (f"{tag}_pad_negative", _pool(kind, pad=(0, -1, 0, 0)), [f"pad_left -1 is below [0,2] on {t}"]),
                (f"{tag}_alu_pad_ok", _pool(kind, kernel=(32, 32), pad=(15, 15, 31, 31)), []),
                (f"{tag}_alu_pad_top", _pool(kind, kernel=(32, 32), pad=(16, 0, 0, 0)),
                 [f"pad_top 16 exceeds the ALU pad field [0,15] on {t}"]),
                (f"{tag}_alu_pad_left", _pool(kind, kernel=(32, 32), pad=(0, 16, 0, 0)),
                 [f"pad_left 16 exceeds the ALU pad field [0,15] on {t}"]),
                (f"{tag}_pad_bottom_32", _pool(kind, kernel=(32, 32), pad=(0, 0, 32, 0)),
                 [f"pad_bottom 32 exceeds [0,31] (kernel_h-1) on {t}"]),
                (f"{tag}_relu", _pool(kind, activation="relu"), []),
                (f"{tag}_relu6", _pool(kind, activation="relu6"), []),
                (f"{tag}_leaky", _pool(kind, activation="leaky_relu", alpha=0.1),
                 [f"activation leaky_relu not supported for {kind} on {t} (supported: relu, relu6)"]),
            )
        ],
        ("max_nonsquare_ok", _pool(kernel=(3, 5), pad=(0, 0, 0, 0)), []),
        ("avg_nonsquare", _pool("avg_pool2d", kernel=(3, 5), pad=(0, 0, 0, 0)),
         [f"kernel 3x5 is not square (w == h required) on {t}"]),
        ("avg_count_include_pad_false", _pool("avg_pool2d", count_include_pad=False), []),
        ("gap_4pp", _gap(4 * pp, 4 * pp), []),
        ("gap_256", _gap(256, 256),
         [f"kernel_h 256 with stride_h 1: one output row's window spans {255 // pp + 1} wraps of the PP={pp} image "
          f"banks, more than the 4 base addresses of an ALU fetch on {t}"]),
        ("gap_1", _gap(1, 1), []),
        ("gap_257", _gap(257, 257), [f"kernel 257x257 exceeds [1,256] on {t}",
                                     f"kernel_h 257 with stride_h 1: one output row's window spans {256 // pp + 1} "
                                     f"wraps of the PP={pp} image banks, more than the 4 base addresses of an ALU "
                                     f"fetch on {t}"]),
        ("gap_nonsquare", _gap(7, 8), [f"kernel 7x8 is not square (w == h required) on {t}"]),
        ("gap_relu6", _gap(7, 7, activation="relu6"), []),
        ("gap_leaky", _gap(7, 7, activation="leaky_relu", alpha=0.1),
         [f"activation leaky_relu not supported for global_avg_pool (as avg_pool2d) on {t} (supported: relu, relu6)"]),
        # ---- eltwise
        ("elew_ok", _elew(), []),
        ("elew_ic_max", _elew(c=n), []),
        ("elew_ic_over", _elew(c=n + 1), [f"input channels {n + 1} exceed 256*{cp}={n} on {t}"]),
        ("elew_inputs_4", _elew(n=4), []),
        ("elew_inputs_5", _elew(n=5), [f"num_inputs 5 exceeds [2,4] on {t}"]),
        ("elew_inputs_1", _elew(n=1), [f"num_inputs 1 is below [2,4] on {t}"]),
        ("elew_relu", _elew(activation="relu"), []),
        ("elew_relu6", _elew(activation="relu6"),
         [f"activation relu6 not supported for eltwise_add on {t} (supported: relu)"]),
        ("elew_leaky", _elew(activation="leaky_relu", alpha=0.1),
         [f"activation leaky_relu not supported for eltwise_add on {t} (supported: relu)"]),
        # element-wise multiply (ELEW mult): two operands, equal shapes or a channel gate N x C x 1 x 1
        ("elew_mul", _elew(kind="eltwise_mul"), []),
        ("elew_mul_gate", _elew(kind="eltwise_mul", in_shape2=(1, 32, 1, 1)), []),
        ("elew_mul_gate_relu", _elew(kind="eltwise_mul", in_shape2=(1, 32, 1, 1), activation="relu"), []),
        ("elew_mul_row_broadcast", _elew(kind="eltwise_mul", in_shape2=(1, 32, 8, 1)),
         [f"operand shapes 1x32x8x8 and 1x32x8x1: eltwise_mul takes equal shapes or a channel gate 1x32x1x1 on {t}"]),
        ("elew_mul_inputs_3", _elew(kind="eltwise_mul", n=3), [f"num_inputs 3 exceeds [2,2] on {t}"]),
        ("elew_mul_ic_over", _elew(kind="eltwise_mul", c=n + 1),
         [f"input channels {n + 1} exceed 256*{cp}={n} on {t}"]),
        ("elew_add_gate", _elew(in_shape2=(1, 32, 1, 1)),
         [f"operand shapes 1x32x8x8 and 1x32x1x1: eltwise_add takes equal shapes on {t}"]),
        # ---- concat, upsample
        ("concat_ok", OpDesc("concat", (1, 32, 8, 8), (1, 96, 8, 8), num_inputs=3), []),
        ("concat_relu", OpDesc("concat", (1, 32, 8, 8), (1, 64, 8, 8), num_inputs=2, activation="relu"),
         [f"activation relu not supported for concat on {t} (supported: none)"]),
        ("up_2", _up(), []),
        ("up_from_shape", _up(scale=None), []),
        ("up_1", _up(scale=(1, 1), out=(10, 10)), []),
        ("up_16", _up(scale=(16, 16), out=(160, 160)), []),
        ("up_17", _up(scale=(17, 16), out=(170, 160)), [f"upsample scale 17x16 exceeds [1,16] on {t}"]),
        ("up_0", _up(scale=(0, 1), out=(0, 10)), [f"upsample scale 0x1 is below [1,16] on {t}"]),
        ("up_fraction", _up(scale=None, out=(25, 20)), [f"upsample scale 2.5x2 is not an integer factor on {t}"]),
        ("up_relu", _up(activation="relu"),
         [f"activation relu not supported for upsample_nearest on {t} (supported: none)"]),
        # ---- dense (1x1 conv over a 1x1 map)
        ("dense_in_max", _dense(bd * cp), []),
        ("dense_in_over", _dense(bd * cp + 1), []),
        ("dense_nchw_in", OpDesc("dense", (1, 8, 4, 4), (1, 10)), []),
        ("dense_oc_max", _dense(64, oc=n), []),
        ("dense_oc_over", _dense(64, oc=n + 1), []),
        ("dense_relu", _dense(64, activation="relu"), []),
        ("dense_hswish", _dense(64, activation="hard_swish"),
         [f"activation hard_swish not supported for dense on {t} (supported: {conv_acts})"]),
        # ---- not a DPU op
        ("unknown_kind", OpDesc("softmax", (1, 10, 1, 1), (1, 10, 1, 1)), [f"op kind 'softmax' not supported on {t}"]),
    ]


PARAMS = [
    pytest.param(name, op, expected, id=f"{name.rsplit('_', 1)[1]}-{case_id}")
    for name in ARCHS
    for case_id, op, expected in cases(load_arch(name))
]


@pytest.mark.parametrize("name,op,expected", PARAMS)
def test_limit(name, op, expected):
    assert check_op(load_arch(name), op) == expected


def test_case_ids_unique():
    ids = [case_id for case_id, _, _ in cases(load_arch(ARCHS[0]))]
    assert len(ids) == len(set(ids))


# ---- arch flags that switch rules --------------------------------------------------------------

@pytest.mark.parametrize("name", ARCHS)
def test_conv_leaky_flag(name):
    arch = dataclasses.replace(load_arch(name), conv_leaky=False)
    op = _conv(activation="leaky_relu", alpha=0.1)
    assert check_op(arch, op) == [
        f"activation leaky_relu not supported for conv2d on {arch.dpu_name} (supported: relu, relu6)"
    ]
    assert check_op(load_arch(name), op) == []


def _act(activation: str, alpha: float | None = None, shape=(1, 32, 14, 14)) -> OpDesc:
    return OpDesc("activation", shape, shape, activation=activation, alpha=alpha)


@pytest.mark.parametrize("name", ARCHS)
def test_dw_leaky_flag(name):
    base = load_arch(name)
    arch = dataclasses.replace(base, dw_leaky=True, alu_activations=("relu", "leaky_relu", "relu6"))
    # standalone LeakyReLU (ALU mode 4) follows the flag ...
    assert check_op(arch, _act("leaky_relu", 0.1)) == []
    assert check_op(base, _act("leaky_relu", 0.1)) == [
        f"activation leaky_relu not supported for activation on {name} (supported: relu, relu6, hard_sigmoid)"
    ]
    assert check_op(arch, _act("leaky_relu", 0.2)) == [
        f"LeakyReLU alpha 0.2 quantizes to 51/256, DPU supports only 26/256 on {name}"
    ]
    assert check_op(arch, _pool(activation="leaky_relu", alpha=0.1)) == []
    # ... but a LeakyReLU fused into the ALU dwconv is rejected even with the flag (not implemented), here
    # rather than by the quantizer
    assert check_op(arch, _dw(activation="leaky_relu", alpha=0.1)) == [
        f"activation leaky_relu not supported for depthwise_conv2d on {name} (supported: relu, relu6)"
    ]
    # the list alone is not enough: the flag gates it
    listed_only = dataclasses.replace(base, alu_activations=("relu", "leaky_relu", "relu6"))
    assert check_op(listed_only, _act("leaky_relu", 0.1)) != []


@pytest.mark.parametrize("name", ARCHS)
def test_standalone_activation_kind(name):
    arch = load_arch(name)
    assert check_op(arch, _act("relu")) == [] and check_op(arch, _act("relu6")) == []
    assert check_op(arch, _act("hard_sigmoid")) == []  # ALU mode 7
    assert check_op(arch, _act("hard_swish")) == [
        f"activation hard_swish not supported for activation on {name} (supported: relu, relu6, hard_sigmoid)"
    ]
    assert check_op(arch, _act("sigmoid")) == [
        f"activation sigmoid not supported for activation on {name} (supported: relu, relu6, hard_sigmoid): it "
        "needs exp, which no ISA1 engine computes (ALU modes: dwconv, prelu, leaky, avg/max pool, hsigmoid); a model "
        "trained with hard_sigmoid runs on the DPU"
    ]


@pytest.mark.parametrize("name", ARCHS)
def test_transposed_conv_phase_weights_must_fit_a_bank(name):
    arch = load_arch(name)
    ic = 2048 * arch.channel_parallel // 16  # ceil(ic/cp) = 128 rows per tap
    ok = OpDesc("conv2d_transpose", (1, ic, 4, 4), (1, 8, 8, 8), kernel=(4, 4), stride=(2, 2), pad=(1, 1, 1, 1))
    rows = 4 * (ic // arch.channel_parallel)
    reasons = check_op(arch, ok)
    if rows > arch.bank_depth:
        assert any("weights of one output phase" in r for r in reasons), reasons
    else:
        assert not any("output phase" in r for r in reasons), reasons
    big = dataclasses.replace(ok, kernel=(16, 16), stride=(1, 1), pad=(0, 0, 0, 0), out_shape=(1, 8, 19, 19))
    assert any("weights of one output phase" in r for r in check_op(arch, big))


def test_board_names_its_dpu():
    arch = load_arch("zcu102")
    assert check_op(arch, _conv(activation="leaky_relu", alpha=0.2)) == [
        "LeakyReLU alpha 0.2 quantizes to 51/256, DPU supports only 26/256 on DPUCZDX8G_ISA1_B4096 (zcu102)"
    ]
    assert check_op(load_arch("dnnvm-zu2"), _conv(kernel=(17, 17), pad=(0, 0, 0, 0))) == [
        "kernel 17x17 exceeds [1,16] on DPUCZDX8G_ISA1_B1152 (dnnvm-zu2)"
    ]


def test_brief_examples():
    b4096, b1152 = load_arch("B4096"), load_arch("B1152")
    assert check_op(b4096, _conv(kernel=(17, 17), pad=(0, 0, 0, 0))) == [
        "kernel 17x17 exceeds [1,16] on DPUCZDX8G_ISA1_B4096"]
    # split on ISA1 (output-channel chunks, input-channel slices), rejected where the profile does not split
    assert check_op(b1152, _conv(oc=4096, kernel=(1, 1), pad=(0, 0, 0, 0))) == []
    assert check_op(b4096, _conv(c=4096, pad=(0, 0, 0, 0))) == []
    isa0 = dataclasses.replace(b4096, isa=0, save_argmax=False)
    assert check_op(isa0, _conv(c=4096, pad=(0, 0, 0, 0))) == [
        "kw*kh*ceil(ic/cp) = 3*3*ceil(4096/16) = 2304 exceeds bank_depth 2048 on DPUCZDX8G_ISA0_B4096"]


@pytest.mark.parametrize("name,expected", [
    ("DPUCZDX8G_ISA1_B1152", []),  # split: 2 input-channel slices, 2 output-channel chunks
    ("DPUCZDX8G_ISA1_B4096", []),
])
def test_vgg_fc6(name, expected):
    # VGG-16 fc6: 512x7x7 = 25088 features
    assert check_op(load_arch(name), OpDesc("dense", (1, 512, 7, 7), (1, 4096))) == expected


@pytest.mark.parametrize("name", ARCHS)
def test_isa0_no_split(name):
    """The ISA0 profile has no split rule: the reduction and output-channel limits stay rejections."""
    arch = dataclasses.replace(load_arch(name), isa=0, save_argmax=False)
    t, cp, n = arch.dpu_name, arch.channel_parallel, 256 * arch.channel_parallel
    assert check_op(arch, _conv(c=n + 1, oc=n + 1, kernel=(1, 1), pad=(0, 0, 0, 0))) == [
        f"dilation*input_channels = 1*{n + 1} = {n + 1} exceeds 256*{cp}={n} on {t}",
        f"output channels {n + 1} exceed 256*{cp}={n} on {t}"]
    assert input_channel_chunks(arch, _conv(c=n + 1, kernel=(1, 1), pad=(0, 0, 0, 0))) == []


@pytest.mark.parametrize("name", ARCHS)
def test_input_channel_chunks(name):
    arch = load_arch(name)
    cp, bd = arch.channel_parallel, arch.bank_depth
    # fits one CONV: one slice
    assert input_channel_chunks(arch, _conv(c=64)) == [(0, 64)]
    # VGG-16 fc6 as the frontend gives it (a 7x7 conv over 512 channels): slices of whole channel groups, each
    # within bank_depth rows of weights
    fc6 = _conv(c=512, oc=4096, kernel=(7, 7), pad=(0, 0, 0, 0))
    slices = input_channel_chunks(arch, fc6)
    assert sum(c for _, c in slices) == 512 and [c0 for c0, _ in slices] == [0] + list(
        np.cumsum([c for _, c in slices])[:-1])
    assert all(c0 % cp == 0 and 49 * -(-c // cp) <= bd for c0, c in slices)
    assert len(slices) == (1 if 49 * -(-512 // cp) <= bd else 2)
    # dilation*input_channels: slices of at most 256/d channel groups
    dil = _conv(c=512 * cp + 1, oc=32, dilation=(2, 2), pad=(0, 0, 0, 0))
    slices = input_channel_chunks(arch, dil)
    assert all(2 * c <= 256 * cp for _, c in slices) and sum(c for _, c in slices) == 512 * cp + 1
    # one channel group alone too big for the bank: no slicing helps
    huge = _conv(c=2 * cp, oc=32, kernel=(16, 16), pad=(0, 0, 0, 0))
    assert input_channel_chunks(dataclasses.replace(arch, bank_depth=255), huge) == []
    # grouped and depthwise convs are not split
    grouped = _conv(c=2 * (bd // 256 * cp + 1), oc=64, groups=2, kernel=(16, 16), pad=(0, 0, 0, 0))
    assert check_op(arch, grouped) and input_channel_chunks(arch, grouped) == []


def test_placement_note_of_split_fc():
    from tvm_dpu.arch.limits import placement_note

    note = placement_note(load_arch("dnnvm-zu2"), _conv(c=512, oc=4096, kernel=(7, 7), pad=(0, 0, 0, 0)))
    assert note == ("input channels split into 2 slices of at most 264: 2 partial convs summed by ELEW add; "
                    "output channels in 2 CONV chunks of at most 256 channel groups")
    assert placement_note(load_arch("B4096"), _conv(c=512, oc=4096, kernel=(7, 7), pad=(0, 0, 0, 0))) is None


# ---- the table's DPUCZDX8G (ISA0) column for pooling ------------------------------------------

@pytest.mark.parametrize("name", ARCHS)
@pytest.mark.parametrize("kind", ["max_pool2d", "avg_pool2d"])
def test_isa0_pool_profile(name, kind):
    arch = dataclasses.replace(load_arch(name), isa=0, save_argmax=False)
    t = arch.dpu_name.replace("ISA1", "ISA0")
    assert arch.dpu_name == t
    assert check_op(arch, _pool(kind, kernel=(2, 2), pad=(1, 1, 1, 1))) == []
    assert check_op(arch, _pool(kind, kernel=(8, 8), stride=(8, 8), pad=(0, 0, 0, 0))) == []
    assert check_op(arch, _pool(kind, kernel=(1, 1), stride=(1, 1), pad=(0, 0, 0, 0))) == [
        f"kernel 1x1 is below [2,8] on {t}"]
    assert check_op(arch, _pool(kind, kernel=(9, 9), pad=(0, 0, 0, 0))) == [f"kernel 9x9 exceeds [2,8] on {t}"]
    assert check_op(arch, _pool(kind, stride=(9, 9))) == [f"stride 9x9 exceeds [1,8] on {t}"]
    assert check_op(arch, _pool(kind, pad=(0, 0, 0, 3))) == [f"pad_right 3 exceeds [0,2] (kernel_w-1) on {t}"]
    # ISA0 pools run on the pool engine: only the table's pad rule applies (no ALU pad fields)
    assert check_op(arch, _pool(kind, kernel=(8, 8), pad=(7, 7, 7, 7))) == []
    assert check_op(arch, _pool(kind, activation="relu")) == []
    assert check_op(arch, _pool(kind, activation="relu6")) == [
        f"activation relu6 not supported for {kind} on {t} (supported: relu)"]


def test_isa0_avg_square_and_global():
    arch = dataclasses.replace(load_arch("B4096"), isa=0, save_argmax=False)
    t = "DPUCZDX8G_ISA0_B4096"
    assert check_op(arch, _pool("avg_pool2d", kernel=(2, 3), pad=(0, 0, 0, 0))) == [
        f"kernel 2x3 is not square (w == h required) on {t}"]
    assert check_op(arch, _gap(8, 8)) == []
    assert check_op(arch, _gap(9, 9)) == [f"kernel 9x9 exceeds [2,8] on {t}"]


def test_isa0_from_fingerprint_uses_isa0_profile():
    from tvm_dpu.arch import arch_from_fingerprint

    arch = arch_from_fingerprint(0x1000020F6014407)
    assert check_op(arch, _pool(kernel=(16, 16), pad=(0, 0, 0, 0))) == [
        "kernel 16x16 exceeds [2,8] on DPUCZDX8G_ISA0_B4096"]
    assert check_op(arch, _dw(activation="relu6")) == []


# ---- bad input ----------------------------------------------------------------------------------

def test_unknown_profile():
    arch = dataclasses.replace(load_arch("B4096"), isa=5)
    msg = "no operator limits for DPUCZDX8G_ISA5 .*known profiles: DPUCZDX8G_ISA1, DPUCZDX8G_ISA0"
    with pytest.raises(ArchError, match=msg):
        check_op(arch, _conv())
    # a family tvm-dpu cannot compile for yet: the error says so and what is missing (families.json)
    arch = dataclasses.replace(load_arch("B4096"), family="DPUCVDX8G")
    with pytest.raises(ArchError, match="cannot generate code for DPUCVDX8G ISA1 yet: no instruction table"):
        check_op(arch, _conv())


def test_malformed_opdesc():
    with pytest.raises(ValueError, match="OpDesc c1: shapes in \\(1, 32, 16\\) / out"):
        check_op(load_arch("B4096"), OpDesc("conv2d", (1, 32, 16), (1, 32, 16, 16), name="c1"))
    with pytest.raises(ValueError, match="pad 4"):
        bad = OpDesc("conv2d", (1, 32, 16, 16), (1, 32, 16, 16), pad=(1, 1))  # type: ignore[arg-type]
        check_op(load_arch("B4096"), bad)
