"""The TE computes of the nn.* operators (convolutions, products, per-channel layers, pad,
batch_flatten, dropout) and einsum agree with their NumPy references, run by the loop-IR
interpreter on small random inputs."""

import numpy as np
import pytest

import opfusion as opf
from opfusion import te
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Function
from opfusion.ir.layout import Layout, transform_array
from opfusion.ir.module import IRModule
from opfusion.ir.op import get_op
from opfusion.opdefs.nn import group_window_weight
from opfusion.target import Target
from opfusion.te.lower import lower
from opfusion.testing import assert_close
from opfusion.tir.interp import run
from opfusion.topi import get_compute
from opfusion.topi.nn import (
    CONV_ACC,
    CONV_PAD,
    MATMUL_DOT,
    MATMUL_PACK,
    MATMUL_PARTIAL,
    channel_tile,
    conv_accumulators,
    flatten_pixels,
    group_window_tile,
    nchwc_width_unit,
    padded_out_blocks,
    pointwise_accumulators,
)
from opfusion.topi.testing import call_over_arrays, check_compute

nn = opf.op.nn


def normal(*shape, dtype="float32", seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def stage_tags(builder, *arrays, **attrs):
    """The tags of every computed stage the compute of ``builder(*arrays)`` makes."""
    call, params, _ = call_over_arrays(builder, arrays, attrs)
    holders = [te.placeholder(p.type_annotation.shape, p.type_annotation.dtype) for p in params]
    out = get_compute(call.op.name)(holders, call.attrs, call.checked_type)
    return [op.tag for op in te.post_dfs_order(out) if isinstance(op, te.ComputeOp)]


# ---------------------------------------------------------------------------------------------
# conv2d

CONV2D_CASES = [
    # (data shape, weight shape, attrs)
    ((1, 3, 6, 6), (4, 3, 3, 3), {}),
    ((1, 3, 6, 6), (4, 3, 3, 3), {"padding": 1}),
    ((1, 2, 7, 6), (3, 2, 3, 2), {"padding": (1, 0, 2, 1)}),
    ((1, 2, 7, 7), (3, 2, 3, 3), {"strides": 2, "padding": 1}),
    ((1, 2, 7, 9), (3, 2, 3, 3), {"strides": (1, 2), "padding": (0, 1)}),
    ((1, 2, 9, 7), (3, 2, 2, 3), {"strides": (2, 1)}),
    ((1, 2, 9, 9), (3, 2, 3, 3), {"strides": 3, "padding": (2, 1, 0, 2)}),
    ((1, 2, 9, 9), (3, 2, 3, 3), {"dilation": 2, "padding": 2}),
    ((1, 2, 9, 9), (2, 2, 3, 2), {"dilation": (2, 1), "strides": (1, 2), "padding": 1}),
    ((1, 4, 6, 6), (6, 2, 3, 3), {"groups": 2, "padding": 1}),
    ((2, 4, 5, 5), (4, 1, 3, 3), {"groups": 4, "padding": 1}),  # depthwise
    ((1, 3, 6, 6), (6, 1, 3, 3), {"groups": 3, "strides": 2}),  # depthwise, multiplier 2
    ((1, 4, 5, 5), (3, 4, 1, 1), {}),
    ((1, 2, 4, 3), (2, 2, 2, 2), {}),  # output width 2: no padded block
    ((1, 2, 6, 14), (3, 2, 3, 3), {"padding": 1}),  # width 14: two blocks, the last padded
    ((1, 2, 4, 16), (3, 2, 1, 3), {"padding": (0, 1)}),  # width 16: whole blocks
    ((2, 2, 5, 5), (3, 2, 5, 5), {"padding": 2, "channels": 3, "kernel_size": (5, 5)}),
]


@pytest.mark.parametrize("data, weight, attrs", CONV2D_CASES, ids=str)
def test_conv2d(data, weight, attrs):
    check_compute(nn.conv2d, normal(*data), normal(*weight, seed=1), **attrs)


def test_conv2d_int32_accumulates_exactly():
    rng = np.random.default_rng(3)
    x = rng.integers(-20, 20, (1, 3, 6, 6)).astype("int32")
    w = rng.integers(-20, 20, (4, 3, 3, 3)).astype("int32")
    check_compute(nn.conv2d, x, w, padding=1, strides=2)


def test_conv2d_out_dtype_widens_before_multiplying():
    rng = np.random.default_rng(4)
    x = rng.integers(-100, 100, (1, 2, 5, 5)).astype("int8")
    w = rng.integers(-100, 100, (3, 2, 3, 3)).astype("int8")
    check_compute(nn.conv2d, x, w, padding=1, out_dtype="int32")


def test_conv2d_float64():
    check_compute(nn.conv2d, normal(1, 2, 6, 6, dtype="float64"),
                  normal(3, 2, 3, 3, dtype="float64", seed=1), padding=1, rtol=1e-12)


def test_conv2d_is_padded_input_accumulator_and_crop():
    tags = stage_tags(nn.conv2d, normal(1, 2, 6, 6), normal(3, 2, 3, 3), padding=1)
    assert tags == [CONV_PAD, CONV_ACC, "conv2d_out"]


def test_conv2d_without_padding_reads_the_input_in_place():
    # A row of exactly one vector of the current target: no padded block to read.
    lanes = opf.Target.current().vector_lanes("float32")
    tags = stage_tags(nn.conv2d, normal(1, 2, 6, lanes + 2), normal(3, 2, 3, 3))
    assert CONV_PAD not in tags


# ---------------------------------------------------------------------------------------------
# conv2d_nchwc (blocked)

CONV2D_NCHWC_CASES = [
    # (data NCHW, weight OIHW, in block, out block, attrs)
    ((1, 8, 6, 6), (8, 8, 3, 3), 4, 8, {"padding": 1}),
    ((1, 3, 9, 17), (8, 3, 3, 3), 3, 8, {"padding": 1}),  # RGB block; 17 columns: padded units
    ((2, 8, 9, 9), (4, 8, 3, 3), 8, 4, {"strides": 2, "padding": (1, 0, 2, 1)}),
    ((1, 4, 9, 9), (4, 4, 3, 3), 4, 4, {"dilation": 2, "padding": 2}),
    ((1, 4, 5, 5), (8, 4, 1, 1), 4, 8, {"padding": 2}),  # padding wider than the kernel
    ((1, 4, 7, 3), (4, 4, 3, 2), 4, 4, {"strides": (1, 2)}),  # 1 output column
    ((1, 4, 11, 11), (4, 4, 7, 7), 4, 4, {"strides": 2, "padding": 3}),  # a 7x7 stem
    ((1, 16, 6, 9), (8, 8, 3, 3), 4, 4, {"groups": 2, "padding": 1}),  # grouped
    ((1, 24, 7, 7), (12, 8, 1, 1), 8, 4, {"groups": 3}),  # ShuffleNet's 1x1 groups
    # strided 1x1: a compact copy of the inputs read (with padding, and one stride of 3)
    ((1, 8, 14, 13), (16, 8, 1, 1), 8, 8, {"strides": 2}),
    ((1, 8, 9, 10), (8, 8, 1, 1), 4, 8, {"strides": (2, 3), "padding": (1, 0, 0, 2)}),
    ((2, 8, 9, 9), (296, 8, 1, 1), 8, 8, {"strides": 2}),  # 37 blocks computed as 40
]


@pytest.mark.parametrize("attrs", [{"padding": 1}, {"strides": 2, "padding": (1, 2, 0, 1)},
                                   {"dilation": 2, "padding": 2}], ids=str)
def test_conv2d_nchwc_depthwise(attrs):
    x = _blocked(normal(1, 16, 9, 11), "NCHW", "NCHW8c")
    w = _blocked(normal(16, 1, 3, 3, seed=1), "OIHW", "OIHW1i8o")
    check_compute(nn.conv2d_nchwc, x, w, groups=16, data_layout="NCHW8c",
                  kernel_layout="OIHW1i8o", out_layout="NCHW8c", **attrs)


@pytest.mark.parametrize("data, weight, groups, ib, ob, attrs", [
    ((1, 48, 7, 9), (40, 12, 3, 3), 4, 8, 8, {"strides": 2, "padding": 1}),
    ((1, 40, 5, 6), (40, 10, 1, 1), 4, 8, 8, {}),
    ((1, 136, 6, 9), (136, 34, 1, 1), 4, 8, 8, {}),  # ShuffleNet's: 5 blocks a group
    ((2, 24, 5, 7), (24, 3, 3, 3), 8, 8, 8, {"padding": 1}),  # 3 groups in a block
], ids=str)
def test_conv2d_nchwc_group_window(data, weight, groups, ib, ob, attrs):
    x = _blocked(normal(*data), "NCHW", f"NCHW{ib}c")
    w = group_window_weight(normal(*weight, seed=1), groups, ob)
    check_compute(nn.conv2d_nchwc, x, w, groups=groups, group_window=True, channels=weight[0],
                  data_layout=f"NCHW{ib}c", kernel_layout=f"OIHW{weight[1]}i{ob}o",
                  out_layout=f"NCHW{ob}c", **attrs)


@pytest.mark.parametrize("data, weight, attrs", [
    ((1, 16, 7, 7), (64, 16, 1, 1), {}),  # 49 pixels: 25 units of 2, the last cropped
    ((2, 8, 13, 13), (296, 8, 1, 1), {}),  # 37 blocks computed as 40
    ((1, 8, 14, 13), (32, 8, 1, 1), {"strides": 2}),  # a compact copy of 7 x 7 pixels
    ((1, 8, 5, 6), (32, 8, 1, 1), {"strides": (2, 1), "padding": (1, 0, 1, 2)}),
], ids=str)
def test_conv2d_nchwc_pixels_as_one_line(data, weight, attrs):
    # AVX2's 8 accumulators: these 1x1 convolutions tile their pixels as one line
    with opf.Target("c -mattr=+avx2,+fma"):
        x = _blocked(normal(*data), "NCHW", "NCHW8c")
        w = _blocked(normal(*weight, seed=1), "OIHW", "OIHW8i8o")
        check_compute(nn.conv2d_nchwc, x, w, data_layout="NCHW8c", kernel_layout="OIHW8i8o",
                      out_layout="NCHW8c", **attrs)


@pytest.mark.parametrize("out_h, out_w, budget, blocks, want", [
    (7, 7, 8, 64, True),  # a row of 7: a tile of 1 block; the line: 4 blocks x 2 columns
    (13, 13, 8, 128, True),  # both 4 x 2 tiles; the line crops 1 column of 170, rows 13
    (14, 14, 8, 64, False),  # rows of 14 are whole 4 x 2 tiles already
    (7, 7, 16, 64, False),  # AVX-512: 7 columns of 2 blocks either way
    (1, 49, 8, 64, False),  # one row is a line already
])
def test_which_1x1_convolutions_tile_their_pixels_as_one_line(out_h, out_w, budget, blocks,
                                                               want):
    assert flatten_pixels(out_h, out_w, budget, blocks) is want


def _blocked(x, src, dst):
    return transform_array(x, Layout.parse(src), Layout.parse(dst))


@pytest.mark.parametrize("data, weight, ib, ob, attrs", CONV2D_NCHWC_CASES, ids=str)
def test_conv2d_nchwc(data, weight, ib, ob, attrs):
    x = _blocked(normal(*data), "NCHW", f"NCHW{ib}c")
    w = _blocked(normal(*weight, seed=1), "OIHW", f"OIHW{ib}i{ob}o")
    layouts = {"data_layout": f"NCHW{ib}c", "kernel_layout": f"OIHW{ib}i{ob}o",
               "out_layout": f"NCHW{ob}c"}
    check_compute(nn.conv2d_nchwc, x, w, **layouts, **attrs)


def test_conv2d_nchwc_compiled_matches_on_a_padded_row():
    # 23 output columns: no unit divides them, so the accumulator's last unit is padding
    # that the result crops (compiled, so the register tiles run).
    x = _blocked(normal(1, 8, 5, 23), "NCHW", "NCHW8c")
    w = _blocked(normal(16, 8, 3, 3, seed=1), "OIHW", "OIHW8i16o")
    check_compute(nn.conv2d_nchwc, x, w, padding=1, data_layout="NCHW8c",
                  kernel_layout="OIHW8i16o", out_layout="NCHW16c", compiled=True, rtol=1e-5)


def test_seven_output_blocks_compute_as_two_wide_tiles_compiled():
    """7 output blocks (112 channels of 16) are computed as 8, two tiles of 4 blocks, the
    eighth repeating the seventh's weights and cropped (padded_out_blocks)."""
    assert padded_out_blocks(7) == 8 and padded_out_blocks(6) == 6 and padded_out_blocks(5) == 5
    x = _blocked(normal(1, 32, 6, 7), "NCHW", "NCHW16c")
    w = _blocked(normal(112, 32, 1, 1, seed=1), "OIHW", "OIHW16i16o")
    avx512 = Target("c -mattr=+avx512f,+avx512dq,+avx512bw,+avx512vl,+avx2,+fma")
    with avx512:
        check_compute(nn.conv2d_nchwc, x, w, data_layout="NCHW16c", kernel_layout="OIHW16i16o",
                      out_layout="NCHW16c", compiled=not avx512.missing_on_host(), rtol=1e-5)


@pytest.mark.parametrize("layout", ["NCHW", "NCHW8c"])
def test_channel_shuffle(layout):
    x = _blocked(normal(1, 24, 3, 4), "NCHW", layout)
    check_compute(opf.op.channel_shuffle, x, groups=3, layout=layout, rtol=0)


def test_conv2d_nchwc_width_units():
    assert [nchwc_width_unit(w, 16) for w in (56, 28, 14, 7, 3, 13, 17, 55, 112)] == \
        [7, 7, 7, 7, 3, 13, 6, 5, 7]  # 17: three units of 6 crop 1 column (8: 7 columns)
    assert nchwc_width_unit(12, 8) == 6 and nchwc_width_unit(13, 8) == 7


def test_conv2d_nchwc_wide_tiles_with_few_registers():
    """8 accumulators (AVX2): rows of dense convolutions in units of 2 columns with a
    multiple of 4 output blocks (a 4 x 2 tile), of 4 with a multiple of 2 (2 x 4), when at
    most a tenth of the row is cropped; rows of 7, too much cropping, unknown block counts
    and 16 accumulators (AVX-512) as before."""
    assert [nchwc_width_unit(w, 8, 8) for w in (112, 56, 28, 14, 13, 55, 27, 7, 9)] == \
        [2, 2, 2, 2, 2, 2, 2, 7, 2]
    # 13 columns: 2 x 4 would crop 3 of 16; 3 x 2 crops 1 of 14
    assert [nchwc_width_unit(w, 8, 6) for w in (56, 55, 13)] == [4, 4, 2]
    # 3 blocks (24 channels): 3 x 2 (3 x 3 for a 1x1's 12: 3 x 4's 17 registers spill)
    assert [nchwc_width_unit(w, 8, 3) for w in (112, 56, 7)] == [2, 2, 7]
    assert nchwc_width_unit(57, 12, 3) == 3 and channel_tile(3, 2, 8) == 3
    assert [nchwc_width_unit(w, 8, 5) for w in (112, 56)] == [7, 7]  # 5 x 2: 10 sums
    assert nchwc_width_unit(56, 8) == 7
    assert [nchwc_width_unit(w, 16, 8) for w in (56, 28, 14, 7)] == [7, 7, 7, 7]


def test_pointwise_tiles_with_few_registers():
    """A dense 1x1 convolution on a target of 16 registers gets 12 accumulators: 4 blocks x 3
    columns (2 x 4 with an even block count that 4 does not divide, never 2 x 6, whose six
    live broadcasts spill), other convolutions half the registers; on AVX-512's 32 every
    convolution gets 28 (4 blocks x 7 columns)."""
    avx2, avx512 = Target("c -mattr=+avx2,+fma"), Target("c -mattr=+avx512f")
    assert conv_accumulators(avx2, pointwise=True) == 12 and conv_accumulators(avx2) == 8
    assert conv_accumulators(avx512, pointwise=True) == conv_accumulators(avx512) == 28
    assert [nchwc_width_unit(w, 12, 8) for w in (56, 28, 14, 24)] == [3, 3, 3, 3]
    assert [nchwc_width_unit(w, 12, 6) for w in (56, 28)] == [4, 4]
    assert channel_tile(8, 3, 12) == 4 and channel_tile(6, 4, 12) == 2
    # 56 x 56 pixels: rows of 56 crop one column of 57, the line of 3136 one of 3138
    assert flatten_pixels(56, 56, 12, 8) and not flatten_pixels(8, 24, 12, 8)


@pytest.mark.parametrize("out_h, out_w, blocks, cores, want", [
    (56, 56, 32, 2, 12),  # a line of 3136 pixels, 8 tiles of 4 blocks: 4 per core
    (56, 56, 32, 4, 8),  # 2 per core: the rows, in 4 x 2 tiles (3 crops 56)
    (14, 14, 12, 2, 8),  # a line in 3 tiles starves 2 cores
    (4, 24, 8, 2, 12),  # rows of 8 units of 3
    (7, 7, 64, 2, 12),  # 49 pixels: 17 units of 3, the last rereading the last pixel
])
def test_which_1x1_convolutions_take_12_accumulators(out_h, out_w, blocks, cores, want):
    target = Target(f"c -mattr=+avx2,+fma -num-cores={cores}")
    assert pointwise_accumulators(out_h, out_w, blocks, target) == want
    assert pointwise_accumulators(out_h, out_w, blocks, Target("c -mattr=+avx512f")) == 28


@pytest.mark.parametrize("out_w, local, pointwise, want", [
    (28, 5, True, (5, 2)),  # ShuffleNet's groups of 34 channels: 5 blocks, no crop
    (14, 9, True, (3, 2)),  # 9 blocks: 3 x 3 would crop a column of 15; 3 x 2 (6 sums)
    (27, 9, True, (3, 3)),
    (28, 4, True, (4, 2)),  # 4 x 3 would crop 2 columns of 30: 4 x 2 crops none
    (28, 10, True, (5, 2)),
    (14, 18, True, (6, 2)),
    (7, 9, True, (1, 7)),  # a row of 7: one unit of 7
    (28, 5, False, (1, 7)),  # not 1x1: 8 accumulators, 5 x 2 does not fit
    (28, 10, False, (2, 4)),
])
def test_group_window_tiles(out_w, local, pointwise, want):
    with Target("c -mattr=+avx2,+fma") as target:
        assert group_window_tile(out_w, local, target, pointwise) == want


@pytest.mark.parametrize("out_w, local, want", [
    (28, 5, (5, 4)),  # ShuffleNet's windows of 5 blocks: 20 sums, not 1 x 7 (0.89x the time)
    (28, 4, (4, 7)),  # 28 sums
    (14, 5, (5, 2)),
    (7, 9, (3, 7)),   # a row of 7: one unit of 7
])
def test_group_window_tiles_on_avx512_take_up_to_28_sums(out_w, local, want):
    assert group_window_tile(out_w, local, Target("c -mattr=+avx512f"), True) == want


@pytest.mark.parametrize("data, weight, groups, attrs", [
    ((1, 136, 3, 28), (136, 34, 1, 1), 4, {}),  # 5 x 2 tiles
    ((1, 272, 2, 27), (272, 68, 1, 1), 4, {}),  # 9 blocks a group: 3 x 3 tiles
    ((1, 112, 4, 59), (112, 28, 3, 3), 4, {"padding": 1}),  # not 1x1: 8 accumulators
], ids=str)
def test_group_window_wide_tiles_compiled(data, weight, groups, attrs):
    with Target("c -mattr=+avx2,+fma"):
        x = _blocked(normal(*data), "NCHW", "NCHW8c")
        w = group_window_weight(normal(*weight, seed=1), groups, 8)
        check_compute(nn.conv2d_nchwc, x, w, groups=groups, group_window=True,
                      channels=weight[0], data_layout="NCHW8c",
                      kernel_layout=f"OIHW{weight[1]}i8o", out_layout="NCHW8c",
                      compiled=True, rtol=1e-5, **attrs)


@pytest.mark.parametrize("data, weight, attrs", [
    ((1, 24, 2, 24), (64, 24, 1, 1), {}),  # rows of 8 units of 3 (not flattened)
    ((1, 16, 9, 9), (40, 16, 1, 1), {}),  # 81 pixels: 27 units of 3; 5 blocks padded to 8
    ((1, 16, 11, 10), (32, 16, 1, 1), {"strides": 2}),  # 6 x 5 pixels of a compact copy
], ids=str)
def test_pointwise_4x3_tiles_compiled(data, weight, attrs):
    with Target("c -mattr=+avx2,+fma"):
        x = _blocked(normal(*data), "NCHW", "NCHW8c")
        w = _blocked(normal(*weight, seed=1), "OIHW", "OIHW8i8o")
        check_compute(nn.conv2d_nchwc, x, w, data_layout="NCHW8c", kernel_layout="OIHW8i8o",
                      out_layout="NCHW8c", compiled=True, rtol=1e-5, **attrs)


# ---------------------------------------------------------------------------------------------
# conv2d_transpose

CONV2D_TRANSPOSE_CASES = [
    ((1, 2, 4, 4), (2, 3, 3, 3), {}),
    ((1, 2, 4, 4), (2, 3, 3, 3), {"padding": 1}),
    ((1, 2, 3, 4), (2, 3, 3, 3), {"strides": 2, "padding": 1, "output_padding": 1}),
    ((1, 2, 3, 3), (2, 2, 2, 3), {"strides": (2, 3), "padding": (0, 1, 1, 0)}),
    ((1, 2, 3, 3), (2, 2, 3, 2), {"dilation": (2, 1), "output_padding": (1, 0)}),
    ((2, 4, 3, 3), (4, 1, 2, 3), {"groups": 2, "strides": (1, 2), "dilation": (2, 1),
                                  "padding": (0, 1, 1, 0)}),
    ((1, 4, 3, 3), (4, 1, 3, 3), {"groups": 4, "strides": 2, "padding": 1}),  # depthwise
    ((1, 2, 4, 4), (2, 2, 3, 3), {"padding": (3, 0, 0, 2)}),  # cropping past the kernel
]


@pytest.mark.parametrize("data, weight, attrs", CONV2D_TRANSPOSE_CASES, ids=str)
def test_conv2d_transpose(data, weight, attrs):
    check_compute(nn.conv2d_transpose, normal(*data), normal(*weight, seed=1), **attrs)


# ---------------------------------------------------------------------------------------------
# dense, matmul, batch_matmul


@pytest.mark.parametrize("data, units", [
    ((3, 16), 5),  # dot form: 8 lanes
    ((2, 12), 3),  # dot form: 4 lanes
    ((3, 5), 4),  # plain reduction
    ((8, 4), 16),  # enough rows to pack the weight into 16-column panels
    ((2, 4, 6), 8),  # 8 rows over two axes, packed into 8-column panels
    ((2, 3, 16), 4),
    ((16,), 3),
])
def test_dense(data, units):
    check_compute(nn.dense, normal(*data), normal(units, data[-1], seed=1))


def test_dense_int32_with_units():
    rng = np.random.default_rng(5)
    check_compute(nn.dense, rng.integers(-9, 9, (3, 16)).astype("int32"),
                  rng.integers(-9, 9, (4, 16)).astype("int32"), units=4)


def test_dense_forms_follow_the_shapes():
    assert MATMUL_DOT in stage_tags(nn.dense, normal(3, 16), normal(5, 16))
    assert MATMUL_PACK in stage_tags(nn.dense, normal(8, 4), normal(16, 4))
    assert MATMUL_PARTIAL not in stage_tags(nn.dense, normal(3, 5), normal(4, 5))


@pytest.mark.parametrize("a, b, attrs", [
    ((3, 5), (5, 4), {}),
    ((2, 3, 16), (16, 4), {}),
    ((2, 1, 3, 8), (3, 8, 5), {}),  # broadcast batch axes
    ((16,), (2, 16, 3), {}),  # 1-D on the left
    ((2, 5, 16), (16,), {}),  # 1-D on the right
    ((16,), (16,), {}),  # a dot product
    ((5,), (5,), {}),
    ((8, 3), (8,), {"transpose_a": True}),
    ((2, 1, 3, 8), (3, 5, 8), {"transpose_b": True}),
    ((2, 4, 3), (2, 5, 4), {"transpose_a": True, "transpose_b": True}),
    ((8, 4), (4, 16), {}),  # packed panels
    ((2, 8, 4), (4, 8), {}),  # packed, the right operand shared by the batch
    ((3, 8, 4), (3, 16, 4), {"transpose_b": True}),  # packed, one panel set per batch
])
def test_matmul(a, b, attrs):
    check_compute(nn.matmul, normal(*a), normal(*b, seed=1), **attrs)


@pytest.mark.parametrize("x, y, attrs", [
    ((2, 3, 16), (2, 4, 16), {}),
    ((2, 3, 16), (1, 4, 16), {}),
    ((1, 3, 5), (2, 4, 5), {}),
    ((2, 5, 3), (2, 5, 4), {"transpose_a": True, "transpose_b": False}),
    ((2, 3, 5), (2, 5, 4), {"transpose_b": False}),
    ((2, 5, 3), (2, 4, 5), {"transpose_a": True}),
    ((2, 8, 4), (2, 8, 4), {}),  # packed
    ((2, 8, 4), (1, 4, 16), {"transpose_b": False}),  # packed, shared
])
def test_batch_matmul(x, y, attrs):
    check_compute(nn.batch_matmul, normal(*x), normal(*y, seed=1), **attrs)


# ---------------------------------------------------------------------------------------------
# per-channel layers, layout and identity


@pytest.mark.parametrize("shape, axis", [((2, 3, 4), 1), ((2, 3, 4), -1), ((2, 3, 4), 0),
                                         ((5,), 0)])
def test_bias_add(shape, axis):
    check_compute(nn.bias_add, normal(*shape), normal(shape[axis], seed=1), axis=axis)


@pytest.mark.parametrize("shape, axis", [((2, 3, 4), 1), ((2, 3, 4), -1)])
def test_prelu(shape, axis):
    check_compute(nn.prelu, normal(*shape), normal(shape[axis], seed=1), axis=axis)


@pytest.mark.parametrize("pad_width", [(1, 2, 2, 0), (0, 0, 1, 1)])
def test_pad_constant(pad_width):
    check_compute(nn.pad, normal(3, 4), np.float32(1.5), pad_width=pad_width)


def check_unread_inputs(builder, *arrays, **attrs):
    """check_compute for a call whose compute ignores some inputs (``nn.pad``'s pad_value
    outside constant mode): ``lower`` rejects an argument the schedule never reads, so only
    the inputs the compute reads become arguments."""
    call, params, values = call_over_arrays(builder, arrays, attrs)
    want = evaluate(IRModule.from_expr(Function(params, call)), values)
    holders = [te.placeholder(p.type_annotation.shape, p.type_annotation.dtype) for p in params]
    out = get_compute(call.op.name)(holders, call.attrs, call.checked_type)
    schedule = te.create_schedule(out.op)
    read = [i for i, h in enumerate(holders) if h.op in schedule.stage_map]
    got = np.empty(want.shape, want.dtype)
    run(lower(schedule, [holders[i] for i in read] + [out]), *[values[i] for i in read], got)
    assert_close(got, want)


@pytest.mark.parametrize("pad_mode", ["edge", "reflect"])
@pytest.mark.parametrize("pad_width", [(1, 2, 2, 0), (2, 2, 3, 3), (0, 0, 1, 0)])
def test_pad_edge_and_reflect(pad_mode, pad_width):
    check_unread_inputs(nn.pad, normal(3, 4), np.float32(0), pad_width=pad_width,
                        pad_mode=pad_mode)


def test_pad_by_nothing_is_a_copy():
    check_unread_inputs(nn.pad, normal(3, 4), np.float32(0), pad_width=(0, 0, 0, 0))


def test_pad_integer_constant():
    x = np.arange(12, dtype="int32").reshape(3, 4)
    check_compute(nn.pad, x, np.int32(-7), pad_width=(1, 0, 0, 2))


@pytest.mark.parametrize("shape", [(2, 3, 4), (2, 5), (3,), (2, 1, 3, 2)])
def test_batch_flatten(shape):
    check_compute(nn.batch_flatten, normal(*shape))


def test_dropout_is_the_identity():
    check_compute(nn.dropout, normal(2, 3, 4), rate=0.3)


# ---------------------------------------------------------------------------------------------
# einsum


@pytest.mark.parametrize("equation, shapes", [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("ij,jk", [(2, 3), (3, 4)]),  # implicit output
    ("ij->ji", [(2, 3)]),
    ("ii->i", [(3, 3)]),
    ("ii", [(3, 3)]),  # trace
    ("i,j->ij", [(2,), (3,)]),
    ("bij,bjk->bik", [(2, 2, 3), (2, 3, 4)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    ("...ij,...jk->...ik", [(2, 1, 2, 3), (3, 3, 4)]),  # ellipsis axes broadcast
    ("...j,kj", [(2, 1, 3), (4, 3)]),
    ("ij,kj->ik", [(2, 1), (4, 3)]),  # a labelled axis of size 1 broadcasts
    ("ij,j,jk->", [(2, 3), (3,), (3, 2)]),
    ("iij->j", [(2, 2, 3)]),
])
def test_einsum(equation, shapes):
    arrays = [normal(*shape, seed=i) for i, shape in enumerate(shapes)]
    check_compute(opf.op.einsum, arrays, equation=equation)


def test_einsum_integers():
    rng = np.random.default_rng(6)
    arrays = [rng.integers(-5, 5, (2, 3)).astype("int32"),
              rng.integers(-5, 5, (3, 2)).astype("int32")]
    check_compute(opf.op.einsum, arrays, equation="ij,jk->ik")


def test_every_nn_operator_has_a_compute():
    from opfusion.ir import list_ops

    # (deformable convolution and max pooling's indices are opaque: test_topi_coverage.py)
    ours = [name for name in list_ops() if name.startswith("nn.") and name not in
            ("nn.relu", "nn.leaky_relu", "nn.deform_conv2d", "nn.max_pool_indices")
            ] + ["einsum"]
    assert [name for name in ours if get_compute(name) is None] == []


def test_group_window_reads_through_an_input_shuffle():
    """``input_shuffle``: the window reads channel_shuffle(data) (FoldChannelShuffle); the
    reference is the window on the shuffled data, and the compute matches it."""
    with Target("c -mattr=+avx2,+fma"):
        x = _blocked(normal(1, 136, 3, 28), "NCHW", "NCHW8c")
        w = group_window_weight(normal(136, 34, 1, 1, seed=1), 4, 8)
        attrs = {"groups": 4, "group_window": True, "channels": 136, "data_layout": "NCHW8c",
                 "kernel_layout": "OIHW34i8o", "out_layout": "NCHW8c"}
        check_compute(nn.conv2d_nchwc, x, w, input_shuffle=4, compiled=True, **attrs)
    shuffled = get_op("channel_shuffle").reference(x, 4, "NCHW8c")
    conv = get_op("nn.conv2d_nchwc")
    full = {**attrs, "strides": (1, 1), "padding": (0, 0, 0, 0), "dilation": (1, 1)}
    assert_close(conv.reference(x, w, input_shuffle=4, **full),
                 conv.reference(shuffled, w, **full), 0)
    with pytest.raises(opf.OpfusionError, match="input_shuffle"):
        data = opf.var("d", shape=(1, 4, 3, 5, 8))
        weight = opf.const(normal(4, 4, 1, 1, 8, 8))
        opf.transform.InferType()(IRModule.from_expr(Function([data], nn.conv2d_nchwc(
            data, weight, input_shuffle=4, data_layout="NCHW8c", kernel_layout="OIHW8i8o",
            out_layout="NCHW8c"))))
