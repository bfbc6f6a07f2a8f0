"""TE computes of the nn.* operators: convolution (strided, padded, dilated, grouped, depthwise,
transposed), dense and the matrix products, the per-channel layers (bias_add, prelu), pad,
batch_flatten, dropout, and einsum.

The computes are shaped for the CPU schedule rules (:mod:`opfusion.backend.cpu.schedules`),
which find their stages by tag; accumulators are laid out in vectors of the current target
(``Target.current()``, set by the group lowering). A convolution is three stages: ``conv2d_pad``
(the zero-padded input, split into ``stride`` column phases so that every kernel tap reads
consecutive columns), ``conv2d_acc`` (the reduction, its columns in blocks of one vector, the
last block padded) and the op's result, a crop of the accumulator. A product whose operands both
run along the contracted axis (dense, ``transpose_b`` products) sums ``lanes`` interleaved
partial dot products (``matmul_partial``) and then the lanes (``matmul_dot``); any other product
is one reduction (``matmul``). Every product accumulates in the result dtype, as TVM does."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .. import te
from ..ir.op import get_op
from ..opdefs._winograd import matrices as winograd_matrices
from ..opdefs.einsum import parse_equation
from ._util import accumulator_dtype, vector_lanes
from .registry import register_compute

CONV_PAD = "conv2d_pad"
CONV_ACC = "conv2d_acc"
CONV_OUT = "conv2d_out"
CONV_NCHWC_PAD = "conv2d_nchwc_pad"
CONV_NCHWC_ACC = "conv2d_nchwc_acc"
CONV_NCHWC = "conv2d_nchwc"
CONV_GROUP_ACC = "conv2d_group_acc"
WINO_PAD = "winograd_pad"
WINO_ROWS = "winograd_input_rows"
WINO_INPUT = "winograd_input"
WINO_PRODUCT = "winograd_product"
WINO_OUT = "conv2d_winograd"
MATMUL = "matmul"
MATMUL_PARTIAL = "matmul_partial"
MATMUL_DOT = "matmul_dot"
MATMUL_PACK = "matmul_pack"
MATMUL_CROP = "matmul_crop"

Index = Sequence[Any]


def _zero(dtype: str) -> te.PrimExpr:
    return te.const(0, dtype)


# ---------------------------------------------------------------------------------------------
# convolution


def width_blocks(out_width: int, dtype: str) -> tuple[int, int]:
    """How a convolution lays out its output columns while accumulating in ``dtype``:
    ``(blocks, lanes)`` with ``blocks * lanes >= out_width``. Columns go in blocks of one
    vector (the last block padded with columns that read zero padding and are cropped): of
    the target's full width, or of half of it (from 16 lanes down) when that needs no more
    blocks — a 7-wide row is one 8-lane vector on AVX-512, not a 16-lane one mostly padding.
    A row so narrow that padding it would waste more than vectors gain is one block of its
    own width."""
    lanes = vector_lanes(dtype)
    choices = [lanes, lanes // 2] if lanes >= 16 else [lanes]
    if out_width < choices[-1] // 2:
        return 1, out_width
    best = min(choices, key=lambda width: (-(-out_width // width), width))
    return -(-out_width // best), best


def zero_padded(data: te.Tensor, top: int, left: int, rows: int, cols: int,
                fill: te.PrimExpr) -> Callable[..., te.PrimExpr]:
    """``padded(n, c, y, x, *rest)``: element (y, x) of ``data`` (axes 2 and 3; ``rest`` the
    axes after them, a channel block) shifted by ``top`` rows and ``left`` columns, ``fill``
    outside it, for ``rows`` x ``cols`` positions; guarded only on the edges that need it."""
    height, width = int(data.shape[2]), int(data.shape[3])

    def padded(n: Any, c: Any, y: Any, x: Any, *rest: Any) -> te.PrimExpr:
        inside = []
        if top:
            inside.append(y >= top)
        if rows > top + height:
            inside.append(y < top + height)
        if left:
            inside.append(x >= left)
        if cols > left + width:
            inside.append(x < left + width)
        value = data[(n, c, y - top, x - left, *rest)]
        return te.if_then_else(te.all(*inside), value, fill) if inside else value

    return padded


def packed_word(value: Callable[[int], te.PrimExpr], parts: int) -> te.PrimExpr:
    """``parts`` unsigned values (``value(p)``, int32 expressions of 8-bit ones) as one
    int32 word, the first lowest, in bytes (4) or 16-bit halves (2). Summed in uint32, where
    the top part's multiple of 2^24 (or 2^16) wraps as the word's bits do."""
    bits = 32 // parts
    total: te.PrimExpr = te.const(0, "uint32")
    for part in range(parts):
        total = total + te.cast(value(part), "uint32") * te.const(1 << (bits * part), "uint32")
    return te.cast(total, "int32")


def word_constant(value: int, parts: int) -> int:
    """The int32 word of ``parts`` copies of the unsigned 8-bit ``value``."""
    bits = 32 // parts
    word = sum(value << (bits * part) for part in range(parts))
    return word - (1 << 32) if word >= 1 << 31 else word


def word_reader(data: te.Tensor, parts: int) -> Callable[..., te.PrimExpr]:
    """``read(*i, j)``: word ``j`` along the last axis of 8-bit ``data`` at ``i``: its
    values ``parts * j ..`` (int8 ones offset by 128 into bytes), the parts past the last 0
    (:func:`packed_word`)."""
    length = int(data.shape[-1])
    offset = 128 if data.dtype == "int8" else 0

    def read(*i: Any) -> te.PrimExpr:
        *at, j = i

        def part(p: int) -> te.PrimExpr:
            index = j * parts + p
            if length % parts == 0:
                return te.cast(data[(*at, index)], "int32") + offset
            value = te.cast(data[(*at, te.min(index, length - 1))], "int32") + offset
            return te.select(index < length, value, te.const(0, "int32"))

        return packed_word(part, parts)

    return read


def _pad_fill(dtype: str, words: int, pad_value: int) -> te.PrimExpr:
    """What a blocked convolution's padding holds: 0, or with ``words``, words of the
    ``pad_value`` byte (the zero point, as the words hold it)."""
    return te.const(word_constant(pad_value, words), "int32") if words else _zero(dtype)


def padded_source(data: te.Tensor, top: int, left: int, rows: int, cols: int,
                  fill: te.PrimExpr | None = None) -> te.Tensor:
    """What a blocked convolution reads: ``data`` (N, C/b, H, W, b), or, when it reads
    ``rows`` x ``cols`` positions from ``top``, ``left`` that leave it, a copy padded with
    ``fill`` (default 0; the stage tagged CONV_NCHWC_PAD that the schedules build first)."""
    height, width = int(data.shape[2]), int(data.shape[3])
    if not (top or left or rows > height or cols > width):
        return data
    return te.compute((data.shape[0], data.shape[1], rows, cols, data.shape[4]),
                      zero_padded(data, top, left, rows, cols,
                                  _zero(data.dtype) if fill is None else fill),
                      name="conv2d_nchwc_pad", tag=CONV_NCHWC_PAD)


def window_reader(data: te.Tensor, top: int, left: int, rows: int, out_cols: int,
                  stride: int, reach: int, fill: te.PrimExpr, name: str,
                  tag: str) -> Callable[..., te.PrimExpr]:
    """How a sliding window reads ``data`` padded by ``top`` rows and ``left`` columns (with
    ``fill`` outside it): ``read(n, c, y, x, shift)`` is padded row ``y``, padded column
    ``x*stride + shift``, for ``rows`` rows, ``out_cols`` outputs and shifts up to ``reach``.

    When no read leaves ``data`` and the columns are not strided, ``data`` is read directly;
    otherwise through a padded copy (a stage named ``name``, tagged ``tag``) that a schedule
    builds first. Strided columns are stored in phases: ``pad[n, c, y, r, x]`` holds padded
    column ``x*stride + r``, so the taps of consecutive outputs are consecutive within phase
    ``shift % stride`` and vectorize. Only the phases a shift reaches are stored
    (``min(stride, reach + 1)``): a stride wider than the window skips the columns between
    windows, and the copy stays proportional to the output, whatever the stride."""
    batch, channels, height, width = data.shape
    phase_w = out_cols + reach // stride  # columns per phase
    cols = phase_w * stride
    if top == 0 and left == 0 and stride == 1 and rows <= height and cols <= width:
        return lambda n, c, y, x, shift: data[n, c, y, x + shift]

    padded = zero_padded(data, top, left, rows, cols, fill)
    if stride == 1:
        pad = te.compute((batch, channels, rows, cols), padded, name=name, tag=tag)
        return lambda n, c, y, x, shift: pad[n, c, y, x + shift]
    phases = min(stride, reach + 1)
    pad = te.compute((batch, channels, rows, phases, phase_w),
                     lambda n, c, y, r, x: padded(n, c, y, x * stride + r), name=name, tag=tag)
    return lambda n, c, y, x, shift: pad[n, c, y, shift % stride, x + shift // stride]


def _conv2d_nchw(data: te.Tensor, weight_at: Callable[..., te.PrimExpr], out_channels: int,
                 kernel: Sequence[int], strides: Sequence[int], padding: Sequence[int],
                 dilation: Sequence[int], groups: int, out_hw: Sequence[int], out_dtype: str,
                 name: str) -> te.Tensor:
    """``out[n, o, y, x] = sum(pad(data)[n, c, y*sh + i*dh, x*sw + j*dw] * weight_at(o, c', i,
    j))`` over the input channels ``c`` of ``o``'s group (``c'`` its index in the group).

    The sum is accumulated in ``acc[n, o, y, x // lanes, x % lanes]`` (see
    :func:`width_blocks`), which the result crops."""
    batch, channels, height, width = data.shape
    kh, kw = kernel
    sh, sw = strides
    dh, dw = dilation
    top, left = padding[0], padding[1]
    out_h, out_w = out_hw
    blocks, lanes = width_blocks(out_w, accumulator_dtype(out_dtype))
    per_group_in = channels // groups
    per_group_out = out_channels // groups
    rows = (out_h - 1) * sh + (kh - 1) * dh + 1
    read = window_reader(data, top, left, rows, blocks * lanes, sw, (kw - 1) * dw,
                         _zero(data.dtype), f"{name}_pad", CONV_PAD)

    rc = te.reduce_axis((0, per_group_in), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    def channel(o: Any) -> Any:
        return rc if groups == 1 else o // per_group_out * per_group_in + rc

    final_dtype = out_dtype
    out_dtype = accumulator_dtype(out_dtype)
    acc = te.compute(
        (batch, out_channels, out_h, blocks, lanes),
        lambda n, o, y, b, x: te.sum(
            te.cast(read(n, channel(o), y * sh + ry * dh, b * lanes + x, rx * dw), out_dtype)
            * te.cast(weight_at(o, rc, ry, rx), out_dtype), axis=[rc, ry, rx]),
        name=f"{name}_acc", tag=CONV_ACC)
    if lanes == out_w:
        return te.compute((batch, out_channels, out_h, out_w),
                          lambda n, o, y, x: te.cast(acc[n, o, y, 0, x], final_dtype),
                          name=name, tag=CONV_OUT)
    # (The lane as x % lanes also makes the region a stage computed at a tile of this one
    # needs whole blocks, even when the row is narrower than a block.)
    return te.compute((batch, out_channels, out_h, out_w),
                      lambda n, o, y, x: te.cast(acc[n, o, y, x // lanes, x % lanes],
                                                 final_dtype),
                      name=name, tag=CONV_OUT)


@register_compute("nn.conv2d")
def conv2d(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """NCHW x OIHW convolution; groups and depthwise (groups == channels) included."""
    data, weight = inputs
    _, _, out_h, out_w = out_type.shape
    return _conv2d_nchw(data, lambda o, c, i, j: weight[o, c, i, j], weight.shape[0],
                        weight.shape[2:], attrs.strides, attrs.padding, attrs.dilation,
                        attrs.groups, (out_h, out_w), out_type.dtype, "conv2d")


#: Output channel blocks a wide register tile of a blocked convolution may have, in order of
#: preference (see :func:`nchwc_width_unit`): 3 for block counts that 2 does not divide
#: (ShuffleNet's 24-channel stem: 3 x 2 tiles took 0.62x the time of 1 x 7; Zen 3, AVX2).
WIDE_TILE_BLOCKS = (4, 2, 3)
#: The share of a row's columns a wide tile may compute in vain (its last unit cropped).
WIDE_TILE_WASTE = 0.1
#: Columns of a wide register tile at most: each column's broadcast input is live through
#: the tile's row of multiply-adds, so 2 blocks x 6 columns (12 sums, 6 broadcasts, 2
#: weights) spills 16 registers (resnet50's 1x1 layers at half the speed of 4 x 3; Zen 3).
WIDE_TILE_MAX_COLUMNS = 4
#: The vector registers of the targets that take wide tiles (budgets of 12 accumulators or
#: fewer: AVX2's 16).
WIDE_TILE_REGISTERS = 16
#: Columns of a group-window tile at most on a target of 32 registers, whose tiles go
#: broadcast by broadcast (only the weight vectors stay live beside the sums): a unit of 7,
#: the best measured on AVX-512 (see :func:`nchwc_width_unit`).
MANY_REGISTERS_MAX_COLUMNS = 7


def nchwc_width_unit(out_width: int, budget: int, out_blocks: int = 0) -> int:
    """Output columns one register tile of a blocked convolution covers (the compute lays
    its accumulator out in units of this many, so every tile is whole).

    With a budget of 12 accumulators or fewer (AVX2's 16 registers, see
    :func:`conv_accumulators`), a row of more than 7 columns is cut in units of budget / b
    columns (at most WIDE_TILE_MAX_COLUMNS), b the most of WIDE_TILE_BLOCKS that divides
    ``out_blocks``, when that crops at most WIDE_TILE_WASTE of the row: the tile is then b
    channel blocks x budget / b columns, 4 x 2 or 2 x 4 (a 1x1 convolution's budget of 12: 4
    x 3 or 2 x 4). 4 x 2 needs 6 loads (weight vectors and broadcasts) per 8 multiply-adds,
    where 1 block x 7 columns needs 8 loads per 7 and is bound by the loads
    (``benchmarks/conv_tiles.py`` on Zen 3, resnet50's layers: 1x1 convolutions at 56, 28
    and 14 columns 1.06-1.23x faster, stride-2 ones 1.06-1.28x, the 7x7 stem 1.76x; at 7
    columns the 7-column tile stays, a 4 x 2 one measured 0.9x).
    Otherwise 7 when it divides the row (the best tile measured on AVX-512 at 56, 28, 14 and
    7 columns), else the largest divisor of the row from 4 to 8, then up to ``budget``
    accumulators; for a row with none, the unit of 4 to 8 columns that crops the fewest,
    and a row narrower than 4 is one unit. ``out_blocks`` 0: not known (no
    wide tile)."""
    if out_width < 4:
        return out_width
    if budget <= 12 and out_width > 7 and out_blocks:
        for blocks in WIDE_TILE_BLOCKS:
            unit = min(budget // blocks, WIDE_TILE_MAX_COLUMNS)
            while blocks * unit + unit + 1 > WIDE_TILE_REGISTERS:
                unit -= 1  # the sums, a row's broadcasts and a weight vector in registers
            padded = -(-out_width // unit) * unit
            if (out_blocks % blocks == 0 and unit > 1
                    and padded - out_width <= WIDE_TILE_WASTE * padded):
                return unit
    if out_width % 7 == 0 and budget >= 7:
        return 7
    for low, high in ((4, min(8, budget)), (9, budget)):
        for unit in range(high, low - 1, -1):
            if out_width % unit == 0:
                return unit
    # No divisor: the unit from 4 up to the budget that crops the fewest columns, the widest
    # of those (13 columns: 7, two units cropping one column, not 8 cropping three).
    return min(range(min(8, budget), 3, -1), key=lambda unit: -(-out_width // unit) * unit)


def channel_tile(blocks: int, columns: int, budget: int) -> int:
    """Output channel blocks of a blocked register tile of ``columns`` columns: the first of
    WIDE_TILE_BLOCKS (4, 2, 3) that divides ``blocks`` with the tile within ``budget``
    accumulators; else 1. More blocks share each broadcast input."""
    for tile in WIDE_TILE_BLOCKS:
        if blocks % tile == 0 and tile * columns <= budget:
            return tile
    return 1


def group_window_tile(out_width: int, local: int, target: Any,
                      pointwise: bool) -> tuple[int, int]:
    """(channel blocks, columns) of a group-window convolution's register tile, ``local``
    the output blocks a group touches. Where wide tiles are (a budget of 12 accumulators or
    fewer, :func:`conv_accumulators`), the tile of the most sums, then the fewest loads per
    multiply-add, then the most blocks, among ``b`` blocks dividing ``local`` (any count: a
    group of 34 channels touches 5 blocks of 8, which :func:`channel_tile` gives one block x
    7 columns, bound by its loads) by ``u`` of 2 to WIDE_TILE_MAX_COLUMNS columns dividing
    the row (a cropped last unit would need a padded copy of the whole input), with 8 sums
    or more (fewer leave the multiply-add latency uncovered), within the budget and with
    ``b x u + u + 1`` within the registers (the sums, the broadcast inputs of a row and one
    weight vector at a time). ShuffleNet's 1x1 group windows of 5 blocks at 28 columns as 5
    x 2 tiles took 0.74x the time of 1 x 7; its windows of 9 blocks at 14 columns as 3 x 3
    tiles, the last column cropped, 1.11x, and now take 3 x 2 (0.94x of 1 x 7): else
    :func:`nchwc_width_unit`'s unit with :func:`channel_tile`'s blocks (Zen 3, AVX2). On 32
    registers (AVX-512: 28 sums) the same search, up to 7 columns: windows of 5 blocks at 28
    columns as 5 x 4 tiles (20 sums) rather than 1 x 7."""
    budget = conv_accumulators(target, pointwise)
    many = target.vector_registers >= 32
    if (budget <= 12 or many) and out_width > 7:
        best: tuple[tuple[int, float, int], tuple[int, int]] | None = None
        columns = MANY_REGISTERS_MAX_COLUMNS if many else WIDE_TILE_MAX_COLUMNS
        for blocks in (b for b in range(1, min(local, budget) + 1) if local % b == 0):
            for unit in range(2, columns + 1):
                sums = blocks * unit
                # live beside the sums: a row's broadcasts and one weight vector; on 32
                # registers, where a tile of fewer blocks than columns goes broadcast by
                # broadcast (regtile._scalar_major), its weight vectors, the broadcast
                # folded into the multiply-adds (4 x 7 with 28 sums measured fastest)
                live = min(blocks, unit) if many else unit + 1
                if (not 8 <= sums <= budget or sums + live > target.vector_registers
                        or out_width % unit):
                    continue
                key = (sums, -(blocks + unit) / sums, blocks)
                if best is None or key > best[0]:
                    best = (key, (blocks, unit))
        if best is not None:
            return best[1]
    budget = conv_accumulators(target)
    unit = nchwc_width_unit(out_width, budget, local)
    return channel_tile(local, unit, budget), unit


#: The share of a dense convolution's accumulator blocks that may be computed in vain to
#: make whole wide tiles (:func:`padded_out_blocks`): 7 blocks as 8. MobileNet v3's 112
#: channels at 14 x 14 (7 blocks of 16, tiles of 1 block x 7 columns, bound by their loads)
#: as 2 tiles of 4 blocks: its 480 -> 112 and 672 -> 112 layers 0.116 -> 0.103 ms and
#: 0.162 -> 0.146 ms (a Xeon with AVX-512, in the model's sequence).
WIDE_TILE_BLOCK_WASTE = 1 / 8


def padded_out_blocks(out_blocks: int) -> int:
    """Output channel blocks a dense blocked convolution's accumulator has: ``out_blocks``
    rounded up to whole wide tiles (WIDE_TILE_BLOCKS[0]) when that computes at most
    WIDE_TILE_BLOCK_WASTE of them in vain (SqueezeNet's 1000 classes, 125 blocks of 8: 128), so
    that an odd block count still gets a tile of several blocks, each broadcast input
    shared by their weight vectors, instead of one block of up to 7 columns, bound by its
    loads (SqueezeNet's last convolution, 512 -> 1000 channels at 13 x 13, 1.08x faster;
    Zen 3, AVX2); the blocks past the real ones are cropped."""
    tile = WIDE_TILE_BLOCKS[0]
    padded = -(-out_blocks // tile) * tile
    return padded if padded - out_blocks <= WIDE_TILE_BLOCK_WASTE * padded else out_blocks


def _real_block(o: Any, acc_blocks: int, out_blocks: int) -> Any:
    """The weight block that accumulator block ``o`` reads: the blocks past the real ones
    (:func:`padded_out_blocks`) repeat the last one's weight, in bounds and cropped, so that
    the register tile needs no guard."""
    return o if acc_blocks == out_blocks else te.min(o, out_blocks - 1)


def conv_accumulators(target: Any, pointwise: bool = False, words: int = 0) -> int:
    """Accumulator vectors of a blocked convolution's register tile: half the vector
    registers (8 with AVX2; AVX-512: see below), leaving the rest for the weight vectors and
    the broadcast inputs of one multiply-add row. ``pointwise`` (a 1x1 convolution) on a
    target of 16 registers: 12, a tile of 4 channel blocks x 3 columns
    (:func:`nchwc_width_unit`), whose 12 sums, 3 broadcast inputs and one weight vector at a
    time fill the 16 registers: 7 loads per 12 multiply-adds where 4 x 2 needs 6 per 8, and
    12 independent sums cover the multiply-add latency with room to spare where 8 just do
    (Zen 3, AVX2, resnet50's 1x1 layers alone: 1.03-1.11x faster, stride 1 and 2; its 3x3
    stride-2 layers measured level and the 7x7 stem 0.68x, so they keep 8). On 32 registers
    (AVX-512) every convolution gets 28: 4 blocks x 7 columns, its 4 weight vectors and one
    broadcast at a time live (the register tile's updates go column by column, see
    :func:`opfusion.backend.cpu.regtile._scalar_major`). On a Xeon
    (``benchmarks/ab_checkouts.py``): 1x1 convolutions alone, with the whole-height tasks of
    :func:`opfusion.backend.cpu.schedules.conv2d_nchwc.whole_height_task`, densenet121
    0.933x the time, squeezenet 0.948x, resnet50 0.970x, shufflenet 0.982x, inception_v1 and
    v2 0.99x; then every convolution, vgg19 0.920x, inception_v1 0.940x, resnet50 0.959x,
    shufflenet 0.965x, zfnet512 0.977x (geomean of the nine light models 0.967x). Whether a
    1x1 convolution takes it: :func:`pointwise_accumulators`.

    ``words`` 4 (products of bytes by AVX-VNNI's ``vpdpbusd``, which adds into its sum) on
    16 registers: 14, whose tiles (2 blocks x 7 columns on rows of 7s, else 2 x 6, 4 x 3...)
    read their weight vectors from memory (:mod:`opfusion.backend.cpu.regtile`): 14 sums and
    one broadcast in registers. Its latency of 5 cycles at 2 a cycle wants 10 independent
    sums: ResNet-18's 3x3 layers 1.45 -> 1.7 ``vpdpbusd`` a cycle as 4 x 3 tiles (12 sums),
    then the model 0.955x the time, ResNet-50 0.97x and MobileNetV3 0.96x as 2 x 7 (its last
    stage's rows of 7, which no 3 or 4 columns divide, 0.49 -> 0.39 ms a layer; a Xeon's
    cores running AVX2 code with AVX-VNNI)."""
    registers = target.vector_registers
    if registers == 16 and words == 4:
        return registers - 2
    if registers == 32 or (registers == 16 and pointwise):
        return registers - 4  # the sums, the weight vectors (or broadcasts) of a row, one more
    return max(2, registers // 2)


#: Bytes of each output's contraction that one product of matrix tiles must take at least:
#: a block of 16 channels (fewer do less work than VNNI's instructions in the same time).
MATRIX_MIN_ROW_BYTES = 16


#: Multiply-adds from which a convolution whose products take less than a full tile row
#: (blocks of 16 channels) runs on matrix tiles. Below, VNNI's: switching to the tiles and
#: back between kernels costs more than such a small convolution gains (QDQ ShuffleNet v2
#: and MobileNet v3, all of whose convolutions of bytes are below 20 million, 1.2-1.35x the
#: time with them on tiles; a Xeon VM). A convolution in blocks of 64 channels, whose
#: products take whole rows (4x a block of 16's work), takes the tiles at any size.
MATRIX_MIN_MACS = 32_000_000


def takes_matrix_tiles(target: Any, words: int, groups: int, depthwise: bool,
                       row_words: int = 4, macs: int = MATRIX_MIN_MACS) -> bool:
    """Whether a blocked convolution of ``words`` runs its products on the target's matrix
    tiles (AMX, :attr:`opfusion.target.Target.matrix_tiles`): a dense one (one group) of
    4-byte words. One ``tdpbusd`` multiplies up to 16 outputs' words (a tile's rows: output
    columns) by 16 output channels' (a vector's lanes), as many words as a row of 64 bytes
    holds, in the time of about 16 ``vpdpbusd``: 16 x 16 x 4 multiply-adds of VNNI each at
    the least (a 16-byte row, one block of 16 channels), three times that where the taps of a
    row of the kernel read consecutive bytes (see :mod:`opfusion.backend.cpu.matrix_tiles`).
    On a Xeon (one core, in a loop): 0.69 million million multiply-adds a second with
    16-byte rows, 1.65-1.8 with 48-byte ones, against VNNI's 0.31. ``row_words``: the words
    of a product's row (a pixel's block of channels, times the kernel's columns where the
    taps read neighbouring pixels), at least MATRIX_MIN_ROW_BYTES: ShuffleNet's blocks of 4
    channels at 1x1 stay VNNI's."""
    return (words == 4 and groups == 1 and not depthwise and target.matrix_tiles > 0
            and row_words * 4 >= MATRIX_MIN_ROW_BYTES
            and (macs >= MATRIX_MIN_MACS or row_words * 4 >= target.matrix_tile_bytes))


def matrix_width_unit(out_width: int, rows: int) -> int:
    """Output columns of a unit of a convolution on matrix tiles (:func:`takes_matrix_tiles`):
    the row itself up to ``rows`` (a tile's rows) columns, else its largest divisor from half
    of ``rows`` to ``rows`` (56 columns: 14), else ``rows`` (the last unit cropped). A tile's
    product takes the same time for any number of rows: fewer rows do less work."""
    if out_width <= rows:
        return out_width
    for unit in range(rows, rows // 2 - 1, -1):
        if out_width % unit == 0:
            return unit
    return rows


def matrix_tile_runs(columns: int, rows: int) -> int:
    """Tiles of sums that ``columns`` consecutive output columns take: equal runs of at most
    ``rows`` each (0: no such equal split)."""
    runs = -(-columns // rows)
    return runs if columns % runs == 0 else 0


def matrix_tile_fits(blocks: int, columns: int, target: Any, vectors: int = 1) -> bool:
    """Whether a register tile of ``blocks`` channel blocks (of ``vectors`` vectors of 16
    sums each) x ``columns`` columns fits the matrix tiles: its tiles of sums (blocks x
    vectors x runs of columns) and one tile of each operand (see
    :mod:`opfusion.backend.cpu.matrix_tiles`)."""
    runs = matrix_tile_runs(columns, target.matrix_tile_rows)
    return runs > 0 and blocks * vectors * runs + 2 <= target.matrix_tiles


def matrix_tile(blocks: int, units: int, unit: int, target: Any,
                vectors: int = 1) -> tuple[int, int]:
    """(channel blocks, units of columns) of a convolution's register tile on matrix tiles,
    its blocks ``vectors`` vectors of sums each: the most tiles of sums up to 4 (each
    operand tile loaded once a step and used by two products, 2 x 2, where the tiles allow),
    then with every operand tile resident (sums, inputs and weights within the tiles), then
    the most channel blocks."""
    rows = target.matrix_tile_rows
    best: tuple[tuple[int, bool, int], tuple[int, int]] | None = None
    for tile in (b for b in range(1, 5) if blocks % b == 0):
        for cols in (u for u in range(1, 5) if units % u == 0):
            runs = matrix_tile_runs(cols * unit, rows)
            sums = tile * vectors * runs
            if not matrix_tile_fits(tile, cols * unit, target, vectors) or sums > 4:
                continue
            key = (sums, tile * vectors + runs + sums <= target.matrix_tiles, tile)
            if best is None or key > best[0]:
                best = (key, (tile, cols))
    return best[1] if best is not None else (1, 1)


#: Parallel tasks per core a dense 1x1 convolution's pixel line needs from its channel
#: tiles alone (a task of a line has every pixel, see :func:`pointwise_accumulators`).
LINE_TASKS_PER_CORE = 4


def pointwise_accumulators(out_h: int, out_w: int, acc_blocks: int, target: Any,
                           words: int = 0) -> int:
    """The accumulator budget of a dense 1x1 convolution: :func:`conv_accumulators`'s
    pointwise one where its tiles cut the output well, else the general one. Columns of 3
    rarely divide a row, and a row's cropped last unit would need a padded copy of the whole
    input (a 1x1 convolution reads its input in place); so the 4 x 3 tiles are taken on a
    pixel line (:func:`flatten_pixels`, whose last unit rereads the last pixel) when its
    channel tiles alone make LINE_TASKS_PER_CORE tasks per core (a line's task has every
    pixel: 3 tasks on 2 cores ran Inception-v2's 96-channel 14 x 14 layers 1.41x slower than
    rows of 4 x 2 tiles), or on rows that the unit divides; else as before, 4 x 2."""
    wide = conv_accumulators(target, pointwise=True)
    budget = conv_accumulators(target, words=words)
    if wide == budget:
        return budget
    if flatten_pixels(out_h, out_w, wide, acc_blocks):
        tiles = acc_blocks // channel_tile(acc_blocks, nchwc_width_unit(
            out_h * out_w, wide, acc_blocks), wide)
        return wide if tiles >= LINE_TASKS_PER_CORE * target.num_cores else budget
    return wide if out_w % nchwc_width_unit(out_w, wide, acc_blocks) == 0 else budget


@register_compute("nn.conv2d_nchwc")
def conv2d_nchwc(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """Blocked convolution: ``acc[n, ob, y, xb, xi, o] = sum(pad(data)[n, c // ib, y*sh +
    i*dh, x*sw + j*dw, c % ib] * weight[ob, c // ib, i, j, c % ib, o])`` over every input
    channel ``c`` and tap ``(i, j)``, with ``x = xb * unit + xi`` (see
    :func:`nchwc_width_unit`; a last partial unit reads padding and is cropped), then the
    result ``out[n, ob, y, x, o]``. Vectors run along the output channel block ``o``: each
    input value is broadcast and multiplied by a vector of weights. Grouped: the sum runs
    over the input channels of ``ob``'s group. Depthwise (weight ``OIHW1i<k>o``): output
    channel ``(ob, o)`` sums input channel ``(ob, o)`` over the taps alone. Group window:
    see :func:`_conv2d_group_window`."""
    from ..target import Target

    if attrs.group_window:
        return _conv2d_group_window(inputs, attrs, out_type)
    data, weight = inputs
    batch, blocks_in, _, _, in_block = (int(d) for d in data.shape)
    out_blocks, _, kh, kw, _, out_block = (int(d) for d in weight.shape)
    _, _, out_h, out_w, _ = (int(d) for d in out_type.shape)
    sh, sw = attrs.strides
    dh, dw = attrs.dilation
    top, left = attrs.padding[0], attrs.padding[1]
    target = Target.current()
    assert target is not None
    depthwise = weight.shape[4] == 1 and attrs.groups > 1
    # Wide tiles (several channel blocks) for dense convolutions only: a depthwise tile is
    # one block, a grouped one stays inside its group.
    acc_blocks = padded_out_blocks(out_blocks) if attrs.groups == 1 else out_blocks
    pointwise = kh == kw == 1 and attrs.groups == 1
    words = int(attrs.words)
    budget = pointwise_accumulators(out_h, out_w, acc_blocks, target, words) if pointwise \
        else conv_accumulators(target, words=words)
    # (a product's row: the block's words, and the taps of a row of the kernel where they
    # read neighbouring pixels)
    row_words = in_block * (kw if dw == 1 else 1)
    macs = out_h * out_w * out_blocks * out_block * blocks_in * in_block * words * kh * kw
    matrix = takes_matrix_tiles(target, words, attrs.groups, depthwise, row_words, macs)
    if pointwise and not matrix and flatten_pixels(out_h, out_w, budget, acc_blocks):
        return _conv2d_pixels(inputs, attrs, out_type, acc_blocks, budget)
    if matrix and (dh, dw) == (1, 1) and matrix_line_pays(
            out_h, out_w, (kw - 1) // sw, target.matrix_tile_rows):
        return _conv2d_matrix_line(inputs, attrs, out_type, acc_blocks,
                                   target.matrix_tile_rows)
    # (with words, the data's block holds words of its channels: ``in_block`` words)
    fill = _pad_fill(data.dtype, words, attrs.pad_value)
    unit = matrix_width_unit(out_w, target.matrix_tile_rows) if matrix else \
        nchwc_width_unit(out_w, budget, acc_blocks if attrs.groups == 1 else 0)
    units = -(-out_w // unit)
    rows = (out_h - 1) * sh + (kh - 1) * dh + 1
    cols = (units * unit - 1) * sw + (kw - 1) * dw + 1
    if kh == kw == 1 and (sh, sw) != (1, 1) and not depthwise:
        # A strided 1x1 convolution reads every sh-th row and sw-th column once each: a
        # compact copy of those (a quarter of the input at stride 2) gives the register
        # tiles consecutive columns, every input cache line used whole (ResNet-50's
        # stride-2 projections at 28, 14 and 7 output columns 1.05x, 1.19x and 1.32x
        # faster; Zen 3, AVX2).
        padded = zero_padded(data, top, left, rows, cols, fill)
        source = te.compute((batch, blocks_in, out_h, units * unit, in_block),
                            lambda n, c, y, x, i: padded(n, c, y * sh, x * sw, i),
                            name="conv2d_nchwc_pad", tag=CONV_NCHWC_PAD)
        sh = sw = 1
    else:
        source = padded_source(data, top, left, rows, cols, fill)
    final_dtype = out_type.dtype
    acc_dtype = accumulator_dtype(final_dtype)
    product = _word_product(words, acc_dtype)
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    shape = (batch, acc_blocks, out_h, units, unit, out_block)

    def column(xb: Any, xi: Any) -> Any:
        return (xb * unit + xi) * sw + rx * dw

    if depthwise:
        # Depthwise: output channel (o, c) reads input channel (o, c) alone; the vector runs
        # along the channels, so every multiply-add is a vector of inputs times a vector of
        # weights, no broadcast.
        acc = te.compute(
            shape,
            lambda n, o, y, xb, xi, c: te.sum(
                te.cast(source[n, o, y * sh + ry * dh, column(xb, xi), c], acc_dtype)
                * te.cast(weight[o, 0, ry, rx, 0, c], acc_dtype), axis=[ry, rx]),
            name="conv2d_nchwc_acc", tag=CONV_NCHWC_ACC)
    else:
        # Each output block lies in one group; its group's input blocks start at
        # group * blocks_per_group (groups=1: at 0).
        blocks_per_group = int(weight.shape[1])
        out_blocks_per_group = out_blocks // attrs.groups
        rc = te.reduce_axis((0, blocks_per_group * in_block), name="rc")

        def first_block(o: Any) -> Any:
            return 0 if attrs.groups == 1 else o // out_blocks_per_group * blocks_per_group

        acc = _block_sums(
            shape, lambda n, o, y, xb, xi: source[
                n, first_block(o) + rc // in_block, y * sh + ry * dh, column(xb, xi),
                rc % in_block],
            weight, acc_blocks, (rc, ry, rx), product,
            {"words": words, "row_words": row_words, "macs": macs})
    return te.compute((batch, out_blocks, out_h, out_w, out_block),
                      lambda n, o, y, x, c: te.cast(acc[n, o, y, x // unit, x % unit, c],
                                                    final_dtype),
                      name="conv2d_nchwc", tag=CONV_NCHWC)


#: How many times a padded line's share of useful tile rows must be a row's for a convolution
#: on matrix tiles to run as a line (:func:`matrix_line_pays`).
MATRIX_LINE_GAIN = 1.25


def matrix_line_pays(out_h: int, out_w: int, reach: int, rows: int) -> bool:
    """Whether a convolution on matrix tiles runs its output as one padded line
    (:func:`_conv2d_matrix_line`, whose line is ``out_w + reach`` positions wide, ``reach``
    the kernel's columns past the first in steps of the stride): when the line's units of
    ``rows`` use at least MATRIX_LINE_GAIN times the share of their tiles' rows that the
    output's rows do. A row of 7 columns (ResNet's last stage) fills 7 of a tile's 16 rows;
    7 rows of 9 padded columns are 4 tiles of 16, 49 of their 64 rows outputs."""
    if out_h == 1:
        return False
    unit = matrix_width_unit(out_w, rows)
    by_rows = out_w / (-(-out_w // unit) * rows)
    width = out_w + reach
    by_line = out_h * out_w / (-(-out_h * width // rows) * rows)
    return by_line >= MATRIX_LINE_GAIN * by_rows


def _conv2d_matrix_line(inputs: list[Any], attrs: Any, out_type: Any, acc_blocks: int,
                        unit: int) -> te.Tensor:
    """A convolution on matrix tiles over its output as one line (see
    :func:`matrix_line_pays`), in phases of the stride: phase (a, b) of the padded input is
    its rows a, a + sh, ... by its columns b, b + sw, ..., out_w + (kw - 1) // sw columns
    (``width``) wide, and tap (ry, rx) reads phase (ry % sh, rx % sw) at its row ry // sh
    and column rx // sw. Output pixel (y, x) is position ``p = y * width + x`` of each
    phase's line, tap (ry, rx) reads its phase's position ``p + ry // sh * width + rx //
    sw``, so a tile's rows (consecutive positions) read one phase at one stride for every
    tap. Stride 1 has one phase, the padded input itself; a strided 1x1 convolution's phase
    holds the pixels it reads alone (as the rows' compact copy does). The positions past a
    row's output columns are computed and cropped. Each phase is one line of the copy, the
    fill past its rows for the last unit's reads; ``acc[n, ob, 0, xb, xi, o]`` for position
    ``xb * unit + xi`` (``unit``: a tile's rows)."""
    data, weight = inputs
    batch, blocks_in, _, _, in_block = (int(d) for d in data.shape)
    out_blocks, _, kh, kw, _, out_block = (int(d) for d in weight.shape)
    _, _, out_h, out_w, _ = (int(d) for d in out_type.shape)
    top, left = attrs.padding[0], attrs.padding[1]
    sh, sw = attrs.strides
    words = int(attrs.words)
    phases_h, phases_w = min(kh, sh), min(kw, sw)
    width = out_w + (kw - 1) // sw
    rows = out_h + (kh - 1) // sh
    units = -(-out_h * width // unit)
    length = units * unit + (kh - 1) // sh * width + (kw - 1) // sw
    fill = _pad_fill(data.dtype, words, attrs.pad_value)
    padded = zero_padded(data, top, left, (rows - 1) * sh + phases_h,
                         (width - 1) * sw + phases_w, fill)

    def copied(n: Any, c: Any, phase: Any, q: Any, i: Any) -> te.PrimExpr:
        inside = te.min(q, rows * width - 1)
        value = padded(n, c, inside // width * sh + phase // phases_w,
                       inside % width * sw + phase % phases_w, i)
        return te.if_then_else(q < rows * width, value, fill)

    line = te.compute((batch, blocks_in, phases_h * phases_w, length, in_block), copied,
                      name="conv2d_nchwc_pad", tag=CONV_NCHWC_PAD)
    acc_dtype = accumulator_dtype(out_type.dtype)
    product = _word_product(words, acc_dtype)
    rc = te.reduce_axis((0, int(weight.shape[1]) * in_block), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    def phase_of(ry: Any, rx: Any) -> Any:
        return (ry % sh if sh > 1 else 0) * phases_w + (rx % sw if sw > 1 else 0)

    def shift(r: Any, stride: int) -> Any:
        return r // stride if stride > 1 else r

    row_words = in_block * (kw if sw == 1 else 1)
    macs = out_h * out_w * out_blocks * out_block * blocks_in * in_block * words * kh * kw
    acc = _block_sums(
        (batch, acc_blocks, 1, units, unit, out_block), lambda n, o, y, xb, xi: line[
            n, rc // in_block, phase_of(ry, rx),
            xb * unit + xi + shift(ry, sh) * width + shift(rx, sw), rc % in_block],
        weight, acc_blocks, (rc, ry, rx), product,
        {"words": words, "row_words": row_words, "macs": macs})
    return _line_output(acc, out_type, width)


def _line_output(acc: te.Tensor, out_type: Any, width: int) -> te.Tensor:
    """The convolution's result from the accumulator of a line of positions ``width`` a row
    (``acc[n, o, 0, p // unit, p % unit, c]`` for output pixel (y, x) at ``p = y * width +
    x``), cast to the result's dtype."""
    unit = int(acc.shape[4])
    return te.compute(tuple(int(d) for d in out_type.shape),
                      lambda n, o, y, x, c: te.cast(
                          acc[n, o, 0, (y * width + x) // unit, (y * width + x) % unit, c],
                          out_type.dtype),
                      name="conv2d_nchwc", tag=CONV_NCHWC)


def _block_sums(shape: tuple[int, ...], read: Callable[..., te.PrimExpr], weight: te.Tensor,
                acc_blocks: int, axes: tuple[Any, Any, Any],
                product: Callable[[Any, Any], te.PrimExpr], attrs: dict[str, Any]) -> te.Tensor:
    """A dense blocked convolution's accumulator ``acc[n, o, y, xb, xi, c]`` of ``shape``
    (units of columns ``xb`` of ``xi`` each, or of a line's positions): the sum over ``axes``
    (input channel, kernel row, kernel column) of ``product(read(n, o, y, xb, xi),
    weight)``, ``read`` the input value at that point of the axes, the weight of output
    block ``o`` (its real block past ``acc_blocks``'s padding) and lane ``c``."""
    rc, ry, rx = axes
    out_blocks, in_block = int(weight.shape[0]), int(weight.shape[4])
    return te.compute(
        shape,
        lambda n, o, y, xb, xi, c: te.sum(product(
            read(n, o, y, xb, xi),
            weight[_real_block(o, acc_blocks, out_blocks), rc // in_block, ry, rx,
                   rc % in_block, c]),
            axis=[rc, ry, rx]),
        name="conv2d_nchwc_acc", tag=CONV_NCHWC_ACC, attrs=attrs)


def _word_product(words: int, acc_dtype: str) -> Callable[[Any, Any], te.PrimExpr]:
    """``product(a, b)`` of a convolution's data and weight values in ``acc_dtype``; with
    ``words`` (4 or 2), of their int32 words: ``dot4_u8s8`` or ``dot2_s16``."""
    if words:
        return te.dot4_u8s8 if words == 4 else te.dot2_s16
    return lambda a, b: te.cast(a, acc_dtype) * te.cast(b, acc_dtype)


def flatten_pixels(out_h: int, out_w: int, budget: int, blocks: int) -> bool:
    """Whether a blocked 1x1 convolution cuts its output pixels, all rows as one line, into
    register tiles rather than each row: when the line gets a tile of more channel blocks
    (:func:`nchwc_width_unit`: with AVX2, 7 x 7 pixels as 25 units of 2 columns for tiles of
    4 blocks, where a row of 7 is one unit of 7 for a tile of 1 block, bound by its loads),
    or as many with fewer cropped columns (13 x 13: one of 170, not 13 of 182)."""
    if out_h == 1:
        return False

    def shape(extent: int) -> tuple[int, float]:
        unit = nchwc_width_unit(extent, budget, blocks)
        padded = -(-extent // unit) * unit
        return budget // unit, -(padded - extent) / padded

    return shape(out_h * out_w) > shape(out_w)


def _conv2d_pixels(inputs: list[Any], attrs: Any, out_type: Any, acc_blocks: int,
                   budget: int) -> te.Tensor:
    """A blocked 1x1 convolution over its output pixels as one line (a product of the
    pixels by the channels, see :func:`flatten_pixels`): ``acc[n, ob, 0, pb, pi, o]`` for
    pixel ``p = pb * unit + pi`` (those past the last read the last and are cropped), then
    the result ``out[n, ob, y, x, o] = acc[..., y * width + x]``. A strided or padded one
    reads a compact copy of the pixels it uses, as one line. ``budget``: the accumulators
    of its register tile (:func:`pointwise_accumulators`)."""
    data, weight = inputs
    batch, blocks_in, height, width, in_block = (int(d) for d in data.shape)
    out_blocks, _, _, _, _, out_block = (int(d) for d in weight.shape)
    _, _, out_h, out_w, _ = (int(d) for d in out_type.shape)
    sh, sw = attrs.strides
    top, left = attrs.padding[0], attrs.padding[1]
    pixels = out_h * out_w
    unit = nchwc_width_unit(pixels, budget, acc_blocks)
    units = -(-pixels // unit)
    words = int(attrs.words)

    def pixel(p: Any) -> tuple[Any, Any]:
        last = te.min(p, pixels - 1)
        return last // out_w, last % out_w

    if (sh, sw) != (1, 1) or top or left or out_h > height or out_w > width:
        padded = zero_padded(data, top, left, (out_h - 1) * sh + 1, (out_w - 1) * sw + 1,
                             _pad_fill(data.dtype, words, attrs.pad_value))

        def copied(n: Any, c: Any, y: Any, p: Any, i: Any) -> te.PrimExpr:
            row, col = pixel(p)
            return padded(n, c, row * sh, col * sw, i)

        line = te.compute((batch, blocks_in, 1, units * unit, in_block), copied,
                          name="conv2d_nchwc_pad", tag=CONV_NCHWC_PAD)

        def read(n: Any, c: Any, p: Any, i: Any) -> te.PrimExpr:
            return line[n, c, 0, p, i]
    else:
        def read(n: Any, c: Any, p: Any, i: Any) -> te.PrimExpr:
            row, col = pixel(p)
            return data[n, c, row, col, i]

    acc_dtype = accumulator_dtype(out_type.dtype)
    product = _word_product(words, acc_dtype)
    rc = te.reduce_axis((0, int(weight.shape[1]) * in_block), name="rc")
    ry = te.reduce_axis((0, 1), name="ry")
    rx = te.reduce_axis((0, 1), name="rx")

    acc = _block_sums(
        (batch, acc_blocks, 1, units, unit, out_block),
        lambda n, o, y, xb, xi: read(n, rc // in_block, xb * unit + xi, rc % in_block),
        weight, acc_blocks, (rc, ry, rx), product, {"words": words})
    return _line_output(acc, out_type, out_w)


def _group_input_channels(groups: int, per_group: int, in_block: int,
                          shuffle: int) -> Callable[[Any, Any], tuple[Any, Any]]:
    """The data block and lane of group ``g``'s input channel ``c``, as a function of
    ``(g, c)``. Read through a channel shuffle of ``shuffle`` groups (FoldChannelShuffle's
    ``input_shuffle``; 0: none), they are tabled once per call (two small stages), so that
    the multiply-adds' loop finds each by two loads, not by the divisions of the shuffle's
    index map (which cost ShuffleNet's windows 7%)."""
    if not shuffle:
        def plain(g: Any, c: Any) -> tuple[Any, Any]:
            channel = g * per_group + c
            return channel // in_block, channel % in_block

        return plain
    source = get_op("channel_shuffle").source_channel
    channels = groups * per_group

    def shuffled(g: Any, c: Any) -> Any:
        return source(g * per_group + c, channels, shuffle)

    blocks = te.compute((groups, per_group), lambda g, c: shuffled(g, c) // in_block,
                        name="conv2d_shuffle_block")
    lanes = te.compute((groups, per_group), lambda g, c: shuffled(g, c) % in_block,
                       name="conv2d_shuffle_lane")
    return lambda g, c: (blocks[g, c], lanes[g, c])


def _conv2d_group_window(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """A group-window convolution (groups whose channels no block divides; weight
    ``(groups, J, KH, KW, C/groups, o)``, see :func:`opfusion.opdefs.nn.group_window_weight`):
    ``acc[n, g, j, y, xb, xi, o]`` sums group ``g``'s own input channels (read one by one,
    wherever they lie in the data's blocks) into the ``J`` output blocks its outputs touch,
    from ``group_output_blocks[g]`` on; output block ``b`` then adds the sums of the groups
    its channels belong to (two where it holds a group boundary; the weight's lanes outside
    a group are zero). Every multiply-add is one a grouped convolution needs, where a dense
    convolution over whole input blocks would spend most of them on zeros."""
    from ..opdefs.nn import group_spans
    from ..target import Target

    data, weight = inputs
    batch, in_block = int(data.shape[0]), int(data.shape[4])
    groups, local, kh, kw, per_group, out_block = (int(d) for d in weight.shape)
    _, out_blocks, out_h, out_w, _ = (int(d) for d in out_type.shape)
    per_out = out_blocks * out_block // groups
    sh, sw = attrs.strides
    dh, dw = attrs.dilation
    top, left = attrs.padding[0], attrs.padding[1]
    target = Target.current()
    assert target is not None
    # A register tile of several of a group's blocks shares each broadcast input.
    unit = group_window_tile(out_w, local, target, kh == kw == 1)[1]
    units = -(-out_w // unit)
    rows = (out_h - 1) * sh + (kh - 1) * dh + 1
    cols = (units * unit - 1) * sw + (kw - 1) * dw + 1
    source = padded_source(data, top, left, rows, cols)
    final_dtype = out_type.dtype
    acc_dtype = accumulator_dtype(final_dtype)
    rc = te.reduce_axis((0, per_group), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    block_and_lane = _group_input_channels(groups, per_group, in_block, attrs.input_shuffle)

    def tap(n: Any, g: Any, y: Any, xb: Any, xi: Any) -> te.PrimExpr:
        block, lane = block_and_lane(g, rc)
        return te.cast(source[n, block, y * sh + ry * dh, (xb * unit + xi) * sw + rx * dw,
                              lane], acc_dtype)

    acc = te.compute(
        (batch, groups, local, out_h, units, unit, out_block),
        lambda n, g, j, y, xb, xi, o: te.sum(
            tap(n, g, y, xb, xi) * te.cast(weight[g, j, ry, rx, rc, o], acc_dtype),
            axis=[rc, ry, rx]),
        name="conv2d_group_acc", tag=CONV_GROUP_ACC)
    spans = group_spans(out_blocks * out_block, groups, out_block)

    def result(n: Any, b: Any, y: Any, x: Any, o: Any) -> te.PrimExpr:
        first = b * out_block // per_out
        total = None
        for span in range(spans):
            group = te.min(first + span, groups - 1)
            local_block = te.max(te.min(b - group * per_out // out_block, local - 1), 0)
            part = acc[n, group, local_block, y, x // unit, x % unit, o]
            if span:  # the next group, when this block holds its first channels
                part = te.if_then_else(first + span <= (b * out_block + out_block - 1) // per_out,
                                       part, te.const(0, acc_dtype))
            total = part if total is None else total + part
        return te.cast(total, final_dtype)

    return te.compute((batch, out_blocks, out_h, out_w, out_block), result,
                      name="conv2d_nchwc", tag=CONV_NCHWC)


def sparse_rows(matrix: Any, index: Any, term: Callable[[int], te.PrimExpr]) -> te.PrimExpr:
    """``sum(matrix[index, c] * term(c))`` over the non-zero entries of row ``index``, as a
    select over the rows: once a loop over ``index`` is unrolled (see
    :func:`opfusion.tir.simplify.unroll_selecting_loops`) each copy keeps its row's few terms,
    without multiplying by the zeros."""
    expr = None
    for row in reversed(range(matrix.shape[0])):
        total = None
        for col in range(matrix.shape[1]):
            coef = float(matrix[row, col])
            if coef == 0.0:
                continue
            value = term(col)
            value = value if coef == 1.0 else -value if coef == -1.0 else value * coef
            total = value if total is None else total + value
        assert total is not None, "a transform row of zeros"
        expr = total if expr is None else te.if_then_else(index == row, total, expr)
    assert expr is not None
    return expr


@register_compute("nn.winograd_weight_transform")
def winograd_weight_transform(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """``U[x, y, k, c, i, o] = sum(G[x, a] * G[y, b] * weight[k, c, a, b, i, o])`` (run at
    compile time by FoldConstant; a compute for completeness)."""
    (weight,) = inputs
    _, g, _ = winograd_matrices(attrs.tile_size)
    rows = te.compute((g.shape[0], *weight.shape[:2], 3, *weight.shape[4:]),
                      lambda x, k, c, b, i, o: sparse_rows(
                          g, x, lambda col: weight[k, c, col, b, i, o]),
                      name="winograd_weight_rows")
    return te.compute(tuple(int(d) for d in out_type.shape),
                      lambda x, y, k, c, i, o: sparse_rows(
                          g, y, lambda col: rows[x, k, c, col, i, o]),
                      name="winograd_weight_transform")


@register_compute("nn.conv2d_winograd_nchwc")
def conv2d_winograd_nchwc(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """Winograd F(m x m, 3 x 3) over blocked data, in stages the schedule rule finds by tag:
    ``winograd_pad`` (the input padded to whole tiles), ``winograd_input_rows`` and
    ``winograd_input`` (``B^T d B`` of every tile and channel, rows then columns),
    ``winograd_product`` (for each of the alpha x alpha positions, a matrix product over the
    input channels: vectors along the output channel block, as in the direct convolution) and
    the result (``A^T M A``, read for each output pixel from its tile)."""
    data, weight = inputs
    tile = attrs.tile_size
    bt, _, at = winograd_matrices(tile)
    alpha = tile + 2
    batch, blocks_in, height, width, in_block = (int(d) for d in data.shape)
    out_blocks, out_block = int(weight.shape[2]), int(weight.shape[5])
    _, _, out_h, out_w, _ = (int(d) for d in out_type.shape)
    tiles_h, tiles_w = -(-out_h // tile), -(-out_w // tile)
    rows, cols = tiles_h * tile + 2, tiles_w * tile + 2
    top, left = attrs.padding[0], attrs.padding[1]
    source = data
    if top or left or rows != height or cols != width:
        source = te.compute((batch, blocks_in, rows, cols, in_block),
                            zero_padded(data, top, left, rows, cols, _zero(data.dtype)),
                            name="winograd_pad", tag=WINO_PAD)
    dtype = accumulator_dtype(out_type.dtype)
    input_rows = te.compute(
        (batch, blocks_in, tiles_h, tiles_w, alpha, alpha, in_block),
        lambda n, c, ty, tx, x, b, i: sparse_rows(
            bt, x, lambda a: te.cast(source[n, c, ty * tile + a, tx * tile + b, i], dtype)),
        name="winograd_input_rows", tag=WINO_ROWS)
    transformed = te.compute(
        (alpha, alpha, batch, blocks_in, tiles_h, tiles_w, in_block),
        lambda x, y, n, c, ty, tx, i: sparse_rows(
            bt, y, lambda b: input_rows[n, c, ty, tx, x, b, i]),
        name="winograd_input", tag=WINO_INPUT)
    rc = te.reduce_axis((0, blocks_in * in_block), name="rc")
    product = te.compute(
        (alpha, alpha, batch, out_blocks, tiles_h, tiles_w, out_block),
        lambda x, y, n, k, ty, tx, o: te.sum(
            transformed[x, y, n, rc // in_block, ty, tx, rc % in_block]
            * te.cast(weight[x, y, k, rc // in_block, rc % in_block, o], dtype), axis=[rc]),
        name="winograd_product", tag=WINO_PRODUCT)

    def result(n: Any, k: Any, y: Any, x: Any, o: Any) -> te.PrimExpr:
        ty, tx = y // tile, x // tile
        value = sparse_rows(at, x % tile, lambda col: sparse_rows(
            at, y % tile, lambda row: product[row, col, n, k, ty, tx, o]))
        return te.cast(value, out_type.dtype)

    return te.compute((batch, out_blocks, out_h, out_w, out_block), result,
                      name="conv2d_winograd", tag=WINO_OUT)


@register_compute("nn.conv2d_transpose")
def conv2d_transpose(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """Transposed convolution as a stride-1 convolution of the zero-inserted, padded input
    with the flipped kernel (IOHW read as OIHW per group)."""
    data, weight = inputs
    batch, channels, height, width = data.shape
    _, per_group_out, kh, kw = weight.shape
    groups = attrs.groups
    per_group_in = channels // groups
    sh, sw = attrs.strides
    dh, dw = attrs.dilation
    top, left = attrs.padding[0], attrs.padding[1]
    _, out_channels, out_h, out_w = out_type.shape
    # Output row y takes its taps from row y + top - (kh-1-i)*dh of the (uncropped) full
    # result, i.e. row y + i*dh of the inserted input shifted by (kh-1)*dh - top.
    shift_h, shift_w = (kh - 1) * dh - top, (kw - 1) * dw - left
    blocks, lanes = width_blocks(out_w, accumulator_dtype(out_type.dtype))
    rows = out_h + (kh - 1) * dh
    cols = blocks * lanes + (kw - 1) * dw

    def inserted(n: Any, c: Any, y: Any, x: Any) -> te.PrimExpr:
        u, v = y - shift_h, x - shift_w
        inside = []
        for pos, shift, stride, size, extent in ((u, shift_h, sh, height, rows),
                                                  (v, shift_w, sw, width, cols)):
            if shift > 0:
                inside.append(pos >= 0)
            if stride > 1:
                inside.append(pos % stride == 0)
            if extent - 1 - shift > (size - 1) * stride:
                inside.append(pos <= (size - 1) * stride)
        value = data[n, c, u // sh, v // sw]
        return te.if_then_else(te.all(*inside), value, _zero(data.dtype)) if inside else value

    source = te.compute((batch, channels, rows, cols), inserted, name="conv2d_transpose_pad",
                        tag=CONV_PAD)

    def weight_at(o: Any, c: Any, i: Any, j: Any) -> te.PrimExpr:
        first = o // per_group_out * per_group_in if groups > 1 else 0
        return weight[first + c, o % per_group_out, kh - 1 - i, kw - 1 - j]

    return _conv2d_nchw(source, weight_at, out_channels, (kh, kw), (1, 1), (0, 0, 0, 0),
                        (dh, dw), groups, (out_h, out_w), out_type.dtype, "conv2d_transpose")


# ---------------------------------------------------------------------------------------------
# dense and matrix products


#: A contraction this deep (or with fewer output rows than PACK_MIN_ROWS) uses the dot form
#: when both operands run along it; shallower ones pay too much for summing the lanes.
DOT_MIN_DEPTH = 128
#: Output rows from which packing the right operand into column panels pays for itself.
PACK_MIN_ROWS = 8


def dot_lanes(depth: int, dtype: str) -> int:
    """Interleaved partial sums (accumulated in ``dtype``) for a contraction of ``depth``
    values read consecutively from both operands: one vector of the current target (8
    float32 with AVX2) or half of one when that divides it, 0 for a plain reduction."""
    full = vector_lanes(dtype)
    if full < 2:  # no vectors (a GPU thread): a plain reduction
        return 0
    for lanes in (full, full // 2):
        if depth % lanes == 0 and depth >= 2 * lanes:
            return lanes
    return 0


def panel_width(rows: int, depth: int, width: int, along_k: bool, dtype: str) -> int:
    """Columns per panel when the right operand is packed, or 0 to read it in place:
    :func:`panel_vectors` vectors of the current target (of ``dtype``, the accumulator's)
    when they divide the width, else two, else one.

    ``rows``: output rows sharing the right operand; ``along_k``: both operands are
    contiguous along the contraction (the dot form applies)."""
    lanes = vector_lanes(dtype)
    if lanes < 2:  # no vectors (a GPU thread): operands read in place
        return 0
    if along_k and dot_lanes(depth, dtype) and (depth >= DOT_MIN_DEPTH or rows < PACK_MIN_ROWS):
        return 0
    if rows < PACK_MIN_ROWS or width % lanes:
        return 0
    from ..target import Target

    target = Target.current()
    assert target is not None  # (vector_lanes asserted it)
    for vectors in (panel_vectors(target), 2):
        if width % (vectors * lanes) == 0:
            return vectors * lanes
    return lanes


#: A constant right operand's columns may be padded with zeros to whole panels when that
#: adds at most this fraction of them (:func:`padded_panel_width`).
MAX_PANEL_PADDING = 1 / 64


def padded_panel_width(rows: int, width: int, target: Any) -> tuple[int, int]:
    """(columns per panel, columns padded to whole panels) for a constant right operand of
    ``width`` columns packed at compile time for a product of ``rows`` rows (at least
    PACK_MIN_ROWS), or (0, width) when it is not packed.

    The widest panel (:func:`panel_vectors` vectors, then two, then one) whose zero columns
    would add at most MAX_PANEL_PADDING of the width (the product computes them with their
    panel, in its kernel, and drops them); none for a few columns in no whole vectors (33:
    PackMatmulWeights pads such a product's operands instead, or leaves it). Power-of-two
    widths (BERT-large's 1024 and 4096, a decoder's 4096) divide into no panels of three
    vectors: padded, 1024 columns take 4 x 3 tiles on AVX2 (43 panels of 24) instead of 4 x 2
    (0.86-0.89x the time); a vocabulary's 30522 columns, in no whole vectors, had the rows
    copied into a padded operand and the weight packed on every call, and now stream as
    panels (128 x 768 x 30522: 0.35x the time on AVX-512, 0.55x on AVX2)."""
    lanes = target.vector_lanes("float32")
    if lanes < 2 or rows < PACK_MIN_ROWS or width < lanes:
        return 0, width
    for vectors in (panel_vectors(target), 2, 1):
        padded = _cheaply_padded(width, vectors * lanes)
        if padded:
            return vectors * lanes, padded
    return 0, width


def _cheaply_padded(width: int, cols: int) -> int:
    """``width`` rounded up to whole panels of ``cols`` columns when that adds at most
    MAX_PANEL_PADDING of it, else 0."""
    padded = -(-width // cols) * cols
    return padded if padded - width <= width * MAX_PANEL_PADDING else 0


def panel_vectors(target: Any) -> int:
    """Vectors of columns in a packed panel, which a product's register tile spans: three
    with 16 vector registers or more (tiles of 4 rows x 3 vectors, 12 sums, with AVX2's 16;
    8 x 3, 24 sums, with AVX-512's 32), else two. Per multiply-add, a third vector of columns
    saves a third of the broadcasts of the left operand, and on AVX2 the 12 sums hide the
    multiply-add latency that 8 barely cover. AVX-512: ViT-B/16's products alone (Xeon, two
    threads, interleaved) 0.91-0.96x the time of 8 x 2 tiles, in C 8 x 3 ran 330-345
    GFLOP/s against 8 x 2's 290-315, 6 x 4 and 12 or 14 x 2 in between. AVX2 code on the
    same Xeon: 128 x 768 x 3072 at 160 GFLOP/s against 4 x 2's 139 (6 x 2: 140), the BERT
    layer 0.875x the time."""
    return 3 if target.vector_registers >= 16 else 2


def few_rows_panel_width(rows: int, width: int, target: Any) -> tuple[int, int]:
    """(columns per panel, columns padded to whole panels) of a constant right operand
    packed at compile time for a product of fewer than PACK_MIN_ROWS rows (a matrix-vector
    product: a decoder's token step, a CNN's classifier), or (0, width) to read it in place
    (a few columns in no whole vectors).

    The register tile is the largest divisor of ``rows`` up to :func:`register_rows` rows by
    as many vectors of columns as fill the accumulators (``2 * register_rows``: 1 row x 8
    vectors, 2 x 4, 3 or 4 x 2 with AVX2), or fewer where the zero columns that pad the
    weight to whole panels would add more than MAX_PANEL_PADDING of its width; a panel is
    that tile's columns, so each task streams one contiguous panel. Read in place, a row of
    the weight is a few vectors per (strided) row of memory that the prefetchers do not
    follow: 1 x 768 x 3072, kernel alone, 35 -> 66 GFLOP/s, 2 x 768 x 3072 37 -> 107, 4 x
    1024 x 1024 76 -> 141 (Zen 3, two threads); a classifier's 9216 x 4096 weight, read from
    memory, 27 -> 29; a decoder's token step through a vocabulary (1 x 768 x 50257, in no
    whole vectors, read in place before): 84 -> 12 ms with AVX2 (Xeon)."""
    lanes = target.vector_lanes("float32")
    if lanes < 2 or width < lanes:
        return 0, width
    tile_rows = max(d for d in range(1, register_rows(target) + 1) if rows % d == 0)
    budget = max(1, 2 * register_rows(target) // tile_rows)
    for vectors in range(budget, 0, -1):
        padded = _cheaply_padded(width, vectors * lanes)
        if padded:
            return vectors * lanes, padded
    return 0, width


def _panels(batch: Sequence[int], depth: int, width: int, cols: int,
            value: Callable[[Index, Any, Any], te.PrimExpr], name: str) -> te.Tensor:
    """The right operand (``value(batch_index, k, n)``) packed as ``(*batch, width / cols,
    depth, cols)``: the columns of one output tile, row after row, in one contiguous panel."""
    return te.compute((*batch, width // cols, depth, cols),
                      lambda *i: value(i[:-3], i[-2], i[-3] * cols + i[-1]),
                      name=f"{name}_pack", tag=MATMUL_PACK)


def _contract(out_shape: Sequence[int], a_at: Callable[[Index, Any], te.PrimExpr],
              b_at: Callable[[Index, Any], te.PrimExpr], depth: int, out_dtype: str,
              along_k: bool, name: str, words: int = 0) -> te.Tensor:
    """``out[idx] = sum_k a_at(idx, k) * b_at(idx, k)``, accumulated in ``out_dtype``.

    ``along_k``: both operands are contiguous along k, so the sum is split into interleaved
    lanes (one vector of partial sums per output element) and the lanes summed last.
    ``words``: the operands are int32 words of four bytes, multiplied by ``dot4_u8s8``, or (2)
    of two 16-bit halves, by ``dot2_s16``."""

    final_dtype = out_dtype
    out_dtype = accumulator_dtype(out_dtype)

    multiply = _word_product(words, out_dtype)

    def product(idx: Index, k: Any) -> te.PrimExpr:
        return multiply(a_at(idx, k), b_at(idx, k))

    lanes = dot_lanes(depth, out_dtype) if along_k else 0
    if lanes:
        ko = te.reduce_axis((0, depth // lanes), name="ko")
        partial = te.compute(
            (*out_shape, lanes),
            lambda *i: te.sum(product(i[:-1], ko * lanes + i[-1]), axis=ko),
            name=f"{name}_partial", tag=MATMUL_PARTIAL)
        lane = te.reduce_axis((0, lanes), name="lane")
        return te.compute(
            out_shape, lambda *i: te.cast(te.sum(partial[(*i, lane)], axis=lane), final_dtype),
            name=name, tag=MATMUL_DOT)
    if depth == 0:
        return te.compute(out_shape, lambda *i: _zero(out_dtype), name=name, tag=MATMUL)
    k = te.reduce_axis((0, depth), name="k")
    res = te.compute(out_shape, lambda *i: te.sum(product(i, k), axis=k), name=name,
                      tag=MATMUL, attrs={"words": words} if words else None)
    if final_dtype == out_dtype:
        return res
    return te.compute(out_shape, lambda *i: te.cast(res[i], final_dtype), name=name + "_cast")


def _product(dims: Sequence[int]) -> int:
    count = 1
    for d in dims:
        count *= d
    return count


@register_compute("nn.dense")
def dense(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """``out[..., n] = sum_k data[..., k] * weight[n, k]``."""
    data, weight = inputs
    units, depth = weight.shape
    cols = panel_width(_product(data.shape[:-1]), depth, units, True,
                       accumulator_dtype(out_type.dtype))
    b_at: Callable[[Index, Any], te.PrimExpr]
    if cols:
        packed = _panels((), depth, units, cols, lambda _, k, n: weight[n, k], "dense")

        def b_at(i: Index, k: Any) -> te.PrimExpr:
            return packed[i[-1] // cols, k, i[-1] % cols]
    else:
        def b_at(i: Index, k: Any) -> te.PrimExpr:
            return weight[i[-1], k]

    return _contract(out_type.shape, lambda i, k: data[(*i[:-1], k)], b_at, depth,
                     out_type.dtype, not cols, "dense")


def _batch_index(idx: Index, batch: Sequence[int], shape: Sequence[int]) -> list[Any]:
    """An operand's batch indices from the result's (NumPy broadcasting: size-1 axes read 0,
    missing leading axes are dropped)."""
    lead = len(batch) - len(shape)
    return [0 if size == 1 and batch[lead + d] != 1 else idx[lead + d]
            for d, size in enumerate(shape)]


@register_compute("nn.matmul")
def matmul(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """NumPy matmul with transpose flags: broadcast batch axes, 1-D operands as vectors."""
    a, b = inputs
    ta = attrs.transpose_a and a.ndim > 1
    tb = attrs.transpose_b and b.ndim > 1
    depth = a.shape[-2] if ta else a.shape[-1]
    has_m = a.ndim > 1  # the result has an m axis
    has_n = b.ndim > 1  # the result has an n axis
    batch = out_type.shape[:len(out_type.shape) - has_m - has_n]
    along_k = not ta and (tb or not has_n)

    def a_at(idx: Index, k: Any) -> te.PrimExpr:
        if not has_m:
            return a[k]
        m = idx[len(batch)]
        lead = _batch_index(idx, batch, a.shape[:-2])
        return a[(*lead, k, m)] if ta else a[(*lead, m, k)]

    def b_value(lead: Index, k: Any, n: Any) -> te.PrimExpr:
        return b[(*lead, n, k)] if tb else b[(*lead, k, n)]

    width = out_type.shape[-1] if has_n else 1
    # Rows sharing one right operand: the result's, divided by b's batch elements.
    rows = _product(out_type.shape[:-1]) // max(1, _product(b.shape[:-2]))
    cols = (panel_width(rows, depth, width, along_k, accumulator_dtype(out_type.dtype))
            if has_n else 0)
    b_at: Callable[[Index, Any], te.PrimExpr]
    if cols:
        packed = _panels(b.shape[:-2], depth, width, cols, b_value, "matmul")

        def b_at(idx: Index, k: Any) -> te.PrimExpr:
            lead = _batch_index(idx, batch, b.shape[:-2])
            return packed[(*lead, idx[-1] // cols, k, idx[-1] % cols)]
    else:
        def b_at(idx: Index, k: Any) -> te.PrimExpr:
            if not has_n:
                return b[k]
            return b_value(_batch_index(idx, batch, b.shape[:-2]), k, idx[-1])

    return _contract(out_type.shape, a_at, b_at, depth, out_type.dtype, along_k and not cols,
                     "matmul")


@register_compute("nn.matmul_packed")
def matmul_packed(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """``out[..., m, n] = sum_k a[..., m, k] * panels[n // c, k, n % c]``: the plain form over
    a right operand packed at compile time (the product's ``attrs["panels"]`` is c).

    Rows that do not cut into whole register tiles (:func:`register_rows`; a vision
    transformer's 197 tokens) are computed as if padded: the product has whole tiles of rows,
    the rows past the last reading the last row of ``a`` (no padded copy), and a crop stage
    (tag MATMUL_CROP) keeps the real ones, so the epilogue stays in the kernel. Columns past
    ``attrs["columns"]`` (zero columns that fill the last panel) are computed with the panel
    and cropped the same way."""
    from ..target import Target

    a, panels = inputs
    count, depth, cols = (int(d) for d in panels.shape)
    shape = [int(d) for d in out_type.shape]
    rows = shape[-2] if len(shape) >= 2 else 0
    target = Target.current()
    tile = register_rows(target) if target is not None else 1
    padded = -(-rows // tile) * tile if rows >= 2 * tile else rows

    def a_at(idx: Index, k: Any) -> te.PrimExpr:
        if padded != rows:
            idx = (*idx[:-2], te.min(idx[-2], rows - 1), idx[-1])
        return a[(*idx[:-1], k)]

    whole = [*shape[:-2], padded, count * cols] if len(shape) >= 2 else [count * cols]
    result = _contract(whole, a_at,
                       lambda idx, k: panels[idx[-1] // cols, k, idx[-1] % cols], depth,
                       out_type.dtype, False, "matmul", words=int(attrs.words))
    result.op.attrs["panels"] = cols
    if whole == shape:
        return result
    return te.compute(out_type.shape, lambda *i: result[i], name="matmul_crop",
                      tag=MATMUL_CROP, attrs={"panels": cols})


@register_compute("nn.byte_words")
def byte_words(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """``out[..., j]``: values ``data[..., p j .. p j + p - 1]`` (int8 offset by 128; ``p`` is
    ``per_word``, 4 or 2) as one int32 word, the first lowest, in bytes or 16-bit halves;
    parts past the last value are 0 (:func:`word_reader`)."""
    (data,) = inputs
    return te.compute(out_type.shape, word_reader(data, int(attrs.per_word)),
                      name="byte_words")


@register_compute("nn.code_lookup")
def code_lookup(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """``table[clamp(int32(codes - (low - 1)), 0, entries - 1)]``: NaN casts to 0, the
    table's entry for NaN; the clamp keeps every read inside the table whatever the codes
    (a vector gather where the target has one)."""
    codes, table = inputs
    entries = int(table.shape[0])
    below = te.const(float(int(attrs.low) - 1), codes.dtype)

    def element(*i: Any) -> Any:
        index = te.cast(codes[i] - below, "int32")
        index = te.max(te.min(index, te.const(entries - 1, "int32")), te.const(0, "int32"))
        return table[index]

    return te.compute(out_type.shape, element, name="code_lookup", tag="elemwise")


def register_rows(target: Any) -> int:
    """Rows of a product's register tile: 4 (4 rows x 2 vectors of columns = 8 accumulators,
    the measured best with AVX2's 16 registers and with AVX-512's 32; see
    :func:`opfusion.backend.cpu.schedules.common.accumulators`), fewer with fewer
    registers. The packed product and attention cut their rows into tiles of this many."""
    return max(1, min(4, target.vector_registers // 4))


@register_compute("nn.batch_matmul")
def batch_matmul(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """(B, M, K) x (B, N, K) -> (B, M, N), either operand transposed, batch 1 broadcast."""
    x, y = inputs
    ta, tb = attrs.transpose_a, attrs.transpose_b
    depth = x.shape[1] if ta else x.shape[2]
    batch, rows, width = out_type.shape
    along_k = tb and not ta

    def x_at(idx: Index, k: Any) -> te.PrimExpr:
        bi = 0 if x.shape[0] == 1 else idx[0]
        return x[bi, k, idx[1]] if ta else x[bi, idx[1], k]

    def y_value(lead: Index, k: Any, n: Any) -> te.PrimExpr:
        return y[lead[0], n, k] if tb else y[lead[0], k, n]

    shared = rows * (batch if y.shape[0] == 1 else 1)
    cols = panel_width(shared, depth, width, along_k, accumulator_dtype(out_type.dtype))
    y_at: Callable[[Index, Any], te.PrimExpr]
    if cols:
        packed = _panels(y.shape[:1], depth, width, cols, y_value, "batch_matmul")

        def y_at(idx: Index, k: Any) -> te.PrimExpr:
            bi = 0 if y.shape[0] == 1 else idx[0]
            return packed[bi, idx[2] // cols, k, idx[2] % cols]
    else:
        def y_at(idx: Index, k: Any) -> te.PrimExpr:
            return y_value((0 if y.shape[0] == 1 else idx[0],), k, idx[2])

    return _contract(out_type.shape, x_at, y_at, depth, out_type.dtype, along_k and not cols,
                     "batch_matmul")


# ---------------------------------------------------------------------------------------------
# per-channel layers, layout and identity


@register_compute("nn.bias_add")
def bias_add(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """``data + bias`` with the bias along ``axis``."""
    data, bias = inputs
    axis = normalize_axis_of(attrs.axis, data.ndim)
    return te.compute(data.shape, lambda *i: data[i] + bias[i[axis]], name="bias_add")


@register_compute("nn.prelu")
def prelu(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """``x`` where positive, ``alpha[c] * x`` elsewhere, alpha along ``axis``."""
    data, alpha = inputs
    axis = normalize_axis_of(attrs.axis, data.ndim)
    return te.compute(data.shape,
                      lambda *i: te.select(data[i] > _zero(data.dtype), data[i],
                                           data[i] * alpha[i[axis]]),
                      name="prelu")


def normalize_axis_of(axis: int, ndim: int) -> int:
    """``axis`` in 0..ndim-1 (type inference has already checked its range)."""
    return axis % ndim if ndim else 0


@register_compute("nn.pad")
def pad(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """Constant, edge or reflect padding of every axis."""
    data, value = inputs
    widths = attrs.pad_width
    mode = attrs.pad_mode

    def source(axis: int, i: Any) -> Any:
        before, size = widths[2 * axis], data.shape[axis]
        j = i - before
        if mode == "edge":
            return te.min(te.max(j, 0), size - 1)
        if mode == "reflect":
            return te.select(j < 0, 0 - j, te.select(j >= size, 2 * (size - 1) - j, j))
        return j

    def body(*i: Any) -> te.PrimExpr:
        load = data[tuple(source(axis, x) for axis, x in enumerate(i))]
        if mode != "constant":
            return load
        inside = []
        for axis, x in enumerate(i):
            before, after = widths[2 * axis], widths[2 * axis + 1]
            if before:
                inside.append(x >= before)
            if after:
                inside.append(x < before + data.shape[axis])
        return te.if_then_else(te.all(*inside), load, value[()]) if inside else load

    return te.compute(out_type.shape, body, name="pad")


@register_compute("nn.batch_flatten")
def batch_flatten(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """(N, d1, d2, ...) -> (N, d1*d2*...), row-major."""
    (data,) = inputs

    def body(n: Any, j: Any) -> te.PrimExpr:
        index = []
        for size in reversed(data.shape[1:]):
            index.append(j % size)
            j = j // size
        return data[(n, *reversed(index))]

    return te.compute(out_type.shape, body, name="batch_flatten")


@register_compute("nn.dropout")
def dropout(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """Dropout at inference: a copy."""
    (data,) = inputs
    return te.compute(data.shape, lambda *i: data[i], name="dropout")


# ---------------------------------------------------------------------------------------------
# einsum


@register_compute("einsum")
def einsum(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """Any equation np.einsum accepts: repeated letters read diagonals, letters missing from
    the output are summed, ``...`` and size-1 axes broadcast."""
    (operands,) = inputs
    terms, out = parse_equation(attrs.equation)
    dtype = out_type.dtype
    batch_ndim = max((t.ndim - len(term) + 1 for t, term in zip(operands, terms)
                      if "." in term), default=0)
    sizes: dict[str, int] = {}
    for tensor, term in zip(operands, terms):
        dims = _einsum_dims(term, tensor.ndim)
        for letter, size in zip(dims, tensor.shape):
            if not letter.startswith("."):
                sizes[letter] = max(sizes.get(letter, 1), size)
    summed = [c for c in dict.fromkeys("".join(terms)) if c != "." and c not in out]
    axes = {c: te.reduce_axis((0, sizes[c]), name=f"r{c}") for c in summed}
    out_dims = _einsum_dims(out, batch_ndim + len(out) - (1 if "." in out else 0))

    def product(i: Index) -> te.PrimExpr:
        where = {**dict(zip(out_dims, i)), **axes}
        value = None
        for tensor, term in zip(operands, terms):
            dims = _einsum_dims(term, tensor.ndim)
            index = [0 if size == 1 else where[d] for d, size in zip(dims, tensor.shape)]
            load = te.cast(tensor[tuple(index)], dtype)
            value = load if value is None else value * load
        assert value is not None
        return value

    if any(sizes[c] == 0 for c in summed):
        return te.compute(out_type.shape, lambda *i: _zero(dtype), name="einsum")
    if not summed:
        return te.compute(out_type.shape, lambda *i: product(i), name="einsum")
    return te.compute(out_type.shape,
                      lambda *i: te.sum(product(i), axis=[axes[c] for c in summed]),
                      name="einsum")


def _einsum_dims(term: str, ndim: int) -> list[str]:
    """One name per axis of an operand: its letter, or ``.k`` for the k-th from last of the
    broadcast axes that ``...`` stands for (right-aligned across operands, as NumPy does)."""
    if "." not in term:
        return list(term)
    at = term.index(".")
    count = ndim - (len(term) - 1)
    return [*term[:at], *(f".{count - e}" for e in range(count)), *term[at + 1:]]


__all__ = ["CONV_ACC", "CONV_GROUP_ACC", "CONV_NCHWC", "CONV_NCHWC_ACC", "CONV_NCHWC_PAD",
           "CONV_OUT", "CONV_PAD",
           "MATMUL", "MATMUL_CROP", "MATMUL_DOT", "MATMUL_PACK", "MATMUL_PARTIAL",
           "WIDE_TILE_BLOCKS", "WIDE_TILE_MAX_COLUMNS", "WIDE_TILE_REGISTERS", "channel_tile",
           "conv_accumulators",
           "WINO_INPUT", "WINO_OUT", "WINO_PAD", "WINO_PRODUCT", "WINO_ROWS", "dot_lanes",
           "few_rows_panel_width", "flatten_pixels", "group_window_tile", "nchwc_width_unit",
           "MATRIX_MIN_MACS", "matrix_tile", "matrix_tile_fits", "matrix_tile_runs",
           "matrix_width_unit", "takes_matrix_tiles",
           "normalize_axis_of",
           "MAX_PANEL_PADDING", "padded_out_blocks", "padded_panel_width", "panel_vectors",
           "panel_width", "pointwise_accumulators",
           "LINE_TASKS_PER_CORE",
           "register_rows", "sparse_rows", "width_blocks"]
