"""GPU convolutions on tensor cores (nn.conv2d, NCHW, float32 in TF32 arithmetic): an
implicit product of output channels x (pixel, image) columns over input channels, in warp
tiles of ``mma.sync`` m16n8k8.

Taken only for a target with ``-tf32=1`` (see :mod:`.mma`), ungrouped convolutions whose
input channels come in whole 8-step contractions, and batches the column tiles divide (8
images or more): the others keep :mod:`.conv2d`'s float32 tiles.

The product's rows are the output channels, its columns the images at each output pixel: a
block takes ``warps_m * tiles_m * 16`` channels (``blockIdx.y``) of ``warps_n * tiles_n * 8``
images (``blockIdx.z``) at each of ``pixels`` consecutive pixels of a row (``blockIdx.x``),
each pixel its own ``warps_m * warps_n`` warps, all sharing the block's weights. Warps and
lanes split a pixel's tile as :mod:`.mma` says: lane ``t4 + 4 g`` owns ``2 tiles_m``
consecutive channels and ``2 tiles_n`` consecutive images of one pixel, one register tile
(whole loops for the pixel and for the images, so that a lane's results are one box of the
accumulator).

The contraction runs over the window's rows and columns, and within each over the input
channels in steps of ``k_step`` (8 a tensor-core step). With ``shared`` the block copies
the step's weights of its channels and the step's input window of its images into shared
memory together, waits at a barrier, and each warp issues its instructions. The left
operand is the weight, the right one the input read with its padding test, so a padded
position contributes zero. The epilogue (bias, activation, residual) runs on each lane's
registers, or, with ``staged_store``, on a shared tile of the block's sums that the lanes
store and the block's threads then read in the output's order (a lane's own results lie an
image and a channel apart: one word in each of 32 sectors a warp store).

Knobs: ``warps_m``, ``warps_n`` (1, 2, 4), ``tiles_m``, ``tiles_n`` (1, 2, 4), ``pixels`` (1,
2, 4, 7, 8: dividing the width), ``k_step`` (8, 16, 32), ``row_steps`` (the copies at each
row of the window, for windows whose whole tiles do not fit), ``shared``, ``double_buffer``
(two of each tile, the next step's loaded while this one's computes, as in :mod:`.mma`),
``staged_store`` (the sums through shared memory, above), ``async_stages`` (tiles filled by
async copies, steps ahead, as in :mod:`.mma`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

from .... import te
from ....target import Target
from ....tir import expr as E
from ....tir.mma import LANE_X, LANE_Y, TILE_COLS, TILE_ROWS, TILE_STEPS
from ....tir.simplify import linear_form
from ...schedule_rule import Config, ConfigSpace, Knob, KnobValue, ScheduleError, ScheduleRule
from .default import (
    DEFAULT_THREADS,
    accumulator_and_owner,
    arrange_elementwise,
    compute_in_registers,
)
from .matmul import MAX_GRID_Z
from .mma import (
    ASYNC_STAGES,
    BANKS,
    DOUBLE_BUFFER,
    VECTOR,
    bank_offset,
    operand_roles,
    pipelines_once,
    shared_tile_floats,
    stage_in_shared,
    tensorize_tiles,
    tile_copies,
    warp_copy,
)


class GPUConv2dMmaRule(ScheduleRule):
    """Tensor-core convolutions: see the module docstring."""

    name = "gpu_conv2d_mma"
    ops = ("nn.conv2d",)

    def space(self, anchor: Any, output: Any, target: Target) -> ConfigSpace | None:
        window = _window(anchor) if _takes(anchor, output) else None
        if not target.allow_tf32 or window is None:
            return None
        batch, channels, width = (int(anchor.shape[i]) for i in (0, 1, 3))
        in_channels = int(anchor.op.input_tensors[1].shape[1])
        limit = target.max_threads_per_block
        shared_bytes = target.max_dynamic_shared_memory_per_block
        copy_floats = shared_copies(anchor)

        def fits(c: dict[str, KnobValue]) -> bool:
            rows, cols = _block(c)
            pixels, k_step = int(c["pixels"]), int(c["k_step"])
            warps = int(c["warps_m"]) * int(c["warps_n"]) * pixels
            tiles = copy_floats(c) * 4 if c["shared"] else 0
            tiles += _staged_bytes(c)
            return (channels % rows == 0 and batch % cols == 0 and width % pixels == 0
                    and pipelines_once(c) and (c["shared"] or not c["row_steps"])
                    and in_channels % k_step == 0 and warps <= MAX_WARPS
                    and warps * LANE_X * LANE_Y <= limit
                    and channels // rows <= MAX_GRID_Z
                    and tiles <= shared_bytes)

        fits.__doc__ = "tiles that divide channels and images, blocks and shared tiles that fit"
        if batch // TILE_COLS > MAX_GRID_Z:
            return None
        space = ConfigSpace(self.name, [
            Knob("warps_m", (1, 2, 4), "warps along the output channels of a block"),
            Knob("warps_n", (1, 2, 4), "warps along the images of a block"),
            Knob("tiles_m", (1, 2, 4), "16-channel tensor-core tiles of each warp"),
            Knob("tiles_n", (1, 2, 4), "8-image tensor-core tiles of each warp"),
            Knob("pixels", (1, 2, 4, 7, 8), "consecutive pixels of a row per block, each its "
                 "own warps, sharing the block's weights"),
            Knob("k_step", (8, 16, 32), "input channels per shared-memory stage"),
            Knob("row_steps", (False, True), "stage one row of the window at a time"),
            Knob("shared", (True, False), "stage weights and input in shared memory"),
            DOUBLE_BUFFER,
            Knob("staged_store", (True, False), "the block's sums through a shared tile, "
                 "stored (and the epilogue computed) in the output's order"),
            ASYNC_STAGES,
        ], fits)
        return None if space.is_empty() else space

    def default_config(self, anchor: Any, output: Any, target: Target) -> Config:
        """The largest tile that fits, with 4 pixels a block where the rows allow (7 on rows
        of 7 or 14, then 2, then 1): a block per pixel loads its weights for each pixel,
        from L2. Sums through a shared tile where it fits; for a short contraction
        (:data:`STAGED_CONTRACTION`), whose kernel stores as many bytes as it reads, a staged
        block of 64 channels before a larger unstaged one (measured on an H200: ResNet-50's
        pointwise layers at batch 32 took 0.40-0.55x the time staged)."""
        space = self.space(anchor, output, target)
        assert space is not None
        weight = anchor.op.input_tensors[1]
        contraction = int(weight.shape[1]) * int(weight.shape[2]) * int(weight.shape[3])
        found = first_fitting(space, default_order(contraction <= STAGED_CONTRACTION),
                              _measured_budget(anchor, target))
        return found if found is not None else next(iter(space))

    def apply(self, s: te.Schedule, anchor: Any, output: Any, target: Target,
              config: Config) -> None:
        arrange_conv2d_mma(s, anchor, output, int(config["warps_m"]), int(config["warps_n"]),
                           int(config["tiles_m"]), int(config["tiles_n"]),
                           int(config["pixels"]), int(config["k_step"]),
                           bool(config["shared"]), bool(config["row_steps"]),
                           bool(config["double_buffer"]), bool(config["staged_store"]),
                           int(config["async_stages"]))
        arrange_elementwise(s, DEFAULT_THREADS)


#: Warps a block may have along threadIdx.z (CUDA's limit on a block's z size).
MAX_WARPS = 64

#: The heuristic's tiles, largest first, each with the deepest step that fits: the whole
#: window staged at once, else a row of it at a time (a 7x7 stem's weights for 64 channels
#: and 8 input channels are 100 KB), untuned.
_TILES = tuple(
    ({"warps_m": wm, "warps_n": wn, "tiles_m": tm, "tiles_n": tn, "k_step": k,
      "shared": True}, row_steps)
    for wm, wn, tm, tn in ((2, 2, 2, 2), (2, 1, 2, 2), (1, 1, 2, 2), (1, 1, 1, 1))
    for row_steps in (False, True) for k in (16, 8))


#: Contractions (input channels x window) up to which the heuristic stages its sums through
#: shared memory before it takes a larger tile: the pointwise layers, whose outputs are as
#: many words as their inputs and whose stores, a lane's words an image and a channel apart,
#: are most of their time.
STAGED_CONTRACTION = 512

#: The fewest output channels of a block the heuristic stages before a larger tile.
STAGED_ROWS = 64


def first_fitting(space: ConfigSpace, order: list[dict[str, KnobValue]],
                  accept: Callable[[Config], bool] | None = None) -> Config | None:
    """The first of ``order`` (configs but the pixels) that fits ``space`` (and ``accept``
    takes), with 4 pixels a block where the rows allow, then 7, 2 and 1; None when none
    does."""
    for pixels in (4, 7, 2, 1):
        for config in order:
            try:
                found = space.config(**config, pixels=pixels)
            except ScheduleError:
                continue
            if accept is None or accept(found):
                return found
    return None


def _measured_budget(anchor: Any, target: Target) -> Callable[[Config], bool]:
    """Whether a config fits the shared memory the heuristic budgets for it: its tiles
    with 31 words of padding a row, the most bank alignment adds. The space admits the
    tiles that fit as laid out (less padding), larger ones among them; the heuristic keeps
    to the budget under which its choices were measured (an H200, 2026-11-29) until a
    measurement of the larger tiles says otherwise."""
    weight = anchor.op.input_tensors[1]
    kernel_h, kernel_w = int(weight.shape[2]), int(weight.shape[3])
    stride, dilation_h, dilation_w = _window(anchor)  # type: ignore[misc]
    window_h, window_w = (kernel_h - 1) * dilation_h + 1, (kernel_w - 1) * dilation_w + 1

    def accept(c: Config) -> bool:
        rows, cols = _block(c)
        pixels = int(c["pixels"])
        weight_rows, input_rows = (1, 1) if c["row_steps"] else (kernel_h, window_h)
        tiles = (rows * weight_rows * kernel_w
                 + cols * input_rows * ((pixels - 1) * stride + window_w)) * int(c["k_step"])
        tiles = (tiles + (BANKS - 1) * (rows + cols)) * 4 * tile_copies(c)
        if not c["shared"]:
            tiles = 0
        return tiles + _staged_bytes(c) <= target.max_shared_memory_per_block

    return accept


def default_order(staged_first: bool) -> list[dict[str, KnobValue]]:
    """The heuristic's configs (but the pixels) in order: by tile, each staged then not,
    double-buffered then not; with ``staged_first`` the staged ones of blocks of 64
    channels first (a smaller block staged was slower than the larger one unstaged: the
    1x1 stride-2 layers at 7 pixels)."""
    configs = [{**tile, "row_steps": row_steps, "staged_store": staged,
                "double_buffer": double, "async_stages": 0}
               for tile, row_steps in _TILES
               for staged, double in itertools.product((True, False), repeat=2)]
    if not staged_first:
        return configs
    return [c for c in configs if c["staged_store"] and _block(c)[0] >= STAGED_ROWS] + configs


def shared_copies(anchor: Any) -> Callable[[Mapping[str, KnobValue]], int]:
    """For a convolution the rule takes: the elements of a config's shared copies, the
    step's weights of the block's channels and its images' input under the windows of its
    pixels (consecutive ones of one row; their rows, or one row), as lowering lays them out
    (:func:`shared_tile_floats`): padded for the windows' spans, shaped by them clamped to
    the image, as many as the steps in flight."""
    data, weight = anchor.op.input_tensors[:2]
    kernel_h, kernel_w = int(weight.shape[2]), int(weight.shape[3])
    stride, dilation_h, dilation_w = _window(anchor)  # type: ignore[misc]
    window_h, window_w = (kernel_h - 1) * dilation_h + 1, (kernel_w - 1) * dilation_w + 1
    roles = [operand_roles(anchor, t, (1, 0)) for t in (data, weight)]
    height_in, width_in = int(data.shape[2]), int(data.shape[3])

    def floats(c: Mapping[str, KnobValue]) -> int:
        rows, cols = _block(c)
        pixels, k_step = int(c["pixels"]), int(c["k_step"])
        span_h = 1 if c["row_steps"] else window_h
        span_w = (pixels - 1) * stride + window_w
        data_tile = [cols, k_step, span_h, span_w]
        weight_tile = [rows, k_step, 1 if c["row_steps"] else kernel_h, kernel_w]
        tiles, copies = (int(c["tiles_m"]), int(c["tiles_n"])), tile_copies(c)
        clamped = [cols, k_step, min(span_h, height_in), min(span_w, width_in)]
        return (shared_tile_floats(roles[0], tiles, data_tile, clamped, copies)
                + shared_tile_floats(roles[1], tiles, weight_tile, None, copies))

    return floats


def _staged_bytes(c: Mapping[str, KnobValue]) -> int:
    """The shared tile of a block's sums with ``staged_store`` (each image's rows padded
    off the banks; at most 31 words), else none."""
    if not c["staged_store"]:
        return 0
    rows, cols = _block(c)
    return (rows * int(c["pixels"]) + BANKS - 1) * cols * 4


def _window(anchor: Any) -> tuple[int, int, int] | None:
    """(horizontal stride, vertical and horizontal dilation) of a convolution, read off the
    input's row and column indices in its compute (``y * stride + ry * dilation - pad``,
    clamped); None when they are not of that form."""
    loads = te.reads_of(anchor.op, anchor.op.input_tensors[0])
    if len(loads) != 1:
        return None
    _, _, y, x = anchor.op.axis
    _, ry, rx = anchor.op.reduce_axis
    row, col = (linear_form(_unclamped(i)) for i in loads[0].indices[2:])
    steps = (col.coef_of(x.var), row.coef_of(ry.var), col.coef_of(rx.var))
    return steps if all(step >= 1 for step in steps) and row.coef_of(y.var) >= 1 else None


def _unpadded(anchor: Any) -> bool:
    """Whether a convolution reads its input without padding: its row and column indices
    (``y * stride + ry * dilation - pad``, clamped) have no constant part."""
    loads = te.reads_of(anchor.op, anchor.op.input_tensors[0])
    return len(loads) == 1 and all(linear_form(_unclamped(i)).const == 0
                                   for i in loads[0].indices[2:])


def _unclamped(index: Any) -> Any:
    """``index`` without its clamps to the input (a max or min with a constant)."""
    while isinstance(index, (E.Min, E.Max)) and (isinstance(index.a, E.IntImm)
                                                 or isinstance(index.b, E.IntImm)):
        index = index.b if isinstance(index.a, E.IntImm) else index.a
    return index


def _block(config: Any) -> tuple[int, int]:
    """(channels, images) of a block's tile."""
    return (int(config["warps_m"]) * int(config["tiles_m"]) * TILE_ROWS,
            int(config["warps_n"]) * int(config["tiles_n"]) * TILE_COLS)


def _takes(anchor: Any, output: Any) -> bool:
    """Ungrouped float32 convolutions (the GPU's direct compute: data, then weight) whose
    input channels come in 8-steps, with the result as the group's output shape."""
    op = anchor.op
    if (not isinstance(op, te.ComputeOp) or len(op.axis) != 4 or len(op.reduce_axis) != 3
            or tuple(output.shape) != tuple(anchor.shape) or anchor.dtype != "float32"):
        return False
    reads = op.input_tensors
    if len(reads) < 2 or any(t.dtype != "float32" for t in reads[:2]):
        return False
    data, weight = reads[:2]
    return (len(weight.shape) == 4 and int(data.shape[1]) == int(weight.shape[1])
            and int(weight.shape[0]) == int(anchor.shape[1])
            and int(weight.shape[1]) % TILE_STEPS == 0)


def arrange_conv2d_mma(s: te.Schedule, anchor: Any, output: Any, warps_m: int, warps_n: int,
                       tiles_m: int, tiles_n: int, pixels: int, k_step: int,
                       shared: bool, row_steps: bool = False,
                       double_buffer: bool = False, staged_store: bool = False,
                       async_stages: int = 0) -> None:
    """The tiling of the module docstring with explicit knobs (they must divide the
    convolution: see the space)."""
    if staged_store:  # the lanes fill a block's shared tile; the output is computed from it
        acc, owner = _staged_tile(s, anchor, output, warps_m, warps_n, tiles_m, tiles_n,
                                  pixels, vector_pixels(output, pixels))
    else:  # the lanes compute the output (the epilogue) from their registers
        acc, owner = accumulator_and_owner(s, anchor, output)
    _arrange_lanes(s, acc, owner, list(owner.op.axis), warps_m, warps_n, tiles_m, tiles_n,
                   pixels, bind_blocks=not staged_store)
    stage = s[acc]
    an, ao, _, _ = stage.op.axis
    rc, ry, rx = stage.op.reduce_axis
    step = tensorize_tiles(stage, ao, an, rc, k_step, outer_reduce=(ry, rx))
    if row_steps:  # the copies at each row of the window: one row's weights and input
        step = ry
    if shared:
        data, weight = anchor.op.input_tensors[:2]
        stride, dilation_h, dilation_w = _window(anchor)  # type: ignore[misc]
        spans = {  # the input's rows and columns under the block's pixels' windows
            2: 1 if row_steps else (int(weight.shape[2]) - 1) * dilation_h + 1,
            3: (pixels - 1) * stride + (int(weight.shape[3]) - 1) * dilation_w + 1}
        block = {"rows": warps_m * tiles_m * TILE_ROWS, "cols": warps_n * tiles_n * TILE_COLS,
                 "k": k_step}

        def extent(operand: Any, role: str, dim: int) -> int:
            if role in block:
                return block[role]
            if operand is data:
                return spans[dim]
            return 1 if row_steps and dim == 2 else int(weight.shape[dim])

        # a 1x1 convolution's input at consecutive pixels of a row from a multiple of 4:
        # copied in 16-byte vectors where the block's pixels are whole vectors
        pointwise = (int(weight.shape[2]) == int(weight.shape[3]) == 1 and stride == 1
                     and _unpadded(anchor) and int(data.shape[3]) % pixels == 0
                     and pixels % 4 == 0)
        stage_in_shared(s, acc, [data, weight], stage, step, pixels * warps_m * warps_n,
                        (tiles_m, tiles_n), extent, axes=(1, 0), double_buffer=double_buffer,
                        async_stages=async_stages, aligned=(data,) if pointwise else ())


def _arrange_lanes(s: te.Schedule, acc: Any, owner: te.Stage, axes: list[Any], warps_m: int,
                   warps_n: int, tiles_m: int, tiles_n: int, pixels: int,
                   bind_blocks: bool) -> None:
    """Split ``owner``'s (images, channels, row, column) ``axes`` into the block's warps and
    lanes (blocks too with ``bind_blocks``; else ``owner`` is already one block's tile) and
    compute the accumulator ``acc`` at each lane's loop."""
    n, o, y, x = axes
    # Whole loops for the pixel and the image tile (no index split across them), so that a
    # lane's results are one box of the accumulator: its channels and images at one pixel.
    pixel = owner.fuse(y, x)
    if bind_blocks:
        oo, o = owner.split(o, factor=warps_m * tiles_m * TILE_ROWS)
        no, n = owner.split(n, factor=warps_n * tiles_n * TILE_COLS)
    wi, o1 = owner.split(o, factor=tiles_m * TILE_ROWS)
    g, rows = owner.split(o1, factor=tiles_m * 2)
    wj, n1 = owner.split(n, factor=tiles_n * TILE_COLS)
    t4, cols = owner.split(n1, factor=tiles_n * 2)
    if not bind_blocks:
        owner.reorder(pixel, wi, wj, g, t4, rows, cols)
        owner.bind(owner.fuse(pixel, wi, wj), "threadIdx.z")
    elif pixels == 1:  # unsplit: a split by 1 hides from bound inference that x is one pixel
        owner.bind(no, "blockIdx.z")
        owner.bind(oo, "blockIdx.y")
        owner.reorder(no, oo, pixel, wi, wj, g, t4, rows, cols)
        owner.bind(pixel, "blockIdx.x")
        owner.bind(owner.fuse(wi, wj), "threadIdx.z")
    else:
        owner.bind(no, "blockIdx.z")
        owner.bind(oo, "blockIdx.y")
        po, pi = owner.split(pixel, factor=pixels)
        owner.reorder(no, oo, po, pi, wi, wj, g, t4, rows, cols)
        owner.bind(po, "blockIdx.x")
        owner.bind(owner.fuse(pi, wi, wj), "threadIdx.z")
    owner.bind(g, "threadIdx.y")
    owner.bind(t4, "threadIdx.x")
    s[acc].compute_at(owner, t4)


def vector_pixels(output: Any, pixels: int) -> int:
    """How many consecutive pixels of a row a thread takes in a staged epilogue: 4 (one
    16-byte load of each input of the output's shape, one store) where a block's pixels
    and the rows are whole vectors of 4, so that each vector starts at a multiple of 4;
    else 1."""
    width = int(output.shape[3])
    return VECTOR if pixels % VECTOR == 0 and width % VECTOR == 0 else 1


def _staged_tile(s: te.Schedule, anchor: Any, output: Any, warps_m: int, warps_n: int,
                 tiles_m: int, tiles_n: int, pixels: int, vector: int = 1
                 ) -> tuple[Any, te.Stage]:
    """The block's sums stored into a shared tile by its lanes, and the group's output (the
    epilogue: bias, activation, residual) computed from that tile by the block's threads in
    the output's own order: consecutive threads take consecutive pixels of a row, then the
    next channel, so that a warp's stores and residual loads cover whole 32-byte sectors
    instead of one 4-byte word in each of 32 (a lane's results lie an image and a channel
    apart in NCHW). Returns the register accumulator and the tile's stage."""
    tile = s.cache_write(anchor, "local") if output.op is anchor.op else anchor
    acc = s.cache_write(tile, "local")
    s[tile].set_scope("shared")
    # with vectors, a thread computes its pixels' epilogue into registers (its inputs of
    # the output's shape loaded whole) and stores them as one 16-byte vector
    local = s.cache_write(output, "local") if vector > 1 else None
    owner = s[output]
    n, o, y, x = owner.op.axis
    no, ni = owner.split(n, factor=warps_n * tiles_n * TILE_COLS)
    oo, oi = owner.split(o, factor=warps_m * tiles_m * TILE_ROWS)
    xo, xi = owner.split(x, factor=pixels) if pixels > 1 else (x, None)
    owner.reorder(no, oo, y, xo, ni, oi, *([xi] if xi is not None else []))
    owner.bind(no, "blockIdx.z")
    owner.bind(oo, "blockIdx.y")
    pixel = owner.fuse(y, xo)
    owner.bind(pixel, "blockIdx.x")
    s[tile].compute_at(owner, pixel)
    inner = [ni, oi] + ([xi] if xi is not None else [])
    step = warp_copy(owner, pixels * warps_m * warps_n, inner, vector=vector)
    if local is not None:
        compute_in_registers(s, local, owner, step, tuple(output.shape))
    # a lane's first sum (images 2 tiles_n t4 apart, channels 2 tiles_m g apart) on the
    # fewest words per bank: the images' stride in the tile padded
    lanes = [divmod(lane, LANE_X) for lane in range(LANE_X * LANE_Y)]  # (g, t4)
    images = tuple(2 * tiles_n * t4 for _, t4 in lanes)
    channels = tuple(2 * tiles_m * g for g, _ in lanes)
    dense = warps_m * tiles_m * TILE_ROWS * pixels
    s[tile].storage_align(s[tile].op.axis[0], BANKS,
                          bank_offset(images, channels, pixels, dense))
    return acc, s[tile]
