"""Neural-network operators: convolution, dense and matrix products, and the small layers
around them (bias_add, prelu, pad, batch_flatten, dropout).

TVM conventions: NCHW data, OIHW conv2d weights, IOHW conv2d_transpose weights, padding as
(top, left, bottom, right). Pooling lives in :mod:`.nn_pool`, normalization and softmax in
:mod:`.nn_norm`; both are imported here so that importing this family registers it all."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import OpAttributeError
from ..ir.layout import Layout, LayoutError, transform_array
from ..ir.op import Attr, Attrs, Op, OpPatternKind, get_op, register_op
from ..ir.types import TensorType, Type, cast_array, is_float
from . import _winograd as winograd
from . import nn_attention, nn_norm, nn_pool  # noqa: F401  (registers pooling, normalization

#                                                   and attention)
from ._common import broadcast_shape, normalize_axis, same_dtype
from ._nn_common import (
    along,
    check_positive,
    expect_rank,
    float_dtype,
    normalize_padding,
    numeric_dtype,
    pad_spatial,
    spatial_output,
    wide,
    windows,
)
from ._winograd import TILE_SIZES

# ---------------------------------------------------------------------------------------------
# convolution


def _conv_attrs(kernel_layout: str) -> dict[str, Attr]:
    return {
        "strides": Attr("ints", 1, length=2, doc="(height, width) step of the window"),
        "padding": Attr("ints", 0, always_print=True,
                        doc="1, 2 or 4 values, normalized to (top, left, bottom, right)"),
        "dilation": Attr("ints", 1, length=2, doc="(height, width) spacing of kernel taps"),
        "groups": Attr("int", 1, doc="channel groups; groups == in_channels is depthwise"),
        "channels": Attr("int", optional=True, doc="output channels, checked against weight"),
        "kernel_size": Attr("ints", optional=True, length=2,
                            doc="(KH, KW), checked against weight"),
        "data_layout": Attr("str", "NCHW", choices=("NCHW",)),
        "kernel_layout": Attr("str", kernel_layout, choices=(kernel_layout,)),
        "out_dtype": Attr("dtype", optional=True, doc="result dtype (default: the input's)"),
    }


class _ConvBase(Op):
    inputs = ("data", "weight")
    pattern = OpPatternKind.kOutEWiseFusable

    def normalize_attrs(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs["padding"] = normalize_padding(self, attrs["padding"])
        check_positive(self, attrs, ("strides", "dilation", "groups", "channels", "kernel_size"))
        return attrs

    def _check_common(self, arg_types: Sequence[Type],
                      attrs: Attrs) -> tuple[TensorType, TensorType, str]:
        """Ranks, dtypes and kernel_size; returns data, weight and the output dtype."""
        data, weight = self.expect_tensors(arg_types)
        expect_rank(self, data, "data", 4, ("N", "C", "H", "W"))
        expect_rank(self, weight, "weight", 4, self.attrs["kernel_layout"].default)
        dtype = numeric_dtype(self, [data, weight], self.inputs)
        kernel = weight.shape[2:]
        if min(kernel) < 1:
            raise self.type_error(f"weight {weight.shape} has an empty kernel {kernel}; every "
                                  "kernel extent must be at least 1")
        if attrs.kernel_size is not None and tuple(attrs.kernel_size) != kernel:
            raise self.type_error(f"attribute 'kernel_size'={attrs.kernel_size} does not match "
                                  f"weight {weight.shape} (kernel {kernel}); fix the attribute "
                                  "or the weight")
        return data, weight, attrs.out_dtype or dtype

    def _check_channels(self, out_channels: int, weight: TensorType, attrs: Attrs) -> None:
        if attrs.channels is not None and attrs.channels != out_channels:
            raise self.type_error(f"attribute 'channels'={attrs.channels} but weight "
                                  f"{weight.shape} gives {out_channels} output channels "
                                  f"(groups={attrs.groups}); fix the attribute or the weight")


@register_op
class Conv2D(_ConvBase):
    name = "nn.conv2d"
    doc = "2-D convolution of NCHW data with an OIHW weight (grouped and depthwise included)."
    attrs = _conv_attrs("OIHW")

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        data, weight, out_dtype = self._check_common(arg_types, attrs)
        batch, in_channels = data.shape[:2]
        out_channels, per_group = weight.shape[:2]
        groups = attrs.groups
        if in_channels != per_group * groups:
            raise self.type_error(
                f"data {data.shape} has {in_channels} input channels but weight {weight.shape} "
                f"takes {per_group} per group x groups={groups} = {per_group * groups}; check "
                "the weight shape or the 'groups' attribute")
        if out_channels % groups:
            raise self.type_error(f"weight {weight.shape} has {out_channels} output channels, "
                                  f"not divisible by groups={groups}; check the weight shape "
                                  "or the 'groups' attribute")
        self._check_channels(out_channels, weight, attrs)
        out_h, out_w = spatial_output(self, data, weight.shape[2:], attrs.strides,
                                      attrs.dilation, attrs.padding)
        return TensorType((batch, out_channels, out_h, out_w), out_dtype)

    def reference(self, data: np.ndarray, weight: np.ndarray, *, strides: tuple,
                  padding: tuple, dilation: tuple, groups: int, **_: Any) -> np.ndarray:
        # im2col: gather every window once (a strided view, copied by the reshape), then one
        # batched matrix product per group.
        batch = data.shape[0]
        out_channels, per_group, kh, kw = weight.shape
        padded = pad_spatial(wide(data), padding)
        out_hw = (
            (padded.shape[2] - dilation[0] * (kh - 1) - 1) // strides[0] + 1,
            (padded.shape[3] - dilation[1] * (kw - 1) - 1) // strides[1] + 1,
        )
        view = windows(padded, (kh, kw), strides, dilation, out_hw)  # N, C, OH, OW, KH, KW
        view = view.reshape(batch, groups, per_group, *out_hw, kh, kw)
        cols = view.transpose(0, 1, 3, 4, 2, 5, 6).reshape(
            batch, groups, out_hw[0] * out_hw[1], per_group * kh * kw)
        kernel = wide(weight).reshape(groups, out_channels // groups, per_group * kh * kw)
        out = cols @ kernel.transpose(0, 2, 1)  # N, G, OH*OW, O/G
        return out.transpose(0, 1, 3, 2).reshape(batch, out_channels, *out_hw)


def _block(op: Op, attrs: Attrs, name: str, pattern: str) -> Layout:
    """The parsed layout attribute ``name``; a type error unless it is ``pattern`` with
    positive block sizes (``NCHW<k>c`` for data, ``OIHW<i>i<o>o`` for weights)."""
    text = attrs[name]
    try:
        layout = Layout.parse(text)
    except LayoutError as err:
        raise op.type_error(f"attribute {name!r}: {err}") from None
    shape = "".join(a if f == 0 else "#" + a.lower() for a, f in layout.axes)
    if shape != pattern:
        wanted = pattern.replace("#", "<k>")
        raise op.type_error(f"attribute {name!r}={text!r} must have the form {wanted}")
    return layout


def group_output_blocks(out_channels: int, groups: int, out_block: int) -> tuple[int, ...]:
    """The first output block each group's output channels touch (a block may hold the end
    of one group and the start of the next when no block divides a group's outputs)."""
    per_out = out_channels // groups
    return tuple(g * per_out // out_block for g in range(groups))


def group_local_blocks(out_channels: int, groups: int, out_block: int) -> int:
    """Output blocks of a group-window convolution's weight per group: the most output blocks
    any one group's output channels touch."""
    per_out = out_channels // groups
    return max(((g + 1) * per_out - 1) // out_block - g * per_out // out_block + 1
               for g in range(groups))


def group_spans(out_channels: int, groups: int, out_block: int) -> int:
    """The most groups one output block's channels belong to (2 when a block holds a group
    boundary and every group has a block's channels or more)."""
    per_out = out_channels // groups
    return max((index * out_block + out_block - 1) // per_out - index * out_block // per_out + 1
               for index in range(out_channels // out_block))


def group_window_weight(dense: np.ndarray, groups: int, out_block: int) -> np.ndarray:
    """A grouped convolution's OIHW weight (O, C/groups, KH, KW) as a group-window one:
    (groups, J, KH, KW, C/groups, o) with J = :func:`group_local_blocks`, group g's filters
    for output block ``group_output_blocks[g] + j`` on the group's own input channels, zero
    in the lanes of output channels outside the group (and in blocks past its last)."""
    out_channels, per_group, kh, kw = dense.shape
    per_out = out_channels // groups
    local = group_local_blocks(out_channels, groups, out_block)
    packed = np.zeros((groups, local, kh, kw, per_group, out_block), dense.dtype)
    for g, first in enumerate(group_output_blocks(out_channels, groups, out_block)):
        for j in range(local):
            outs = (first + j) * out_block + np.arange(out_block)
            inside = (outs >= g * per_out) & (outs < (g + 1) * per_out)
            for lane in np.flatnonzero(inside):
                packed[g, j, :, :, :, lane] = dense[outs[lane]].transpose(1, 2, 0)
    return packed


def _window_weight_dense(weight: np.ndarray, out_channels: int) -> np.ndarray:
    """A group-window weight (groups, J, KH, KW, C/groups, o) back as the grouped OIHW one
    (O, C/groups, KH, KW)."""
    groups, _, kh, kw, per_group, out_block = weight.shape
    per_out = out_channels // groups
    dense = np.zeros((out_channels, per_group, kh, kw), weight.dtype)
    for g, first in enumerate(group_output_blocks(out_channels, groups, out_block)):
        for o in range(g * per_out, (g + 1) * per_out):
            dense[o] = weight[g, o // out_block - first, :, :, :, o % out_block].transpose(
                2, 0, 1)
    return dense


@register_op
class Conv2DNCHWc(_ConvBase):
    name = "nn.conv2d_nchwc"
    doc = ("2-D convolution in blocked layouts (TVM's conv2d_NCHWc): data NCHW<i>c "
           "(N, C/i, H, W, i), weight OIHW<i>i<o>o (O/o, C/i, KH, KW, i, o), result NCHW<o>c; "
           "the layout pass makes it from nn.conv2d. Grouped: every block inside one group; "
           "depthwise: weight OIHW1i<k>o, data and result NCHW<k>c; group_window (groups "
           "whose channels no block divides): weight (groups, J, KH, KW, C/groups, o), each "
           "group's filters for the J output blocks its outputs touch (group_window_weight), "
           "with kernel_layout OIHW<C/groups>i<o>o and the 'channels' attribute set.")
    attrs = {
        **_conv_attrs("OIHW"),
        "data_layout": Attr("str", "NCHW16c", always_print=True,
                            doc="NCHW<i>c: the data's channel block"),
        "kernel_layout": Attr("str", "OIHW16i16o", always_print=True,
                              doc="OIHW<i>i<o>o: the weight's blocks"),
        "out_layout": Attr("str", "NCHW16c", always_print=True,
                           doc="NCHW<o>c: the result's channel block"),
        "group_window": Attr("bool", False,
                             doc="the weight holds, per group, its filters for the "
                                 "output blocks its output channels touch, on the group's "
                                 "own input channels (group_window_weight): for groups "
                                 "whose channels no block divides"),
        "input_shuffle": Attr("int", 0,
                              doc="a group window reads channel_shuffle(data, input_shuffle) "
                                  "(its channel j * s + i is data channel i * (C / s) + j), "
                                  "0: the data as it is; FoldChannelShuffle sets it"),
        "words": Attr("int", 0,
                      doc="0, or the values in each int32 word of the data and the weight: "
                          "4 (bytes, dot4_u8s8: VNNI's vpdpbusd) or 2 (16-bit halves, "
                          "dot2_s16: pmaddwd); the data then holds words of its block's "
                          "channels, unsigned (nn.byte_words: N, C/i, H, W, ceil(i/words)), "
                          "the weight words of its input block's channels, signed (O/o, C/i, "
                          "KH, KW, ceil(i/words), o), and the sums are int32 "
                          "(WordConvolutions makes it)"),
        "pad_value": Attr("int", 0,
                          doc="with words: the byte each part of the padding's words holds "
                              "(the zero point of quantized data as the words hold it, whose "
                              "real value is 0)"),
    }

    def blocks(self, attrs: Attrs) -> tuple[int, int, int]:
        """(data channel block, weight input block, output channel block), with the weight's
        output block checked against the result's."""
        data = _block(self, attrs, "data_layout", "NCHW#c")
        kernel = _block(self, attrs, "kernel_layout", "OIHW#i#o")
        out = _block(self, attrs, "out_layout", "NCHW#c")
        if kernel.factor("O") != out.factor("C"):
            raise self.type_error(
                f"attribute 'kernel_layout'={attrs.kernel_layout!r} must block O as "
                f"'out_layout'={attrs.out_layout!r} blocks C")
        return data.factor("C"), kernel.factor("I"), out.factor("C")

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        data, weight = self.expect_tensors(arg_types)
        expect_rank(self, data, "data", 5, ("N", "C", "H", "W", "c"))
        expect_rank(self, weight, "weight", 6, ("O", "I", "H", "W", "i", "o"))
        in_block, kernel_block, out_block = self.blocks(attrs)
        # (with words, the data's and the weight's blocks hold words of their channels)
        if attrs.words:
            out_dtype = self._check_words(data, weight, attrs)
            held = -(-in_block // attrs.words), -(-kernel_block // attrs.words)
        else:
            out_dtype = numeric_dtype(self, [data, weight], self.inputs)
            held = in_block, kernel_block
        if (data.shape[4], weight.shape[4]) != held or weight.shape[5] != out_block:
            raise self.type_error(f"data {data.shape} and weight {weight.shape} do not have "
                                  f"the blocks of their layouts ({attrs.data_layout}, "
                                  f"{attrs.kernel_layout})")
        if attrs.input_shuffle and (not attrs.group_window
                                    or data.shape[1] * in_block % attrs.input_shuffle):
            raise self.type_error(
                f"'input_shuffle'={attrs.input_shuffle} needs a group window over channels "
                f"it divides (data {data.shape}, group_window={attrs.group_window})")
        if attrs.group_window:
            out_channels = self._check_window(data.shape[1] * in_block, weight.shape,
                                              out_block, attrs)
        else:
            out_channels = weight.shape[0] * out_block
            self._check_groups(data.shape[1] * in_block, weight.shape[1] * kernel_block,
                               weight.shape[0] * out_block, (in_block, kernel_block, out_block),
                               attrs)
        kernel = weight.shape[2:4]
        if min(kernel) < 1:
            raise self.type_error(f"weight {weight.shape} has an empty kernel {kernel}")
        if attrs.kernel_size is not None and tuple(attrs.kernel_size) != kernel:
            raise self.type_error(f"attribute 'kernel_size'={attrs.kernel_size} does not match "
                                  f"weight {weight.shape} (kernel {kernel})")
        self._check_channels(out_channels, weight, attrs)
        out_h, out_w = spatial_output(self, data, kernel, attrs.strides, attrs.dilation,
                                      attrs.padding)
        return TensorType((data.shape[0], out_channels // out_block, out_h, out_w, out_block),
                          attrs.out_dtype or out_dtype)

    def _check_words(self, data: TensorType, weight: TensorType, attrs: Attrs) -> str:
        """The products of words: int32 words of bytes or halves (nn.byte_words), an int32
        weight of words, one group; returns the sums' dtype (int32)."""
        if attrs.words not in (2, 4):
            raise self.type_error(f"words={attrs.words}: 0 (plain values), 2 or 4 values a "
                                  "word")
        if data.dtype != "int32" or weight.dtype != "int32":
            raise self.type_error(f"words={attrs.words} takes int32 words (nn.byte_words) and "
                                  f"an int32 weight of words, got {data.dtype} and "
                                  f"{weight.dtype}")
        if attrs.groups != 1 or attrs.group_window:
            raise self.type_error(f"words={attrs.words} is for convolutions of one group, got "
                                  f"groups={attrs.groups}")
        if not 0 <= attrs.pad_value <= 255:
            raise self.type_error(f"pad_value={attrs.pad_value} is not a byte (0 to 255, the "
                                  "zero point as the words hold it)")
        if attrs.out_dtype not in (None, "int32"):
            raise self.type_error(f"words={attrs.words} sums in int32, not {attrs.out_dtype}")
        return "int32"

    def _check_groups(self, channels: int, per_group: int, out_channels: int,
                      blocks: tuple[int, int, int], attrs: Attrs) -> None:
        """The two blocked forms: every block inside one group (groups=1 included; the
        weight's input block is the data's), or depthwise (one input channel per group, one
        output per input channel, the weight's input block 1)."""
        in_block, kernel_block, out_block = blocks
        groups = attrs.groups
        if channels % groups or out_channels % groups or per_group * groups != channels:
            raise self.type_error(
                f"data has {channels} input channels and the weight {out_channels} outputs "
                f"of {per_group} input channels each, which groups={groups} does not split; "
                "check the weight shape or the 'groups' attribute")
        depthwise = per_group == 1 and out_channels == channels and kernel_block == 1 \
            and out_block == in_block
        within = kernel_block == in_block and per_group % in_block == 0 \
            and (out_channels // groups) % out_block == 0
        if not (depthwise or within):
            raise self.type_error(
                f"groups={groups} with blocks {attrs.data_layout}, {attrs.kernel_layout}, "
                f"{attrs.out_layout}: blocked convolutions need every block inside one group "
                "(the weight's input block equal to the data's) or a depthwise form "
                "(OIHW1i<k>o with data and result in NCHW<k>c)")

    def _check_window(self, channels: int, weight_shape: tuple[int, ...], out_block: int,
                      attrs: Attrs) -> int:
        """The group-window form (see group_window_weight): the output channels, from the
        'channels' attribute; the weight's groups, blocks per group and input channels."""
        groups, out_channels = attrs.groups, attrs.channels
        if out_channels is None or out_channels % groups or out_channels % out_block \
                or channels % groups:
            raise self.type_error(
                f"group_window with groups={groups}, {channels} input channels and "
                f"'channels'={out_channels}: the attribute must be set, the groups must split "
                f"both and blocks of {out_block} the outputs")
        want = (groups, group_local_blocks(out_channels, groups, out_block), *weight_shape[2:4],
                channels // groups, out_block)
        if tuple(weight_shape) != want:
            raise self.type_error(
                f"weight {weight_shape} is not the group-window weight of groups={groups} over "
                f"{channels} -> {out_channels} channels: expected {want}")
        return out_channels

    def reference(self, data: np.ndarray, weight: np.ndarray, *, data_layout: str,
                  kernel_layout: str, out_layout: str, group_window: bool = False,
                  input_shuffle: int = 0, words: int = 0, pad_value: int = 0,
                  **attrs: Any) -> np.ndarray:
        if words:
            blocks = (Layout.parse(data_layout).factor("C"),
                      Layout.parse(kernel_layout).factor("I"))
            data, weight, attrs = _word_operands(data, weight, words, pad_value, blocks, attrs)
        plain_data = transform_array(data, Layout.parse(data_layout), Layout.parse("NCHW"))
        if input_shuffle:
            plain_data = get_op("channel_shuffle").reference(plain_data, input_shuffle, "NCHW")
        if group_window:
            plain_weight = _window_weight_dense(weight, attrs["channels"])
        else:
            plain_weight = transform_array(weight, Layout.parse(kernel_layout),
                                           Layout.parse("OIHW"))
        out = get_op("nn.conv2d").reference(plain_data, plain_weight, **attrs)
        out = transform_array(out, Layout.parse("NCHW"), Layout.parse(out_layout))
        return out.astype(np.int32) if words else out


def _word_operands(data: np.ndarray, weight: np.ndarray, words: int, pad_value: int,
                   blocks: tuple[int, int], attrs: dict[str, Any]
                   ) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """A convolution of words as one of plain values: the data's words split into their
    unsigned parts (bytes, or 16-bit halves) and padded with ``pad_value``, the weight's into
    their signed parts, each cropped to its block's channels (``blocks``: the data's, the
    weight's input block), and the attributes with no padding left."""
    values = word_parts(data, "uint8" if words == 4 else "<i2", words)[..., :blocks[0]]
    top, left, bottom, right = attrs["padding"]
    values = np.pad(values.astype(np.int64),
                    [(0, 0), (0, 0), (top, bottom), (left, right), (0, 0)],
                    constant_values=pad_value)
    parts = word_parts(np.moveaxis(weight, 4, 5), "int8" if words == 4 else "<i2", words)
    # part p of the weight's word j is input channel words * j + p
    parts = np.moveaxis(parts, 5, 4)[..., :blocks[1], :].astype(np.int64)
    return values, parts, {**attrs, "padding": (0, 0, 0, 0)}


@register_op
class WinogradWeightTransform(Op):
    name = "nn.winograd_weight_transform"
    doc = ("G g G^T of every 3x3 filter of a blocked weight OIHW<i>i<o>o (O/o, C/i, 3, 3, i, "
           "o): (alpha, alpha, O/o, C/i, i, o) with alpha = tile_size + 2; the layout pass "
           "applies it to constant weights, so it runs once, at compile time.")
    inputs = ("weight",)
    pattern = OpPatternKind.kOpaque
    attrs = {"tile_size": Attr("int", 4, choices=TILE_SIZES,
                               doc="m of F(m x m, 3 x 3): output tiles of m x m")}

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (weight,) = self.expect_tensors(arg_types)
        expect_rank(self, weight, "weight", 6, ("O", "I", "H", "W", "i", "o"))
        if weight.shape[2:4] != (3, 3):
            raise self.type_error(f"weight {weight.shape} has a {weight.shape[2]}x"
                                  f"{weight.shape[3]} kernel; Winograd here is for 3x3")
        if not is_float(weight.dtype):
            raise self.type_error(f"weight has dtype {weight.dtype}; Winograd needs floats")
        alpha = attrs.tile_size + 2
        kb, cb, _, _, ib, ob = weight.shape
        return TensorType((alpha, alpha, kb, cb, ib, ob), weight.dtype)

    def reference(self, weight: np.ndarray, tile_size: int) -> np.ndarray:
        return winograd.transform_weight(weight, tile_size)


@register_op
class Conv2DWinogradNCHWc(Op):
    name = "nn.conv2d_winograd_nchwc"
    doc = ("3x3 stride-1 convolution of blocked data NCHW<i>c by Winograd's F(m x m, 3 x 3), "
           "with a weight already transformed by nn.winograd_weight_transform (alpha, alpha, "
           "O/o, C/i, i, o); the result is NCHW<o>c. The layout pass makes it from nn.conv2d.")
    inputs = ("data", "weight")
    pattern = OpPatternKind.kOutEWiseFusable
    attrs = {
        "tile_size": Attr("int", 4, choices=TILE_SIZES, always_print=True,
                          doc="m of F(m x m, 3 x 3)"),
        "padding": Attr("ints", 0, always_print=True,
                        doc="1, 2 or 4 values, normalized to (top, left, bottom, right)"),
        "channels": Attr("int", optional=True, doc="output channels, checked against weight"),
        "data_layout": Attr("str", "NCHW16c", always_print=True,
                            doc="NCHW<i>c: the data's channel block"),
        "out_layout": Attr("str", "NCHW16c", always_print=True,
                           doc="NCHW<o>c: the result's channel block"),
        "out_dtype": Attr("dtype", optional=True, doc="result dtype (default: the input's)"),
    }

    def normalize_attrs(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs["padding"] = normalize_padding(self, attrs["padding"])
        check_positive(self, attrs, ("channels",))
        return attrs

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        data, weight = self.expect_tensors(arg_types)
        expect_rank(self, data, "data", 5, ("N", "C", "H", "W", "c"))
        expect_rank(self, weight, "weight", 6, ("alpha", "alpha", "O", "I", "i", "o"))
        in_block = _block(self, attrs, "data_layout", "NCHW#c").factor("C")
        out_block = _block(self, attrs, "out_layout", "NCHW#c").factor("C")
        alpha = attrs.tile_size + 2
        dtype = float_dtype(self, [data, weight], self.inputs)
        if weight.shape[:2] != (alpha, alpha) or weight.shape[4:] != (in_block, out_block) \
                or data.shape[4] != in_block or weight.shape[3] != data.shape[1]:
            raise self.type_error(
                f"data {data.shape} and the transformed weight {weight.shape} do not match "
                f"tile_size={attrs.tile_size} (alpha {alpha}) and the layouts "
                f"{attrs.data_layout}, {attrs.out_layout}: the weight must be "
                f"({alpha}, {alpha}, O/{out_block}, {data.shape[1]}, {in_block}, {out_block})")
        self._check(weight.shape[2] * out_block, attrs)
        out_h, out_w = spatial_output(self, data, (3, 3), (1, 1), (1, 1), attrs.padding)
        return TensorType((data.shape[0], weight.shape[2], out_h, out_w, out_block),
                          attrs.out_dtype or dtype)

    def _check(self, out_channels: int, attrs: Attrs) -> None:
        if attrs.channels is not None and attrs.channels != out_channels:
            raise self.type_error(f"attribute 'channels'={attrs.channels} but the weight "
                                  f"gives {out_channels} output channels")

    def reference(self, data: np.ndarray, weight: np.ndarray, *, tile_size: int,
                  padding: tuple, **_: Any) -> np.ndarray:
        out_h = data.shape[2] + padding[0] + padding[2] - 2
        out_w = data.shape[3] + padding[1] + padding[3] - 2
        return winograd.convolve(wide(data), weight, tile_size, padding, (out_h, out_w))


@register_op
class Conv2DTranspose(_ConvBase):
    name = "nn.conv2d_transpose"
    doc = "Transposed 2-D convolution (the gradient of conv2d) with an IOHW weight."
    attrs = {
        **_conv_attrs("IOHW"),
        "output_padding": Attr("ints", 0, length=2,
                               doc="extra (height, width) rows/columns at the bottom/right"),
    }

    def normalize_attrs(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().normalize_attrs(attrs)
        for axis, extra in enumerate(attrs["output_padding"]):
            limit = max(attrs["strides"][axis], attrs["dilation"][axis])
            if not 0 <= extra < limit:
                raise OpAttributeError(
                    f"{self.name} attribute 'output_padding'={attrs['output_padding']} must be "
                    f"non-negative and smaller than the stride or the dilation "
                    f"(strides={attrs['strides']}, dilation={attrs['dilation']})")
        return attrs

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        data, weight, out_dtype = self._check_common(arg_types, attrs)
        batch, in_channels = data.shape[:2]
        groups = attrs.groups
        if weight.shape[0] != in_channels:
            raise self.type_error(f"data {data.shape} has {in_channels} input channels but "
                                  f"weight {weight.shape} (IOHW) expects {weight.shape[0]}; "
                                  "check the weight shape")
        if in_channels % groups:
            raise self.type_error(f"data {data.shape} has {in_channels} input channels, not "
                                  f"divisible by groups={groups}; check the 'groups' attribute")
        out_channels = weight.shape[1] * groups
        self._check_channels(out_channels, weight, attrs)
        sizes = []
        for axis in range(2):
            size, kernel = data.shape[2 + axis], weight.shape[2 + axis]
            full = ((size - 1) * attrs.strides[axis] + attrs.dilation[axis] * (kernel - 1) + 1
                    + attrs.output_padding[axis])
            out = full - attrs.padding[axis] - attrs.padding[axis + 2]
            if out <= 0:
                raise self.type_error(f"output {('height', 'width')[axis]} would be {out}: the "
                                      f"padding {attrs.padding} crops away all {full} rows of "
                                      "the result; use less padding")
            sizes.append(out)
        return TensorType((batch, out_channels, *sizes), out_dtype)

    def reference(self, data: np.ndarray, weight: np.ndarray, *, strides: tuple,
                  padding: tuple, dilation: tuple, groups: int, output_padding: tuple,
                  **_: Any) -> np.ndarray:
        # col2im: multiply every input pixel by the whole kernel in one matmul, then add each
        # kernel tap's plane into the (uncropped) output at its strided offset.
        batch, channels, height, width = data.shape
        _, per_group_out, kh, kw = weight.shape
        per_group_in = channels // groups
        x = wide(data).reshape(batch, groups, per_group_in, height * width).transpose(0, 1, 3, 2)
        kernel = wide(weight).reshape(groups, per_group_in, per_group_out * kh * kw)
        cols = (x @ kernel).reshape(batch, groups, height, width, per_group_out, kh, kw)
        cols = cols.transpose(0, 1, 4, 5, 6, 2, 3)  # N, G, O/G, KH, KW, H, W
        full_h = (height - 1) * strides[0] + dilation[0] * (kh - 1) + 1 + output_padding[0]
        full_w = (width - 1) * strides[1] + dilation[1] * (kw - 1) + 1 + output_padding[1]
        full = np.zeros((batch, groups, per_group_out, full_h, full_w), cols.dtype)
        span_h, span_w = (height - 1) * strides[0] + 1, (width - 1) * strides[1] + 1
        for i in range(kh):
            top = i * dilation[0]
            for j in range(kw):
                left = j * dilation[1]
                full[..., top:top + span_h:strides[0], left:left + span_w:strides[1]] += (
                    cols[:, :, :, i, j])
        top, left, bottom, right = padding
        out = full[..., top:full_h - bottom, left:full_w - right]
        return out.reshape(batch, groups * per_group_out, *out.shape[-2:])


# ---------------------------------------------------------------------------------------------
# dense and matrix products


@register_op
class Dense(Op):
    name = "nn.dense"
    doc = "data (..., K) times the transpose of weight (N, K): (..., N)."
    inputs = ("data", "weight")
    pattern = OpPatternKind.kOutEWiseFusable
    attrs = {
        "units": Attr("int", optional=True, doc="N, checked against weight"),
        "out_dtype": Attr("dtype", optional=True, doc="result dtype (default: the input's)"),
    }

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        data, weight = self.expect_tensors(arg_types)
        dtype = numeric_dtype(self, [data, weight], self.inputs)
        if data.ndim < 1:
            raise self.type_error("input 'data' must have at least one axis, got a scalar")
        expect_rank(self, weight, "weight", 2, ("N", "K"))
        if data.shape[-1] != weight.shape[1]:
            raise self.type_error(f"data {data.shape} has {data.shape[-1]} features on its "
                                  f"last axis but weight {weight.shape} takes {weight.shape[1]}"
                                  "; check the weight shape (dense wants (units, in_features))")
        if attrs.units is not None and attrs.units != weight.shape[0]:
            raise self.type_error(f"attribute 'units'={attrs.units} but weight {weight.shape} "
                                  f"has {weight.shape[0]} rows; fix the attribute or the weight")
        return TensorType((*data.shape[:-1], weight.shape[0]), attrs.out_dtype or dtype)

    def reference(self, data: np.ndarray, weight: np.ndarray, **_: Any) -> np.ndarray:
        return wide(data) @ wide(weight).T


@register_op
class MatMul(Op):
    name = "nn.matmul"
    doc = ("NumPy matmul: batch axes broadcast, 1-D inputs act as vectors; transpose_a/_b "
           "swap the last two axes of an input of rank >= 2.")
    inputs = ("a", "b")
    pattern = OpPatternKind.kOutEWiseFusable
    attrs = {
        "transpose_a": Attr("bool", False),
        "transpose_b": Attr("bool", False),
        "out_dtype": Attr("dtype", optional=True, doc="result dtype (default: the input's)"),
    }

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        a, b = self.expect_tensors(arg_types)
        dtype = numeric_dtype(self, [a, b], self.inputs)
        for name, ty in (("a", a), ("b", b)):
            if ty.ndim == 0:
                raise self.type_error(f"input {name!r} is a scalar; use multiply instead")
        a_shape = _swap_last(a.shape, attrs.transpose_a)
        b_shape = _swap_last(b.shape, attrs.transpose_b)
        a_mat = a_shape if a.ndim > 1 else (1, *a_shape)
        b_mat = b_shape if b.ndim > 1 else (*b_shape, 1)
        if a_mat[-1] != b_mat[-2]:
            raise self.type_error(
                f"a {a.shape} (transpose_a={attrs.transpose_a}) contracts {a_mat[-1]} values "
                f"but b {b.shape} (transpose_b={attrs.transpose_b}) has {b_mat[-2]}; check "
                "the shapes or the transpose attributes")
        batch = broadcast_shape(self, [TensorType(a_mat[:-2], dtype), TensorType(b_mat[:-2],
                                       dtype)], ("a's batch axes", "b's batch axes"))
        # As in NumPy, the axis a 1-D input was promoted with is dropped from the result.
        rows = (a_mat[-2],) if a.ndim > 1 else ()
        cols = (b_mat[-1],) if b.ndim > 1 else ()
        return TensorType((*batch, *rows, *cols), attrs.out_dtype or dtype)

    def reference(self, a: np.ndarray, b: np.ndarray, transpose_a: bool, transpose_b: bool,
                  **_: Any) -> np.ndarray:
        a, b = wide(a), wide(b)
        if transpose_a and a.ndim > 1:
            a = np.swapaxes(a, -1, -2)
        if transpose_b and b.ndim > 1:
            b = np.swapaxes(b, -1, -2)
        return np.matmul(a, b)


@register_op
class MatMulPacked(Op):
    name = "nn.matmul_packed"
    doc = ("a (..., M, K) times a constant right operand packed in column panels (N/c, K, c), "
           "as PackMatmulWeights makes it from nn.matmul or nn.dense: each panel holds c "
           "columns of the (K, N) matrix row after row, the layout the product's register "
           "tiles read, so that no kernel packs it again on every call. With 'columns', the "
           "product has that many (the last panel ends in zero columns, which it drops).")
    inputs = ("a", "b")
    pattern = OpPatternKind.kOutEWiseFusable
    attrs = {"out_dtype": Attr("dtype", optional=True,
                               doc="result dtype (default: the input's)"),
             "columns": Attr("int", 0, doc="the result's columns when fewer than the panels "
                                           "hold (N/c * c); 0: all of them"),
             "words": Attr("int", 0,
                           doc="0, or the values in each int32 word of a and the panels: 4 "
                               "8-bit ones (a's unsigned, as nn.byte_words makes them; the "
                               "panels' signed), each step of the contraction multiplying "
                               "four pairs (dot4_u8s8, one lane of VNNI's vpdpbusd); 2 "
                               "signed 16-bit ones, two pairs (dot2_s16, pmaddwd). Summed "
                               "in int32")}

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        a, b = self.expect_tensors(arg_types)
        dtype = numeric_dtype(self, [a, b], self.inputs)
        if attrs.words not in (0, 2, 4):
            raise self.type_error(f"words={attrs.words}: 0 (plain values), 2 or 4 values a "
                                  "word")
        if attrs.words and dtype != "int32":
            raise self.type_error(f"words={attrs.words} takes int32 words, got {dtype}")
        if a.ndim < 1:
            raise self.type_error("input 'a' is a scalar; use multiply instead")
        if b.ndim != 3:
            raise self.type_error(f"input 'b' {b.shape} must be column panels (N/c, K, c)")
        if a.shape[-1] != b.shape[1]:
            raise self.type_error(f"a {a.shape} contracts {a.shape[-1]} values but the panels "
                                  f"{b.shape} hold {b.shape[1]} rows")
        held = b.shape[0] * b.shape[2]
        columns = attrs.columns or held
        if not held - b.shape[2] < columns <= held:
            raise self.type_error(f"columns={attrs.columns} must end in the last of the "
                                  f"{b.shape[0]} panels of {b.shape[2]} columns (between "
                                  f"{held - b.shape[2] + 1} and {held})")
        return TensorType((*a.shape[:-1], columns), attrs.out_dtype or dtype)

    def reference(self, a: np.ndarray, b: np.ndarray, columns: int = 0, words: int = 0,
                  **_: Any) -> np.ndarray:
        if words:  # ``words`` (unsigned or signed, signed) pairs per step of the contraction
            count, depth, cols = b.shape
            low, high = ("uint8", "int8") if words == 4 else ("<i2", "<i2")
            a = word_parts(a, low, words)
            b = word_parts(b, high, words).reshape(count, depth, cols, words)
            # row w k + i: part i of each word of row k
            b = b.transpose(0, 1, 3, 2).reshape(count, words * depth, cols)
            return self.reference(a.astype(np.int64), b.astype(np.int64),
                                  columns).astype(np.int32)
        panels, depth, cols = b.shape
        plain = b.transpose(1, 0, 2).reshape(depth, panels * cols)
        return np.matmul(wide(a), wide(plain[:, :columns or panels * cols]))


def word_parts(words: np.ndarray, dtype: str, per_word: int = 4) -> np.ndarray:
    """The parts of int32 ``words`` as ``dtype`` (uint8 or int8 bytes, four a word, or "<i2"
    halves, two), merged into the last axis: (..., W) -> (..., per_word W), the lowest
    first."""
    data = np.ascontiguousarray(words, dtype="<i4")
    return data.view(dtype).reshape(*data.shape[:-1], per_word * data.shape[-1])


@register_op
class ByteWords(Op):
    name = "nn.byte_words"
    doc = ("8-bit values packed four to an int32 word along the last axis, byte 0 the lowest, "
           "as the VNNI products (nn.matmul_packed with words=4) read their left operand: "
           "(..., K) uint8 or int8 -> (..., ceil(K/4)) int32; with per_word=2, two to a word "
           "as 16-bit halves (words=2: pmaddwd). Signed values are offset by 128 (each value "
           "unsigned); the last word's missing parts are 0. A kernel of its "
           "own (opaque to fusion): fused into the kernel that quantizes the bytes, that "
           "kernel's vector loop became a scalar one computing each byte (BERT's quantized "
           "feed-forward input, 128 x 3072: 0.70 ms against 0.05 + 0.02 apart).")
    inputs = ("data",)
    pattern = OpPatternKind.kOpaque
    attrs = {"per_word": Attr("int", 4, doc="values a word: 4 bytes or 2 16-bit halves")}

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        if data.dtype not in ("uint8", "int8"):
            raise self.type_error(f"input 'data' must be uint8 or int8, got {data.dtype}")
        if data.ndim < 1:
            raise self.type_error("input 'data' is a scalar; it needs an axis to pack")
        if attrs.per_word not in (2, 4):
            raise self.type_error(f"per_word={attrs.per_word}: 4 bytes or 2 halves a word")
        return TensorType((*data.shape[:-1], -(-data.shape[-1] // attrs.per_word)), "int32")

    def reference(self, data: np.ndarray, per_word: int = 4, **_: Any) -> np.ndarray:
        codes = data.astype(np.int32) + (128 if data.dtype == np.int8 else 0)
        extra = -data.shape[-1] % per_word
        codes = np.pad(codes, [(0, 0)] * (data.ndim - 1) + [(0, extra)])
        codes = codes.astype(np.uint8 if per_word == 4 else "<u2")
        return np.ascontiguousarray(codes).view("<i4").astype(np.int32)


#: What an ``nn.code_lookup`` table may hold (a vector gather reads 4-byte elements).
CODE_TABLE_DTYPES = ("float32", "int32")


@register_op
class CodeLookup(Op):
    name = "nn.code_lookup"
    doc = ("A function of quantized codes read from a table: ``codes`` are float32 whole "
           "numbers ``low``, ``low + 1``, ... (QuantizeLinear's clipped ``round(x / s) + z`` "
           "before its cast) or NaN; ``table[0]`` is the value for NaN and ``table[1 + j]`` "
           "the one for code ``low + j``. Exactly: the index is ``cast(codes - (low - 1), "
           "int32)`` (opfusion's cast: NaN is 0, truncated), clamped to the table. Made by "
           "the TabulateCodes pass, which evaluates a chain of elementwise operators on every "
           "code once at compile time (a quantized GELU: a dozen quantize/dequantize steps "
           "around erf or tanh). Elementwise in ``codes``; the table is a constant read by "
           "value, like a weight.")
    inputs = ("codes", "table")
    pattern = OpPatternKind.kElemWise
    attrs = {"low": Attr("int", required=True, doc="the smallest code (table[1]'s)")}

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        codes, table = self.expect_tensors(arg_types)
        if codes.dtype != "float32":
            raise self.type_error(f"input 'codes' must be float32, got {codes.dtype}")
        if table.ndim != 1 or table.shape[0] < 2:
            raise self.type_error(f"input 'table' must be 1-D with at least 2 entries (NaN's "
                                  f"and one code's), got shape {table.shape}")
        if table.dtype not in CODE_TABLE_DTYPES:
            raise self.type_error(f"input 'table' must be float32 or int32, got {table.dtype}")
        return TensorType(codes.shape, table.dtype)

    def reference(self, codes: np.ndarray, table: np.ndarray, low: int) -> np.ndarray:
        return table[code_index(codes, low, table.shape[0])]


def code_index(codes: np.ndarray, low: int, entries: int) -> np.ndarray:
    """``nn.code_lookup``'s table index of each code (NaN: 0; code ``low + j``: 1 + j)."""
    shifted = codes.astype(np.float32) - np.float32(low - 1)  # (float32, as the kernels)
    return np.clip(cast_array(shifted, "int32"), 0, entries - 1)


def _swap_last(shape: tuple[int, ...], swap: bool) -> tuple[int, ...]:
    return (*shape[:-2], shape[-1], shape[-2]) if swap and len(shape) > 1 else shape


@register_op
class BatchMatMul(Op):
    name = "nn.batch_matmul"
    doc = "Batched matmul of 3-D tensors: (B, M, K) x (B, N, K) -> (B, M, N) by default."
    inputs = ("x", "y")
    pattern = OpPatternKind.kOutEWiseFusable
    attrs = {
        "transpose_a": Attr("bool", False, doc="x is (B, K, M)"),
        "transpose_b": Attr("bool", True, doc="y is (B, N, K); False: (B, K, N)"),
        "out_dtype": Attr("dtype", optional=True, doc="result dtype (default: the input's)"),
    }

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        x, y = self.expect_tensors(arg_types)
        dtype = numeric_dtype(self, [x, y], self.inputs)
        expect_rank(self, x, "x", 3, ("B", "K", "M") if attrs.transpose_a else ("B", "M", "K"))
        expect_rank(self, y, "y", 3, ("B", "N", "K") if attrs.transpose_b else ("B", "K", "N"))
        _, m, k = _swap_last(x.shape, attrs.transpose_a)
        _, k2, n = _swap_last(y.shape, attrs.transpose_b)
        if k != k2:
            raise self.type_error(
                f"x {x.shape} (transpose_a={attrs.transpose_a}) contracts {k} values but y "
                f"{y.shape} (transpose_b={attrs.transpose_b}) has {k2}; check the shapes or "
                "the transpose attributes")
        bx, by = x.shape[0], y.shape[0]
        if bx != by and 1 not in (bx, by):
            raise self.type_error(f"batch sizes differ: x {x.shape} and y {y.shape}; they must "
                                  "be equal or one of them 1")
        return TensorType((by if bx == 1 else bx, m, n), attrs.out_dtype or dtype)

    def reference(self, x: np.ndarray, y: np.ndarray, transpose_a: bool, transpose_b: bool,
                  **_: Any) -> np.ndarray:
        x, y = wide(x), wide(y)
        if transpose_a:
            x = x.transpose(0, 2, 1)
        if transpose_b:
            y = y.transpose(0, 2, 1)
        return x @ y


# ---------------------------------------------------------------------------------------------
# per-channel layers


class _ChannelVectorOp(Op):
    """data plus a 1-D vector laid along ``axis`` (bias_add, prelu)."""

    pattern = OpPatternKind.kBroadcast
    attrs = {"axis": Attr("int", 1)}
    float_only = False

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        data, vector = self.expect_tensors(arg_types)
        name = self.inputs[1]
        dtype = numeric_dtype(self, [data, vector], self.inputs)
        if self.float_only and not is_float(dtype):
            raise self.type_error(f"input 'data' must be floating point, got {dtype}")
        axis = normalize_axis(self, attrs.axis, data.ndim)
        if vector.shape != (data.shape[axis],):
            raise self.type_error(f"input {name!r} must be 1-D with data's axis {attrs.axis} "
                                  f"size {data.shape[axis]}, got {name} {vector.shape} for "
                                  f"data {data.shape}; check the shapes or the 'axis' attribute")
        return data


@register_op
class BiasAdd(_ChannelVectorOp):
    name = "nn.bias_add"
    doc = "Add a 1-D bias along ``axis`` (the channel axis by default)."
    inputs = ("data", "bias")

    def reference(self, data: np.ndarray, bias: np.ndarray, axis: int) -> np.ndarray:
        return data + along(bias, data.ndim, axis)


@register_op
class PRelu(_ChannelVectorOp):
    name = "nn.prelu"
    doc = "x where x > 0, alpha[c] * x elsewhere, with the 1-D alpha along ``axis``."
    inputs = ("data", "alpha")
    float_only = True

    def reference(self, data: np.ndarray, alpha: np.ndarray, axis: int) -> np.ndarray:
        return np.where(data > 0, data, data * along(alpha, data.ndim, axis))


# ---------------------------------------------------------------------------------------------
# layout and identity


@register_op
class Pad(Op):
    name = "nn.pad"
    doc = ("Pad every axis; pad_width is flat: (before_0, after_0, before_1, after_1, ...). "
           "pad_value (a 0-d tensor) fills in constant mode.")
    inputs = ("data", "pad_value")
    pattern = OpPatternKind.kInjective
    attrs = {
        "pad_width": Attr("ints", required=True,
                          doc="2 * ndim values: (before_0, after_0, before_1, after_1, ...)"),
        "pad_mode": Attr("str", "constant", choices=("constant", "edge", "reflect")),
    }

    def normalize_attrs(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if any(p < 0 for p in attrs["pad_width"]):
            raise OpAttributeError(f"{self.name} attribute 'pad_width'={attrs['pad_width']} "
                                   "must not be negative; crop with strided_slice instead")
        return attrs

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        data, value = self.expect_tensors(arg_types)
        if value.ndim != 0:
            raise self.type_error(f"input 'pad_value' must be a scalar (0-d) tensor, got shape "
                                  f"{value.shape}")
        same_dtype(self, [data, value], self.inputs)
        widths = attrs.pad_width
        if len(widths) != 2 * data.ndim:
            raise self.type_error(f"attribute 'pad_width' needs 2 x rank = {2 * data.ndim} "
                                  f"values (before_0, after_0, before_1, ...) for data "
                                  f"{data.shape}, got {len(widths)}")
        shape = []
        for axis, size in enumerate(data.shape):
            before, after = widths[2 * axis], widths[2 * axis + 1]
            if attrs.pad_mode == "reflect" and max(before, after) > size - 1:
                raise self.type_error(f"attribute 'pad_width' pads axis {axis} of data "
                                      f"{data.shape} by ({before}, {after}); reflect mode pads "
                                      f"at most size - 1 = {size - 1}")
            if attrs.pad_mode == "edge" and size == 0 and before + after:
                raise self.type_error(f"edge mode cannot pad the empty axis {axis} of data "
                                      f"{data.shape}; use constant mode")
            shape.append(size + before + after)
        return TensorType(shape, data.dtype)

    def reference(self, data: np.ndarray, pad_value: np.ndarray, pad_width: tuple,
                  pad_mode: str) -> np.ndarray:
        pairs = [(pad_width[2 * i], pad_width[2 * i + 1]) for i in range(data.ndim)]
        if pad_mode == "constant":
            return np.pad(data, pairs, mode="constant", constant_values=pad_value.item())
        return np.pad(data, pairs, mode=pad_mode)


@register_op
class BatchFlatten(Op):
    name = "nn.batch_flatten"
    doc = "Flatten all axes but the first: (N, ...) -> (N, product of the rest)."
    inputs = ("data",)
    pattern = OpPatternKind.kInjective

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        if data.ndim < 1:
            raise self.type_error("input 'data' must have a batch axis, got a scalar")
        return TensorType((data.shape[0], int(np.prod(data.shape[1:], dtype=np.int64))),
                          data.dtype)

    def reference(self, data: np.ndarray) -> np.ndarray:
        return data.reshape(data.shape[0], -1)


@register_op
class Dropout(Op):
    name = "nn.dropout"
    doc = "Dropout at inference: the identity (``rate`` is kept for training-time tools)."
    inputs = ("data",)
    pattern = OpPatternKind.kOpaque
    attrs = {"rate": Attr("float", 0.5, doc="fraction dropped in training, in [0, 1)")}

    def normalize_attrs(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not 0.0 <= attrs["rate"] < 1.0:
            raise OpAttributeError(f"{self.name} attribute 'rate'={attrs['rate']} must be in "
                                   "[0, 1)")
        return attrs

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        (data,) = self.expect_tensors(arg_types)
        return data

    def reference(self, data: np.ndarray, rate: float) -> np.ndarray:
        return data


from . import einsum  # noqa: E402, F401  (registers einsum, which the ONNX frontend needs)
