"""The blocked convolution rule (nn.conv2d_nchwc): vectors along the output channel block.

A parallel task owns ``task_blocks`` output channel blocks x ``row_block`` output rows; its
accumulator (of the compute's width units, see :func:`opfusion.topi.nn.nchwc_width_unit`) is
computed at the task by register tiles of ``channel_tile`` channel blocks x ``col_units`` units
of columns: for every input channel and kernel tap, each of the tile's input values is broadcast
once and multiplied by the tile's ``channel_tile`` weight vectors, as ONNX Runtime's NCHWc
kernels and TVM's conv2d_NCHWc schedule do (a depthwise tile multiplies a vector of inputs by a
vector of weights instead, one channel tile by default). The epilogue (bias, activation,
residual add) then reads the accumulator vector by vector, while it is still in cache: where
a tile sums the whole reduction (no K-blocking, no line chunks, no pixel line), right
after each tile, from a tile-sized accumulator in L1 (on a Xeon with AVX-512, MobileNet v3's
16 -> 64 layer at 112 x 112: 125 -> 98 us, its 28 KB task accumulator stored and read back
had cost a fifth of the kernel; its 16-channel depthwise layer at 112 x 112: 48 -> 37 us),
else after the task's tiles. The
padded input, when the convolution has padding, is built first, in parallel; a depthwise
convolution's task, which reads its own channel blocks alone, builds their padded rows itself
(no pass over the whole input before the kernel: ShuffleNet and MobileNet-v2 0.98x the time).

Knobs: ``channel_tile``, ``col_units`` (the register tile, at most ``vector_registers``
accumulators), ``task_blocks`` (a multiple of ``channel_tile``), ``row_block``, ``k_blocks``
(K-blocking: the input channel blocks every row and column of a task sums before the next
ones, see :func:`reduction_blocks`), ``line_chunks`` (a pixel line's sums computed whole, in
parallel chunks of its units, before the epilogue: see :func:`line_chunks`), ``rows_first``
(the order of the tasks, which decides what each core reads: see :func:`rows_first`); each a
divisor of its axis but ``line_chunks`` and ``rows_first``; ``prefetch`` (with K-blocking,
the next reduction block's weights prefetched: see :func:`prefetch_next_k_block`). A
group-window convolution (see :func:`group_window_tiles`) has ``channel_tile``,
``col_units`` and ``row_block``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .... import te
from ....target import Target
from ....tir import expr as E
from ....topi.nn import (
    CONV_GROUP_ACC,
    CONV_NCHWC_ACC,
    CONV_NCHWC_PAD,
    LINE_TASKS_PER_CORE,
    channel_tile,
    conv_accumulators,
    group_window_tile,
    matrix_tile,
    matrix_tile_fits,
    pointwise_accumulators,
    takes_matrix_tiles,
)
from ...schedule_rule import Config, ConfigSpace, Knob, ScheduleRule
from .common import (
    arrange_rest,
    divisor,
    divisors,
    itemsize,
    min_tasks,
    owner_of,
    padded_copy_first,
    parallel_outer,
    producer,
    reduction_work,
    tensor_bytes,
    vectorize_block_lanes,
)

#: Parallel tasks a blocked convolution is cut into at least, when it has the rows: enough
#: that two threads split them evenly whatever each task costs (measured on resnet50's
#: layers with 2 cores; more tasks only re-read more weights).
NCHWC_MIN_TASKS = 64
#: Output rows up to which a task takes them all (see :func:`task_rows`).
SMALL_ROWS = 7


def _shape(acc: te.Tensor) -> tuple[int, int, int, int, int]:
    """(output channel blocks, rows, width units, columns per unit, input channel block)."""
    _, blocks, height, units, unit, _ = (int(d) for d in acc.shape)
    source = acc.op.input_tensors[0]
    return blocks, height, units, unit, int(source.shape[4])


def is_depthwise(acc: te.Tensor) -> bool:
    """Whether the accumulator is a depthwise convolution's (it sums the taps alone)."""
    return len(acc.op.reduce_axis) == 2


def is_pointwise(acc: te.Tensor) -> bool:
    """Whether the accumulator is a dense 1x1 convolution's: one tap, every input channel
    (a grouped one sums its group's alone), whose budget the compute took from
    :func:`opfusion.topi.nn.pointwise_accumulators`."""
    if is_depthwise(acc):
        return False
    rc, ry, rx = (int(r.dom.extent) for r in acc.op.reduce_axis)
    source = acc.op.input_tensors[0]
    return ry == rx == 1 and rc == int(source.shape[1]) * int(source.shape[4])


def on_matrix_tiles(acc: te.Tensor, target: Target) -> bool:
    """Whether the accumulator's products run on the target's matrix tiles (see
    :func:`opfusion.topi.nn.takes_matrix_tiles`): a dense convolution of 4-byte words (its
    sum runs over every input channel) where the target has AMX."""
    if is_depthwise(acc):
        return False
    source = acc.op.input_tensors[0]
    dense = int(acc.op.reduce_axis[0].dom.extent) == int(source.shape[1]) * int(source.shape[4])
    return takes_matrix_tiles(target, int(acc.op.attrs.get("words") or 0), 1 if dense else 2,
                              False, int(acc.op.attrs.get("row_words") or 0),
                              int(acc.op.attrs.get("macs") or 0))


class Conv2dNCHWcRule(ScheduleRule):
    """Blocked direct convolution: per-task accumulators, register tiles of broadcasts."""

    name = "conv2d_nchwc"
    ops = ("nn.conv2d_nchwc",)

    def space(self, anchor: te.Tensor, output: te.Tensor, target: Target) -> ConfigSpace | None:
        grouped = producer(anchor, CONV_GROUP_ACC)
        if grouped is not None:
            return _group_window_space(self.name, grouped, target)
        acc = producer(anchor, CONV_NCHWC_ACC)
        if acc is None:
            return None
        blocks, _, units, unit, _ = _shape(acc)
        height = int(anchor.shape[2])  # the output's rows (the pixels' line is one)
        registers = target.vector_registers

        one_line = is_pixel_line(acc, height)
        matrix = on_matrix_tiles(acc, target)

        vectors = int(acc.shape[5]) // target.vector_lanes(acc.dtype)

        def tile_fits(tile: int, columns: int) -> bool:
            if matrix:
                return matrix_tile_fits(tile, columns, target, vectors)
            return tile * columns <= registers

        def fits(config: Mapping[str, Any]) -> bool:
            """the register tile fits the vector registers (the matrix tiles), a task is
            whole tiles, and a pixel line's sums at a task (no line chunks) are at a task of
            every row: the units of some rows are bounded loosely, and each such task
            computed most of the line (6.5x the multiply-adds of a 7 x 7 line)"""
            return (tile_fits(config["channel_tile"], config["col_units"] * unit)
                    and config["task_blocks"] % config["channel_tile"] == 0
                    and not (one_line and config["line_chunks"] == 1
                             and config["row_block"] < height))

        return ConfigSpace(self.name, [
            Knob("channel_tile", divisors(blocks, 4),
                 "output channel blocks of a register tile (one weight vector each)"),
            Knob("col_units", divisors(units, 4),
                 f"units of {unit} output columns of a register tile"),
            Knob("task_blocks", divisors(blocks),
                 "output channel blocks of one parallel task (a multiple of channel_tile)"),
            Knob("row_block", divisors(height), "output rows of one parallel task"),
            Knob("k_blocks", divisors(_input_blocks(acc)),
                 "input channel blocks of one reduction block, whose weights stay in L1 while "
                 "the task's columns use them"),
            Knob("line_chunks", _line_chunk_counts(acc, height),
                 "parallel chunks of a pixel line's units, its sums computed whole before the "
                 "epilogue (1: at the task)"),
            Knob("rows_first", (False, True),
                 "tasks in row order, each core every channel tile of its rows (it reads all "
                 "the weights and its own rows), or in channel-tile order (half the weights, "
                 "every row)"),
            Knob("prefetch", (0, 1) if not is_depthwise(acc) else (0,),
                 "with K-blocking, prefetch the next reduction block's weights into L2 while "
                 "this one runs"),
        ], fits)

    def default_config(self, anchor: te.Tensor, output: te.Tensor, target: Target) -> Config:
        space = self.space(anchor, output, target)
        assert space is not None
        grouped = producer(anchor, CONV_GROUP_ACC)
        if grouped is not None:
            _, _, local, height, _, unit, _ = (int(d) for d in grouped.shape)
            tasks = int(grouped.shape[0]) * height
            _, ry, rx = (int(r.dom.extent) for r in grouped.op.reduce_axis)
            blocks, _ = group_window_tile(int(anchor.shape[3]), local, target, ry == rx == 1)
            return space.config(
                channel_tile=blocks, col_units=1,
                row_block=divisor(height, max(1, tasks // min_tasks(target))))
        acc = producer(anchor, CONV_NCHWC_ACC)
        assert acc is not None
        blocks, _, _, unit, _ = _shape(acc)
        height = int(anchor.shape[2])
        stem = _stem_tile(space, acc, target)
        if stem is not None:
            return stem
        words = int(acc.op.attrs.get("words") or 0)
        budget = pointwise_accumulators(height, int(anchor.shape[3]), int(acc.shape[1]), target,
                                        words) if is_pointwise(acc) \
            else conv_accumulators(target, words=words)
        tile = 1 if is_depthwise(acc) else channel_tile(blocks, unit, budget)
        col_units = 1
        if on_matrix_tiles(acc, target):
            tile, col_units = matrix_tile(blocks, int(acc.shape[3]), unit, target,
                                          int(acc.shape[5]) // target.vector_lanes(acc.dtype))
        # A task: one register tile's channel blocks x the rows that leave NCHWC_MIN_TASKS
        # tasks (or as many as the shape has); all of them when the pixels are one line
        # (a task of some rows would compute the units across its edges twice).
        channel_tasks = int(acc.shape[0]) * blocks // tile
        chunks = line_chunks(acc, height, channel_tasks, target)
        row_block = height if is_pixel_line(acc, height) and chunks == 1 \
            else task_rows(height, channel_tasks, target)
        k_blocks = reduction_blocks(acc, tile, target)
        if on_matrix_tiles(acc, target):
            k_blocks = _input_blocks(acc)
        first = rows_first(acc, target)
        if not first and whole_height_task(acc, tile, channel_tasks, k_blocks, target):
            row_block = height
        return space.config(channel_tile=tile, col_units=col_units, task_blocks=tile,
                            row_block=row_block, k_blocks=k_blocks, line_chunks=chunks,
                            rows_first=first, prefetch=space.knob("prefetch").values[-1])

    def apply(self, s: te.Schedule, anchor: te.Tensor, output: te.Tensor, target: Target,
              config: Config) -> None:
        if producer(anchor, CONV_GROUP_ACC) is not None:
            group_window_tiles(s, anchor, output, int(config["channel_tile"]),
                               int(config["col_units"]), int(config["row_block"]))
            return
        conv2d_nchwc_tiles(s, anchor, output, int(config["channel_tile"]),
                           int(config["col_units"]), int(config["task_blocks"]),
                           int(config["row_block"]), int(config["k_blocks"]),
                           int(config["line_chunks"]), bool(config["rows_first"]),
                           bool(config["prefetch"]))


#: Input channels up to which a convolution is an image's stem (RGB: one block of 3).
STEM_CHANNELS = 4


def _stem_tile(space: ConfigSpace, acc: te.Tensor, target: Target) -> Config | None:
    """The stem's config on a target of 32 vector registers, or None: an image's few channels
    (one block of at most STEM_CHANNELS) give each output column few multiply-adds, so its
    register tile is one channel block by as many column units as leave 4 registers free
    (4 units of 7 on AVX-512: 28 sums, where 2 blocks x 7 columns keep 14), a task every
    channel block of one output row. From ``opf.tune`` on a Xeon with AVX-512 (ResNet-50's
    7x7 stride-2 stem, 3 -> 64 channels at 112 x 112): 0.964 ms -> 0.723."""
    blocks, _, _, unit, in_block = _shape(acc)
    # (products of words broadcast the input into a register of its own, which the float
    # multiply-add takes from memory: a tile of more channel blocks shares each broadcast)
    if (target.vector_registers < 32 or is_depthwise(acc) or in_block > STEM_CHANNELS
            or _input_blocks(acc) != 1 or acc.op.attrs.get("words")):
        return None
    units = [u for u in space.knob("col_units").values
             if u * unit <= target.vector_registers - 4]
    if not units:
        return None
    return space.config(channel_tile=1, col_units=max(units), task_blocks=blocks,
                        row_block=1, k_blocks=1, line_chunks=1, rows_first=False, prefetch=0)


def _input_blocks(acc: te.Tensor) -> int:
    """Input channel blocks one output block sums (1 for a depthwise convolution)."""
    if is_depthwise(acc):
        return 1
    return int(acc.op.reduce_axis[0].dom.extent) // _shape(acc)[4]


def reduction_blocks(acc: te.Tensor, tile: int, target: Target) -> int:
    """Input channel blocks of the default reduction block: all of them when a register
    tile's weights for every input channel fit in half the L1 cache, else the most that do
    (K-blocking: a tile of 4 output blocks of 8 over 512 input channels reads 64 KiB of
    weights for 2 columns, from L2; in 16 KiB pieces, measured on Zen 3 with AVX2,
    SqueezeNet's last convolution (512 -> 1000 channels at 13 x 13) ran 1.06x faster and
    ResNet-50's stride-2 3x3 ones 1.08-1.09x; the 1x1 ones of 1024 inputs 1.03x)."""
    blocks = _input_blocks(acc)
    _, _, _, _, in_block = _shape(acc)
    kh, kw = (int(r.dom.extent) for r in acc.op.reduce_axis[1:]) if not is_depthwise(acc) \
        else (1, 1)
    per_block = tile * in_block * kh * kw * int(acc.shape[5]) * itemsize(acc)
    return divisor(blocks, max(1, target.cache_bytes(1) // 2 // per_block))


def whole_height_task(acc: te.Tensor, tile: int, channel_tasks: int, k_blocks: int,
                      target: Target) -> bool:
    """Whether a 1x1 convolution's default task takes every output row: in channel-tile
    order, when its tile's weights need K-blocking (``k_blocks`` short of its input blocks),
    its channel tiles alone give each core two tasks, and the sums of every row fit in a
    quarter of the L2. A task of a row or two reuses each reduction block's weights for a
    few columns only and walks every input block's rows side by side; a task of every row
    reads each block of weights once and each input block's pixels in one run, which the
    hardware prefetches. ResNet-50's 1024 -> 256 layers at 14 x 14 (a Xeon with AVX-512, in
    the model's sequence): tiles of 2 blocks, 0.389 ms a layer in tasks of one row, 0.324 of
    every row; tiles of 4 blocks, 0.396 and 0.301 (its 256 -> 1024 layers 0.341 and
    0.329)."""
    if not is_pointwise(acc) or channel_tasks < 2 * target.num_cores \
            or k_blocks >= _input_blocks(acc):
        return False
    sums = tile * int(acc.shape[2]) * int(acc.shape[3]) * int(acc.shape[4]) \
        * int(acc.shape[5]) * itemsize(acc)
    return sums <= target.cache_bytes(2) // 4


def is_pixel_line(acc: te.Tensor, height: int) -> bool:
    """Whether the accumulator runs the output's ``height`` rows of pixels as one line of
    units (:func:`opfusion.topi.nn.flatten_pixels`): it has one row where the output has
    several."""
    return int(acc.shape[2]) < height


def _line_chunk_counts(acc: te.Tensor, height: int) -> tuple[int, ...]:
    """Candidate ``line_chunks``: powers of two up to the line's units for a pixel line (the
    accumulator has one row where the output has several), else 1."""
    units = int(acc.shape[3])
    if not is_pixel_line(acc, height):
        return (1,)
    return tuple(c for c in (1, 2, 4, 8, 16, 32, 64) if c <= units)


def line_chunks(acc: te.Tensor, height: int, channel_tasks: int, target: Target) -> int:
    """Chunks of a pixel line's units computed in parallel before the epilogue, or 1 (the
    line's sums at its task). A task of a line holds every pixel, so a line with fewer than
    LINE_TASKS_PER_CORE channel tasks per core starves the cores: SqueezeNet's squeeze
    layers (16 output channels, one channel tile) ran on one thread, 2.0-2.3x ONNX Runtime's
    time. Such a line's sums are computed whole, in chunks that make min_tasks tasks with
    the channel tiles, and the epilogue runs over rows in parallel after them."""
    counts = _line_chunk_counts(acc, height)
    if len(counts) == 1 or channel_tasks >= LINE_TASKS_PER_CORE * target.num_cores:
        return 1
    wanted = -(-min_tasks(target) // channel_tasks)
    return next((c for c in counts if c >= wanted), counts[-1])


def task_rows(height: int, channel_tasks: int, target: Target) -> int:
    """Output rows of a blocked convolution's parallel task: the most that leave
    NCHWC_MIN_TASKS tasks (or as many as the shape has); but where the rows have no divisor
    near that (13, a prime, gives 1 row for a limit of 6), all the rows when that still
    leaves every core four tasks: a task of one row re-reads its weights for a few columns
    (SqueezeNet's last convolution, 512 -> 1000 channels at 13 x 13 in tiles of 4 blocks,
    has 416 one-row tasks at a limit of 6 rows, 32 of all 13 rows with this rule). An output
    of SMALL_ROWS rows or fewer takes every row in each task whenever its channel tiles alone
    give every core four tasks: its rows are a few columns each, and ResNet-50's 512-channel
    7 x 7 layers re-read 0.6 MB of weights for every 7 columns (``opf.tune`` on a Xeon with
    AVX-512: 0.864 -> 0.758 ms; whole models with ``benchmarks/ab_checkouts.py``: resnet50
    0.967-0.983x the time, inception_v1 0.984-0.998x, densenet121 0.962-0.992x)."""
    if height <= SMALL_ROWS and channel_tasks >= 4 * target.num_cores:
        return height
    limit = max(1, height * channel_tasks // NCHWC_MIN_TASKS)
    rows = divisor(height, limit)
    if 2 * rows <= limit < height:
        wider = min(d for d in divisors(height) if d > limit)
        if channel_tasks * (height // wider) >= 4 * target.num_cores:
            return wider
    return rows


def rows_first(acc: te.Tensor, target: Target) -> bool:
    """Whether the default task order is rows first: where the weights are smaller than the
    input and fit in half the L2. Each core then computes every channel tile of a contiguous
    range of rows, reading all the weights (from L2 after the first rows) but only its own
    rows of the input, which the core that computed them mostly holds in its cache when the
    layer before split its work the same way. In channel-tile order each core reads half the
    weights and every row of the input, half of it from the other core's cache or from
    memory: ResNet-50's 256 -> 64 layer at 56 x 56 took 0.50 ms after the layer that wrote
    its input, 0.31-0.36 alone. For the late layers, whose weights outweigh their input
    (1-4 MB against 0.1-0.8 MB), channel tiles stay first (every layer rows first ran
    ResNet-50 in 36 ms against 31). A Xeon with AVX-512, ``benchmarks/ab_checkouts.py``:
    densenet121 0.892x the time, squeezenet 0.926x, resnet50 0.941x, inception_v1 and v2
    0.977x, shufflenet 0.973x, vgg19 0.985x."""
    reads = acc.op.input_tensors
    weights = [t for t in reads if len(t.shape) == 6]  # OIHW<i>i<o>o; the input is 5-D
    inputs = [t for t in reads if len(t.shape) == 5]
    if len(weights) != 1 or not inputs:
        return False
    weight_bytes = tensor_bytes(weights[0])
    return weight_bytes < tensor_bytes(inputs[0]) and weight_bytes <= target.cache_bytes(2) // 2


def conv2d_nchwc_tiles(s: te.Schedule, anchor: te.Tensor, output: te.Tensor, channel_tile: int,
                       col_units: int, task_blocks: int, row_block: int,
                       k_blocks: int = 0, line_chunks: int = 1,
                       rows_first: bool = False, prefetch: bool = False) -> None:
    """The blocked convolution schedule with explicit sizes (see the module docstring);
    with ``prefetch`` and K-blocking, :func:`prefetch_next_k_block`."""
    acc = producer(anchor, CONV_NCHWC_ACC)
    assert acc is not None
    pad = producer(acc, CONV_NCHWC_PAD)
    _, _, _, unit, in_block = _shape(acc)
    owner = owner_of(s, anchor, output)
    stage = s[owner]
    n, o, y, x, c = stage.op.axis
    oo, oi = stage.split(o, factor=task_blocks)
    yo, yi = stage.split(y, factor=row_block)
    # Columns by the accumulator's units, so that the region computed at a task is whole
    # units (a last partial unit computes columns that are cropped).
    xo, xi = stage.split(x, factor=unit)
    tasks = [n, yo, oo] if rows_first else [n, oo, yo]
    blocks = _input_blocks(acc)
    # Not for a pixel line (an accumulator of one row where the output has several): the
    # output's columns of a row are not the line's units, and the region of the line a
    # tile's columns read would be bounded loosely, up to the whole line at every tile
    # (ResNet-50 for AVX2 ran a thousand times its multiply-adds in its 56 x 56 layers).
    one_line = is_pixel_line(acc, int(anchor.shape[2]))
    tile_epilogue = line_chunks == 1 and not 0 < k_blocks < blocks and not one_line
    if tile_epilogue:
        # Each register tile's epilogue right after its sums (see the module docstring).
        oio, oii = stage.split(oi, factor=channel_tile)
        xoo, xoi = stage.split(xo, factor=col_units)
        stage.reorder(*tasks, oio, yi, xoo, oii, xoi, xi, c)
    else:
        stage.reorder(*tasks, oi, yi, xo, xi, c)
    # By its multiply-adds: a one-pixel convolution (a squeeze-excite layer) has few
    # outputs but streams all of its weights, 0.9 MB for MobileNet v3's 960 -> 240.
    task = parallel_outer(stage, tasks, reduction_work(acc.op))
    stage.vectorize(c)

    acc_stage = s[acc]
    an, ao, ay, ab, ax, ac = acc_stage.op.axis
    aoo, aoi = acc_stage.split(ao, factor=channel_tile)
    chunk = []
    if line_chunks > 1:
        # The line's sums whole, before the epilogue: tasks of channel tiles x chunks of
        # units (see :func:`line_chunks`).
        abc, ab = acc_stage.split(ab, nparts=line_chunks)
        chunk = [abc]
    else:
        acc_stage.compute_at(stage, xoo if tile_epilogue else task)
    abo, abi = acc_stage.split(ab, factor=col_units)
    if is_depthwise(acc):
        ry, rx = acc_stage.op.reduce_axis
        acc_stage.reorder(an, aoo, *chunk, ay, abo, ry, rx, aoi, abi, ax, ac)
    else:
        rc, ry, rx = acc_stage.op.reduce_axis
        rco, rci = acc_stage.split(rc, factor=in_block)
        if 0 < k_blocks < blocks:
            # K-blocking: every row and column of the task sums one reduction block of
            # input channels before the next, its weights in L1.
            rcoo, rcoi = acc_stage.split(rco, factor=k_blocks)
            acc_stage.reorder(an, aoo, *chunk, rcoo, ay, abo, rcoi, ry, rx, rci, aoi, abi, ax,
                              ac)
            if prefetch:
                prefetch_next_k_block(acc_stage, acc, (rcoo, rcoi, rci), ay, abo, channel_tile,
                                      blocks // k_blocks)
        else:
            acc_stage.reorder(an, aoo, *chunk, ay, abo, rco, ry, rx, rci, aoi, abi, ax, ac)
    if chunk:
        parallel_outer(acc_stage, [an, aoo, *chunk], reduction_work(acc.op))
    acc_stage.unroll(aoi)
    acc_stage.unroll(abi)
    acc_stage.unroll(ax)
    acc_stage.vectorize(ac)

    if pad is not None and is_depthwise(acc) and not chunk:
        # A depthwise task reads its own channel blocks alone: their padded rows built at the
        # task, in cache, rather than a whole padded copy first.
        s[pad].compute_at(stage, task)
        vectorize_block_lanes(s[pad], pad)
    else:
        padded_copy_first(s, pad)
    arrange_rest(s)


def prefetch_next_k_block(acc_stage: te.Stage, acc: te.Tensor, loops: tuple[Any, Any, Any],
                          row: Any, column: Any, channel_tile: int, k_parts: int) -> None:
    """Each input channel step of a K-blocked register tile prefetches the weight vector one
    of the tile's output blocks reads for the same channel of the next reduction block (the
    last block its own), the output block turning with the tile's ``row`` and ``column`` so
    that the tiles of a block's first rows fetch the next block's weights for every output
    block between them. ``loops`` are the reduction's loops: the reduction block (of
    ``k_parts``), the input channel block inside it and the channel inside that.

    Why: a reduction block's weights are a few KiB per output block, each its own 4 KiB
    page, where the hardware prefetchers stop; the first row of tiles of each block read
    them from L3 or memory at the rate of the multiply-adds (ResNet-50's last stage: 1x1
    convolutions of 2048 <-> 512 channels at 7 x 7, 4 MB of weights each, in blocks of 64
    input channels). ``benchmarks/ab_checkouts.py`` on a Xeon with AVX-512: resnet50 0.981x
    the time, inception_v1 0.941x, squeezenet 0.971x; densenet121, vgg19, zfnet512 level.

    The address is the weight's own index with the reduction block advanced: the clamp to
    the last block is a function of the block loop alone, so the innermost loop adds a
    constant stride (a clamp of the channel itself cost each step of 28 multiply-adds a
    dozen integer instructions: a ResNet-50 1024 -> 256 layer, in C with warm weights, 0.30
    ms without the prefetch and 0.32-0.42 ms with it; in the model, stages 1-3 3-7% slower
    than with no prefetch, and level with it now)."""
    weights = [t for t in acc.op.input_tensors if len(t.shape) == 6]
    if len(weights) != 1:
        return
    (weight,) = weights
    loads = te.reads_of(acc.op, weight)
    if len(loads) != 1:
        return
    block_loop, inner_block, channel = (loop.var for loop in loops)
    blocks_per_part = int(loops[1].dom.extent)
    ao = acc.op.axis[1]
    shifted: dict[Any, Any] = {}
    if channel_tile > 1:
        shifted[ao.var] = ao.var + (row + column) % channel_tile
    indices = [E.substitute(i, shifted) for i in loads[0].indices]
    # The weight is (out block, input block, ky, kx, input channel, out channel): its input
    # block and channel indices are the reduction's block and channel, advanced one part.
    indices[1] = te.min(block_loop + 1, k_parts - 1) * blocks_per_part + inner_block
    indices[4] = channel
    acc_stage.prefetch(weight, loops[2], indices)


def _group_window_space(name: str, acc: te.Tensor, target: Target) -> ConfigSpace:
    """The knobs of a group-window convolution (see :func:`group_window_tiles`)."""
    _, _, local, height, units, unit, _ = (int(d) for d in acc.shape)

    def fits(config: Mapping[str, Any]) -> bool:
        """the register tile fits the vector registers"""
        return config["channel_tile"] * config["col_units"] * unit <= target.vector_registers

    return ConfigSpace(name, [
        Knob("channel_tile", divisors(local, target.vector_registers // 2),
             "a group's output blocks in a register tile (one weight vector each)"),
        Knob("col_units", divisors(units, 4), f"units of {unit} output columns of a register tile"),
        Knob("row_block", divisors(height), "output rows of one parallel task"),
    ], fits)


def group_window_tiles(s: te.Schedule, anchor: te.Tensor, output: te.Tensor, channel_tile: int,
                       col_units: int, row_block: int) -> None:
    """A group-window convolution (``opfusion.topi.nn._conv2d_group_window``): a parallel task
    is ``row_block`` output rows of every output block; at the task, every group's sums for
    those rows are computed by register tiles of ``channel_tile`` of the group's blocks x
    ``col_units`` units of columns (each input value broadcast once per tile), then the
    output blocks add their groups' sums and the epilogue runs, vector by vector. A task
    holds all the groups so that it computes each group's sums once (an output block needs
    up to two groups')."""
    acc = producer(anchor, CONV_GROUP_ACC)
    assert acc is not None
    pad = producer(acc, CONV_NCHWC_PAD)
    owner = owner_of(s, anchor, output)
    stage = s[owner]
    n, b, y, x, c = stage.op.axis
    yo, yi = stage.split(y, factor=row_block)
    stage.reorder(n, yo, b, yi, x, c)
    task = parallel_outer(stage, [n, yo], reduction_work(acc.op))
    stage.vectorize(c)

    acc_stage = s[acc]
    acc_stage.compute_at(stage, task)
    an, ag, aj, ay, ax, axi, ac = acc_stage.op.axis
    rc, ry, rx = acc_stage.op.reduce_axis
    ajo, aji = acc_stage.split(aj, factor=channel_tile)
    axo, axb = acc_stage.split(ax, factor=col_units)
    acc_stage.reorder(an, ag, ajo, ay, axo, ry, rx, rc, aji, axb, axi, ac)
    acc_stage.unroll(aji)
    acc_stage.unroll(axb)
    acc_stage.unroll(axi)
    acc_stage.vectorize(ac)

    padded_copy_first(s, pad)
    arrange_rest(s)
